"""The trainer's command line contract: flags, JSON lines (with the record of what ran, in
the done event and every checkpoint's sidecar), exit codes, no shadowing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trainer_harness import Launcher, done_hash, start_event  # noqa: E402

pytestmark = pytest.mark.slow  # real trainer processes (torch start-up each)


# Each bad argument is checked in process (test_trainer_args.py); here a real process shows
# the contract for one of argparse's own errors and one found in main().
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--bogus"], "unrecognized arguments"),
        (["--model", "no_such_module_xyz:make"], "--model"),
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
    ck = tmp_path / "c"
    # What ddpdeploy tells the trainer about the run: in the done event and every sidecar.
    env = {"DDPDEPLOY_SPEC_SHA256": "ab" * 32, "DDPDEPLOY_IMAGE": "reg/img:1",
           "DDPDEPLOY_IMAGE_DIGEST": "sha256:" + "cd" * 32, "DDPDEPLOY_GIT_COMMIT": "f00d",
           "DDPDEPLOY_GIT_DIRTY": "true"}  # fmt: skip
    args = ["--steps", "6", "--log-every", "3", "--checkpoint-dir", str(ck),
            "--checkpoint-every", "3", "--seed", "7"]  # fmt: skip
    with Launcher(tmp_path) as L:
        p = L.run_ok(args, env=env)
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
    sidecars = sorted(ck.glob("ckpt-step-*.json"))
    assert len(sidecars) == 2
    for run in [events[-1]["run"], *(json.loads(s.read_text())["run"] for s in sidecars)]:
        assert {k: run[k] for k in want} == want
        assert run["argv"][1:] == args and "cuda" in run and "nccl" in run


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
    # One process, as torchrun starts each worker: python by the trainer's path.
    with Launcher(tmp_path) as L:
        p = L.python(["--steps", "3", "--model", "mymodels:make", "--log-every", "3"])
        assert p.wait(60) == 0, p.tail()
    assert "shadowed" not in p.stderr
    done_hash(p)


def test_cpu_sync_bn_runs_single_process(tmp_path: Path) -> None:
    """--sync-bn on CPU uses the gloo path instead of torch's GPU-only SyncBatchNorm error."""
    with Launcher(tmp_path) as L:
        p = L.python(["--steps", "2", "--bn", "--sync-bn"])
        assert p.wait(60) == 0, p.tail()
    assert "only work with GPU modules" not in p.stderr
    done_hash(p)
