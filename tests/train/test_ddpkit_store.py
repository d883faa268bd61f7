"""ddpkit's checkpoint store against what a shared folder may hold: another run's or corrupt
checkpoints (retention must not count or delete them), files that are no regular file or
no torch file (load_latest skips them in one line each), a failed save on rank 0 (every
rank fails alike), steps outside the file name's range, and the one spelling of names."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pickle
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")

from fs_helpers import without_dac_override  # noqa: E402
from trainer_harness import ROOT, Launcher, Proc, base_env, free_port  # noqa: E402

TRAIN_DIR = ROOT / "train"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture
def kit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """ddpkit as a fresh process sees it (no run id yet), one process, folder tmp/ck."""
    monkeypatch.syspath_prepend(str(TRAIN_DIR))
    monkeypatch.setenv("DDPDEPLOY_CHECKPOINT_DIR", str(tmp_path / "ck"))
    for k in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(k, raising=False)
    import ddpkit

    return importlib.reload(ddpkit)


def plant(folder: Path, step: int, payload: bytes, sidecar: object, name: str = "") -> None:
    """A checkpoint written by someone else: ``payload`` and ``sidecar`` (JSON) as given."""
    folder.mkdir(exist_ok=True)
    stem = name or f"ckpt-step-{step:09d}"
    (folder / f"{stem}.pt").write_bytes(payload)
    (folder / f"{stem}.json").write_text(json.dumps(sidecar))


def torch_bytes(value: object, tmp_path: Path) -> bytes:
    f = tmp_path / "value.pt"
    torch.save(value, f)
    return f.read_bytes()


def valid_sidecar(step: int, payload: bytes, run_id: str = "another-run") -> dict[str, object]:
    sha = hashlib.sha256(payload).hexdigest()
    return {"step": step, "sha256": sha, "run_id": run_id, "file": f"ckpt-step-{step:09d}.pt"}


def steps_in(folder: Path) -> dict[str, list[int]]:
    by_ext: dict[str, list[int]] = {"pt": [], "json": []}
    for p in folder.iterdir():
        if m := re.match(r"ckpt-step-(\d+)\.(pt|json)$", p.name):
            by_ext[m.group(2)].append(int(m.group(1)))
    return {k: sorted(v) for k, v in by_ext.items()}


# ---- retention: only this run's own checkpoints count, and only they are deleted ----------
def test_retention_keeps_newer_foreign_and_corrupt_checkpoints(
    kit: ModuleType, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    other = torch_bytes({"step": 901}, tmp_path)
    plant(ck, 900, b"not what the sidecar says", valid_sidecar(900, b"something else"))
    plant(ck, 901, other, valid_sidecar(901, other))  # whole, but another run's
    plant(ck, 902, other, ["a", "list"])  # a sidecar that is no JSON object
    for step in (1, 2, 3):
        kit.save({"step": step}, step, keep=2)
    # This run's two newest stay; nothing it did not write was counted or deleted.
    assert steps_in(ck) == {"pt": [2, 3, 900, 901, 902], "json": [2, 3, 900, 901, 902]}


def test_retention_goes_on_with_the_run_it_resumed(kit: ModuleType, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    for step in (1, 2):
        kit.save({"step": step}, step, keep=2)
    run_id = json.loads((ck / "ckpt-step-000000002.json").read_text())["run_id"]
    kit = importlib.reload(kit)  # a restarted process: no run id until it resumes
    assert kit.load_latest()["step"] == 2
    kit.save({"step": 3}, 3, keep=2)  # the run it resumed: its step 1 goes
    assert steps_in(ck)["json"] == [2, 3]
    assert json.loads((ck / "ckpt-step-000000003.json").read_text())["run_id"] == run_id
    kit = importlib.reload(kit)  # a process that saves without resuming is a new run
    kit.save({"step": 4}, 4, keep=1)
    assert steps_in(ck)["json"] == [2, 3, 4]


def test_a_changed_payload_is_no_longer_this_runs(kit: ModuleType, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1, keep=1)
    (ck / "ckpt-step-000000001.pt").write_bytes(b"overwritten by someone")
    kit.save({"step": 2}, 2, keep=1)
    assert steps_in(ck)["pt"] == [1, 2]  # its sha256 no longer verifies: not deleted


def test_retention_never_deletes_the_checkpoint_just_written(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Found by the third hostile pass: save(..., 100, keep=1) then save(..., 50, keep=1)
    # deleted step 50 as retention's oldest, yet returned its path and printed its
    # `checkpoint` line.
    ck = tmp_path / "ck"
    kit.save({"a": 1}, 100, keep=1)
    capfd.readouterr()
    path = kit.save({"a": 2}, 50, keep=1)
    assert Path(path).is_file() and path.endswith("ckpt-step-000000050.pt")
    (line,) = capfd.readouterr().out.splitlines()
    assert json.loads(line)["path"] == path
    assert steps_in(ck) == {"pt": [50, 100], "json": [50, 100]}
    kit.save({"a": 3}, 51, keep=1)  # no longer the one just written: 50 goes
    assert steps_in(ck) == {"pt": [51, 100], "json": [51, 100]}
    kit.save({"a": 4}, 101, keep=1)  # the newest again: back to keep
    assert steps_in(ck) == {"pt": [101], "json": [101]}


# ---- load_latest: every unusable candidate skipped in one line, the next older one used ----
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch on the planted pickle
def test_load_latest_skips_what_it_cannot_use(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "ck"
    kit.save({"step": 3}, 3)
    not_torch = pickle.dumps(Counter())  # a pickle, but no state torch's weights_only loads
    plant(ck, 4, not_torch, valid_sidecar(4, not_torch))
    good = (ck / "ckpt-step-000000003.pt").read_bytes()
    plant(ck, 5, good, ["a", "list"])
    elsewhere = tmp_path / "elsewhere.pt"  # whole, but reached through a link
    elsewhere.write_bytes(torch_bytes({"step": 6}, tmp_path))
    plant(ck, 6, b"", valid_sidecar(6, elsewhere.read_bytes()))
    (ck / "ckpt-step-000000006.pt").unlink()
    (ck / "ckpt-step-000000006.pt").symlink_to(elsewhere)
    capfd.readouterr()
    assert kit.load_latest()["step"] == 3
    said = [x for x in capfd.readouterr().err.splitlines() if x.startswith("ddpkit:")]
    assert len(said) == 3, said
    for line, step in zip(said, (6, 5, 4), strict=True):
        assert f"ckpt-step-{step:09d}.pt" in line and line.endswith("trying the one before")
    assert "not a JSON object" in said[1] and "does not load (UnpicklingError" in said[2]


@pytest.mark.parametrize("deep", ["[" * 100_000, '{"a":' * 100_000])
def test_a_sidecar_nested_past_the_recursion_limit_is_skipped(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str], deep: str
) -> None:
    # Found by the second hostile pass: json.loads raised RecursionError, out of load_latest
    # as a traceback and out of save's retention as "was not written" (it was written).
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1)
    plant(ck, 2, b"x", {})
    (ck / "ckpt-step-000000002.json").write_text(deep)
    kit.save({"step": 3}, 3)
    assert kit.load_latest()["step"] == 3
    (ck / "ckpt-step-000000003.json").unlink()
    capfd.readouterr()
    assert kit.load_latest()["step"] == 1
    (line,) = [x for x in capfd.readouterr().err.splitlines() if x.startswith("ddpkit:")]
    assert "ckpt-step-000000002.pt: unreadable sidecar (maximum recursion depth" in line


def age(path: Path, seconds: float) -> None:
    """Set ``path``'s modification time ``seconds`` into the past."""
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_a_temp_name_that_cannot_be_removed_is_left(kit: ModuleType, tmp_path: Path) -> None:
    # Found by the second hostile pass: a folder named like a killed writer's temp file
    # made load_latest raise IsADirectoryError (a read-only mount: the same, EROFS).
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1)
    (ck / ".tmp-abc0_xyz.pt").mkdir()
    (ck / ".tmp-abc0_xyz.pt" / "kept").write_text("someone's")
    age(ck / ".tmp-abc0_xyz.pt", kit.STALE_TEMP_S + 60)  # old enough to be tried
    assert kit.load_latest()["step"] == 1
    assert (ck / ".tmp-abc0_xyz.pt" / "kept").is_file()


def test_load_latest_leaves_a_live_writers_temp_files(kit: ModuleType, tmp_path: Path) -> None:
    # Found by the third hostile pass: load_latest deleted every .tmp-* file, also those of
    # another process still writing (on a cluster: the replaced pod saving in its SIGTERM
    # grace while the new one starts), whose rename then failed with FileNotFoundError.
    ck = tmp_path / "ck"
    env = base_env({"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(ck)})
    write = (
        "import ddpkit, torch; ddpkit.CheckpointStore(ddpkit.checkpoint_dir(), 3, "
        "pause_mid_write=3).write({'w': torch.ones(3)}, ddpkit.meta(7))"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", write], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(ck.glob(".tmp-*.pt")) and writer.poll() is None:
            assert time.monotonic() < deadline, "the writer never started its temp file"
            time.sleep(0.05)
        assert writer.poll() is None, writer.communicate()
        assert kit.load_latest() is None  # nothing committed yet; the writer pauses
        assert list(ck.glob(".tmp-*.pt"))
        out, err = writer.communicate(timeout=120)
    finally:
        writer.kill()
    assert writer.returncode == 0, err
    assert torch.equal(kit.load_latest()["w"], torch.ones(3))
    assert not list(ck.glob(".tmp-*"))


def test_load_latest_removes_temp_files_untouched_for_ten_minutes(
    kit: ModuleType, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1)
    dead, live = (
        [".tmp-dead0_ab.pt", ".tmp-dead0_ab.json"],
        [".tmp-live0_ab.pt", ".tmp-live0_ab.json"],
    )
    for name in dead + live:
        (ck / name).write_bytes(b"half")
    for name in dead:
        age(ck / name, kit.STALE_TEMP_S + 1)
    assert kit.load_latest()["step"] == 1
    assert sorted(p.name for p in ck.glob(".tmp-*")) == sorted(live)


def test_load_latest_keeps_old_files_that_only_look_like_temp_files(
    kit: ModuleType, tmp_path: Path
) -> None:
    # Found by the sixth hostile pass: every old ".tmp-*.pt" or ".json" was removed, also a
    # user's own .tmp-notes.json kept beside the checkpoints. Only names mkstemp makes go.
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1)
    theirs = [".tmp-notes.json", ".tmp-ABCDEFGH.pt", ".tmp-abcdefghi.pt", ".tmp-abcdefgh.pt.bak"]
    for name in theirs:
        (ck / name).write_text("someone's")
        age(ck / name, kit.STALE_TEMP_S + 60)
    assert kit.load_latest()["step"] == 1
    assert sorted(p.name for p in ck.glob(".tmp-*")) == sorted(theirs)


def test_a_save_whose_rename_fails_leaves_no_temp_file(kit: ModuleType, tmp_path: Path) -> None:
    # Found by the third hostile pass: when renaming the payload failed, the sidecar's temp
    # file (and the payload's) stayed in the folder, and since temp files younger than ten
    # minutes are now left alone, the next start would not remove them either.
    # Since the commit is the sidecar's rename alone, the payload already renamed into
    # place must go too when that rename fails: no sidecar names it.
    ck = tmp_path / "ck"
    (ck / "ckpt-step-000000001.json").mkdir(parents=True)  # a folder where the sidecar goes
    (ck / "ckpt-step-000000001.json" / "kept").write_text("someone's")
    with pytest.raises(kit.CheckpointError, match="IsADirectoryError"):
        kit.save({"step": 1}, 1)
    assert sorted(p.name for p in ck.iterdir()) == [".ddpkit.lock", "ckpt-step-000000001.json"]


def test_a_folder_at_the_payloads_usual_name_is_left_and_the_save_stands(
    kit: ModuleType, tmp_path: Path
) -> None:
    # A folder (someone's) holds ckpt-step-N.pt: the payload takes a name of its own, which
    # the sidecar names, and the folder is not touched.
    ck = tmp_path / "ck"
    (ck / "ckpt-step-000000001.pt").mkdir(parents=True)
    (ck / "ckpt-step-000000001.pt" / "kept").write_text("someone's")
    path = kit.save({"step": 1}, 1)
    assert re.fullmatch(r"ckpt-step-000000001\.[0-9a-f]{16}\.pt", Path(path).name)
    assert (ck / "ckpt-step-000000001.pt" / "kept").read_text() == "someone's"
    assert kit.load_latest()["step"] == 1
    # A folder the sweep of the step's old payloads cannot delete stops none after it.
    (ck / "ckpt-step-000000001.0000000000000000.pt").mkdir()
    (ck / "ckpt-step-000000001.ffffffffffffffff.pt").write_bytes(b"a killed commit's")
    again = kit.save({"step": 1}, 1)
    assert sorted(p.name for p in ck.glob("ckpt-step-000000001.*.pt")) == sorted(
        ["ckpt-step-000000001.0000000000000000.pt", Path(again).name]
    )


def test_a_checkpoint_copied_under_another_step_is_skipped(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Found by the second hostile pass: ckpt-step-5 copied to ckpt-step-50 was resumed from
    # with resume_step 50 in the start line while the state was step 5's (collect refuses it).
    ck = tmp_path / "ck"
    kit.save({"step": 5}, 5)
    for ext in (".pt", ".json"):
        (ck / f"ckpt-step-000000050{ext}").write_bytes(
            (ck / f"ckpt-step-000000005{ext}").read_bytes()
        )
    capfd.readouterr()
    assert kit.load_latest()["step"] == 5
    (line,) = [x for x in capfd.readouterr().err.splitlines() if x.startswith("ddpkit:")]
    assert "ckpt-step-000000050.pt: its sidecar says step '5', its name 50" in line


def test_a_link_or_folder_in_a_checkpoints_place_is_named_as_such(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Found by the third hostile pass: a symlinked sidecar (or payload) was skipped with
    # "[Errno 40] Too many levels of symbolic links", and a folder in a sidecar's place
    # with "[Errno 21] Is a directory: 3", a file descriptor where the path belongs.
    ck = tmp_path / "ck"
    for step in (1, 2, 3, 4):
        kit.save({"step": step}, step, keep=4)
    (ck / "ckpt-step-000000004.json").unlink()
    (ck / "ckpt-step-000000004.json").mkdir()
    for name in ("ckpt-step-000000003.pt", "ckpt-step-000000002.json"):
        (ck / name).rename(tmp_path / name)  # whole, but reached through a link
        (ck / name).symlink_to(tmp_path / name)
    capfd.readouterr()
    assert kit.load_latest()["step"] == 1
    said = [x for x in capfd.readouterr().err.splitlines() if x.startswith("ddpkit:")]
    assert said == [
        f"ddpkit: skipping checkpoint {ck}/ckpt-step-000000004.pt: unreadable sidecar "
        f"({ck}/ckpt-step-000000004.json: a directory, not a regular file); trying the one "
        "before",
        f"ddpkit: skipping checkpoint {ck}/ckpt-step-000000003.pt: unreadable "
        f"({ck}/ckpt-step-000000003.pt: a symlink, not a regular file); trying the one before",
        f"ddpkit: skipping checkpoint {ck}/ckpt-step-000000002.pt: unreadable sidecar "
        f"({ck}/ckpt-step-000000002.json: a symlink, not a regular file); trying the one "
        "before",
    ]


def test_an_empty_checkpoint_dir_variable_is_called_empty(
    kit: ModuleType, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # Found by the third hostile pass: DDPDEPLOY_CHECKPOINT_DIR= (set, but to nothing) was
    # reported as "is not set", sending the reader to look for a missing variable.
    monkeypatch.setenv("DDPDEPLOY_CHECKPOINT_DIR", "")
    capfd.readouterr()
    with pytest.raises(SystemExit) as exited:
        kit.load_latest()
    assert exited.value.code == 2
    assert capfd.readouterr().err.splitlines() == [
        "ddpkit: error: DDPDEPLOY_CHECKPOINT_DIR is set but empty; give the job a checkpoint "
        "volume (checkpoint: in ddpdeploy.yaml) or pass directory= to ddpkit"
    ]


def test_load_latest_does_not_block_on_a_fifo(tmp_path: Path) -> None:
    """A payload that is a FIFO: opening it to read would wait for a writer forever."""
    ck = tmp_path / "ck"
    env = base_env({"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(ck)})
    save = "import ddpkit; ddpkit.save({'step': 1}, 1)"
    subprocess.run([sys.executable, "-c", save], env=env, check=True, timeout=120)
    plant(ck, 2, b"", valid_sidecar(2, b""))
    (ck / "ckpt-step-000000002.pt").unlink()
    os.mkfifo(ck / "ckpt-step-000000002.pt")
    load = "import ddpkit; print(ddpkit.load_latest()['step'])"
    p = subprocess.run(
        [sys.executable, "-c", load], env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and p.stdout.split() == ["1"], p.stderr
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("ddpkit:")]
    assert "ckpt-step-000000002.pt" in line and "not a regular file" in line


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("RANK", "abc", "RANK='abc' is not a whole number of at least 0"),
        ("TORCHELASTIC_RESTART_COUNT", "x", "TORCHELASTIC_RESTART_COUNT='x' is not a whole"),
        ("WORLD_SIZE", "0", "WORLD_SIZE='0' is not a whole number of at least 1"),
        ("DDPDEPLOY_HANG_TIMEOUT_S", "nan", "DDPDEPLOY_HANG_TIMEOUT_S='nan' is not a finite"),
        ("DDPDEPLOY_STRAGGLER_FACTOR", "-1", "DDPDEPLOY_STRAGGLER_FACTOR='-1' is not a finite"),
        ("DDPDEPLOY_RANKS_EVERY", "\u0663", "DDPDEPLOY_RANKS_EVERY='\u0663' is not a whole"),
        ("DDPDEPLOY_CHECKPOINT_DIR", "/ck\n", "DDPDEPLOY_CHECKPOINT_DIR='/ck\\n' is not a usable"),
        # the sixth pass: "--1" passed the old check and int() raised
        ("RANK", "--1", "RANK='--1' is not a whole number of at least 0"),
        ("DDPDEPLOY_RANKS_EVERY", "--3", "DDPDEPLOY_RANKS_EVERY='--3' is not a whole number"),
        ("DDPDEPLOY_CHAOS_HOLD_STEP", "five", "DDPDEPLOY_CHAOS_HOLD_STEP='five' is not a list"),
    ],
)
def test_a_variable_that_lies_is_one_line_naming_it(
    tmp_path: Path, name: str, value: str, said: str
) -> None:
    # Found by the fourth hostile pass: RANK=abc or TORCHELASTIC_RESTART_COUNT=x ended in a
    # bare ValueError naming neither (at import for the ranks/straggler settings).
    env = base_env({"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(tmp_path)})
    code = (
        "import ddpkit; ddpkit.save({'w': 1}, 1); print(ddpkit.load_latest()['w']); "
        "ddpkit.log('step', step=1)"  # the chaos hold's settings are read at the first step
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, name: value},
        capture_output=True,
        text=True,
        timeout=120,
    )
    late = name.startswith("DDPDEPLOY_CHAOS_")  # read after the lines before the first step
    assert p.returncode == 2 and (p.stdout == "" or late), p.stderr
    (line,) = [x for x in p.stderr.splitlines() if "ddpkit" in x or "Error" in x]
    assert line.startswith(f"ddpkit: error: {said}") and line.endswith("; fix or unset it")


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK='2' is not a rank below WORLD_SIZE=2 (0 to 1)"),
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "p"}, "MASTER_PORT='p' is not a whole"),
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a"),
        ({"WORLD_SIZE": "2"}, "MASTER_ADDR is set but RANK is not; start the script with"),
        # the sixth pass: torch's env:// called an empty MASTER_ADDR "not set"
        ({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": ""}, "MASTER_ADDR is set but empty"),
    ],
)
def test_a_launcher_env_that_lies_is_one_line_before_any_wait(
    env: dict[str, str], said: str
) -> None:
    # Found by the fifth hostile pass: RANK=2 of WORLD_SIZE=2 waited at the store for a
    # peer that never comes; a missing RANK was a bare KeyError.
    base = base_env({"PYTHONPATH": str(TRAIN_DIR), "MASTER_ADDR": "127.0.0.1"})
    base["MASTER_PORT"] = str(free_port())
    code = "import ddpkit; ddpkit.init_process_group('gloo', probe=False); print('joined')"
    p = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stdout == "", p.stderr
    (line,) = [x for x in p.stderr.splitlines() if "ddpkit" in x or "Error" in x]
    assert line.startswith(f"ddpkit: error: {said}")


def test_a_relative_checkpoint_folder_is_the_same_folder_after_a_chdir(tmp_path: Path) -> None:
    # Found by the fourth hostile pass: DDPDEPLOY_CHECKPOINT_DIR=ck, a save, os.chdir, and
    # load_latest looked in another folder and returned None (a silent fresh start).
    env = base_env({"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": "ck"})
    (tmp_path / "elsewhere").mkdir()
    code = (
        "import os, ddpkit; ddpkit.save({'w': 7}, 3); os.chdir('elsewhere'); "
        "print(ddpkit.load_latest()['w'])"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == "7", p.stderr
    assert (tmp_path / "ck" / "ckpt-step-000000003.pt").is_file()


# ---- save: one outcome on every rank, and a step the name can hold ------------------------
@pytest.mark.slow
def test_a_failed_save_fails_alike_on_every_rank(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(tmp_path / "ck")}
    with Launcher(tmp_path) as L:
        p = L.torchrun([], script=SCRIPTS / "save_failure.py", env=env)
        assert p.wait(90) == 0, p.tail()  # not a hang in mismatched collectives
    said = [x for x in p.stderr.splitlines() if " save 1: " in x]
    assert len(said) == 2, p.tail()
    texts = {x.split(": ", 1)[1] for x in said}  # the same error on both ranks
    assert len(texts) == 1, said
    assert texts.pop().startswith("CheckpointError: checkpoint ") and "rank 0: " in said[0]
    assert not [x for x in p.stderr.splitlines() if " save 2: " in x], p.tail()
    assert "rank 0 finished, sum 3" in p.stderr and "rank 1 finished, sum 3" in p.stderr
    assert steps_in(tmp_path / "ck") == {"pt": [2], "json": [2]}


@pytest.mark.slow
def test_a_save_on_rank_0_only_is_named_in_one_line_and_ends(tmp_path: Path) -> None:
    # Found by the sixth hostile pass: `if rank == 0: ddpkit.save(...)` hung with no line
    # (rank 0's broadcast paired with rank 1's next all-reduce) until the group's timeout.
    env = {
        "PYTHONPATH": str(TRAIN_DIR),
        "DDPDEPLOY_CHECKPOINT_DIR": str(tmp_path / "ck"),
        "DDPDEPLOY_SAVE_WARN_S": "2",
    }
    with Launcher(tmp_path) as L:
        p = L.torchrun([], script=SCRIPTS / "save_on_rank0_only.py", env=env)
        assert p.wait(90) != 0, p.tail()
    said = [x for x in p.stderr.splitlines() if x.startswith("ddpkit: warning: rank(s)")]
    assert said == [
        "ddpkit: warning: rank(s) 1 did not call save(step 1) within 2 s; call ddpkit.save "
        "on every rank (only rank 0's state is written), not under `if rank == 0`"
    ], p.tail()
    assert "CheckpointError: checkpoint " in p.stderr and "within 10 s" in p.stderr, p.tail()
    assert steps_in(tmp_path / "ck") == {"pt": [1], "json": [1]}  # rank 0 wrote it first


def test_a_committed_save_stands_when_retention_cannot_delete(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Found by the sixth hostile pass: an old sidecar retention could not delete (immutable,
    # or another user's in a sticky folder) made every rank raise "was not written" about a
    # checkpoint that was on disk, committed, and had printed no `checkpoint` line.
    ck = tmp_path / "ck"
    for step in (1, 2):
        kit.save({"step": step}, step, keep=1)
    kit.save({"step": 3}, 3, keep=3)
    old = ck / "ckpt-step-000000002.json"
    if subprocess.run(["chattr", "+i", str(old)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here (the real EPERM on unlink)")
    try:
        capfd.readouterr()
        path = kit.save({"step": 4}, 4, keep=1)
        out, err = capfd.readouterr()
    finally:
        subprocess.run(["chattr", "-i", str(old)], check=True)
    assert json.loads(out)["path"] == path == str(ck / "ckpt-step-000000004.pt")
    (line,) = [x for x in err.splitlines() if x.startswith("ddpkit:")]
    assert line.startswith(f"ddpkit: warning: retention could not delete {old} (keep=1): ")
    # 2 stays whole (its payload too: a sidecar that stays keeps its payload a candidate);
    # 3 was deletable and went.
    assert steps_in(ck) == {"pt": [2, 4], "json": [2, 4]}
    assert kit.load_latest()["step"] == 4


@pytest.mark.slow
def test_a_huge_planted_payload_is_hashed_in_chunks_and_skipped(tmp_path: Path) -> None:
    # Found by the sixth hostile pass: load_latest read a whole payload into memory before
    # checking its sha256; a planted sparse 6 GiB file under a 3 GiB address-space limit
    # was a MemoryError traceback, and step 1 was never tried.
    ck = tmp_path / "ck"
    code = (
        "import resource, ddpkit\n"
        "ddpkit.save({'w': 1}, 1)\n"
        "store = ddpkit.CheckpointStore(ddpkit.checkpoint_dir(), 3)\n"
        "with open(store.payload_path(2), 'wb') as f:\n"
        "    f.truncate(6 << 30)\n"
        "open(store.sidecar_path(2), 'w').write("
        '\'{"step": 2, "sha256": "00"}\')\n'
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "print(ddpkit.load_latest()['w'])\n"
    )
    env = base_env({"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(ck)})
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == "1", p.stderr
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("ddpkit:")]
    assert "ckpt-step-000000002.pt: fails its sha256 check; trying the one before" in line


def test_a_state_weights_only_refuses_is_one_error_not_a_fresh_start(
    kit: ModuleType, tmp_path: Path
) -> None:
    # Found by the fourth hostile pass: save took an argparse.Namespace (or a dataclass) in
    # the state, then load_latest skipped every checkpoint with torch's many-line refusal
    # (bold escapes included) and returned None: the restarted run trained from step 0.
    import argparse

    # Written as trusted (or by a ddpkit before save checked it): load still refuses it.
    kit.save({"args": argparse.Namespace(lr=0.1)}, 1, weights_only=False)
    kit.save({"args": argparse.Namespace(lr=0.1)}, 2, weights_only=False)
    with pytest.raises(kit.CheckpointError) as caught:
        kit.load_latest()
    said = str(caught.value)
    assert "ckpt-step-000000002.pt verifies but torch.load(weights_only=True) refuses it" in said
    assert "it holds argparse.Namespace" in said and "weights_only=False" in said
    assert "\x1b" not in said
    assert kit.load_latest(weights_only=False)["args"].lr == 0.1


def test_a_state_weights_only_refuses_is_refused_when_saved_not_at_the_restart(
    kit: ModuleType, tmp_path: Path
) -> None:
    # Found by the fifth hostile pass: save took an argparse.Namespace, so the run trained
    # on for hours with checkpoints that no restart could load.
    import argparse

    with pytest.raises(kit.CheckpointError) as caught:
        kit.save({"args": argparse.Namespace(lr=0.1), "w": torch.ones(2)}, 1)
    said = str(caught.value)
    assert "\n" not in said and said.endswith(
        f"checkpoint of step 1 in {tmp_path / 'ck'} was not written: rank 0: TypeError: "
        "torch.load(weights_only="
        "True) would refuse it on resume: it holds argparse.Namespace; save only tensors, "
        "numbers, strings and dicts or lists of them (vars(args) for an argparse.Namespace), "
        "or pass weights_only=False to save and to load_latest if you trust the folder"
    ), said
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == []  # no temp file either
    kit.save({"args": vars(argparse.Namespace(lr=0.1)), "w": torch.ones(2)}, 1)
    assert kit.load_latest()["args"] == {"lr": 0.1}


# Found by the fourth hostile pass (left open then): save(None) wrote a checkpoint that
# load_latest() returned as None, its answer for "no checkpoint": the restart started over.
def test_saving_none_is_refused_not_read_back_as_a_fresh_start(
    kit: ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(kit.CheckpointError) as caught:
        kit.save(None, 1)
    said = str(caught.value)
    assert "\n" not in said and said.endswith(
        "was not written: rank 0: TypeError: ddpkit.save(None): load_latest() returns None "
        "for no checkpoint, so a restart would start over; save what to resume from, e.g. "
        "{'model': model.state_dict(), 'optimizer': opt.state_dict()}"
    ), said
    assert not (tmp_path / "ck").exists() or steps_in(tmp_path / "ck") == {"pt": [], "json": []}
    kit.save({"w": 0}, 2)  # any other state loads back as saved
    assert kit.load_latest() == {"w": 0}


@pytest.mark.slow
def test_a_weights_only_refusal_raises_alike_on_every_rank(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(tmp_path / "ck")}
    with Launcher(tmp_path) as L:
        p = L.torchrun([], script=SCRIPTS / "weights_only_refusal.py", env=env)
        assert p.wait(90) == 0, p.tail()  # not a hang in mismatched collectives
    for what in (" save: ", " load: "):
        said = [x for x in p.stderr.splitlines() if what in x]
        assert len(said) == 2 and all("it holds argparse.Namespace" in x for x in said), p.tail()
    assert "rank 0 finished, sum 3" in p.stderr and "rank 1 finished, sum 3" in p.stderr
    assert "skipping checkpoint" not in p.stderr


def test_a_full_disk_is_named_as_such(
    kit: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the second hostile pass: torch.save turned the write's ENOSPC into
    # "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598".
    from fs_helpers import mount_tmpfs

    disk = tmp_path / "disk"
    disk.mkdir()
    mount_tmpfs(disk, "size=256k")
    try:
        kit.save({"w": torch.zeros(10)}, 1, directory=str(disk))
        with pytest.raises(kit.CheckpointError, match=r"rank 0: OSError: \[Errno 28\] No space"):
            kit.save({"w": torch.zeros(200_000)}, 2, directory=str(disk))
        assert sorted(p.name for p in disk.iterdir()) == [
            ".ddpkit.lock",
            "ckpt-step-000000001.json",
            "ckpt-step-000000001.pt",
        ]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True, check=False)


def test_a_failed_save_of_a_step_that_exists_keeps_the_old_copy(
    kit: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the third hostile pass: the new payload was renamed over the old before the
    # sidecar was written; when that write failed the step's pair no longer matched. A
    # stand-in for the disk: a real one fills between the two writes only when another
    # writer shares it, which no test can time.
    kit.save({"w": torch.ones(3)}, 1)

    class FullDisk:
        loads = staticmethod(json.loads)

        @staticmethod
        def dumps(obj: object) -> str:
            raise OSError(28, "No space left on device")

    with monkeypatch.context() as m, pytest.raises(kit.CheckpointError, match="No space left"):
        m.setattr(kit, "json", FullDisk)
        kit.save({"w": torch.zeros(3)}, 1)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [
        ".ddpkit.lock",
        "ckpt-step-000000001.json",
        "ckpt-step-000000001.pt",
    ]
    assert torch.equal(kit.load_latest()["w"], torch.ones(3))


@pytest.mark.parametrize("step", [-1, 10**18, 2.0, True, torch.tensor(5.0)])
def test_a_step_the_name_cannot_hold_is_refused(kit: ModuleType, tmp_path: Path, step) -> None:
    with pytest.raises(ValueError, match="checkpoint step must be an integer from 0 to"):
        kit.save({}, step)
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").iterdir())


@pytest.mark.parametrize("keep", [0, 2.5, None, "3", True])
def test_a_keep_retention_cannot_use_is_refused_before_writing(
    kit: ModuleType, tmp_path: Path, keep
) -> None:
    # Found by the second hostile pass: keep=2.5 wrote the checkpoint, then retention's
    # slice raised TypeError and save said "was not written"; keep=None raised a bare
    # TypeError ('<' not supported).
    with pytest.raises(ValueError, match="keep must be an integer >= 1, got "):
        kit.save({}, 1, keep=keep)
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").iterdir())


def test_only_the_one_spelling_of_a_name_is_read(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "ck"
    payload = torch_bytes({"step": 7}, tmp_path)
    plant(ck, 7, payload, valid_sidecar(7, payload), name="ckpt-step-7")
    plant(ck, 8, payload, valid_sidecar(8, payload), name="ckpt-step-0000000008")
    assert kit.load_latest() is None
    assert "ddpkit:" not in capfd.readouterr().err  # not even tried
    kit.save({"step": 123}, 123)
    assert (ck / "ckpt-step-000000123.pt").is_file()


NAME = re.compile(r"ckpt-step-[^\s`\"'/)]*")
ONE_SPELLING = re.compile(
    r"ckpt-step-(\d{9,18}|\{step:09d\}|\{N:09d\})(\.json|(\.<16 hex>|\.[0-9a-f]{16})?\.pt)$"
)


def test_docs_spell_checkpoint_names_one_way() -> None:
    """ckpt-step-{step:09d}.pt, read back by ^ckpt-step-(\\d{9,18})\\.json$: examples
    in the docs and the trainer's folder use that spelling only."""
    pages = [*(ROOT / "docs").glob("*.md"), TRAIN_DIR / "README.md", *TRAIN_DIR.glob("*.py")]
    found = {(p.name, m) for p in pages for m in NAME.findall(p.read_text())}
    names = {(page, n) for page, n in found if n.endswith((".pt", ".json"))}
    assert names, "no checkpoint name in the docs"
    assert sorted(x for x in names if not ONE_SPELLING.match(x[1])) == []


# ---- the seventh pass (ddpkit2): a load that fails on every verified checkpoint, two
# writers in one folder, a folder rank 0 may not list ----------------------------------------
@pytest.mark.parametrize("where", ["cuda", "bogus", {"cpu": "cuda:0"}])
def test_a_load_no_verified_checkpoint_takes_raises_and_keeps_them(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str], where: object
) -> None:
    # It skipped all three good ones and returned None: the script started over and saved
    # over the run's steps 1 and 2, and the next correct start resumed the old step 3. A
    # verified torch file is whole: its load's fault is named at the newest, nothing read.
    ck = tmp_path / "ck"
    for step in (1, 2, 3):
        kit.save({"w": torch.ones(2), "step": step}, step)  # a tensor: map_location moves it
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    with pytest.raises(kit.CheckpointError) as info:
        kit.load_latest(map_location=where)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"checkpoint {ck}/ckpt-step-000000003.pt verifies but does not ")
    assert "load here (" in message and "fix what load_latest is given (map_location" in message
    assert message.endswith("or move it away to resume from the one before")
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before
    assert kit.load_latest(map_location="cpu")["step"] == 3


def test_an_older_one_that_loads_still_wins_over_a_newer_that_does_not(
    kit: ModuleType, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    kit.save({"step": 3}, 3)
    not_torch = pickle.dumps([1, 2])
    plant(ck, 4, not_torch, valid_sidecar(4, not_torch))
    assert kit.load_latest() == {"step": 3}


def _hold_lock(folder: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process (a second writer) holding the folder's lock for ``seconds``."""
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(folder / '.ddpkit.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        f"time.sleep({seconds})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


@pytest.mark.slow  # a second process holds the lock
def test_a_commit_waits_for_another_writers_and_then_lands_whole(
    kit: ModuleType, tmp_path: Path
) -> None:
    # Two saves of one step interleaved (one's payload beside the other's sidecar): both
    # said saved, and load_latest skipped the pair as failing its sha256.
    ck = tmp_path / "ck"
    kit.save({"step": 4}, 4)
    holder = _hold_lock(ck, 1.5)
    start = time.monotonic()
    kit.save({"step": 5}, 5)
    assert time.monotonic() - start >= 1.0  # it waited for the other writer
    assert holder.wait(timeout=30) == 0
    assert kit.load_latest() == {"step": 5}


@pytest.mark.slow  # starts a process
def test_retention_checks_and_deletes_under_the_lock(kit: ModuleType, tmp_path: Path) -> None:
    # A pair another run committed between retention's check and its unlink was deleted.
    ck = tmp_path / "ck"
    store = kit.CheckpointStore(str(ck), keep=1)
    for step in (1, 2):
        kit.save({"step": step}, step, keep=5)
    holder = _hold_lock(ck, 1.5)
    start = time.monotonic()
    store._apply_retention(2)
    assert time.monotonic() - start >= 1.0
    assert holder.wait(timeout=30) == 0
    assert steps_in(ck) == {"pt": [2], "json": [2]}


@pytest.mark.slow  # starts a process
def test_a_lock_held_past_its_wait_fails_the_save_in_one_line(
    kit: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1)
    monkeypatch.setenv("DDPDEPLOY_CHECKPOINT_LOCK_S", "0.3")
    holder = _hold_lock(ck, 5)
    try:
        with pytest.raises(kit.CheckpointError) as info:
            kit.save({"step": 2}, 2)
    finally:
        holder.kill()
        holder.wait()
    message = str(info.value)
    assert "\n" not in message and "stayed locked by another process for 0.3 s" in message
    assert steps_in(ck) == {"pt": [1], "json": [1]}  # nothing half-written
    assert not [p for p in ck.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("kind", ["a symlink", "a folder"])
def test_a_link_or_folder_at_the_lock_path_is_named(
    kit: ModuleType, tmp_path: Path, kind: str
) -> None:
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1)
    outside = tmp_path / "outside"
    (ck / ".ddpkit.lock").unlink()
    if kind == "a symlink":
        (ck / ".ddpkit.lock").symlink_to(outside)
    else:
        (ck / ".ddpkit.lock").mkdir()
    with pytest.raises(kit.CheckpointError) as info:
        kit.save({"step": 2}, 2)
    assert str(info.value).endswith(f"{ck}/.ddpkit.lock is {kind}, not a regular file; remove it")
    assert not outside.exists()  # never followed
    assert steps_in(ck) == {"pt": [1], "json": [1]}


@pytest.mark.slow  # starts a process
def test_a_folder_rank_0_may_not_list_is_one_error(kit: ModuleType, tmp_path: Path) -> None:
    # os.listdir's PermissionError left load_latest as a traceback on rank 0, before the
    # broadcast every other rank waits in.
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1)
    code = (
        f"import sys; sys.path.insert(0, {str(TRAIN_DIR)!r}); import ddpkit\n"
        "try:\n    ddpkit.load_latest()\n"
        "except ddpkit.CheckpointError as e:\n    print(e)\n"
    )
    ck.chmod(0o300)  # write and search, no read
    try:
        out = subprocess.run(
            [*without_dac_override(), sys.executable, "-c", code],
            env={**os.environ, "DDPDEPLOY_CHECKPOINT_DIR": str(ck)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        ck.chmod(0o755)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"cannot list {ck}: Permission denied; give the run a folder it can read and write"
    )


def test_the_lock_is_readable_by_all_whatever_the_umask(kit: ModuleType, tmp_path: Path) -> None:
    # Under umask 077 the lock was 0600: every other user's run in the folder then failed.
    old = os.umask(0o077)
    try:
        kit.save({"step": 1}, 1)
    finally:
        os.umask(old)
    assert (tmp_path / "ck" / ".ddpkit.lock").stat().st_mode & 0o777 == 0o644


@pytest.mark.slow  # starts a process
def test_another_users_unreadable_lock_is_named_with_the_fix(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    ck.chmod(0o777)
    lock = ck / ".ddpkit.lock"
    lock.touch()
    os.chown(lock, 65534, 65534)
    lock.chmod(0o600)
    code = (
        f"import sys; sys.path.insert(0, {str(TRAIN_DIR)!r}); import ddpkit\n"
        "try:\n    ddpkit.save({'a': 1}, 1)\n"
        "except ddpkit.CheckpointError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [*without_dac_override(), sys.executable, "-c", code],
        env={**os.environ, "DDPDEPLOY_CHECKPOINT_DIR": str(ck)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(
        f"{lock} is another user's and not readable by this one; make it readable by all "
        "(chmod a+r) or remove it"
    ), out.stdout
    assert sorted(p.name for p in ck.iterdir()) == [".ddpkit.lock"]


def test_a_newest_whose_class_is_gone_is_named_not_stepped_back_from(
    kit: ModuleType, tmp_path: Path
) -> None:
    # It resumed step 1, and the run's next save of step 2 replaced the verified step 2.
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1, weights_only=False)
    kit.save({"step": 2, "cfg": _Gone()}, 2, weights_only=False)
    before = (ck / "ckpt-step-000000002.pt").read_bytes()
    del globals()["_Gone"]
    try:
        with pytest.raises(kit.CheckpointError, match="ckpt-step-000000002.pt verifies but does"):
            kit.load_latest(weights_only=False)
    finally:
        globals()["_Gone"] = _GoneClass
    assert (ck / "ckpt-step-000000002.pt").read_bytes() == before


class _Gone:
    """A class a state holds, which the loading script no longer defines."""


_GoneClass = _Gone


def test_a_reader_racing_a_resave_of_the_step_reads_the_new_pair(
    kit: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sidecar was read, the pair re-saved, then the payload opened: a whole checkpoint
    # was called one that "fails its sha256 check" and an older one resumed. A stand-in
    # for the slow mount that makes the window: the re-save runs as the payload is opened.
    kit.save({"step": 4}, 4)
    kit.save({"step": 5, "v": "old"}, 5)
    opened = kit._open_regular
    raced = []

    def resave_first(path, *args, **kwargs):
        if path.endswith("ckpt-step-000000005.pt") and not raced:
            raced.append(1)
            kit.save({"step": 5, "v": "new"}, 5)
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(kit, "_open_regular", resave_first)
    assert kit.load_latest() == {"step": 5, "v": "new"}
    assert raced


def test_log_names_an_event_that_is_no_name(kit: ModuleType) -> None:
    for event in (b"ev", 123, None, ""):
        with pytest.raises(TypeError, match=r"the event must be a name, e.g. 'step'"):
            kit.log(event, a=1)  # type: ignore[arg-type]


def test_a_socket_at_the_lock_path_is_named(kit: ModuleType, tmp_path: Path) -> None:
    import socket

    ck = tmp_path / "ck"
    ck.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ck / ".ddpkit.lock"))  # it was "[Errno 6] No such device or address"
    try:
        with pytest.raises(kit.CheckpointError) as info:
            kit.save({"step": 1}, 1)
    finally:
        sock.close()
    assert str(info.value).endswith(f"{ck}/.ddpkit.lock is not a regular file; remove it")


def _torchrun_while_locked(
    tmp_path: Path, ck: Path, hold_s: int, script: str, **ddpdeploy_env: str
) -> Proc:
    """``script`` under a 2-rank torchrun, to its exit 0, while another process holds the
    folder's lock for ``hold_s`` seconds; ``ddpdeploy_env``: DDPDEPLOY_<NAME> values."""
    ck.mkdir()
    holder = _hold_lock(ck, hold_s)
    env = {"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(ck)}
    env |= {f"DDPDEPLOY_{k}": v for k, v in ddpdeploy_env.items()}
    try:
        with Launcher(tmp_path) as L:
            p = L.torchrun([], script=SCRIPTS / script, env=env)
            assert p.wait(90) == 0, p.tail()
    finally:
        holder.kill()
        holder.wait()
    return p


@pytest.mark.slow
def test_a_slow_write_on_rank_0_is_not_called_a_missing_save(tmp_path: Path) -> None:
    # Rank 0 arrived in save's meeting only after its write: past DDPDEPLOY_SAVE_WARN_S the
    # other ranks warned "rank(s) 0 did not call save … not under `if rank == 0`".
    ck = tmp_path / "ck"
    # 12 s: past torchrun's start-up, into rank 0's commit
    p = _torchrun_while_locked(tmp_path, ck, 12, "save_with_rank0_slow.py", SAVE_WARN_S="1")
    assert "did not call save" not in p.stderr, p.tail()
    assert "saved" in p.stdout and steps_in(ck) == {"pt": [1], "json": [1]}


def test_a_load_out_of_memory_is_one_error(kit: ModuleType, tmp_path: Path) -> None:
    # MemoryError left the verdict's all_reduce: the other ranks waited for the group's
    # timeout while this one printed a traceback.
    kit.save({"w": torch.ones(2), "step": 1}, 1)  # a tensor: map_location is called for it

    def no_memory(storage: object, location: str) -> object:
        raise MemoryError("simulated")

    with pytest.raises(kit.CheckpointError) as info:
        kit.load_latest(map_location=no_memory)
    assert str(info.value).endswith(
        "verifies but loading it ran out of memory on rank 0 (MemoryError: simulated); load "
        "it with map_location='cpu', or give the job more memory"
    ), info.value


# ---- the ninth pass (ddpkit3's H6, H7): one rename commits a checkpoint -----------------
# The payload and the sidecar were renamed into their names one after the other. A kill
# between the two renames of a step saved again (a resumed run repeating its last save)
# left the new payload beside the old sidecar, and a failed sidecar rename (an immutable
# old sidecar) had replaced the old payload already: both copies of the step were lost.
def payload_names(folder: Path, step: int) -> list[str]:
    return sorted(p.name for p in folder.glob(f"ckpt-step-{step:09d}*.pt"))


def named_payload(folder: Path, step: int) -> str:
    return str(json.loads((folder / f"ckpt-step-{step:09d}.json").read_text())["file"])


KILL_AFTER_RENAME = """
import os, signal, sys
import ddpkit
real = os.replace
def replace(src, dst):
    real(src, dst)
    if dst.endswith(sys.argv[1]):  # the kill lands right after this rename
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
ddpkit.save({"step": 5, "v": "new"}, 5)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("after", "loaded"), [(".pt", "old"), (".json", "new")])
def test_a_kill_inside_the_commit_of_a_resaved_step_keeps_one_whole_pair(
    kit: ModuleType, tmp_path: Path, after: str, loaded: str
) -> None:
    ck = tmp_path / "ck"
    kit.save({"step": 4, "v": "old"}, 4)
    kit.save({"step": 5, "v": "old"}, 5)
    env = {**os.environ, "PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(ck)}
    p = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_RENAME, after], env=env, timeout=120, check=False
    )
    assert p.returncode == -9
    kit = importlib.reload(kit)
    assert kit.load_latest() == {"step": 5, "v": loaded}
    assert len(payload_names(ck, 5)) == 2  # the old or the new one, named by no sidecar
    # The next commit of the step deletes what the killed one left.
    kit.save({"step": 5, "v": "again"}, 5)
    assert payload_names(ck, 5) == [named_payload(ck, 5)]
    assert kit.load_latest() == {"step": 5, "v": "again"}


def test_a_failed_sidecar_rename_of_a_resaved_step_keeps_the_old_pair(
    kit: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = tmp_path / "ck"
    kit.save({"step": 3, "v": "old"}, 3)
    before = {p.name: p.read_bytes() for p in ck.glob("ckpt-step-*")}
    real = os.replace

    def immutable_sidecar(src: str, dst: str) -> None:
        if dst.endswith(".json"):  # as chattr +i on the old sidecar makes it
            raise PermissionError(1, "Operation not permitted", dst)
        real(src, dst)

    with monkeypatch.context() as m, pytest.raises(kit.CheckpointError, match="not permitted"):
        m.setattr(os, "replace", immutable_sidecar)
        kit.save({"step": 3, "v": "new"}, 3)
    assert {p.name: p.read_bytes() for p in ck.glob("ckpt-step-*")} == before
    assert not list(ck.glob(".tmp-*"))
    assert importlib.reload(kit).load_latest() == {"step": 3, "v": "old"}


def test_a_resaved_step_takes_a_name_of_its_own_and_the_old_payload_goes(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    ck = tmp_path / "ck"
    first = kit.save({"step": 2, "v": 1}, 2)
    second = kit.save({"step": 2, "v": 2}, 2)
    assert Path(first).name == "ckpt-step-000000002.pt"
    assert re.fullmatch(r"ckpt-step-000000002\.[0-9a-f]{16}\.pt", Path(second).name)
    assert payload_names(ck, 2) == [Path(second).name] == [named_payload(ck, 2)]
    third = kit.save({"step": 2, "v": 3}, 2)  # the usual name is free again
    assert payload_names(ck, 2) == [Path(third).name] == ["ckpt-step-000000002.pt"]
    events = [json.loads(x) for x in capfd.readouterr().out.splitlines() if x.startswith("{")]
    assert [e["path"] for e in events if e["event"] == "checkpoint"] == [first, second, third]
    assert kit.load_latest() == {"step": 2, "v": 3}


def test_retention_deletes_every_payload_of_a_step_it_deletes(
    kit: ModuleType, tmp_path: Path
) -> None:
    ck = tmp_path / "ck"
    kit.save({"step": 1}, 1, keep=1)
    kit.save({"step": 1, "v": 2}, 1, keep=1)  # ckpt-step-000000001.<hex>.pt
    stray = ck / "ckpt-step-000000001.0123456789abcdef.pt"  # a killed commit's
    stray.write_bytes(b"left by a kill")
    kit.save({"step": 2}, 2, keep=1)
    assert sorted(p.name for p in ck.glob("ckpt-step-*")) == [
        "ckpt-step-000000002.json",
        "ckpt-step-000000002.pt",
    ]


@pytest.mark.parametrize(
    "file",
    [
        "../outside.pt",
        "/etc/passwd",
        "ckpt-step-000000006.pt",  # another step's
        "ckpt-step-000000005.0123.pt",
        "ckpt-step-000000005.0123456789ABCDEF.pt",
        "ckpt-step-000000005.json",
        7,
    ],
)
def test_a_sidecar_naming_no_payload_of_its_step_is_skipped(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str], file: object
) -> None:
    ck = tmp_path / "ck"
    payload = torch_bytes({"step": 5}, tmp_path)
    kit.save({"step": 4}, 4)
    plant(ck, 5, payload, {**valid_sidecar(5, payload), "file": file})
    (tmp_path / "outside.pt").write_bytes(payload)
    assert kit.load_latest() == {"step": 4}
    err = capfd.readouterr().err
    assert (
        f"its sidecar names payload {str(file)[:80]!r}, which is no payload name of step 5" in err
    )


def test_a_sidecar_without_file_names_the_usual_payload(kit: ModuleType, tmp_path: Path) -> None:
    # Sidecars written before `file` existed.
    ck = tmp_path / "ck"
    payload = torch_bytes({"step": 5}, tmp_path)
    sidecar = valid_sidecar(5, payload)
    del sidecar["file"]
    plant(ck, 5, payload, sidecar)
    assert kit.load_latest() == {"step": 5}


@pytest.mark.slow
def test_every_rank_is_told_the_name_rank_0_committed(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    env = {"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(ck)}
    with Launcher(tmp_path) as L:
        p = L.torchrun([], script=SCRIPTS / "save_twice.py", env=env)
        assert p.wait(90) == 0, p.tail()
    resaved = ck / named_payload(ck, 1)
    assert re.fullmatch(r"ckpt-step-000000001\.[0-9a-f]{16}\.pt", resaved.name)
    for r in (0, 1):  # in the order each rank printed them
        said = [x for x in p.stdout.splitlines() if x.startswith(f"rank {r} saved ")]
        assert said == [
            f"rank {r} saved {ck / 'ckpt-step-000000001.pt'}",
            f"rank {r} saved {resaved}",
        ]
    assert payload_names(ck, 1) == [resaved.name]


# ---- the ddpkit3 pass's debatable items, settled ----------------------------------------
@pytest.mark.parametrize("value", ["nan", "-1", "soon"])
@pytest.mark.parametrize("name", ["DDPDEPLOY_CHECKPOINT_LOCK_S", "DDPDEPLOY_SAVE_WARN_S"])
def test_a_bad_lock_or_save_wait_is_one_line_as_the_run_resumes(
    kit: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    value: str,
    name: str,
) -> None:
    # The lock's was read at the first commit only, on rank 0: a typo cost the run up to its
    # first checkpoint, and the other ranks learnt of it when torchrun tore the group down.
    # The save wait's likewise, inside the first multi-rank save (the ddpkit5 pass, K8).
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as info:
        kit.load_latest()
    assert info.value.code == 2
    assert capfd.readouterr().err == (
        f"ddpkit: error: {name}={value!r} is not a finite number of at least 0; fix or unset it\n"
    )
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("directory", [b"/tmp/x", 123, "/tmp/a\0b"])
def test_a_directory_that_is_no_folder_name_is_named(kit: ModuleType, directory: object) -> None:
    with pytest.raises(TypeError, match=r"^directory= must name a folder as text"):
        kit.save({"step": 1}, 1, directory=directory)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^directory= must name a folder as text"):
        kit.load_latest(directory=directory)  # type: ignore[arg-type]


# ---- the ddpkit4 pass: the sidecar-last commit's own hostile paths -----------------------
def test_an_undeletable_old_payload_is_named_and_stops_no_other_delete(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # The sweep after a commit stopped at the first name it could not delete (no line), and
    # retention, once the sidecar was gone, left every later payload of the step behind.
    ck = tmp_path / "ck"
    kit.save({"step": 4}, 4, keep=1)
    kit.save({"step": 5}, 5, keep=1)
    blocker = ck / "ckpt-step-000000005.0000000000000000.pt"
    blocker.mkdir()
    for v in range(3):
        kit.save({"step": 5, "v": v}, 5, keep=1)
    assert len(payload_names(ck, 5)) == 2  # the committed one and the folder
    assert (
        "the step's older payload could not be deleted: ckpt-step-000000005.0000000000000000.pt"
        in capfd.readouterr().err
    )
    kit.save({"step": 6}, 6, keep=1)
    assert payload_names(ck, 5) == [blocker.name]  # only what cannot be deleted
    assert not (ck / "ckpt-step-000000005.json").exists()


@pytest.mark.parametrize(
    ("file", "said"),
    [(None, "null"), ("ckpt-step-000000005.pt\n", "'ckpt-step-000000005.pt\\n'")],
)
def test_a_sidecar_file_of_null_or_with_a_newline_is_refused(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str], file: object, said: str
) -> None:
    # `$` matched before a final newline, and null read as no `file` in collect only.
    ck = tmp_path / "ck"
    kit.save({"step": 4}, 4)
    payload = torch_bytes({"step": 5}, tmp_path)
    plant(ck, 5, payload, {**valid_sidecar(5, payload), "file": file})
    (ck / "ckpt-step-000000005.pt\n").write_bytes(payload)
    assert kit.load_latest() == {"step": 4}
    err = capfd.readouterr().err
    assert f"its sidecar names payload {said}, which is no payload name of step 5" in err


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_a_signal_raised_as_the_sidecar_rename_returns_keeps_the_commit(
    kit: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: type[BaseException]
) -> None:
    # Found by the ddpkit4 pass: Ctrl-C (or a SIGTERM handler's sys.exit) during the
    # sidecar's rename is raised as os.replace returns, after the commit, and the error path
    # deleted the payload the new sidecar names: both step 5s were lost. A stand-in raises
    # right after the real rename, where Python runs the signal's handler.
    ck = tmp_path / "ck"
    kit.save({"step": 4}, 4)
    kit.save({"step": 5, "v": "old"}, 5)
    real = os.replace

    def interrupted_after(src: str, dst: str) -> None:
        real(src, dst)
        if dst.endswith(".json"):
            raise exc()

    with monkeypatch.context() as m, pytest.raises(exc):
        m.setattr(os, "replace", interrupted_after)
        kit.save({"step": 5, "v": "new"}, 5)
    assert importlib.reload(kit).load_latest() == {"step": 5, "v": "new"}
    assert (ck / named_payload(ck, 5)).is_file()


# ---- the ddpkit5 pass ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("step-float", "its sidecar says step '5.0', its name 5"),
        ("step-true", "its sidecar says step 'True', its name 1"),
        ("bom", "unreadable sidecar (Unexpected UTF-8 BOM"),
        ("utf16", "unreadable sidecar ('utf-8' codec can't decode"),
    ],
)
def test_ddpkit_and_collect_refuse_the_same_sidecars(
    kit: ModuleType, tmp_path: Path, capfd: pytest.CaptureFixture[str], kind: str, said: str
) -> None:
    # Found by the ddpkit5 pass (K5): "step": 5.0 (5.0 == 5) and a UTF-8 BOM (json.loads on
    # bytes strips it) were loaded by ddpkit and refused by collect: the two readers took
    # different steps of one folder. One rule now: an int step, strict UTF-8 JSON, no BOM.
    from ddpdeploy.collect.checkpoint import collect
    from ddpdeploy.collect.source import LocalSource

    ck = tmp_path / "ck"
    old, new = (0, 1) if kind == "step-true" else (4, 5)  # true == 1
    kit.save({"step": old}, old)
    kit.save({"step": new}, new)
    side = ck / f"ckpt-step-{new:09d}.json"
    doc = json.loads(side.read_text())
    if kind.startswith("step-"):
        doc["step"] = 5.0 if kind == "step-float" else True
    raw = json.dumps(doc).encode()
    side.write_bytes({"bom": b"\xef\xbb\xbf" + raw, "utf16": json.dumps(doc).encode("utf-16")}
                     .get(kind, raw))  # fmt: skip
    assert kit.load_latest() == {"step": old}
    assert said in capfd.readouterr().err
    assert collect(LocalSource(ck), tmp_path / "out").step == old


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["lock", "unset"])
def test_a_bad_checkpoint_env_after_the_group_is_up_exits_2_on_every_rank(
    tmp_path: Path, bad: str
) -> None:
    # Found by the ddpkit5 pass (K6): the exit 2 was a plain SystemExit, and in about half
    # the runs torch 2.13 aborted one rank in the teardown of the live gloo group (exit -6,
    # "terminate called without an active exception") after its line.
    env = {"PYTHONPATH": str(TRAIN_DIR)}
    if bad == "lock":
        env.update(DDPDEPLOY_CHECKPOINT_DIR=str(tmp_path / "ck"), DDPDEPLOY_CHECKPOINT_LOCK_S="abc")
        line = (
            "ddpkit: error: DDPDEPLOY_CHECKPOINT_LOCK_S='abc' is not a finite number of at "
            "least 0; fix or unset it"
        )
    else:  # base_env leaves DDPDEPLOY_CHECKPOINT_DIR out
        line = "ddpkit: error: DDPDEPLOY_CHECKPOINT_DIR is not set; give the job a checkpoint"
    with Launcher(tmp_path) as L:
        p = L.torchrun([], script=SCRIPTS / "bad_env_after_init.py", env=env)
        assert p.wait(90) != 0, p.tail()
    assert p.stderr.count(line) == 2, p.tail()
    assert "terminate called" not in p.stderr and "SIGABRT" not in p.stderr, p.tail()
    assert len(re.findall(r"exitcode\s*: 2 \(pid", p.stderr)) == 2, p.tail()
    assert "not reached" not in p.stdout


def test_a_step_deleted_by_a_newer_save_while_load_latest_reads_gives_the_newer_one(
    kit: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Found by the ddpkit5 pass (K4): the replaced pod's last save (keep=1) committed step 4
    # between load_latest's listing and its read of step 3, and deleted step 3; the listing
    # held nothing older, so load_latest returned None: a fresh start beside an intact
    # step 4. A stand-in for that save, as for the re-save above: it runs as 3 is opened.
    ck = tmp_path / "ck"
    for step in (1, 2, 3):
        kit.save({"step": step}, step, keep=1)
    opened = kit._open_regular
    raced = []

    def newer_save_first(path, *args, **kwargs):
        if path.endswith("ckpt-step-000000003.pt") and not raced:
            raced.append(1)
            kit.save({"step": 4}, 4, keep=1)
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(kit, "_open_regular", newer_save_first)
    assert kit.load_latest() == {"step": 4}
    assert raced and steps_in(ck) == {"pt": [4], "json": [4]}
    err = capfd.readouterr().err
    assert f"ddpkit: checkpoint {ck}/ckpt-step-000000003.pt vanished (unreadable sidecar" in err
    assert f"listing {ck} again" in err and "skipping" not in err


@pytest.mark.slow
@pytest.mark.parametrize("init_method", ["", "env://"])
def test_a_lock_held_past_half_the_group_timeout_fails_the_save_alike_on_every_rank(
    tmp_path: Path, init_method: str
) -> None:
    # Found by the ddpkit5 pass (K2): rank 0 waited for the lock up to
    # DDPDEPLOY_CHECKPOINT_LOCK_S (300 s) while rank 1 waited for it in a broadcast under
    # the group's timeout: rank 1 died in gloo's raw recv timeout, naming no lock. With
    # init_method= the group's timeout went unrecorded (the review after the fix).
    ck = tmp_path / "ck"
    p = _torchrun_while_locked(
        tmp_path, ck, 40, "save_with_short_group_timeout.py", TEST_GROUP_S="8",
        TEST_INIT_METHOD=init_method,
    )  # fmt: skip
    said = sorted(x for x in p.stderr.splitlines() if re.match(r"rank \d ", x))
    assert len(said) == 2 and said[0][7:] == said[1][7:], p.tail()  # the same on both
    assert re.match(
        rf"rank 0 CheckpointError: checkpoint of step 1 in {ck} was not written: rank 0: "
        rf"TimeoutError: \[Errno 110\] {ck}/\.ddpkit\.lock stayed locked by another process "
        r"for \d s, and rank 0 waits at most half the process group's timeout \(8 s\)",
        said[0],
    ), p.tail()
    assert "Timed out" not in p.stderr, p.tail()
    assert sorted(n.name for n in ck.iterdir()) == [".ddpkit.lock"]  # no temp file left


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_an_interrupted_retention_is_finished_by_the_next_one(
    kit: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: type[BaseException]
) -> None:
    # Found by the ddpkit5 pass (K3): retention deleted a step's sidecar, then its payload;
    # interrupted in between (Ctrl-C, a SIGTERM handler's exit, a kill) it left a payload
    # no sidecar names, which no later save or retention ever looked at: a checkpoint's
    # worth of disk per interruption. A stand-in raises as the payload's delete begins.
    ck = tmp_path / "ck"
    for step in (4, 5):
        kit.save({"step": step}, step, keep=5)
    real = os.unlink

    def interrupted(path, *args, **kwargs):
        if str(path).endswith("ckpt-step-000000005.pt"):
            raise exc()
        return real(path, *args, **kwargs)

    with monkeypatch.context() as m, pytest.raises(exc):
        m.setattr(os, "unlink", interrupted)
        kit.save({"step": 6}, 6, keep=1)
    assert (ck / "ckpt-step-000000005.pt").is_file()
    assert not (ck / "ckpt-step-000000005.json").exists()
    kit.save({"step": 7}, 7, keep=1)
    assert sorted(p.name for p in ck.iterdir()) == [
        ".ddpkit.lock", "ckpt-step-000000007.json", "ckpt-step-000000007.pt"
    ]  # fmt: skip
    assert kit.load_latest() == {"step": 7}


def test_a_marker_whose_payload_was_saved_again_keeps_the_new_payload(
    kit: ModuleType, tmp_path: Path
) -> None:
    # A marker finishes only what it names: a step committed again since (its sidecar
    # names its payload) keeps it, and a payload of other contents stays.
    ck = tmp_path / "ck"
    kit.save({"step": 5}, 5)
    marker = ck / ".ddpkit-deleting-ckpt-step-000000005.json"
    marker.write_bytes((ck / "ckpt-step-000000005.json").read_bytes())
    kit.save({"step": 6}, 6)
    assert not marker.exists() and kit.load_latest() == {"step": 6}
    assert (ck / "ckpt-step-000000005.pt").is_file()  # committed: its sidecar names it


def test_a_signal_raised_as_the_payloads_rename_returns_leaves_no_payload(
    kit: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found re-running the ddpkit5 pass's interruption sweep: Ctrl-C as the payload's
    # rename returned left it under its final name with no sidecar, for good.
    ck = tmp_path / "ck"
    kit.save({"step": 5}, 5)
    real = os.replace

    def interrupted_after(src: str, dst: str) -> None:
        real(src, dst)
        if dst.endswith(".pt"):
            raise KeyboardInterrupt

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(os, "replace", interrupted_after)
        kit.save({"step": 6}, 6)
    assert sorted(p.name for p in ck.iterdir()) == [
        ".ddpkit.lock", "ckpt-step-000000005.json", "ckpt-step-000000005.pt"
    ]  # fmt: skip


@pytest.mark.slow
def test_a_resave_while_the_ranks_load_gives_every_rank_the_same_state(tmp_path: Path) -> None:
    # Found by the ddpkit5 pass (K7): each rank reads the pair itself, and a re-save of the
    # step between rank 0's read and rank 1's had rank 0 resume the old state and rank 1 the
    # new one, both "verified", with no line.
    ck = tmp_path / "ck"
    env = {"PYTHONPATH": str(TRAIN_DIR), "DDPDEPLOY_CHECKPOINT_DIR": str(ck)}
    first = (
        "import ddpkit, torch; [ddpkit.save({'step': s, 'w': torch.ones(10)}, s) for s in (4, 5)]"
    )
    subprocess.run([sys.executable, "-c", first], env={**base_env(), **env}, check=True)
    with Launcher(tmp_path) as L:
        p = L.torchrun([], script=SCRIPTS / "resave_while_ranks_load.py", env=env)
        assert p.wait(120) == 0, p.tail()
    resumed = sorted(x for x in p.stderr.splitlines() if x.startswith("rank "))
    assert resumed == ["rank 0 resumed step 5 of 500", "rank 1 resumed step 5 of 500"], p.tail()
    assert f"ddpkit: checkpoint of step 5 in {ck} was saved again while the ranks read it; " \
        "reading it again" in p.stderr, p.tail()  # fmt: skip
