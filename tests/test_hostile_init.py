"""The first minutes of a new user (issue 24 §5): `init --script X` writes a live checkpoint
volume (the own-script docs start from one) and a job name derived from the script, saying
what it chose in its one line; `smoke --help` shows how a script's arguments are passed."""

from __future__ import annotations

import re

import pytest
from cli_runner import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdeploy.commands.init import derived_name, starter
from ddpdeploy.spec import load_spec
from ddpdeploy.spec.fields import _DNS1035


@pytest.mark.parametrize(
    ("flag", "value", "name"),
    [
        ("--script", "train.py", "train"),
        ("--script", "src/Train_BERT-v2.py", "train-bert-v2"),
        ("--script", "9lives.py", "job-9lives"),
        ("--module", "pkg.train_it", "pkg-train-it"),
    ],
)
def test_init_for_a_script_names_the_job_and_gives_it_a_volume(tmp_path, flag, value, name):
    res = run_cli("init", flag, value, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    spec = load_spec(tmp_path / "ddpdeploy.yaml")
    assert spec.name == name
    assert spec.checkpoint is not None and spec.checkpoint.size == "20Gi"
    assert spec.checkpoint.mount_path == "/checkpoints"
    (line,) = res.stderr.strip().splitlines()
    what = "script" if flag == "--script" else "module"
    assert line.startswith(
        f"wrote ddpdeploy.yaml for your {what} {value}: job name {name} (from its name), "
        "a 20Gi checkpoint volume at /checkpoints ($DDPDEPLOY_CHECKPOINT_DIR)"
    ), line
    rendered = run_cli("render", "--image", "r.invalid/t:1", cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    assert f"claimName: {name}-checkpoints" in rendered.stdout


def test_the_built_in_trainers_starter_is_unchanged(tmp_path):
    assert run_cli("init", cwd=tmp_path).returncode == 0
    spec = load_spec(tmp_path / "ddpdeploy.yaml")
    assert spec.name == "ddp-train" and spec.checkpoint is None


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=120))
def test_any_script_name_makes_a_valid_job_name(base):
    name = derived_name(base, module=False)
    assert re.fullmatch(_DNS1035, name) and len(name) <= 40, name


@settings(max_examples=60, deadline=None)
# A leading '-' is refused (torchrun would read it as its own option): its own test.
@given(st.from_regex(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,79}\.py", fullmatch=True))
def test_the_starter_for_any_script_is_a_valid_spec(tmp_path_factory, script):
    from ddpdeploy.spec import JobSpec
    from ddpdeploy.spec import load as specfile

    text = starter(script=script)
    doc = specfile.resolve(specfile.parse(text), JobSpec)
    spec = JobSpec.model_validate(doc)
    assert spec.command.script == script and spec.checkpoint is not None


def test_smoke_help_shows_a_scripts_arguments_after_the_double_dash():
    res = run_cli("smoke", "--help")
    assert res.returncode == 0
    assert "Example: ddpdeploy smoke --local" in res.stdout
    assert "ddpdeploy smoke --local --nodes 2 -- --epochs 1 --lr 0.1" in res.stdout


@pytest.mark.parametrize("flags", [(), ("--script", "train.py")])
def test_the_starter_keeps_the_restart_safe_default(tmp_path, flags):
    """The starter writes the spec's own default rendezvous (c10d): it wrote `mode: static`,
    the one mode in which a plain script's restart fails, into every new ddpdeploy.yaml."""
    from ddpdeploy.spec import JobSpec

    assert run_cli("init", *flags, cwd=tmp_path).returncode == 0
    spec = load_spec(tmp_path / "ddpdeploy.yaml")
    assert spec.rendezvous.mode == JobSpec().rendezvous.mode == "c10d"


def test_a_script_name_with_a_bidi_override_or_escape_is_shown_plain(tmp_path):
    # Found by the spec3 pass: init printed U+202E as typed, which turns the rest of the
    # terminal line around ("wrote ddpdeploy.yaml for your script yp.txt…").
    name = "a\u202etxt.py"
    (tmp_path / name).write_text("print(1)\n")
    res = run_cli("init", "--script", name, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "\u202e" not in res.stderr and "\x1b" not in res.stderr
    assert "script a\ufffdtxt.py" in res.stderr
