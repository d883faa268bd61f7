"""The cluster commands' views (ddpdeploy.commands.views) with hostile text in pod status:
markup is shown, not parsed; escapes never reach the terminal; a big job is a summary."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from ddpdeploy.cluster.jobstate import job_state
from ddpdeploy.commands import views
from ddpdeploy.errors import OperationError
from ddpdeploy.events import Progress
from ddpdeploy.render.output import to_yaml

ESC = "\x1b"
REASON = f"[/bold]{ESC}]0;pwned{ESC}\\{ESC}[2J"
MESSAGE = "containers with unready status: [pytorch]"


def job(kind: str = "PyTorchJob", api: str = "kubeflow.org/v1") -> dict:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "j", "namespace": "ns"}}


def pod(name: str, phase: str = "Pending", reason: str | None = None, message: str = "") -> dict:
    status: dict = {"phase": phase}
    if reason:
        waiting = {"waiting": {"reason": reason, "message": message}}
        status["containerStatuses"] = [{"name": "pytorch", "image": "i:1", "state": waiting}]
    labels = {"training.kubeflow.org/replica-type": "master"}
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def snap(pods: list[dict]) -> tuple:
    j = job()
    return j, pods, job_state(j, pods)


def shown(renderable) -> str:
    console = Console(width=300, color_system="truecolor", force_terminal=True)
    with console.capture() as got:
        console.print(renderable)
    return got.get()


def test_markup_and_escapes_in_a_waiting_reason_are_text():
    s = snap([pod("j-master-0", reason=REASON, message=MESSAGE)])
    out = shown(views.table("j", s))  # a MarkupError here was the bug
    assert "[/bold]" in out and "[pytorch]" in out
    assert "pwned" not in out and "[2J" not in out  # the OSC and the CSI are gone whole
    # The only escapes left are rich's own styling of the table (SGR: ESC [ ... m).
    assert all(part[:1] == "[" and "m" in part for part in out.split(ESC)[1:])


@given(reason=st.text(), message=st.text(), name=st.text(min_size=1))
def test_any_pod_status_text_is_shown_as_one_plain_row(reason, message, name):
    s = snap([pod(name, reason=reason or "r", message=message)])
    out = shown(views.table("j", s))  # never a MarkupError
    lines = views._lines("j", s, views.MAX_ROWS)
    assert len(lines) == 2 and all(ESC not in line and "\n" not in line for line in lines)
    assert all(part[:1] == "[" and "m" in part for part in out.split(ESC)[1:])


def test_the_line_view_off_a_terminal_is_plain(capsys):
    with views.WaitView("j", live=False) as view:
        view(snap([pod("j-master-0", reason=REASON, message=MESSAGE)]))
    err = capsys.readouterr().err
    assert ESC not in err and "[/bold]" in err and "[pytorch]" in err
    assert view.last is not None and view.last[2].state == "Pending"


def test_the_status_document_keeps_the_text_and_json_escapes_it():
    doc = views.status_doc("j", "ns", snap([pod("j-master-0", reason=REASON, message=MESSAGE)]))
    text = json.dumps(doc)
    assert ESC not in text and "\\u001b" in text
    assert json.loads(text)["pods"][0]["detail"].startswith(REASON)


@pytest.mark.parametrize(
    "training",
    [
        Progress(events=2, step=5, total_steps=10, loss=0.5, probe="busbw 1", run="image x"),
        Progress(quiet="training: waiting for peers since 2026-01-01T00:00:00Z"),
        "training: cannot read rank 0's log: forbidden",
    ],
    ids=["events", "quiet", "error"],
)
def test_the_status_document_says_training_once(training):
    # Found by the fourth hostile pass (left open then): `status -o yaml` showed a
    # `training:` section whose lines (and quiet or error field) began `training:` again.
    doc = views.status_doc("j", "ns", snap([]), training)
    text = to_yaml(doc)
    assert text.count("training:") == 1, text
    assert json.loads(json.dumps(doc)) == yaml.safe_load(text)  # -o json: the same document
    section = doc["training"]
    if isinstance(training, Progress):
        assert section["lines"][0] == training.lines()[0].removeprefix("training: ")
        assert section["lines"][1:] == training.lines()[1:]


def test_a_big_job_waits_as_a_summary_naming_the_stuck_pods():
    pods = [pod(f"j-worker-{i}", phase="Running") for i in range(127)]
    pods.append(pod("j-worker-127", reason="ImagePullBackOff", message="no such image"))
    out = shown(views.table("j", snap(pods), max_rows=views.MAX_ROWS))
    assert len(out.splitlines()) < 12
    assert "127" in out and "j-worker-127" in out and "j-worker-5 " not in out
    lines = views._lines("j", snap(pods), views.MAX_ROWS)
    assert len(lines) == 3 and "j-worker-127" in lines[2]


def test_the_list_table_shows_names_as_text():
    row = {"name": "[red]j", "kind": "Job", "namespace": "ns", "state": "Running", "age": "1m"}
    out = shown(views.list_table([{**row, "nodes": 2, "gpus": 0}]))
    assert "[red]j" in out and "2×0" in out


@pytest.mark.parametrize(
    "show",
    [
        lambda: views.log_line("a line"),
        lambda: views.print_json({"a": 1}),
        lambda: views.print_out(views.list_table([])),
    ],
    ids=["log-line", "json", "table"],
)
def test_a_full_stdout_is_one_operation_error(monkeypatch, show):
    # A fresh /dev/full each time: after the error the writer points the fd at /dev/null.
    with open("/dev/full", "w") as full:
        monkeypatch.setattr("sys.stdout", full)
        with pytest.raises(OperationError) as err:
            show()
    assert str(err.value) == "cannot write to standard output: No space left on device"
