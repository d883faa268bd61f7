"""A folder without ddpdeploy checkpoints (any other script's), collected as plain files
(collect.plain): each read twice to see it is complete, with a SHA256SUMS beside them; a
writer's temp names, links and subfolders left out; `--file` names some; what the command
says of them."""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Any

import pytest
from cli_runner import run_main
from reports import Recorded

from ddpdeploy.collect.checkpoint import collect
from ddpdeploy.collect.plain import SUMS
from ddpdeploy.errors import OperationError, UserError

from .folders import SwapOnOpen, listing, put_trainer_checkpoint, run


def test_plain_files_are_copied_with_sha256sums(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "snapshot.pt").write_bytes(os.urandom(3 << 20))
    (src / "config.json").write_text("{}")
    (src / "notes v2.txt").write_text("spaces are fine")
    (src / ".snapshot.pt.swp").write_text("editor temp")
    (src / "snapshot.pt.tmp").write_text("writer temp")
    (src / "sub").mkdir()
    (src / "link").symlink_to(src / "config.json")
    got, warnings = run(src, tmp_path / "out")
    assert got.describe() == f"3 plain files (with SHA256SUMS) from {src}"
    assert listing(tmp_path / "out") == [SUMS, "config.json", "notes v2.txt", "snapshot.pt"]
    check = subprocess.run(
        ["sha256sum", "--strict", "-c", SUMS], cwd=tmp_path / "out", capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == 3
    for name in ("config.json", "notes v2.txt", "snapshot.pt"):
        assert (tmp_path / "out" / name).read_bytes() == (src / name).read_bytes()
    # Found by the third hostile pass: the subfolder went unsaid (a Hugging Face run's
    # checkpoint-500/ is one).
    assert sorted(w.split(" in ")[0] for w in warnings) == [
        "skipping .snapshot.pt.swp",
        "skipping link",
        "skipping snapshot.pt.tmp",
        "skipping sub/",
    ]
    assert any(w.endswith("a folder (collect copies the files directly in the folder)")
               for w in warnings)  # fmt: skip


def test_a_folder_of_folders_is_not_called_empty(tmp_path):
    # Found by the third hostile pass: "the folder is empty" of one that held checkpoint-500/.
    src = tmp_path / "src"
    (src / "checkpoint-500").mkdir(parents=True)
    (src / "checkpoint-500" / "model.safetensors").write_bytes(b"w")
    with pytest.raises(OperationError, match=r"the folder holds only folders \(checkpoint-500/\)"):
        run(src, tmp_path / "out")


def test_named_plain_files_and_their_errors(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.pt").write_bytes(b"a")
    (src / "b.pt").write_bytes(b"b")
    (src / "link").symlink_to(src / "a.pt")
    got, _ = run(src, tmp_path / "out", files=["b.pt"])
    assert got.files == ["b.pt"] and listing(tmp_path / "out") == [SUMS, "b.pt"]
    for bad in ("missing.pt", "link", "../src/a.pt", ".."):
        with pytest.raises(UserError, match="--file: .* is not a regular file"):
            run(src, tmp_path / "bad", files=[bad])
    assert not (tmp_path / "bad").exists()
    with pytest.raises(UserError, match="--step: .* holds no ddpdeploy checkpoint"):
        run(src, tmp_path / "bad", step=3)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OperationError, match="the folder is empty"):
        run(empty, tmp_path / "bad")


def test_a_plain_file_still_being_written_is_skipped(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "done.pt").write_bytes(b"done")
    (src / "growing.pt").write_bytes(b"part")

    class GrowsAfterFirstRead(SwapOnOpen):
        def open(self, name: str) -> contextlib.AbstractContextManager[Any]:
            if name == "growing.pt":
                self.opens = getattr(self, "opens", 0) + 1
                if self.opens == 2:  # the writer appended between the two reads
                    with open(src / name, "ab") as fh:
                        fh.write(b" and more")
            return self.inner.open(name)

    said = Recorded()
    warnings = said.warnings
    source = GrowsAfterFirstRead(src, "", None)
    got = collect(source, tmp_path / "out", report=said)
    assert got.files == ["done.pt"]
    assert len(warnings) == 1 and "growing.pt" in warnings[0] and "between two reads" in warnings[0]
    with pytest.raises(OperationError, match="--file: growing.pt"):
        collect(GrowsAfterFirstRead(src, "", None), tmp_path / "named", files=["growing.pt"])
    assert not (tmp_path / "named").exists()


def test_plain_files_say_which_format(tmp_path):
    folder = tmp_path / ".ddpdeploy" / "checkpoints" / "s"
    folder.mkdir(parents=True)
    (folder / "snapshot.pt").write_bytes(b"weights")
    (folder / "[bold]x\x1b]0;t").write_bytes(b"a name with markup and an escape")
    (folder / "[red]link").symlink_to(folder / "snapshot.pt")
    out = run_main("collect", "s", "--to", "out", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (
        out.stderr.strip().splitlines()[-1]
        == "collected 1 plain file (with SHA256SUMS) from .ddpdeploy/checkpoints/s into out"
    )
    assert "skipping [red]link" in out.stderr and "[bold]x\\x1b]0;t" in out.stderr
    assert "\x1b" not in out.stderr
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path / "out")
    assert check.returncode == 0


def test_ddpkits_lock_file_is_named_as_such_not_as_a_temp_file(tmp_path):
    # From the ddpkit4 pass: it was skipped as "a temp-file name (a writer may not be done
    # with it)", which it is not.
    src = tmp_path / "src"
    src.mkdir()
    (src / ".ddpkit.lock").write_text("")
    (src / "snapshot.pt").write_bytes(b"weights")
    got, warnings = run(src, tmp_path / "out")
    assert got.files == ["snapshot.pt"]
    assert warnings == [
        f"skipping .ddpkit.lock in {src}: ddpkit's lock file of the folder, not data of the run"
    ]


def _zip_file(path, comment: bytes = b"") -> bytes:
    """A zip archive, the format torch.save writes (a real torch file: the e2e tier's)."""
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", os.urandom(200_000))
        z.comment = comment
    return path.read_bytes()


def test_a_torch_file_cut_short_is_not_vouched_for(tmp_path):
    # Found by the fifth outside-scripts pass: a script that torch.save()s onto its one file
    # and pauses mid-write (or died mid-write) gave the same bytes on both reads, and collect
    # wrote the half file with an "OK" sha256 beside it, exit 0.
    src = tmp_path / "src"
    src.mkdir()
    whole = _zip_file(src / "snapshot.pt")
    _zip_file(src / "with-comment.pt", comment=b"PK\x05\x06 in a comment" + b"x" * 300)
    (src / "half.pt").write_bytes(whole[: len(whole) // 2])
    (src / "no-end.pt").write_bytes(whole[:-1])  # the end record's last byte missing
    got, warnings = run(src, tmp_path / "out")
    assert got.files == ["snapshot.pt", "with-comment.pt"], warnings
    cut = "a zip archive (torch.save's format) without its end record: cut short, or still being"
    assert sorted(w.split(" in ")[0] for w in warnings) == [
        "skipping half.pt",
        "skipping no-end.pt",
    ]
    assert all(cut in w for w in warnings), warnings
    with pytest.raises(OperationError, match="--file: half.pt in .*: a zip archive"):
        run(src, tmp_path / "named", files=["half.pt"])
    assert not (tmp_path / "named").exists()


def test_ddpkits_retention_marker_is_named_as_such_and_left_alone(tmp_path):
    # ddpkit5 K3: retention renames a sidecar to this marker before it deletes the step's
    # payloads; it is ddpkit's, as its lock is: named so in plain mode, unread in a
    # checkpoint folder.
    marker = ".ddpkit-deleting-ckpt-step-000000004.json"
    src = tmp_path / "src"
    src.mkdir()
    (src / marker).write_text("{}")
    (src / "snapshot.pt").write_bytes(b"weights")
    got, warnings = run(src, tmp_path / "out")
    assert got.files == ["snapshot.pt"]
    assert warnings == [
        f"skipping {marker} in {src}: ddpkit's marker of a checkpoint its retention is "
        "deleting, not data of the run"
    ]
    put_trainer_checkpoint(src, 5)
    got, warnings = run(src, tmp_path / "out2")
    assert (got.step, warnings) == (5, [])
