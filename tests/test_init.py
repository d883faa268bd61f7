"""`ddpdeploy init`: the starter for the built-in trainer leaves `args` commented out, and
`--script`/`--module` write a spec for the user's own code; bad entries are one line."""

from __future__ import annotations

import pytest
from cli_runner import run_main

from ddpdeploy.spec import load_spec


def test_default_starter_passes_no_arguments(tmp_path):
    assert run_main("init", cwd=tmp_path).returncode == 0
    command = load_spec(tmp_path / "ddpdeploy.yaml").command
    assert command.builtin and command.args == []
    assert '# args: ["--steps", "100"]' in (tmp_path / "ddpdeploy.yaml").read_text()


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [("--script", "src/train.py", "script"), ("--module", "pkg.train", "module")],
)
def test_init_for_a_script_or_module(tmp_path, flag, value, field):
    res = run_main("init", flag, value, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    spec = load_spec(tmp_path / "ddpdeploy.yaml")
    assert getattr(spec.command, field) == value and spec.command.args == []
    assert not spec.command.builtin
    # The rendered job runs it as the cluster would.
    shown = run_main("render", "--image", "t:1", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert value in shown.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--script", "a.py", "--module", "b"], "error: --script/--module: give one of them"),
        (["--module", "a b"], "error: --module: module 'a b' is not a dotted Python module"),
        (["--script", "../up.py"], "error: --script: '../up.py' leaves the workspace"),
    ],
)
def test_bad_entries_are_one_line_and_write_nothing(tmp_path, args, message):
    res = run_main("init", *args, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith(message) and res.stderr.count("\n") == 1, res.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_file_made_between_the_check_and_the_write_is_not_replaced(tmp_path, monkeypatch):
    # Found by the second hostile pass: two `init` at once (or an editor saving meanwhile)
    # both said "wrote ddpdeploy.yaml" without --force; the file held one of them.
    from ddpdeploy.commands import init

    checked = init._check_target

    def then_someone_writes(path, force):
        checked(path, force)
        if path.name == "ddpdeploy.yaml":
            path.write_text("name: theirs\n")

    monkeypatch.setattr(init, "_check_target", then_someone_writes)
    out = run_main("init", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr == "error: ddpdeploy.yaml exists; pass --force to overwrite it\n"
    assert (tmp_path / "ddpdeploy.yaml").read_text() == "name: theirs\n"
    # The schema stays: the other init wrote the same one and its file points at it.
    assert (tmp_path / ".ddpdeploy.schema.json").is_file()
