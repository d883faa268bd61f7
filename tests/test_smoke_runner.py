"""The smoke room's pure parts (the console parser, the plan, the budget, the options) and
the local target's launch, without torch."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone

import pytest

from ddpdeploy.contract import RANK_OUTPUT_ENV
from ddpdeploy.errors import UserError
from ddpdeploy.events import (
    WorkerFailure,
    parse_event,
    root_cause,
    split_ranks,
    summary_failures,
)
from ddpdeploy.smoke.budget import MAX_WORKERS_PER_CORE, check_cpu_budget
from ddpdeploy.smoke.launch import (
    CHECKPOINT_ENV,
    chaos_spec,
    cpu_spec,
    local_nodes,
    nodes_of,
    run_restarts,
    with_steps,
)
from ddpdeploy.smoke.runner import KillAt, Outcome, Ranks, RunOptions, same_weights, smoke
from ddpdeploy.spec import JobSpec, spec_with
from ddpdeploy.streams import ChunkReader, LineSplitter
from ddpdeploy.targets import launch_contract


def test_launcher_is_a_parameter_of_the_contract():
    contract = launch_contract(JobSpec.model_validate({"nodes": 2}))
    launcher = ["/venv/bin/python", "-m", "torch.distributed.run"]
    command = contract.container_command("/src/train/ddptrain.py", "/tmp/ck", launcher)
    assert command[4:] == [*launcher, *contract.entry_argv("/src/train/ddptrain.py", "/tmp/ck")]
    assert "torchrun" not in command
    assert contract.container_command()[4] == "torchrun"  # the image's, by default


def test_local_nodes_run_this_interpreters_torchrun():
    nodes = local_nodes(JobSpec.model_validate({"nodes": 2}), 29400, "/src/train/ddptrain.py")
    for node in nodes:
        assert node.argv[4:8] == [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "/src/train/ddptrain.py",
        ]
        assert "PET_MAX_RESTARTS" not in node.env
    restarting = local_nodes(JobSpec.model_validate({"nodes": 2}), 29400, "/t.py", max_restarts=1)
    assert all(n.env["PET_MAX_RESTARTS"] == "1" for n in restarting)


def test_a_kill_at_clean_run_gets_no_restarts_even_where_the_spec_sets_some():
    # The baseline must not hide a crash behind a restart (fifth outside-scripts pass).
    spec = JobSpec.model_validate({"nodes": 2, "rendezvous": {"maxRestarts": 3}})
    assert spec.rendezvous.max_restarts == 3
    for kill, want in ((False, "0"), (True, "3")):
        nodes = local_nodes(spec, 29400, "/t.py", max_restarts=run_restarts(3, kill))
        assert all(n.env["PET_MAX_RESTARTS"] == want for n in nodes), kill
    assert run_restarts(None, False) is None  # no --kill-at: the spec's own, untouched


def test_cpu_budget_lets_the_readme_job_run_on_two_cores():
    check_cpu_budget(2, 2, force=False, cores=2)
    check_cpu_budget(2, MAX_WORKERS_PER_CORE, force=False, cores=2)
    with pytest.raises(UserError, match="--force"):
        check_cpu_budget(3, 3, force=False, cores=2)
    check_cpu_budget(50, 50, force=True, cores=2)


def test_rank_prefix_and_summary_are_read_from_torchrun_lines():
    # The shape of torch 2.13's agent summary, as the truth test produces it for real.
    tail = [
        "[rank2]:[rank2]: RuntimeError: Connection closed by peer",
        "Failures:",
        "[1]:",
        "  rank      : 2 (local_rank: 0)",
        "  exitcode  : -15 (pid: 24818)  (SIGTERM)",
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 3 (local_rank: 1)",
        "  exitcode  : 1 (pid: 24819) ",
    ]
    assert split_ranks(tail[0]) == [(2, "[rank2]: RuntimeError: Connection closed by peer")]
    assert split_ranks("plain") == [(None, "plain")]
    got = [(f.rank, f.local_rank, f.code, f.root) for f in summary_failures("n", tail)]
    assert got == [(2, 0, -15, False), (3, 1, 1, True)]


def test_a_rank_prefix_inside_a_workers_line_starts_another_ranks_line():
    # Found by the seventh hostile pass: a rank's partial last line ran on into the next.
    assert split_ranks("[rank1]:partial[rank0]:line 0") == [(1, "partial"), (0, "line 0")]
    # Half an escape ends its rank's line; the next prefix is whole.
    assert split_ranks("[rank1]:x \x1b[31[rank0]:y") == [(1, "x \x1b[31"), (0, "y")]
    # torch's own prefix of an exception's lines, at the start of the text, stays in it.
    got = split_ranks("[rank1]:end[rank0]:[rank0]: Traceback (most recent call last):")
    assert got == [(1, "end"), (0, "[rank0]: Traceback (most recent call last):")]
    assert split_ranks("[rank0]:[rank0]: x") == [(0, "[rank0]: x")]
    assert split_ranks("an agent's line [rank0]:x") == [(None, "an agent's line [rank0]:x")]
    # A prefix a script printed mid-line splits it too (the glue leaves no other mark) ...
    assert split_ranks("[rank0]:said [rank3]: hi") == [(0, "said "), (3, " hi")]
    # ... but not inside a whole protocol event: its strings may hold anything.
    event = '{"event": "step", "step": 4, "note": "from [rank3]: hi"}'
    assert split_ranks(f"[rank0]:{event}") == [(0, event)]
    assert split_ranks(f"[rank1]:partial[rank0]:{event}") == [(1, "partial"), (0, event)]
    assert split_ranks('[rank0]:{"event": "step"}[rank0]:') == [(0, '{"event": "step"}'), (0, "")]


def test_a_module_is_found_where_the_workers_would_find_it(tmp_path):
    # Installed modules (the standard library's, site-packages'), the helpers beside the
    # trainer, the workspace's own and the job's PYTHONPATH are all there for the workers.
    from ddpdeploy.smoke.local import check_module

    (tmp_path / "src" / "mine").mkdir(parents=True)
    (tmp_path / "src" / "mine" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (tmp_path / "src" / "mine" / "train.py").write_text("")
    (tmp_path / "flat").mkdir()  # a namespace package, as python -m finds it
    (tmp_path / "flat" / "run.py").write_text("")
    for module in ("json.tool", "email.mime.text", "yaml.loader", "ddpkit", "flat.run"):
        check_module(tmp_path, module, None)
    check_module(tmp_path, "mine.train", "src")  # the job's own PYTHONPATH, from the workspace
    with pytest.raises(UserError, match="^command.module: mine.train: there is no module mine"):
        check_module(tmp_path, "mine.train", None)
    with pytest.raises(UserError, match=r"^command.module: json.tool.x: json.tool is a module"):
        check_module(tmp_path, "json.tool.x", None)


def test_root_cause_is_the_failed_worker_whose_output_ended_first():
    peer = WorkerFailure("a", 0, 0, 1, root=False)
    killed = WorkerFailure("b", 2, 0, -15, root=False)  # SIGTERMed by its own agent
    cause = WorkerFailure("b", 3, 1, 1, root=True)
    times = {("a", 0): 10.5, ("b", 0): 1.0, ("b", 1): 10.0}
    assert root_cause([peer, killed, cause], times) == cause
    # Without times, torchrun's own pick; with only SIGTERMed workers, one of those.
    assert root_cause([peer, cause], {}) == cause
    assert root_cause([killed], times) == killed


def test_local_nodes_get_the_run_env_through_the_contract():
    spec = JobSpec.model_validate({"nodes": 2, "env": {"A": "1"}, "rendezvous": {"mode": "static"}})
    nodes = local_nodes(spec, 29400, "/t.py", checkpoint_dir="/ck")
    for node in nodes:
        assert node.env["A"] == "1"
        assert {k: node.env[k] for k in RANK_OUTPUT_ENV} == RANK_OUTPUT_ENV
        assert node.env[CHECKPOINT_ENV] == "/ck"
    assert [n.rank for n in nodes] == [0, 1]
    # The contract itself: run-only env after the spec's, nothing else changed.
    contract = launch_contract(spec, run_env={"A": "2", "B": "3"})
    assert contract.pod_env()["A"] == "2" and contract.pod_env()["B"] == "3"
    assert "B" not in launch_contract(spec).pod_env()


def test_nodes_of_take_the_static_rank_or_none_under_c10d():
    doc = {"nodes": 3, "rendezvous": {"mode": "static"}}
    static = nodes_of(launch_contract(JobSpec.model_validate(doc)))
    assert [(n.name, n.rank) for n in static] == [
        ("ddp-train-master-0", 0),
        ("ddp-train-worker-0", 1),
        ("ddp-train-worker-1", 2),
    ]
    elastic = JobSpec.model_validate(
        {"nodes": 2, "rendezvous": {"mode": "elastic", "minNodes": 1, "maxNodes": 2}}
    )
    assert {n.rank for n in nodes_of(launch_contract(elastic))} == {None}
    c10d = nodes_of(launch_contract(JobSpec.model_validate({"nodes": 2})))  # the default
    assert [(n.name, n.rank) for n in c10d] == [
        ("ddp-train-worker-0", None),
        ("ddp-train-worker-1", None),
    ]


def test_changed_specs_are_validated():
    spec = JobSpec.model_validate({"gpus": 4, "nodes": 2})
    cpu = cpu_spec(spec)
    assert (cpu.gpus, cpu.procs, cpu.backend, cpu.nodes) == (0, 4, "gloo", 2)
    # A trainjob's port is fixed by Trainer v2: a local run's free port goes to the
    # contract, not into the spec (which would refuse it).
    trainjob = JobSpec.model_validate({"target": "trainjob"})
    nodes = local_nodes(trainjob, 41234, "/t.py")
    assert nodes[0].env["PET_MASTER_PORT"] == "41234"
    with pytest.raises(UserError, match="procs"):
        spec_with(spec, {"procs": 3})  # what a spec file could not say, a patch cannot either


def test_steps_is_the_builtin_trainers_flag():
    assert with_steps(JobSpec(), 5).command.args == ["--steps", "5"]
    for command in ({"script": "train.py"}, {"module": "pkg.train"}):
        spec = JobSpec.model_validate({"command": command})
        with pytest.raises(UserError, match="after `--`"):
            with_steps(spec, 5)
        assert with_steps(spec, None) is spec


def test_steps_overrides_the_files_args_but_not_the_same_command_lines():
    spec = JobSpec.model_validate({"command": {"args": ["--steps", "100"]}})
    assert with_steps(spec, 5).command.args == ["--steps", "100", "--steps", "5"]
    for after in (["--steps", "3"], ["--lr", "0.1", "--steps=3"]):
        with pytest.raises(UserError, match="after `--` also set --steps 3; give the step"):
            with_steps(spec_with(spec, {"command": {"args": after}}), 2, after)


def test_chaos_spec_gives_the_builtin_trainer_a_checkpoint_only():
    builtin, restarts = chaos_spec(JobSpec(), KillAt(step=8))
    assert restarts == 1 and builtin.checkpoint is not None
    assert builtin.command.args == ["--checkpoint-every", "4"]
    script = JobSpec.model_validate({"command": {"script": "t.py", "args": ["x"]}})
    assert chaos_spec(script, KillAt(seconds=20))[0] == script


def test_event_protocol_lines_and_others():
    event = parse_event('{"event": "done", "step": 7, "weights_sha256": "ab"}')
    assert event is not None and event.kind == "done" and event.step == 7
    assert event.fields["weights_sha256"] == "ab"
    for other in ('{"event": "epoch"}', '{"loss": 1}', "[1, 2]", "{not json", "epoch 1"):
        assert parse_event(other) is None, other
    assert parse_event('{"event": "step", "step": true}').step is None


def test_ranks_and_kill_at_options():
    assert Ranks.parse("all").shows(7) and Ranks.parse("all").prefixed(2)
    assert not Ranks.parse("all").prefixed(1)
    picked = Ranks.parse("0, 3")
    assert picked.shows(3) and not picked.shows(1) and picked.prefixed(4)
    assert not Ranks().prefixed(8) and Ranks().shows(0)
    for bad in ("", "x", "1,", "-1"):
        with pytest.raises(UserError, match="--ranks"):
            Ranks.parse(bad)
    Ranks.parse("0,3").check(4)
    Ranks.parse("all").check(1)
    with pytest.raises(
        UserError, match=r"--ranks: this run has ranks 0 to 1 \(world size 2\), not 5"
    ):
        Ranks.parse("0,5,9").check(2)  # found by the second hostile pass: shown nothing
    assert KillAt.parse("8") == KillAt(step=8)
    assert KillAt.parse("20s") == KillAt(seconds=20.0)
    assert KillAt.parse("checkpoint") == KillAt(checkpoint=True)
    for bad in ("0", "0s", "soon", "-3"):
        with pytest.raises(UserError, match="--kill-at"):
            KillAt.parse(bad)


# Found by the fifth outside-scripts pass: `0s` was "not a time" (it is one, of 0), a step of
# 5000 digits raised int()'s ValueError (a traceback), and 10**23 seconds ran a whole clean
# run before it was refused (`1e+23 s`).
@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("0", "--kill-at: '0': a step must be more than 0"),
        ("0.0s", "--kill-at: '0.0s': a time must be more than 0"),
        ("1" * 5000, "--kill-at: a step of at most 9 digits, not 5000"),
        ("9" * 24 + "s", "--kill-at: a time of at most 9 digits, not 24"),
        ("2.5", "--kill-at: '2.5' is not a step (8), a time (20s) or `checkpoint`"),
    ],
)
def test_a_kill_at_out_of_range_says_which_range(text, line):
    with pytest.raises(UserError) as err:
        KillAt.parse(text)
    assert str(err.value) == line
    assert KillAt.parse("0010s") == KillAt(seconds=10.0) and KillAt.parse("007") == KillAt(step=7)


def test_a_kill_time_past_the_timeout_is_refused_before_any_run():
    from ddpdeploy.report import Quiet

    started: list[bool] = []

    def start(kill: bool) -> object:
        started.append(kill)
        raise AssertionError("no run may start")

    options = RunOptions(world_size=1, kill_at=KillAt(seconds=900.0), timeout=900)
    with pytest.raises(UserError) as err:
        next(smoke(start, Quiet(), options))  # type: ignore[arg-type]
    assert started == []
    assert str(err.value) == (
        "--kill-at: 900 s is not before --timeout (900 s), which ends the run first; choose "
        "an earlier time or raise --timeout"
    )


@pytest.mark.parametrize("flag", ["--ranks", "--kill-at"])
@pytest.mark.parametrize("text", ["\u0663", "\u0661,\u0660", "\uff18", "\u0663s"])
def test_digits_of_other_scripts_are_no_ranks_or_steps(flag, text):
    # Found by the fourth hostile pass: --ranks \u0663 (Arabic-Indic three) was read as rank
    # 3 ("not 3" in its refusal, a value never typed) and --kill-at \uff18 ran a kill at 8.
    with pytest.raises(UserError, match=f"^{flag}: .* is not "):
        (Ranks if flag == "--ranks" else KillAt).parse(text)


def test_digits_of_other_scripts_are_no_ranks_durations_or_steps_anywhere():
    # Found by the fourth hostile pass: one rule for every reader of numbers, not only the
    # flags' (up --timeout \u0661\u0660s was ten seconds; a job line "[rank\u0663]:" was rank 3).
    from ddpdeploy.events import split_ranks
    from ddpdeploy.formats import parse_duration

    assert parse_duration("10s") == 10
    with pytest.raises(UserError, match="is not a duration"):
        parse_duration("\u0661\u0660s")
    assert split_ranks("[rank3]: x") == [(3, " x")]
    assert split_ranks("[rank\u0663]: x") == [(None, "[rank\u0663]: x")]
    assert split_ranks("[rank3]:a[rank\u0663]:b") == [(3, "a[rank\u0663]:b")]


def test_durations_read_and_write_the_same_units_list_shows_ages_in():
    # Left by the fifth hostile pass: `list` showed an age of "3d" while `--since 3d` and
    # `--timeout 3d` were refused, and a 3-day ETA read "72h00m".
    from ddpdeploy.formats import age, duration, parse_duration

    assert parse_duration("3d") == 3 * 86400 and parse_duration("1.5d") == 1.5 * 86400
    assert duration(3 * 86400 + 4 * 3600 + 59) == "3d04h"
    assert duration(23 * 3600) == "23h00m"
    then = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert age("2026-01-01T00:00:00Z", then + timedelta(days=3)) == "3d"
    with pytest.raises(UserError, match="use e.g. 90s, 15m, 2h or 3d"):
        parse_duration("3w")


def test_outcome_without_events_has_no_steps_and_no_comparison():
    plain = Outcome(wall=3.0, exit_codes={"a": 0})
    assert plain.steps is None and plain.steps_per_s is None and plain.weights_sha256 is None
    done = Outcome(wall=3.0, exit_codes={"a": 0}, done={"step": 6, "weights_sha256": "h"},
                   train_time=2.0)  # fmt: skip
    assert done.steps == 6 and done.steps_per_s == 3.0
    assert same_weights(done, plain) is None and same_weights(done, done) is True


def test_line_splitter_and_chunk_reader():
    lines = LineSplitter(b"")
    assert lines.feed(b"a\nb") == [b"a"] and lines.feed(b"c\n\nd") == [b"bc", b""]
    assert lines.finish() == [b"d"] and lines.finish() == []
    text = LineSplitter("")
    assert text.feed("x\ny") == ["x"] and text.finish() == ["y"]
    reader = ChunkReader(iter([b"ab", b"", b"cde"]))
    assert reader.read(1) == b"a" and reader.read() == b"bcde" and reader.read(3) == b""


def test_a_write_on_the_read_only_root_is_named_with_the_fix():
    from ddpdeploy.events import read_only_write

    fix = (
        " on the read-only root file system, as the pod would refuse it; write under "
        "$DDPDEPLOY_CHECKPOINT_DIR (or /tmp), or pass --writable-rootfs"
    )
    python = [
        "Traceback (most recent call last):",
        '  File "/workspace/relative_write.py", line 12, in <module>',
        '    open("snapshot.txt", "w")',
        "OSError: [Errno 30] Read-only file system: 'snapshot.txt'",
    ]
    assert read_only_write(["epoch 0", *python]) == "it wrote snapshot.txt" + fix
    # torch.save's writer names no path: the user's own frame stands in for it.
    torch_save = [
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 7, in <module>',
        '    torch.save(state, "snapshot.pt")',
        '  File "/opt/conda/lib/python3.11/site-packages/torch/serialization.py", line 9, in save',
        "    with _open_zipfile_writer(f) as opened_zipfile:",
        "RuntimeError: [enforce fail at inline_container.cc:747] . open file failed with "
        "strerror: Read-only file system",
    ]
    expected = 'it wrote a file (/workspace/train.py line 7: torch.save(state, "snapshot.pt"))'
    assert read_only_write(torch_save) == expected + fix
    # ...also as torch prints a worker's uncaught exception, prefixed with its rank again.
    assert read_only_write([f"[rank0]: {t}" for t in torch_save]) == expected + fix
    assert read_only_write(["OSError: [Errno 13] Permission denied: 'x'"]) is None


# Found by the fourth outside-scripts pass: the pytorch/examples tutorial and nanoGPT, run
# unchanged, failed with torch's "module 'torch._C' has no attribute '_cuda_setDevice'" or
# "Distributed package doesn't have NCCL built in" under frames of torch's own files: not a
# word that smoke runs on the CPU, nor which line of the script to change.
def test_a_script_that_asks_for_a_gpu_is_told_what_to_change():
    from ddpdeploy.events import needs_gpu

    def trace(own: str, code: str, *lib_and_error: str) -> list[str]:
        return [
            "step 0",
            "Traceback (most recent call last):",
            f'  File "/workspace/{own}", line 14, in setup',
            f"    {code}",
            *lib_and_error,
        ]

    lib = '  File "/venv/lib/python3.11/site-packages/torch/cuda/__init__.py", line 9, in f'
    set_device = trace(
        "train.py",
        "torch.cuda.set_device(local_rank)",
        lib,
        "    torch._C._cuda_setDevice(d)",
        "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
    )
    assert needs_gpu(set_device) == (
        "it used a CUDA device (/workspace/train.py line 14: torch.cuda.set_device(local_rank)), "
        "and smoke runs on the CPU with gloo; keep the model and tensors on the CPU when "
        "torch.cuda.is_available() is false (no torch.cuda.set_device, no .to(LOCAL_RANK) or "
        ".cuda())"
    )
    nccl = trace(
        "run.py",
        "dist.init_process_group(backend)",
        lib,
        "    raise RuntimeError(...)",
        "RuntimeError: Distributed package doesn't have NCCL built in",
    )
    assert needs_gpu([f"[rank1]: {t}" for t in nccl]) == (
        "it asked for the nccl backend (/workspace/run.py line 14: "
        "dist.init_process_group(backend)), and smoke runs on the CPU with gloo; use gloo when "
        "torch.cuda.is_available() is false"
    )
    ddp = trace(
        "m.py",
        "model = DDP(model, device_ids=[rank])",
        "ValueError: DistributedDataParallel device_ids and output_device arguments only work "
        "with single-device/multiple-device GPU modules or CPU modules, but got device_ids [0]",
    )
    assert needs_gpu(ddp).startswith(
        "it gave DDP device_ids for a model on the CPU (/workspace/m.py"
    )
    # A CUDA build on a host without a GPU (a CUDA base image under smoke --docker).
    driver = trace("t.py", "x.cuda()", "RuntimeError: Found no NVIDIA driver on your system.")
    assert needs_gpu(driver).startswith("it used a CUDA device (/workspace/t.py line 14: x.cuda())")
    # Only the last traceback's own error counts: not a word the job printed before it,
    # nor some other failure.
    other = trace("a.py", "f()", "KeyError: 'x'")
    assert needs_gpu(["Torch not compiled with CUDA enabled", *other]) is None
    assert needs_gpu(["Distributed package doesn't have NCCL built in"]) is None
    assert needs_gpu(trace("a.py", "f()", "OSError: [Errno 28] No space left on device")) is None


def test_smoke_refuses_a_rank_the_run_does_not_have_before_starting(tmp_path):
    from cli_runner import run_main

    out = run_main("smoke", "--local", "--nodes", "2", "--ranks", "0,2", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        "error: --ranks: this run has ranks 0 to 1 (world size 2), not 2; pick ranks below "
        "2, or all\n"
    )
    assert not (tmp_path / ".ddpdeploy").exists()  # nothing started, nothing written


def test_a_second_local_smoke_in_the_workspace_is_refused(tmp_path):
    # Found by the second hostile pass: a second `smoke --local` of the job emptied the
    # running one's checkpoint folder under it (its checkpoints gone, the other's in place).
    from cli_runner import run_main

    from ddpdeploy.fs import FolderLock

    (tmp_path / "s.py").write_text("pass\n")
    (tmp_path / "ddpdeploy.yaml").write_text("command: {script: s.py}\ncheckpoint: {size: 1Gi}\n")
    run = tmp_path / ".ddpdeploy" / "checkpoints" / "ddp-train"
    run.mkdir(parents=True)
    (run / "ckpt-step-000000001.pt").write_bytes(b"the running one's")
    held = FolderLock(tmp_path / ".ddpdeploy")  # as the running smoke holds it
    try:
        out = run_main("smoke", "--local", cwd=tmp_path)
    finally:
        held.release()
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines()[-1] == (
        f"error: smoke --local: another smoke --local is running in {tmp_path}; wait for it "
        "to end (a second run would empty its checkpoint folder)"
    )
    assert (run / "ckpt-step-000000001.pt").read_bytes() == b"the running one's"


@pytest.mark.parametrize(
    ("flags", "said"),
    [(["--keep-volume"], "--keep-volume"), (["--base-image", "python:3.11"], "--base-image")],
)
def test_a_docker_flag_without_docker_is_refused(tmp_path, flags, said):
    # Found by the second hostile pass: ignored, and a whole local run went by.
    from cli_runner import run_main

    out = run_main("smoke", *flags, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        f"error: {said}: only with --docker (a --local run uses no image or volume)\n"
    )


def test_local_and_docker_together_are_refused(tmp_path):
    # Found by the second hostile pass: `smoke --local --docker` ran a compose project.
    from cli_runner import run_main

    out = run_main("smoke", "--local", "--docker", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        "error: --local and --docker: pick one (processes here, or a compose project)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_steps_given_twice_on_one_command_line_is_refused(tmp_path):
    # Found by the third hostile pass: `smoke --steps 2 -- --steps 3` ran 2 steps, silently.
    from cli_runner import run_main

    out = run_main("smoke", "--steps", "2", "--", "--steps", "3", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr == (
        "error: --steps 2: the arguments after `--` also set --steps 3; give the step count once\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("link", [".ddpdeploy", ".ddpdeploy/checkpoints/ddp-train"])
def test_a_linked_checkpoint_folder_is_refused_and_its_target_kept(tmp_path, link):
    # Found by the third hostile pass: the link was followed and its target emptied
    # ("smoke: emptied /tmp/victim"), the user's files with it.
    from cli_runner import run_main

    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "thesis.txt").write_text("precious")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "ddpdeploy.yaml").write_text("nodes: 1\ncheckpoint: {size: 1Gi}\n")
    (ws / link).parent.mkdir(parents=True, exist_ok=True)
    (ws / link).symlink_to(victim)
    out = run_main("smoke", "--local", "--steps", "2", cwd=ws)
    assert out.returncode == 2 and out.stderr == (
        f"error: {link} is a symlink (to {victim}); ddpdeploy empties and writes folders "
        "there, so it must be a folder of its own: remove the link\n"
    )
    assert sorted(p.name for p in victim.iterdir()) == ["sub", "thesis.txt"]


# Found by the fourth outside-scripts pass: nanoGPT under `smoke --docker --kill-at
# checkpoint` saved ckpt.pt into the checkpoint volume three times, and after two runs
# (209 s) was told "the spec has no checkpoint: folder to watch ... save under
# $DDPDEPLOY_CHECKPOINT_DIR": it had one and did; smoke --docker watches no volume.
def test_a_checkpoint_kill_no_run_could_place_ends_after_the_clean_run_saying_why():
    from ddpdeploy.errors import OperationError
    from ddpdeploy.report import Quiet
    from ddpdeploy.smoke.backend import Line, Node, RunBackend
    from ddpdeploy.smoke.runner import KillAt, RunOptions, smoke

    class Saves(RunBackend):
        """Two nodes that save into their volume, print their own lines and end."""

        def __init__(self) -> None:
            super().__init__()
            self.nodes = [Node("j-worker-0", None), Node("j-worker-1", None)]
            lines = [
                Line("j-worker-0", "stderr", "PYTORCH_API_USAGE torch.python.import"),
                Line("j-worker-0", "stderr", "[rank0]:PYTORCH_API_USAGE c10d.process_group"),
                Line("j-worker-0", "stdout", "[rank0]:saving checkpoint to /checkpoints"),
            ]
            for line in lines:
                self._feed(line)

        def exit_codes(self) -> dict[str, int | None]:
            return {"j-worker-0": 0, "j-worker-1": 0}

        def tail(self, node: str) -> list[str]:
            return []

        def kill_worker(self, node: str) -> str:
            raise AssertionError("no kill run should start")

        def stop(self) -> None:
            pass

    started: list[bool] = []

    def start(kill: bool) -> RunBackend:
        started.append(kill)
        return Saves()

    options = RunOptions(world_size=2, kill_at=KillAt(checkpoint=True), volume_unwatched=True)
    runs = smoke(start, Quiet(), options)
    assert next(runs)[0] == "clean"
    with pytest.raises(OperationError) as ended:
        next(runs)
    assert started == [False]  # the kill run, which could only end the same, never started
    assert str(ended.value) == (
        "--kill-at checkpoint: the job ended without a checkpoint smoke could see (no "
        "`checkpoint` event; smoke --docker does not watch the checkpoint volume, only the "
        "events), so nothing was killed; save with ddpkit.save (it prints the event), or kill "
        "at a time (--kill-at 1s) or a step, or run --local, which watches its checkpoint "
        "folder"
    )


def _kill_run_outcomes(committed_before_kill: bool) -> dict[str, Outcome]:
    """A clean run and a kill run at step 2 of a ddpkit job on one node, fed as lines: the
    kill run's rank 0 called torch.save (its first save in flight) before the kill, and
    announced it complete before the kill only if ``committed_before_kill``; the restart
    started over."""
    from ddpdeploy.report import Quiet
    from ddpdeploy.smoke.backend import Line, Node, RunBackend
    from ddpdeploy.smoke.runner import RunOptions, smoke

    def lines(kill: bool) -> list[str]:
        usage = "[rank0]:PYTORCH_API_USAGE "
        ckpt = '[rank0]:{"event": "checkpoint", "step": 1, "path": "/c/ckpt-step-000000001.pt"}'
        start = '[rank0]:{"event": "start", "total_steps": 3, "restart_count": %d}'
        out = ["PYTORCH_API_USAGE torch.python.import", usage + "torch.python.import"]
        out += [usage + "c10d.process_group", start % 0, '[rank0]:{"event": "step", "step": 1}']
        out += [usage + "torch.save"]
        if committed_before_kill or not kill:
            out += [ckpt]
        out += ['[rank0]:{"event": "step", "step": 2}']
        if kill:  # the restart: a new worker, from step 0
            out += [usage + "torch.python.import", usage + "c10d.process_group", start % 1]
            out += ['[rank0]:{"event": "step", "step": 1}', usage + "torch.save", ckpt]
            out += ['[rank0]:{"event": "step", "step": 2}']
        out += ['[rank0]:{"event": "step", "step": 3}']
        out += ['[rank0]:{"event": "done", "step": 3, "weights_sha256": "ab"}']
        return out

    class OneNode(RunBackend):
        def __init__(self, kill: bool) -> None:
            super().__init__()
            self.nodes = [Node("j-worker-0", None)]
            for text in lines(kill):
                self._feed(Line("j-worker-0", "stdout" if "event" in text else "stderr", text))

        def exit_codes(self) -> dict[str, int | None]:
            return {"j-worker-0": 0}

        def tail(self, node: str) -> list[str]:
            return []

        def kill_worker(self, node: str) -> str:
            return "local rank 0 (pid 1)"

        def stop(self) -> None:
            pass

    options = RunOptions(world_size=1, kill_at=KillAt(step=2))
    return dict(smoke(OneNode, Quiet(), options))


# Found by the fifth hostile pass: the built-in trainer's own `smoke --local --nodes 1
# --kill-at 2 --steps 4` failed now and then (1 run in 7) with "the restarted workers
# started over ... although the job had saved with torch.save before the kill ... load
# the newest checkpoint": its asynchronous first save was still in flight when the kill
# struck, so there was nothing to load, and the restart rightly started over.
def test_a_save_still_in_flight_at_the_kill_is_no_progress_lost(capsys):
    from ddpdeploy.commands.smoke import _report
    from ddpdeploy.errors import OperationError

    outcomes = _kill_run_outcomes(committed_before_kill=False)
    _report(outcomes)  # green: nothing was complete to resume from
    out = capsys.readouterr().out
    assert "it started over (no checkpoint was complete before the restart)" in out, out
    with pytest.raises(OperationError, match="lost that progress"):
        _report(_kill_run_outcomes(committed_before_kill=True))


def test_an_abort_in_torchs_teardown_after_the_script_ended_is_named():
    # Found under load in CI: a ddpkit script that trained 24/24 and logged done ended with
    # "exited with code -6 (SIGABRT)" and torch's terminate line, and no word of why.
    from ddpdeploy.events import teardown_abort

    tail = ["[rank2]: step 24", "terminate called without an active exception"]
    line = teardown_abort(tail, -6)
    assert line is not None and "end the script with ddpkit.finish()" in line
    assert teardown_abort(tail, 134) == line  # the shell's 128 + 6
    assert teardown_abort(tail, 1) is None
    crashed = ["Traceback (most recent call last):", "  RuntimeError: x", tail[-1]]
    assert teardown_abort(crashed, -6) is None  # a crash, not the teardown
    assert teardown_abort([*tail, "more output"], -6) is None


# Found by the fifth outside-scripts pass: every hint said `--kill-at 20s`, which a clean run
# shorter than 20 s then refused ("not before the clean run's end").
@pytest.mark.parametrize(("wall", "hint"), [(None, "--kill-at 20s"), (14.9, "--kill-at 7s"),
                                            (1.5, "--kill-at 1s")])  # fmt: skip
def test_a_kill_time_hint_falls_inside_the_clean_run_once_it_ran(wall, hint):
    assert RunOptions(world_size=1, clean_wall=wall).time_hint() == hint
