"""The ddpkit script of docs/own-script.md, taken from the page as it stands, under
`ddpdeploy smoke --local --kill-at`: the same progress and recovery lines as the built-in
trainer gives (tests/test_smoke_local.py, tests/test_smoke_scripts.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_runner import run_cli
from local_smoke import leftovers

pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # torchrun agents, twice

DOC = Path(__file__).resolve().parents[2] / "docs" / "own-script.md"


def doc_script() -> str:
    """The first python block under the page's "The `ddpkit` helpers" heading."""
    text = DOC.read_text()
    section = text[text.index("## The `ddpkit` helpers") :]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_doc_example_is_a_whole_ddpkit_script() -> None:
    code = doc_script()
    compile(code, str(DOC), "exec")  # a whole script, not a fragment with `...`
    assert 'ddpkit.log("start"' in code and "ddpkit.save(" in code


def test_doc_example_shows_progress_and_recovery_under_kill_at(tmp_path: Path, marker: str) -> None:
    (tmp_path / "train.py").write_text(doc_script())
    spec = "nodes: 1\ncheckpoint: {claimName: doc}\ncommand: {script: train.py}\n"
    (tmp_path / "ddpdeploy.yaml").write_text(spec)
    res = run_cli(
        "smoke", "--local", "--procs", "2", "--kill-at", "20",
        cwd=tmp_path, env={"DDPDEPLOY_TEST_MARKER": marker}, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    # Both runs' progress knows its length (the start event's total_steps), as the
    # trainer's does: 1024 samples / 2 ranks / batch 32 = 16 steps per epoch, 3 epochs.
    bars = re.findall(r"^\S+ .*? (\d+)/(\S+) ", res.stderr, re.M)
    assert bars and all(b == ("48", "48") for b in bars), res.stderr[-3000:]
    assert re.search(r"^steps +48$", res.stdout, re.M), res.stdout
    assert re.search(r"^killed +local rank \d \(pid \d+\) of \S+ at step 20$", res.stdout, re.M), (
        res.stdout
    )
    assert re.search(r"^recovery +\d+\.\d s \(kill -> step \d+", res.stdout, re.M), res.stdout
    assert re.search(r"^clean run +[0-9a-f]{64} \(same\)$", res.stdout, re.M), res.stdout
    assert '"resumed": true' in res.stderr and '"resume_step": 16' in res.stderr
    assert leftovers(marker) == []
