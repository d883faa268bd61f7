"""`ddpdeploy collect --debug` (collect.debug): the hang stacks, flight recorder dumps and
NCCL debug logs a run leaves beside its checkpoints, into --to/debug/; only names of those
shapes, only regular files, each read at most MAX_DEBUG bytes (a text cut with a note, a dump
refused), nothing shown as markup. From a pod: test_pod.py; a compose volume: test_volume.py;
into a --to that holds other files, or interrupted: test_destination.py."""

from __future__ import annotations

import os

import pytest
from cli_runner import run_cli, run_main

from ddpdeploy.collect.checkpoint import collect, payload_name, sidecar_name
from ddpdeploy.collect.debug import MAX_DEBUG
from ddpdeploy.collect.source import LocalSource, NoCheckpoint
from ddpdeploy.errors import UserError

from .folders import CUT_NOTE, put_checkpoint, put_diagnostics


def test_the_checkpoint_and_every_diagnostics_file_come_home(project, run_folder, tmp_path):
    payload = put_checkpoint(run_folder, 3)
    files = put_diagnostics(run_folder)
    (run_folder / "hang-rank0.txt.tmp").write_bytes(b"not a name of ours")
    (run_folder / "notes.txt").write_bytes(b"not a diagnostics file")
    to = tmp_path / "out"
    out = run_main("collect", "j", "--to", str(to), "--debug", cwd=project)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.strip().splitlines()
    assert (
        lines[1] == f"collected ddpdeploy checkpoint step 3 from .ddpdeploy/checkpoints/j into {to}"
    )
    assert lines[2:] == [
        f"debug: {to}/debug/ddpkit-nccl.node-1.4242.log  49 bytes  NCCL debug log",
        f"debug: {to}/debug/hang-rank0.txt  67 bytes  hang stack: # ddpkit hang watchdog: "
        "rank 0 on h, pid 1, last step 4",
        f"debug: {to}/debug/hang-rank1.txt  67 bytes  hang stack: # ddpkit hang watchdog: "
        "rank 1 on h, pid 2, last step 4",
        f"debug: {to}/debug/nccl_trace_rank_0  2.9 KiB  flight recorder dump",
        f"debug: 2 hang stacks, 1 flight recorder dump, 1 NCCL debug log into {to}/debug",
    ]
    assert (to / payload_name(3)).read_bytes() == payload
    assert sorted(p.name for p in to.iterdir()) == sorted(
        ["debug", payload_name(3), sidecar_name(3)]
    )
    assert {p.name: p.read_bytes() for p in (to / "debug").iterdir()} == files


def test_no_diagnostics_file_is_one_line_and_exit_0_beside_a_checkpoint(
    project, run_folder, tmp_path
):
    put_checkpoint(run_folder, 1)
    out = run_main("collect", "j", "--to", str(tmp_path / "out"), "--debug", cwd=project)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "debug: no diagnostics files in .ddpdeploy/checkpoints/j (hang-rank*.txt, "
        "nccl_trace_rank_*, ddpkit-nccl.*.log)"
    )
    assert not (tmp_path / "out" / "debug").exists()


def test_nothing_at_all_is_exit_1_and_one_line(project, run_folder, tmp_path):
    (run_folder / ".hidden.tmp").write_bytes(b"x")
    out = run_cli("collect", "j", "--to", str(tmp_path / "out"), "--debug", cwd=project)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "error: nothing to collect in .ddpdeploy/checkpoints/j: no checkpoint and no "
        "diagnostics files (hang-rank*.txt, nccl_trace_rank_*, ddpkit-nccl.*.log)"
    )
    assert not (tmp_path / "out").exists()


def test_hostile_entries_are_refused_or_cut_and_never_shown_as_markup(
    project, run_folder, tmp_path
):
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    (run_folder / "hang-rank0.txt").symlink_to(secret)
    os.mkfifo(run_folder / "hang-rank1.txt")
    with open(run_folder / "hang-rank2.txt", "wb") as f:  # 2 GB, sparse: cut at the bound
        f.write(b"# [bold red]rank 2[/] \x1b]0;owned\x07\x1b[2J\n")
        f.truncate(2 << 30)
    with open(run_folder / "nccl_trace_rank_3", "wb") as f:  # a dump that big is refused
        f.truncate(2 << 30)
    (run_folder / "hang-rank4.txt\x1b[31m").write_bytes(b"an escape in the name")
    (run_folder / "nccl_trace_rank_5\n").write_bytes(b"a line break in the name")
    (run_folder / "hang-rank6.txt").write_bytes(b"[link=file:///etc]x[/link]\n")
    to = tmp_path / "out"
    out = run_main("collect", "j", "--to", str(to), "--debug", cwd=project)
    assert out.returncode == 0, out.stderr
    err = out.stderr
    assert "\x1b" not in err and "\x07" not in err and "Traceback" not in err
    assert "warning: skipping hang-rank0.txt in .ddpdeploy/checkpoints/j: a symlink" in err
    assert "warning: skipping hang-rank1.txt in .ddpdeploy/checkpoints/j: a special file" in err
    assert "hang-rank2.txt in .ddpdeploy/checkpoints/j is over 32 MiB: cut there" in err
    assert "skipping nccl_trace_rank_3 in .ddpdeploy/checkpoints/j: is over 32 MiB: refused" in err
    # Shown as the characters they are: markup not applied, escapes made U+FFFD.
    assert "hang stack (cut at 32 MiB): # [bold red]rank 2[/] \ufffd\ufffd" in err
    assert "hang stack: [link=file:///etc]x[/link]" in err
    assert "no checkpoint in .ddpdeploy/checkpoints/j yet: collected the diagnostics only" in err
    assert err.strip().splitlines()[-1] == (
        f"debug: 2 hang stacks, 0 flight recorder dumps, 0 NCCL debug logs into {to}/debug"
    )
    assert sorted(p.name for p in (to / "debug").iterdir()) == ["hang-rank2.txt", "hang-rank6.txt"]
    cut = to / "debug" / "hang-rank2.txt"
    assert cut.stat().st_size == MAX_DEBUG + len(CUT_NOTE)
    with open(cut, "rb") as f:
        f.seek(MAX_DEBUG)
        assert f.read() == CUT_NOTE
    assert secret.read_bytes() == b"not yours"
    # No SHA256SUMS of escaping names, no plain copy of the diagnostics either.
    assert sorted(p.name for p in to.iterdir()) == ["debug"]


def test_without_debug_a_run_with_only_stacks_is_plain_files_as_before(run_folder, tmp_path):
    put_diagnostics(run_folder)
    got = collect(LocalSource(run_folder), tmp_path / "out")
    assert len(got.files) == 4 and got.debug is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoCheckpoint, match="no checkpoint and no diagnostics files"):
        collect(LocalSource(tmp_path / "empty"), tmp_path / "o2", debug=True)
    assert not (tmp_path / "o2").exists()


def test_step_with_debug_still_names_a_missing_step(run_folder, tmp_path):
    put_checkpoint(run_folder, 1)
    put_diagnostics(run_folder)
    with pytest.raises(UserError, match="--step: no checkpoint at step 9"):
        collect(LocalSource(run_folder), tmp_path / "out", 9, debug=True)
    assert not (tmp_path / "out").exists()


def test_a_diagnostics_file_named_with_file_is_that_plain_file(run_folder, tmp_path):
    files = put_diagnostics(run_folder)
    to = tmp_path / "out"
    got = collect(LocalSource(run_folder), to, files=["hang-rank0.txt"], debug=True)
    assert got.files == ["hang-rank0.txt"] and not got.no_checkpoint
    assert (to / "hang-rank0.txt").read_bytes() == files["hang-rank0.txt"]
    assert sorted(f.name for f in got.debug or []) == [
        "ddpkit-nccl.node-1.4242.log",
        "hang-rank1.txt",
        "nccl_trace_rank_0",
    ]
