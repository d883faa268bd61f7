"""Choosing and copying checkpoints (ddpdeploy.checkpoints) on real folders: hostile
sidecars, symlinks, vanishing and corrupt payloads, plain files with SHA256SUMS, and
destinations that must never be clobbered."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reports import Recorded

from ddpdeploy.collect.checkpoint import collect, payload_name, sidecar_name
from ddpdeploy.collect.destination import _write_atomic
from ddpdeploy.collect.plain import SUMS
from ddpdeploy.collect.source import LocalSource, Unreadable
from ddpdeploy.errors import OperationError, UserError


def put_checkpoint(
    folder: Path, step: int, payload: bytes | None = None, meta: dict | None = None
) -> bytes:
    """Step ``step`` in the trainer's layout; ``meta`` overrides sidecar fields."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(5000) if payload is None else payload
    (folder / payload_name(step)).write_bytes(payload)
    doc = {"step": step, "sha256": hashlib.sha256(payload).hexdigest(), "world_size": 2}
    doc |= {"host": "node-0", "rank": 0, "restart_count": 0, "time": 1.5}
    doc["file"] = payload_name(step)
    doc.update(meta or {})
    (folder / sidecar_name(step)).write_text(json.dumps(doc))
    return payload


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A checkpoint folder with an intact step 1 (the fall-back) and nothing else yet."""
    folder = tmp_path / "src"
    put_checkpoint(folder, 1, b"step one")
    return folder


def run(folder: Path, dest: Path, **kw: Any) -> tuple[Any, list[str]]:
    said = Recorded()
    warnings = said.warnings
    got = collect(LocalSource(folder), dest, report=said, **kw)
    return got, warnings


HOSTILE_SIDECARS: dict[str, Any] = {
    "file-escapes": {"file": "../../../.bashrc"},
    "file-dotdot": {"file": ".."},
    "file-root": {"file": "/"},
    "file-int": {"file": 12345},
    "file-other-step": {"file": payload_name(1)},
    "step-string": {"step": "2"},
    "step-bool": {"step": True},
    "step-other": {"step": 7},
    "step-negative": {"step": -2},
    "sha-int": {"sha256": 123},
    "sha-upper": {"sha256": "A" * 64},
    "sha-short": {"sha256": "ab"},
    "rank-list": {"rank": [0]},
    "host-huge": {"host": "h" * 100_000},
    "world-zero": {"world_size": 0},
    "time-string": {"time": "now"},
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SIDECARS))
def test_a_hostile_sidecar_is_skipped_in_one_line(src, tmp_path, case):
    put_checkpoint(src, 2, meta=HOSTILE_SIDECARS[case])
    before = tree(tmp_path)
    got, warnings = run(src, tmp_path / "out")
    assert got.step == 1
    assert len(warnings) == 1 and warnings[0].startswith("checkpoint at step 2 in ")
    assert "\n" not in warnings[0] and len(warnings[0]) < 300
    assert listing(tmp_path / "out") == [sidecar_name(1), payload_name(1)]
    assert tree(tmp_path) - before == {"out", *(f"out/{n}" for n in listing(tmp_path / "out"))}


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[1, 2]", b"null", b"\xff\xfe", b"[" * 100_000, b" " * (2 << 20)],
    ids=["empty", "text", "list", "null", "not-utf8", "deep", "huge"],
)
def test_an_unparsable_sidecar_is_skipped(src, tmp_path, raw):
    put_checkpoint(src, 2)
    (src / sidecar_name(2)).write_bytes(raw)
    got, warnings = run(src, tmp_path / "out")
    assert got.step == 1 and len(warnings) == 1 and "sidecar" in warnings[0]


def test_the_newest_intact_checkpoint_is_copied_byte_for_byte(src, tmp_path):
    payload = put_checkpoint(src, 20)
    (src / ".tmp-abc.pt").write_bytes(b"a writer's temp file")
    (src / payload_name(30)).write_bytes(b"no sidecar yet: not a checkpoint")
    got, warnings = run(src, tmp_path / "out")
    assert (got.step, warnings) == (20, [])
    assert got.describe() == f"ddpdeploy checkpoint step 20 from {src}"
    assert (tmp_path / "out" / payload_name(20)).read_bytes() == payload
    assert (tmp_path / "out" / sidecar_name(20)).read_bytes() == (
        src / sidecar_name(20)
    ).read_bytes()
    assert listing(tmp_path / "out") == [sidecar_name(20), payload_name(20)]


def test_a_corrupt_newest_falls_back_and_a_named_one_is_refused(src, tmp_path):
    put_checkpoint(src, 2)
    data = bytearray((src / payload_name(2)).read_bytes())
    data[100] ^= 1
    (src / payload_name(2)).write_bytes(bytes(data))
    got, warnings = run(src, tmp_path / "out")
    assert got.step == 1
    assert len(warnings) == 1 and "fails its sha256 check" in warnings[0]
    assert "trying the next newest" in warnings[0]
    with pytest.raises(OperationError, match="no intact checkpoint"):
        run(src, tmp_path / "named", step=2)
    assert not (tmp_path / "named").exists()  # created for the copy, removed again
    with pytest.raises(UserError, match=r"--step: no checkpoint at step 9 .*have: 2, 1"):
        run(src, tmp_path / "nine", step=9)


def test_a_payload_symlinked_to_a_matching_file_outside_is_not_read(src, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:$6$hash:::")  # stands in for /etc/shadow
    put_checkpoint(src, 2, meta={"sha256": hashlib.sha256(secret.read_bytes()).hexdigest()})
    (src / payload_name(2)).unlink()
    (src / payload_name(2)).symlink_to(secret)
    (src / "latest").symlink_to(src / payload_name(1))
    got, warnings = run(src, tmp_path / "out")
    assert got.step == 1
    assert any("skipping latest" in w and "symlink" in w for w in warnings)
    assert any("step 2" in w and "a symlink, not a regular file" in w for w in warnings)
    assert b"root:" not in b"".join(p.read_bytes() for p in (tmp_path / "out").iterdir())


class SwapOnOpen:
    """A real folder whose payload is changed (really) between the listing and the open:
    ``swap`` runs on the first open of ``name``."""

    def __init__(self, folder: Path, name: str, swap: Any) -> None:
        self.inner, self.name, self.swap, self.where = LocalSource(folder), name, swap, "swap"

    def entries(self) -> dict[str, str]:
        return self.inner.entries()

    def open(self, name: str) -> contextlib.AbstractContextManager[Any]:
        if name == self.name and self.swap:
            self.swap, swap = None, self.swap
            swap()
        return self.inner.open(name)


def test_a_payload_deleted_between_list_and_open_falls_back(src, tmp_path):
    put_checkpoint(src, 2)
    source = SwapOnOpen(src, payload_name(2), (src / payload_name(2)).unlink)
    said = Recorded()
    warnings = said.warnings
    assert collect(source, tmp_path / "out", report=said).step == 1
    assert len(warnings) == 1 and "vanished" in warnings[0]
    assert listing(tmp_path / "out") == [sidecar_name(1), payload_name(1)]  # no temp left


def test_a_symlink_swapped_in_after_the_listing_is_refused_at_open(src, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")
    put_checkpoint(src, 2, meta={"sha256": hashlib.sha256(b"secret").hexdigest()})

    def swap() -> None:
        (src / "link").symlink_to(secret)
        os.replace(src / "link", src / payload_name(2))

    source = SwapOnOpen(src, payload_name(2), swap)
    assert source.entries()[payload_name(2)] == "regular file"  # when listed
    said = Recorded()
    warnings = said.warnings
    assert collect(source, tmp_path / "out", report=said).step == 1
    assert any("a symlink, not a regular file" in w for w in warnings)


def test_a_fifo_is_neither_opened_nor_waited_on(src, tmp_path):
    os.mkfifo(src / "pipe")
    with pytest.raises(Unreadable, match="not a regular file"):
        LocalSource(src).open("pipe").__enter__()
    got, warnings = run(src, tmp_path / "out")
    assert got.step == 1 and any("pipe" in w and "special file" in w for w in warnings)


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
    assert sorted(w.split(" in ")[0] for w in warnings) == [
        "skipping .snapshot.pt.swp",
        "skipping link",
        "skipping snapshot.pt.tmp",
    ]


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


def test_nothing_in_to_is_replaced_without_overwrite(src, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / payload_name(1)).write_bytes(b"my own file")
    with pytest.raises(UserError, match=rf"--to: .*{payload_name(1)} already exists and differs"):
        run(src, dest)
    assert listing(dest) == [payload_name(1)]
    assert (dest / payload_name(1)).read_bytes() == b"my own file"
    got, _ = run(src, dest, overwrite=True)
    assert got.step == 1 and (dest / payload_name(1)).read_bytes() == b"step one"
    again, _ = run(src, dest)  # identical files are fine: a second collect is a no-op
    assert again.step == 1 and listing(dest) == [sidecar_name(1), payload_name(1)]
    (dest / sidecar_name(1)).unlink()
    (dest / sidecar_name(1)).mkdir()
    with pytest.raises(UserError, match="exists and is not a regular file"):
        run(src, dest, overwrite=True)


@pytest.mark.parametrize("where", ["a-file", "/dev/full", "/dev/full/x", "a-file/sub"])
def test_to_that_cannot_be_a_folder_is_one_line(src, tmp_path, where):
    (tmp_path / "a-file").write_text("x")
    dest = Path(where) if where.startswith("/") else tmp_path / where
    with pytest.raises(UserError, match="^--to: .* not a folder"):
        run(src, dest)
    assert (tmp_path / "a-file").read_text() == "x"


def test_the_writer_removes_its_temp_file_on_failure(tmp_path):
    def fill(out: Any) -> None:
        out.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        _write_atomic(tmp_path / "f", fill)
    assert listing(tmp_path) == []
    assert _write_atomic(tmp_path / "f", b"one") is True
    assert _write_atomic(tmp_path / "f", b"one") is False  # identical: kept
    with pytest.raises(UserError, match="already exists and differs"):
        _write_atomic(tmp_path / "f", b"two")
    assert listing(tmp_path) == ["f"] and (tmp_path / "f").read_bytes() == b"one"


# -- hypothesis: arbitrary sidecar contents -----------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
_fields = st.fixed_dictionaries(
    {},
    optional={
        k: _json | st.just(v)
        for k, v in {
            "step": 2,
            "sha256": "0" * 64,
            "file": payload_name(2),
            "world_size": 1,
            "rank": 0,
            "host": "h",
            "time": 0.5,
        }.items()
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_json | _fields, raw=st.none() | st.binary(max_size=200))
def test_any_sidecar_contents_give_one_plain_line_and_nothing_outside_to(doc, raw):
    with tempfile.TemporaryDirectory() as root:
        base = Path(root)
        src = base / "src"
        put_checkpoint(src, 1, b"step one")
        put_checkpoint(src, 2, b"step two")
        data = raw if raw is not None else json.dumps(doc).encode()
        (src / sidecar_name(2)).write_bytes(data)
        before = tree(base)
        said = Recorded()
        warnings = said.warnings
        got = collect(LocalSource(src), base / "out", report=said)
        assert got.step in (1, 2)
        assert len(warnings) == (got.step == 1)
        for line in warnings:
            assert line.isprintable() and len(line) < 400
        written = tree(base) - before
        assert written == {"out", *(f"out/{n}" for n in listing(base / "out"))}
        assert listing(base / "out") == [sidecar_name(got.step), payload_name(got.step)]
