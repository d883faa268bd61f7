"""`collect --debug` into a `--to` where `debug` is taken by something that is not a folder
(issue 24 §3): named before anything is read, one line, exit 2, nothing written."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from cli_runner import run_cli

from ddpdeploy.collect.checkpoint import payload_name, sidecar_name


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / ".ddpdeploy" / "checkpoints" / "j"
    folder.mkdir(parents=True)
    payload = os.urandom(5000)
    (folder / payload_name(3)).write_bytes(payload)
    meta = {"step": 3, "sha256": hashlib.sha256(payload).hexdigest()}
    (folder / sidecar_name(3)).write_text(json.dumps(meta))
    (folder / "hang-rank0.txt").write_text("# ddpkit hang watchdog: rank 0\n")
    return tmp_path


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("kind", ["file", "link", "dangling link"])
def test_a_debug_that_is_not_a_folder_is_named_before_anything(project, tmp_path, kind):
    to = tmp_path / "out"
    to.mkdir()
    (tmp_path / "elsewhere").mkdir()
    if kind == "file":
        (to / "debug").write_text("my notes\n")
    elif kind == "link":
        (to / "debug").symlink_to(tmp_path / "elsewhere")
    else:
        (to / "debug").symlink_to(tmp_path / "gone")
    before = listing(to)
    out = run_cli("collect", "j", "--to", str(to), "--debug", cwd=project)
    assert out.returncode == 2, out.stderr
    *said, line = out.stderr.strip().splitlines()
    # Only the source it chose is said before: nothing was read.
    assert said == [
        "collect: reading the local run's folder .ddpdeploy/checkpoints/j (--from local)"
    ]
    assert "Traceback" not in out.stderr
    assert line.startswith(f"error: --to: {to / 'debug'} is "), line
    assert "collect --debug writes the diagnostics files into a folder of that name" in line
    assert listing(to) == before  # nothing written, not even the checkpoint
    assert listing(tmp_path / "elsewhere") == []
    if kind == "file":
        assert (to / "debug").read_text() == "my notes\n"


def test_the_library_entry_refuses_it_too(project, tmp_path):
    from ddpdeploy.collect.checkpoint import collect
    from ddpdeploy.collect.source import LocalSource
    from ddpdeploy.errors import UserError

    to = tmp_path / "out"
    to.mkdir()
    (to / "debug").write_text("x")
    source = LocalSource(project / ".ddpdeploy" / "checkpoints" / "j", "here")
    with pytest.raises(UserError, match="collect --debug writes the diagnostics files"):
        collect(source, to, debug=True)
    assert listing(to) == ["debug"]
