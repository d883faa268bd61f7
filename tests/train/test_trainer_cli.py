"""The trainer's command line contract: flags, JSON lines, exit codes, no shadowing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trainer_harness import Launcher, done_hash, start_event  # noqa: E402

pytestmark = pytest.mark.slow  # real trainer processes (torch start-up each)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--steps", "0"], "--steps"),
        (["--bogus"], "unrecognized arguments"),
        (["--model", "no_such_module_xyz:make"], "--model"),
        (["--model", "justamodule"], "pkg.mod:factory"),
        (["--checkpoint-every", "5"], "--checkpoint-dir"),
        (["--backend", "mpi"], "--backend"),
        (["--lr", "nan"], "argument --lr: must be a finite number > 0"),  # third hostile pass
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    with Launcher(tmp_path) as L:
        p = L.python(args)
        assert p.wait(60) == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptrain: error:") and needle in lines[0]
    assert p.stdout == ""


def test_json_lines_schema(tmp_path: Path) -> None:
    with Launcher(tmp_path) as L:
        p = L.run_ok(
            [
                "--steps",
                "6",
                "--log-every",
                "3",
                "--checkpoint-dir",
                str(tmp_path / "c"),
                "--checkpoint-every",
                "3",
            ]
        )
    lines = p.stdout.strip().splitlines()
    events = [json.loads(line) for line in lines]  # every stdout line is JSON
    st = start_event(p)
    assert st["world_size"] == 2 and st["backend"] == "gloo" and st["resumed"] is False
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == [3, 6]
    assert all(set(e) == {"event", "step", "loss", "samples_per_s"} for e in steps)
    ck = [e for e in events if e["event"] == "checkpoint"]
    assert [e["step"] for e in ck] == [3, 6]
    assert all(Path(e["path"]).is_file() and e["rank"] == 0 and e["host"] for e in ck)
    assert set(events[-1]) == {"event", "step", "weights_sha256", "run"}
    assert events[-1]["step"] == 6 and events[-1]["run"]["world_size"] == 2
    assert len(done_hash(p)) == 64


def test_user_files_in_cwd_do_not_shadow_the_trainer(tmp_path: Path) -> None:
    # A user's own train.py and look-alikes of our modules in the working directory ...
    for name in ("train.py", "ddptrain.py", "ddptrain_ckpt.py", "ddptrain_model.py"):
        (tmp_path / name).write_text("raise SystemExit('shadowed: wrong module imported')\n")
    # ... while the working directory still resolves --model pkg.mod:factory.
    (tmp_path / "mymodels.py").write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.ReLU(),\n"
        "                               torch.nn.Linear(8, 10))\n"
    )
    with Launcher(tmp_path) as L:
        p = L.run_ok(["--steps", "3", "--model", "mymodels:make", "--log-every", "3"])
    assert "shadowed" not in p.stderr
    done_hash(p)


def test_cpu_sync_bn_runs_single_process(tmp_path: Path) -> None:
    """--sync-bn on CPU uses the gloo path instead of torch's GPU-only SyncBatchNorm error."""
    with Launcher(tmp_path) as L:
        p = L.python(["--steps", "2", "--bn", "--sync-bn"])
        assert p.wait(60) == 0, p.tail()
    assert "only work with GPU modules" not in p.stderr
    done_hash(p)
