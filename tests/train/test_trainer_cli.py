"""The trainer's command line contract: flags, JSON lines (with the record of what ran, in
the done event and every checkpoint's sidecar), exit codes, no shadowing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trainer_harness import Launcher, Proc, done_hash, start_event  # noqa: E402

pytestmark = pytest.mark.slow  # real trainer processes (torch start-up each)


# Each bad argument is checked in process (test_trainer_args.py); here a real process shows
# the contract for one found in main() (test_trainer_without_numpy.py: one of argparse's).
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path) -> None:
    with Launcher(tmp_path) as L:
        p = L.python(["--model", "no_such_module_xyz:make"])
        assert p.wait(60) == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptrain: error:") and "--model" in lines[0]
    assert p.stdout == ""


# What ddpdeploy tells the trainer about the run: in the done event and every sidecar.
RECORD_ENV = {"DDPDEPLOY_SPEC_SHA256": "ab" * 32, "DDPDEPLOY_IMAGE": "reg/img:1",
              "DDPDEPLOY_IMAGE_DIGEST": "sha256:" + "cd" * 32, "DDPDEPLOY_GIT_COMMIT": "f00d",
              "DDPDEPLOY_GIT_DIRTY": "true"}  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Proc, list[str]]:
    """2 ranks, 6 steps, checkpoints at 3 and 6, with a user's model from the working
    directory, which also holds a train.py and look-alikes of the trainer's modules."""
    tmp = tmp_path_factory.mktemp("cli")
    for name in ("train.py", "ddptrain.py", "ddptrain_ckpt.py", "ddptrain_model.py"):
        (tmp / name).write_text("raise SystemExit('shadowed: wrong module imported')\n")
    (tmp / "mymodels.py").write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.ReLU(),\n"
        "                               torch.nn.Linear(8, 10))\n"
    )
    args = ["--steps", "6", "--log-every", "3", "--checkpoint-dir", str(tmp / "c"),
            "--checkpoint-every", "3", "--seed", "7", "--model", "mymodels:make"]  # fmt: skip
    with Launcher(tmp) as L:
        return L.run_ok(args, env=RECORD_ENV), args


def test_json_lines_schema(run: tuple[Proc, list[str]]) -> None:
    p, args = run
    lines = p.stdout.strip().splitlines()
    events = [json.loads(line) for line in lines]  # every stdout line is JSON
    st = start_event(p)
    assert st["world_size"] == 2 and st["backend"] == "gloo" and st["resumed"] is False
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == [3, 6]
    assert all(set(e) == {"event", "step", "loss", "samples_per_s"} for e in steps)
    ckpts = [e for e in events if e["event"] == "checkpoint"]
    assert [e["step"] for e in ckpts] == [3, 6]
    assert all(Path(e["path"]).is_file() and e["rank"] == 0 and e["host"] for e in ckpts)
    assert set(events[-1]) == {"event", "step", "weights_sha256", "run"}
    assert events[-1]["step"] == 6 and events[-1]["run"]["world_size"] == 2
    assert len(done_hash(p)) == 64
    import torch  # noqa: PLC0415

    want = {"spec_sha256": "ab" * 32, "image": "reg/img:1", "image_digest": "sha256:" + "cd" * 32,
            "git_commit": "f00d", "git_dirty": True, "torch": torch.__version__,
            "world_size": 2, "seed": 7}  # fmt: skip
    sidecars = sorted(Path(ckpts[0]["path"]).parent.glob("ckpt-step-*.json"))
    assert len(sidecars) == 2
    for record in [events[-1]["run"], *(json.loads(s.read_text())["run"] for s in sidecars)]:
        assert {k: record[k] for k in want} == want
        assert record["argv"][1:] == args and "cuda" in record and "nccl" in record


def test_user_files_in_cwd_do_not_shadow_the_trainer(run: tuple[Proc, list[str]]) -> None:
    # A user's own train.py and look-alikes of our modules in the working directory don't
    # shadow the trainer's, while the working directory still resolves --model.
    p, _ = run
    assert "shadowed" not in p.stderr
    done_hash(p)


def test_cpu_sync_bn_runs_single_process(tmp_path: Path) -> None:
    """--sync-bn on CPU uses the gloo path instead of torch's GPU-only SyncBatchNorm error."""
    with Launcher(tmp_path) as L:
        p = L.python(["--steps", "2", "--bn", "--sync-bn"])
        assert p.wait(60) == 0, p.tail()
    assert "only work with GPU modules" not in p.stderr
    done_hash(p)
