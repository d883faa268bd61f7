"""No line of a log crashes `status` (issue 24 §3): rank 0's events read from any JSON a
script (or a forger) prints: fields of any type and size, nesting deeper than the parser
goes, non-finite numbers, stamps that are not dates. What `status` prints from them (the
table's lines, `-o json`, `-o yaml`) always writes, and `-o json` is strict JSON."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdeploy import events as events_module
from ddpdeploy.cluster.jobstate import job_state
from ddpdeploy.cluster.podlogs import quiet_line
from ddpdeploy.commands import views
from ddpdeploy.events import (
    EVENTS,
    NO_EVENTS,
    Event,
    describe,
    last_error,
    parse_event,
    progress,
    split_ranks,
    worker_lines,
)
from ddpdeploy.render.output import to_yaml

FIELDS = (
    "step", "total_steps", "loss", "samples_per_s", "step_s", "median_work_s", "slowest",
    "fastest", "stragglers", "sizes", "warnings", "busbw_gbps", "ok", "min_busbw_gbps",
    "world_size", "backend", "transport", "ranks", "hosts", "stacks", "dir", "idle_s", "run",
    "rank", "host", "work_s", "x_median", "mb", "image", "spec_sha256", "git_commit",
)  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**17, max_value=10**30),
    st.builds(lambda n: 10**n, st.integers(4301, 4400)),  # more digits than Python prints
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["\ud800", "\x1b]0;title\x07", "\u202e", "[/bold]"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=12,
)
events = st.fixed_dictionaries(
    {"event": st.sampled_from(EVENTS)},
    optional={name: values for name in FIELDS},
)


def encode(doc: object) -> str:
    # What a script's json.dumps writes: NaN and Infinity as Python spells them, big ints.
    import sys

    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return json.dumps(doc)
    finally:
        sys.set_int_max_str_digits(limit)


stamps = st.sampled_from(
    ["", "2026-01-02T03:04:05.250000000Z ", "2026-13-45T99:99:99Z ", "0000-00-00T00:00:00Z "]
)
prefixes = st.sampled_from(["", "[rank0]:", "[rank1]:"])


def shown(training) -> None:
    """`status`'s three outputs of ``training``: each writes, as UTF-8, and JSON strictly."""
    snap = (None, [], job_state(None, []))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        views.print_training(training)
        views.print_json(views.status_doc("j", "ns", snap, training))
    text = out.getvalue()
    text.encode("utf-8")
    doc = strict_loads(text[text.index("{") :])
    assert doc["training"]["lines"]
    to_yaml(views.status_doc("j", "ns", snap, training)).encode("utf-8")


def _refuse(name: str) -> None:
    raise AssertionError(f"{name} in the JSON output: strict parsers refuse it")


def strict_loads(text: str) -> object:
    """``text`` read as a strict parser (jq, serde_json, I-JSON) reads it: no NaN or
    Infinity, and no string or key that is not UTF-8 (json.loads takes a lone surrogate
    escape such as \\ud800; each string then fails to encode)."""
    doc = json.loads(text, parse_constant=_refuse)

    def walk(value: object) -> None:
        if isinstance(value, str):
            value.encode("utf-8")
        elif isinstance(value, dict):
            for key, inner in value.items():
                walk(key)
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(doc)
    return doc


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.tuples(stamps, prefixes, events), min_size=1, max_size=6))
def test_any_event_fields_make_lines_never_an_error(lines):
    raw = [f"{stamp}{prefix}{encode(event)}" for stamp, prefix, event in lines]
    got = progress(raw, now=1_800_000_000.0)
    assert all(isinstance(line, str) for line in got.lines())
    shown(got)
    for _, _, event in lines:
        line = describe(Event(event["event"], event))
        assert line is None or isinstance(line, str)


@settings(max_examples=200, deadline=None)
@given(raw=st.lists(st.text(max_size=200), max_size=5))
def test_any_raw_line_is_read_or_skipped(raw):
    shown(progress(raw, now=0.0))


@pytest.mark.parametrize(
    "line",
    [
        '{"event": "ranks", "step": 3, "slowest": "rank 3", "fastest": "x", "stragglers": "y"}',
        '{"event": "probe", "sizes": "big", "warnings": 3, "slowest": []}',
        '{"event": "hang", "ranks": 3, "hosts": [1], "stacks": [1, 2], "step": "x"}',
        '{"event": "step", "step": 2, "loss": Infinity, "samples_per_s": NaN}',
        '{"event": "start", "total_steps": 1e999}',
        '{"event": "ranks", "step_s": 1e999, "median_work_s": 1e308}',
        '{"event": "step", "step": ' + "9" * 5000 + "}",
        '{"event": "step", "step": ' + "9" * 30 + "}",
        '{"event": "start", "total_steps": ' + "9" * 30 + "}",
        '{"event": "step", "step": 1}',
        "{" * 100_000,
        '{"event": "start", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "2026-13-45T99:99:99Z " + '{"event": "step", "step": 1}',
    ],
    ids=lambda line: line[:40],
)
def test_the_hostile_lines_found(line):
    got = progress([line, '{"event": "ranks", "step_s": 5}'], now=0.0)
    shown(got)


# Each diagnostic event whose strings `status` shows, with a lone surrogate (a log's JSON
# escape "\\ud800") in each of them (cluster3 F3: json.dumps wrote "\\ud800" and jq refused
# the whole document).
SURROGATE_EVENTS = [
    '{"event": "probe", "busbw_gbps": 1.5, "transport": "\\ud800", "world": "\\udcff",'
    ' "warnings": ["\\ud800 w"], "slowest": {"rank": 1, "host": "\\ud800"}}',
    '{"event": "ranks", "step": 3, "slowest": {"rank": 1, "host": "\\ud800h"},'
    ' "stragglers": [{"rank": 1, "host": "\\udfff", "slow_by": 2.0}], "step_s": {"0": 1.0}}',
    '{"event": "hang", "idle_s": 30, "ranks": [1], "hosts": {"1": "\\ud800"},'
    ' "stacks": "\\ud800", "dir": "\\ud800/x"}',
    '{"event": "done", "step": 6, "weights_sha256": "\\ud800",'
    ' "run": {"image": "\\ud800", "git_commit": "\\udbff"}}',
]


@pytest.mark.parametrize("line", SURROGATE_EVENTS, ids=lambda line: line.split('"')[3])
def test_a_lone_surrogate_in_an_event_is_u_fffd_in_strict_json(line, capsys):
    got = progress(['{"event": "start", "total_steps": 10}', line], now=0.0)
    doc = views.status_doc("j", "ns", (None, [], job_state(None, [])), got)
    assert re.search("[\ud800-\udfff]", json.dumps(doc, ensure_ascii=False))  # it got there
    views.print_json(doc)
    out = capsys.readouterr().out
    assert not re.search(r"\\u[dD][89a-fA-F]", out)  # no surrogate escape, paired or not
    shown_lines = strict_loads(out)["training"]["lines"]  # type: ignore[index]
    assert "\ufffd" in shown_lines[-1]


def test_a_nan_loss_is_said_in_the_lines_and_null_in_json(capsys):
    got = progress(['{"event": "step", "step": 2, "loss": NaN}'], now=0.0)
    assert got.lines() == ["training: step 2, loss nan"]
    views.print_json(views.status_doc("j", "ns", (None, [], job_state(None, [])), got))
    doc = json.loads(capsys.readouterr().out, parse_constant=_refuse)
    assert doc["training"]["loss"] is None and doc["training"]["lines"] == ["step 2, loss nan"]
    assert math.isnan(yaml.safe_load(to_yaml({"loss": got.loss}))["loss"])


def test_deep_nesting_is_no_event():
    assert parse_event("{" * 100_000) is None
    assert parse_event('{"event": "step", "step": ' + "[" * 100_000) is None


# ---- with no event: what is known instead (quiet_line) -------------------------------------

FLAG_ERROR = (Path(__file__).parent / "kube" / "fixtures" / "flagerror-node0.log").read_text()


def pod(state: dict, restarts: int = 0, last: dict | None = None) -> dict:
    st = {"name": "pytorch", "state": state, "restartCount": restarts}
    if last:
        st["lastState"] = last
    return {"metadata": {"name": "j-master-0"}, "status": {"containerStatuses": [st]}}


def test_last_error_is_the_workers_last_line_not_torchruns_summary():
    assert last_error(FLAG_ERROR.splitlines()) == (
        "ddptrain: error: unrecognized arguments: --bogus-flag 3"
    )
    assert last_error(["ddpdeploy: j-master-0 did not resolve within 300s"]) == (
        "ddpdeploy: j-master-0 did not resolve within 300s"
    )
    assert last_error([]) is None


def test_last_error_and_worker_lines_split_a_partial_line_from_the_next_ranks():
    # A rank's last write without its newline: torchrun's tee runs the next rank's line on
    # from it, and each is its own rank's.
    lines = ["[rank0]:step 3", "[rank1]:loading[rank0]:[rank0]: ValueError: boom", "E agent"]
    assert last_error(lines) == "ValueError: boom"
    assert worker_lines(lines) == [(0, "step 3"), (1, "loading"), (0, "[rank0]: ValueError: boom")]
    # print() writes the text and its newline apart: the newline comes prefixed on its own.
    assert last_error(["[rank0]:ValueError: boom[rank0]:"]) == "ValueError: boom"


def test_quiet_line_says_what_the_pod_and_log_tell():
    running = pod({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
    now = 1767225600.0 + 65  # 2026-01-01T00:01:05Z
    assert quiet_line(running, "pytorch", [], [], now) == (
        "training: waiting for peers since 2026-01-01T00:00:00Z (1m05s ago) (rendezvous): "
        "no worker has started; torchrun starts them once every node has joined"
    )
    looping = pod({"waiting": {"reason": "CrashLoopBackOff"}}, 2, {"terminated": {"exitCode": 1}})
    assert quiet_line(looping, "pytorch", [], FLAG_ERROR.splitlines(), now) == (
        "training: restarting (restart 2; the last run ended with exit code 1): "
        "ddptrain: error: unrecognized arguments: --bogus-flag 3"
    )
    assert quiet_line(running, "pytorch", ["[rank0]:epoch 1"], [], now) == NO_EVENTS


# Found by the third hostile pass: a rank-0 step with "samples_per_s": 1e308 made `status`
# print a 309-digit rate, a ranks event's 9e99 work_s a 103-digit time; such a float is "?",
# as an int past 1e18 is.
@pytest.mark.parametrize("value", ["1e308", "-1e300", "1e18", "Infinity", "NaN"])
def test_an_absurd_float_is_a_question_mark_not_digits(value):
    got = progress([f'{{"event": "step", "step": 5, "samples_per_s": {value}}}'], now=0.0)
    assert got.lines() == ["training: step 5, ? samples/s"]
    ranks = (
        f'{{"event": "ranks", "step": 5, "slowest": {{"rank": 1, "work_s": {value}}}, '
        f'"fastest": {{"rank": 0, "work_s": 0.5}}, "median_work_s": 9e99}}'
    )
    line = describe(Event("ranks", json.loads(ranks)))
    assert line is not None and max(len(w) for w in line.split()) < 20, line
    assert "slowest rank 1 (?) ? ms" in line and "median ? ms" in line
    assert "500.0 ms" in line
    probe = describe(Event("probe", json.loads(f'{{"busbw_gbps": {value}}}')))
    assert probe is not None and probe.startswith("busbw ? GB/s")


def test_an_ordinary_float_still_shows():
    got = progress(['{"event": "step", "step": 5, "samples_per_s": 123.456}'], now=0.0)
    assert got.lines() == ["training: step 5, 123.5 samples/s"]


def test_a_lone_surrogate_in_an_event_is_written_by_status_o_yaml():
    # Found by the fifth hostile pass (the fast tier's hypothesis run): a log event with a
    # JSON "\\ud800" (a lone surrogate) made `status -o yaml` a UnicodeEncodeError traceback.
    got = progress(['{"event": "probe", "world_size": "\\ud800"}'], now=0.0)
    shown(got)


def test_a_probes_warnings_are_on_its_one_line_and_bounded():
    # Found by the sixth hostile pass: each warning began "\n  warning:", which every place
    # that prints the line made a run of spaces, and 5000 warnings one line of 100 KB.
    few = describe(Event("probe", {"busbw_gbps": 1.0, "warnings": ["first", "second"]}))
    assert few == "busbw 1.0 GB/s; world ?, ?; transport ?; warning: first; warning: second"
    many = describe(Event("probe", {"busbw_gbps": 1.0, "warnings": ["w"] * 5000}))
    assert many is not None and "\n" not in many
    assert many.endswith("; warning: w; warning: w; warning: w; 4997 more warnings")


def test_a_hang_of_many_ranks_names_the_first_and_counts_the_rest():
    # Found by the sixth hostile pass: a hang event naming 200,000 ranks made one 2.4 MB
    # `status` line.
    ranks = list(range(200_000))
    line = describe(Event("hang", {"step": 7, "idle_s": 60, "ranks": ranks, "hosts": {}}))
    assert line is not None and len(line) < 1000
    assert "ranks that did not arrive: 0 (?), 1 (?)" in line
    assert "15 (?) and 199984 more;" in line


class _CountingDecoder(json.JSONDecoder):
    calls = 0

    def raw_decode(self, s: str, idx: int = 0) -> tuple[object, int]:
        type(self).calls += 1
        return super().raw_decode(s, idx)


@pytest.mark.parametrize("piece", ["[rank0]:{a", '[rank1]:{"a', "[rank0]:{}"])
def test_a_line_of_many_prefixes_opening_braces_is_tried_for_an_event_a_few_times(
    monkeypatch, piece
):
    # Found by the cluster2 pass: every prefix read the rest of the line as JSON (a copy of
    # it, and json's error scans back to the start): `status` took 16 s on a 2.25 MB line.
    monkeypatch.setattr(events_module, "_DECODER", _CountingDecoder())
    monkeypatch.setattr(_CountingDecoder, "calls", 0)
    parts = split_ranks(piece * 20_000)
    assert len(parts) == 20_000 and _CountingDecoder.calls <= 16
    assert parts[1] == (int(piece[5]), piece[8:])


def test_an_event_after_glued_partial_lines_is_still_one_line():
    event = '{"event": "step", "step": 3, "note": "[rank1]:inside"}'
    line = "[rank1]:{partial[rank2]:{another[rank0]:" + event
    assert split_ranks(line) == [(1, "{partial"), (2, "{another"), (0, event)]
