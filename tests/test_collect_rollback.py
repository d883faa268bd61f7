"""`collect --overwrite` that fails after it replaced files in --to: the old versions come
back (a rollback that only removed what it wrote would leave neither the old file nor the
new one). The full-disk form of it: tests/test_collect_full_disk.py."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from reports import Recorded

from ddpdeploy.collect.checkpoint import collect, payload_name, sidecar_name
from ddpdeploy.collect.source import LocalSource


def test_ctrl_c_after_overwrite_puts_the_old_files_back(tmp_path: Path) -> None:
    src = tmp_path / "run"
    src.mkdir()
    payload = os.urandom(5000)
    (src / payload_name(3)).write_bytes(payload)
    meta = {"step": 3, "sha256": hashlib.sha256(payload).hexdigest()}
    (src / sidecar_name(3)).write_text(json.dumps(meta))
    (src / "hang-rank0.txt").write_bytes(os.urandom(3 << 20))  # several chunks
    to = tmp_path / "out"
    to.mkdir()
    mine = {payload_name(3): b"an older step 3", sidecar_name(3): b"{}", "notes": b"kept"}
    for name, data in mine.items():
        (to / name).write_bytes(data)

    def interrupt(copied: float) -> None:
        if copied > 5000 + (1 << 20):  # inside the stack, the checkpoint replaced
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect(LocalSource(src), to, report=Recorded(interrupt), overwrite=True, debug=True)
    assert {p.name: p.read_bytes() for p in to.iterdir()} == mine  # no debug/, no temp file
    got = collect(LocalSource(src), to, overwrite=True, debug=True)  # and nothing in its way
    assert got.step == 3 and (to / payload_name(3)).read_bytes() == payload
    assert sorted(p.name for p in to.iterdir()) == sorted([*mine, "debug"])
