"""Choosing and verifying a ddpdeploy checkpoint (collect.checkpoint), on real folders:
hostile and unparsable sidecars, a corrupt newest one, the newest intact one copied byte for
byte, the run record beside it; and `collect --from local` on a real `smoke --local` run."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reports import Recorded

from ddpdeploy.collect.checkpoint import Sidecar, collect, payload_name, run_record, sidecar_name
from ddpdeploy.collect.source import LocalSource
from ddpdeploy.errors import OperationError, UserError

from .folders import SwapOnOpen, check_collected, listing, put_trainer_checkpoint, run


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


HOSTILE_SIDECARS: dict[str, Any] = {
    "file-escapes": {"file": "../../../.bashrc"},
    "file-dotdot": {"file": ".."},
    "file-root": {"file": "/"},
    "file-int": {"file": 12345},
    "file-other-step": {"file": payload_name(1)},
    "file-other-step-resaved": {"file": "ckpt-step-000000001.0123456789abcdef.pt"},
    "file-short-hex": {"file": "ckpt-step-000000002.0123.pt"},
    "file-upper-hex": {"file": "ckpt-step-000000002.0123456789ABCDEF.pt"},
    "file-sidecar": {"file": sidecar_name(2)},
    "file-null": {"file": None},  # ddpkit refuses it too (ddpkit4 F3)
    "file-newline": {"file": payload_name(2) + "\n"},  # `$` took it (ddpkit4 F4)
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
    put_trainer_checkpoint(src, 2, meta=HOSTILE_SIDECARS[case])
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
    put_trainer_checkpoint(src, 2)
    (src / sidecar_name(2)).write_bytes(raw)
    got, warnings = run(src, tmp_path / "out")
    assert got.step == 1 and len(warnings) == 1 and "sidecar" in warnings[0]


def test_the_newest_intact_checkpoint_is_copied_byte_for_byte(src, tmp_path):
    payload = put_trainer_checkpoint(src, 20)
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


RESAVED = "ckpt-step-000000020.0123456789abcdef.pt"


def test_a_step_saved_again_is_collected_under_the_name_its_sidecar_gives(src, tmp_path):
    # ddpkit commits a step saved again with a payload of its own name (the sidecar's
    # rename alone commits); the usual name beside it is what a killed commit left.
    payload = put_trainer_checkpoint(src, 20, meta={"file": RESAVED})
    (src / payload_name(20)).rename(src / RESAVED)
    (src / payload_name(20)).write_bytes(b"the replaced payload, named by no sidecar")
    got, warnings = run(src, tmp_path / "out")
    assert (got.step, warnings, got.files) == (20, [], [RESAVED, sidecar_name(20)])
    assert (tmp_path / "out" / RESAVED).read_bytes() == payload
    check_collected(tmp_path / "out", 20)


def test_a_corrupt_newest_falls_back_and_a_named_one_is_refused(src, tmp_path):
    put_trainer_checkpoint(src, 2)
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


def test_run_record_is_the_sidecars_run_object_or_nothing():
    base = {"step": 4, "sha256": "a" * 64}
    for not_a_record in ({}, {"run": "x"}, {"run": [1, 2]}, {"run": None}):
        assert run_record(Sidecar.model_validate({**base, **not_a_record}), "p.pt") is None
    got = run_record(Sidecar.model_validate({**base, "run": {"seed": 3, "step": 99}}), "p.pt")
    assert got is not None and got.endswith(b"\n")
    # Ours win over the record's own fields: the step is the checkpoint's.
    assert json.loads(got) == {"seed": 3, "step": 4, "checkpoint": "p.pt",
                               "checkpoint_sha256": "a" * 64}  # fmt: skip


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
        put_trainer_checkpoint(src, 1, b"step one")
        put_trainer_checkpoint(src, 2, b"step two")
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


# -- a real run: `smoke --local` leaves the checkpoints (slow) ---------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A folder in which a 1-node smoke run left checkpoints at steps 2, 4 and 6."""
    path = tmp_path_factory.mktemp("smoke")
    (path / "ddpdeploy.yaml").write_text(
        "name: c\ncheckpoint: {claimName: local}\n"
        "command: {args: [--checkpoint-every, '2', --keep, '3']}\n"
    )
    out = run_cli("smoke", "--local", "--procs", "1", "--steps", "6", cwd=path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return path


@pytest.mark.slow  # a real smoke --local run (torchrun processes)
def test_collects_the_newest_then_skips_a_corrupt_one(run_dir, tmp_path):
    out = run_cli("collect", "c", "--to", str(tmp_path / "a"), cwd=run_dir)
    assert out.returncode == 0, out.stderr
    assert "step 6" in out.stderr
    check_collected(tmp_path / "a", 6)
    assert (tmp_path / "a" / "RUN.json").is_file()  # the trainer's sidecars carry a record
    picked = run_cli("collect", "c", "--to", str(tmp_path / "b"), "--step", "2", cwd=run_dir)
    assert picked.returncode == 0, picked.stderr
    check_collected(tmp_path / "b", 2)
    # Corrupt the newest payload: it is skipped with a warning, the next one is taken.
    src = run_dir / ".ddpdeploy" / "checkpoints" / "c"
    newest = json.loads((src / "ckpt-step-000000006.json").read_text())["file"]
    data = bytearray((src / newest).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (src / newest).write_bytes(bytes(data))
    out = run_cli("collect", "c", "--to", str(tmp_path / "c"), cwd=run_dir)
    assert out.returncode == 0, out.stderr
    assert "warning: checkpoint at step 6" in out.stderr and "corrupt" in out.stderr
    check_collected(tmp_path / "c", 4)
    named = run_cli("collect", "c", "--to", str(tmp_path / "d"), "--step", "6", cwd=run_dir)
    assert named.returncode == 1 and "no intact checkpoint" in named.stderr
    assert not (tmp_path / "d").exists()  # created for the copy, removed when none was made
    missing = run_cli("collect", "c", "--to", str(tmp_path / "e"), "--step", "99", cwd=run_dir)
    assert missing.returncode == 2 and "--step: no checkpoint at step 99" in missing.stderr
    other = run_cli("collect", "nope", "--to", str(tmp_path / "f"), "--from", "local", cwd=run_dir)
    assert other.returncode == 2 and "no checkpoint folder" in other.stderr


def test_a_step_saved_again_while_it_is_copied_is_read_through_its_new_sidecar(
    src, tmp_path, monkeypatch
):
    # Found by the ddpkit4 pass: a re-save of the newest step between collect's read of
    # its sidecar and its payload deleted that payload, and collect fell back to an older
    # step (exit 0). A stand-in for the race: the copy of the old payload re-saves first.
    from ddpdeploy.collect import checkpoint

    put_trainer_checkpoint(src, 2)
    real = checkpoint.verified_copy
    raced = []

    def resave_first(source, name, sha, progress, *rest):
        if not raced:
            raced.append(name)
            payload = put_trainer_checkpoint(src, 2, meta={"file": RESAVED.replace("20", "02", 1)})
            (src / payload_name(2)).rename(src / RESAVED.replace("20", "02", 1))
            assert payload
        return real(source, name, sha, progress, *rest)

    monkeypatch.setattr(checkpoint, "verified_copy", resave_first)
    got, warnings = run(src, tmp_path / "out")
    assert (got.step, warnings) == (2, []), warnings
    assert got.files[0] == RESAVED.replace("20", "02", 1)
    check_collected(tmp_path / "out", 2)


def test_a_step_deleted_by_a_newer_save_while_it_is_copied_gives_the_newer_one(src, tmp_path):
    # Found by the ddpkit5 pass (K1): a save (keep=1) committed between collect's listing
    # and its open of the newest payload; the step's sidecar was gone with it, collect went
    # on with the old listing (older steps, also gone) and said "no intact checkpoint",
    # exit 1, while step 3 lay whole in the folder. A stand-in for that save: the open of
    # step 2's payload commits step 3 and deletes steps 1 and 2 first.
    put_trainer_checkpoint(src, 2)

    def newer_save() -> None:
        put_trainer_checkpoint(src, 3)
        for step in (1, 2):
            (src / sidecar_name(step)).unlink()
            (src / payload_name(step)).unlink()

    said = Recorded()
    got = collect(SwapOnOpen(src, payload_name(2), newer_save), tmp_path / "out", report=said)
    assert got.step == 3
    assert said.warnings == [
        "checkpoint at step 2 in swap: payload ckpt-step-000000002.pt vanished (no such file); "
        "listing the folder again"
    ]
    check_collected(tmp_path / "out", 3)
