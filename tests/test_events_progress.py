"""The pure reading of a running job's progress from rank 0's log (events.py): what
`status` and `up --follow` show, from real lines (tests/kube/fixtures, a real 2x2 run)."""

from __future__ import annotations

from pathlib import Path

from ddpdeploy.events import probe_line, progress, run_short, split_timestamp

FIXTURES = Path(__file__).resolve().parent / "kube" / "fixtures"
NODE0 = (FIXTURES / "run2x2-node0.log").read_text().splitlines()
HANG = (FIXTURES / "hang-node0.log").read_text().splitlines()


def stamped(lines: list[str], t0: float = 1_000_000.0, every: float = 1.0) -> list[str]:
    """As the kubelet gives them with timestamps=true (RFC 3339, nanoseconds, UTC)."""
    import datetime

    def rfc(t: float) -> str:
        dt = datetime.datetime.fromtimestamp(t, datetime.timezone.utc)
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond:06d}123Z"

    return [f"{rfc(t0 + i * every)} {line}" for i, line in enumerate(lines)]


def test_split_timestamp_reads_the_kubelets_stamp():
    assert split_timestamp("2026-01-02T03:04:05.250000000Z [rank0]:x") == (
        1767323045.25,
        "[rank0]:x",
    )
    assert split_timestamp("2026-01-02T04:04:05+01:00 y") == (1767323045.0, "y")
    assert split_timestamp("[rank0]:no stamp") == (None, "[rank0]:no stamp")


def test_progress_mid_run_step_eta_loss_checkpoint():
    upto = next(i for i, t in enumerate(NODE0) if '"step": 4,' in t)
    lines = stamped(NODE0[: upto + 1])
    got = progress(lines, now=1_000_000.0 + upto + 30)
    assert (got.step, got.total_steps, got.done) == (4, 6, False)
    assert got.loss is not None and round(got.loss, 3) == -1.6 and got.samples_per_s == 128.0
    step1 = next(i for i, t in enumerate(NODE0) if '"step": 1,' in t)
    rate = (upto - step1) / 3  # seconds a step, steps 1-4 a line a second apart
    assert got.eta_s is not None and abs(got.eta_s - 2 * rate) < 1e-6
    ckpt = next(i for i, t in enumerate(NODE0) if '"checkpoint"' in t)
    assert got.checkpoint_step == 3 and got.checkpoint_age_s is not None
    assert abs(got.checkpoint_age_s - (upto + 30 - ckpt)) < 1e-3
    assert got.probe and got.probe.startswith("busbw 0.533 GB/s")
    assert got.ranks and "straggler: rank 3 (vm) 1.6x, rank 2 (vm) 1.2x" in got.ranks
    assert got.lines()[0] == "training: step 4/6, ETA 3s, loss -1.6, 128.0 samples/s"
    assert got.lines()[1] == f"last checkpoint: step 3, {upto + 30 - ckpt}s ago"


def test_progress_done_with_its_run_record():
    got = progress(NODE0)  # no timestamps: no ETA, no age
    assert (got.step, got.done, got.eta_s, got.checkpoint_age_s) == (6, True, None, None)
    assert got.run == "image registry.example/train:v1, spec 3f5a9c0e1d2b, git 64a6f7540b0a"
    assert got.lines()[0] == "training: step 6/6 (done), loss -2.4, 128.0 samples/s"
    assert "last checkpoint: step 6" in got.lines()


def test_progress_of_a_hang():
    got = progress(HANG)
    assert got.hang == (
        "hung at step 4 (no step for 3.8 s): ranks that did not arrive: 3 (vm); "
        "stacks of 4 rank(s) in /checkpoints"
    )
    assert got.hang in got.lines() and got.step == 3


def test_only_rank0s_events_count_and_none_is_one_line():
    other = ['[rank2]:{"event": "step", "step": 99}', "[rank1]:epoch 1", "plain agent line"]
    got = progress(other)
    assert got.events == 0 and got.step is None
    assert got.lines() == ["no training events in rank 0's log (a script without ddpkit.log)"]
    started = progress(['{"event": "start", "total_steps": 10}'])
    assert started.lines() == ["training: started, no step yet"]


def test_a_restart_starts_the_rate_over():
    lines = [
        '[rank0]:{"event": "start", "total_steps": 10}',
        '[rank0]:{"event": "step", "step": 5}',
        '[rank0]:{"event": "start", "total_steps": 10}',
        '[rank0]:{"event": "step", "step": 4}',
        '[rank0]:{"event": "step", "step": 6}',
    ]
    got = progress(stamped(lines, every=10.0))
    assert got.step == 6 and got.eta_s == 4 * 5.0  # 10 s for 2 steps after the restart


def test_run_short_and_probe_line():
    assert run_short({}) == "no image, spec or git recorded"
    assert run_short({"git_commit": "a" * 40, "git_dirty": True}) == f"git {'a' * 12} (dirty)"
    probe = next(t for t in NODE0 if '"probe"' in t)
    assert (line := probe_line(probe)) and line.startswith("busbw 0.533 GB/s; per size")
    assert probe_line(probe.replace("[rank0]", "[rank1]")) is None
    assert probe_line(NODE0[-1]) is None


def test_rank0s_events_run_on_from_another_ranks_partial_line_still_count():
    # torchrun's tee writes a rank's partial last line as it is, and the next rank's line
    # runs on from it: rank 0's event there is rank 0's, not rank 1's text.
    lines = [
        '[rank0]:{"event": "start", "total_steps": 10}',
        '[rank1]:loading 50%[rank0]:{"event": "step", "step": 3}',
        # print() writes the text and its newline apart: the newline is prefixed too.
        '[rank0]:{"event": "checkpoint", "step": 3, "path": "/c"}[rank0]:',
    ]
    got = progress(lines)
    assert (got.events, got.step, got.checkpoint_step) == (3, 3, 3)
    assert progress(['[rank0]:x[rank2]:{"event": "step", "step": 9}']).events == 0
    probe = next(t for t in NODE0 if '"probe"' in t)
    assert (line := probe_line(f"[rank1]:partial{probe}")) and line.startswith("busbw 0.533")
