"""What collect reads from (collect.source), a local folder: only regular files directly in
it are opened, by a reader that refuses anything else at open time: a symlink (listed, or
swapped in after the listing), a FIFO (never waited on), a payload gone before the open; the
next newest checkpoint is taken instead. The pod's reader: test_pod.py; a compose volume's
staging: test_volume.py."""

from __future__ import annotations

import hashlib
import os

import pytest
from reports import Recorded

from ddpdeploy.collect.checkpoint import collect, payload_name, sidecar_name
from ddpdeploy.collect.source import LocalSource, Unreadable

from .folders import SwapOnOpen, listing, put_trainer_checkpoint, run


def test_a_payload_symlinked_to_a_matching_file_outside_is_not_read(src, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:$6$hash:::")  # stands in for /etc/shadow
    put_trainer_checkpoint(src, 2, meta={"sha256": hashlib.sha256(secret.read_bytes()).hexdigest()})
    (src / payload_name(2)).unlink()
    (src / payload_name(2)).symlink_to(secret)
    (src / "latest").symlink_to(src / payload_name(1))
    got, warnings = run(src, tmp_path / "out")
    assert got.step == 1
    assert any("skipping latest" in w and "symlink" in w for w in warnings)
    # One line for the payload, its checkpoint's (found by the second hostile pass: the
    # folder's listing said it first).
    (said,) = [w for w in warnings if payload_name(2) in w]
    assert "step 2" in said and "a symlink, not a regular file" in said
    assert b"root:" not in b"".join(p.read_bytes() for p in (tmp_path / "out").iterdir())


def test_a_payload_deleted_between_list_and_open_falls_back(src, tmp_path):
    put_trainer_checkpoint(src, 2)
    source = SwapOnOpen(src, payload_name(2), (src / payload_name(2)).unlink)
    said = Recorded()
    warnings = said.warnings
    assert collect(source, tmp_path / "out", report=said).step == 1
    assert len(warnings) == 1 and "vanished" in warnings[0]
    assert listing(tmp_path / "out") == [sidecar_name(1), payload_name(1)]  # no temp left


def test_a_symlink_swapped_in_after_the_listing_is_refused_at_open(src, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")
    put_trainer_checkpoint(src, 2, meta={"sha256": hashlib.sha256(b"secret").hexdigest()})

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
