"""The CLI as users run it: real files, real exit codes. What depends on the process (the
same bytes from two interpreters, a full stdout, what rendering imports, the exit code and
stderr of a refusal, --version and --help) runs in a fresh interpreter (run_cli); the many
cases of a behaviour run through cli.main in this process (run_main)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_runner import run_cli, run_cli_into, run_main

ARGS = ["render", "--image", "ghcr.io/t/train:v1", "--nodes", "2", "--gpus", "8"]


def test_render_yaml_is_deterministic_and_parses():
    first = run_cli(*ARGS, "--", "--steps", "100")
    second = run_cli(*ARGS, "--", "--steps", "100")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    policy, job = list(yaml.safe_load_all(first.stdout))
    assert (policy["kind"], job["kind"]) == ("NetworkPolicy", "PyTorchJob")
    cmd = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert cmd[-2:] == ["--steps", "100"]


def test_training_args_after_double_dash_may_look_like_anything():
    res = run_main(*ARGS, "--", "deploy/", "--", "--nodes", "3")
    assert res.returncode == 0, res.stderr
    *_, job = list(yaml.safe_load_all(res.stdout))
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2  # --nodes 2 held
    cmd = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert cmd[-4:] == ["deploy/", "--", "--nodes", "3"]


def test_stdout_write_error_is_one_line_exit_1(tmp_path):
    res = run_cli_into("/dev/full", *ARGS, cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr == "error: cannot write to standard output: No space left on device\n"


@pytest.fixture
def spec_with_pvc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "job.yaml"
    path.write_text("name: j\ncheckpoint: {size: 10Gi}\n")
    return path


def test_render_json_lists_several_objects(spec_with_pvc):
    out = run_main("render", "--image", "t:1", "-o", "json", "-f", str(spec_with_pvc))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["kind"] == "List"
    kinds = [o["kind"] for o in doc["items"]]
    assert kinds == ["PersistentVolumeClaim", "NetworkPolicy", "PyTorchJob"]


def test_out_dir_writes_kustomize_folder(tmp_path, spec_with_pvc):
    out = tmp_path / "deploy"
    res = run_main("render", "--image", "t:1", "-f", str(spec_with_pvc), "--out-dir", str(out))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        ".ddpdeploy-render.sha256",
        "kustomization.yaml",
        "networkpolicy-j.yaml",
        "persistentvolumeclaim-j-checkpoints.yaml",
        "pytorchjob-j.yaml",
    ]
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert kustomization["resources"] == [
        "persistentvolumeclaim-j-checkpoints.yaml",
        "networkpolicy-j.yaml",
        "pytorchjob-j.yaml",
    ]
    job = yaml.safe_load((out / "pytorchjob-j.yaml").read_text())
    assert job["metadata"]["name"] == "j"
    # Rendering again without the PVC removes the file ddpdeploy wrote for it.
    res = run_main("render", "--image", "t:1", "--name", "j", "--out-dir", str(out))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        ".ddpdeploy-render.sha256",
        "kustomization.yaml",
        "networkpolicy-j.yaml",
        "pytorchjob-j.yaml",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["deploy"]  # no temp files left


def test_failed_render_leaves_out_dir_as_it_was(tmp_path):
    out = tmp_path / "deploy"
    assert run_main("render", "--image", "t:1", "--out-dir", str(out)).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    res = run_main("render", "--image", "t:1", "--nodes", "0", "--out-dir", str(out))
    assert res.returncode == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    fresh = tmp_path / "fresh"
    res = run_main("render", "--out-dir", str(fresh))  # no image: refused before writing
    assert res.returncode == 2 and not fresh.exists()


def test_out_dir_never_overwrites_a_file_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "kustomization.yaml").write_text("resources: [mine.yaml]\n")
    res = run_main("render", "--image", "t:1", "--out-dir", str(tmp_path))
    assert res.returncode == 2
    assert "kustomization.yaml exists and ddpdeploy did not write it" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kustomization.yaml", "notes.txt"]
    assert (tmp_path / "kustomization.yaml").read_text() == "resources: [mine.yaml]\n"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["render", "--image", "t:1", "--nodes", "0"], "--nodes: must be greater than"),
        (["render", "--image", "t:1", "--nodes", "two"], "Invalid value for '--nodes'"),
        (["render", "--image", "t:1", "--name", "Bad"], "--name: must be a DNS-1035 label"),
        (["render", "--image", "t:1", "--elastic", "4:2"], "--elastic: minNodes (4)"),
        (["render", "--image", "t:1", "-f", "/nonexistent.yaml"], "-f/--file:"),
        (["render", "--image", "t:1", "--bogus"], "No such option: --bogus"),
        (["render"], "image: required to render manifests"),
        (
            ["render", "--image", "t:1", "-o", "xml"],
            "Invalid value for '-o' / '--output': 'xml' is not one of 'yaml', 'json'",
        ),
        # Checked by Typer before any connection: each command lists its own formats.
        (["status", "j", "-o", "xml"], "'xml' is not one of 'table', 'json', 'yaml'"),
        (["list", "-o", "yaml"], "'yaml' is not one of 'table', 'json'"),
        (["render", "--image", "t:1", "deploy/"], "unexpected argument 'deploy/' before `--`"),
        (["render", "--image", "t:1", "x", "--", "y"], "unexpected argument 'x' before `--`"),
        (["render", "--image", "t:1", "--out-dir", ""], "--out-dir: empty"),
        (["nosuchcommand"], "No such command"),
    ],
)
def test_bad_input_one_line_exit_2_no_traceback(args, expected, tmp_path):
    res = run_main(*args, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ") and expected in lines[0]
    assert list(tmp_path.iterdir()) == []


KUBECONFIG_NOWHERE = """
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


@pytest.mark.parametrize("namespace", ["H4-A", "h4-a/../x", "a_b", "-x", "x" * 64])
@pytest.mark.parametrize(
    "command",
    [["status", "j"], ["down", "j"], ["logs", "j"], ["list"], ["resume", "j"], ["collect", "j"]],
)
def test_a_bad_namespace_is_bad_input_before_any_request(command, namespace, tmp_path):
    # Found by the third hostile pass: `-n H4-A` reached the API and came back as "no job
    # ... in namespace H4-A" (exit 1). The kubeconfig's server answers nothing: a request
    # made would fail otherwise.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG_NOWHERE)
    res = run_main(*command, "-n", namespace, cwd=tmp_path, env={"KUBECONFIG": str(kubeconfig)})
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: Invalid value for '-n' / '--namespace': ")
    assert "must be a DNS-1123 label" in lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["render", "--image", "t:1", "--nodes", "two"], "Invalid value for '--nodes'"),
        (["render"], "image: required to render manifests"),
    ],
    ids=["usage-error", "spec-error"],
)
def test_bad_input_in_a_fresh_interpreter_is_one_line_exit_2(args, expected, tmp_path):
    """The cases above, as a shell sees them: a usage error of the parser and a refusal of
    the spec, each exit 2, one line on stderr, nothing on stdout, no traceback."""
    res = run_cli(*args, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ") and expected in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_unknown_key_and_yaml_error_in_file(tmp_path):
    (tmp_path / "ddpdeploy.yaml").write_text("nodes: 2\nnodez: 3\n")
    res = run_main("render", "--image", "t:1", cwd=tmp_path)
    assert res.returncode == 2 and "unknown field 'nodez'" in res.stderr
    (tmp_path / "ddpdeploy.yaml").write_text("nodes: 2\n  bad: indent\n")
    res = run_main("render", "--image", "t:1", cwd=tmp_path)
    assert res.returncode == 2 and "ddpdeploy.yaml:2:6: YAML syntax error" in res.stderr


def test_init_writes_a_valid_starter_and_refuses_to_overwrite(tmp_path):
    res = run_main("init", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    starter = (tmp_path / "ddpdeploy.yaml").read_text()
    assert "# " in starter  # commented
    res = run_main("render", "--image", "t:1", cwd=tmp_path)  # the starter itself validates
    assert res.returncode == 0, res.stderr
    (tmp_path / "ddpdeploy.yaml").write_text("name: mine\n")
    res = run_main("init", cwd=tmp_path)
    assert res.returncode == 2 and "--force" in res.stderr
    assert (tmp_path / "ddpdeploy.yaml").read_text() == "name: mine\n"
    assert run_main("init", "--force", cwd=tmp_path).returncode == 0
    assert (tmp_path / "ddpdeploy.yaml").read_text() == starter


@pytest.mark.parametrize(
    ("command", "shows"), [("render", "kind: PyTorchJob"), ("compose", "driver: nvidia")]
)
def test_rendering_imports_no_heavy_module(tmp_path, command, shows):
    code = (
        "import sys\n"
        "from ddpdeploy.cli import main\n"
        "try:\n"
        f"    main([{command!r}, '--image', 't:1', '--nodes', '2', '--gpus', '8'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = [m for m in ('torch', 'kubernetes', 'docker') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
    )
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "HEAVY=\n" in res.stderr
    assert shows in res.stdout


def test_version_and_help_examples():
    res = run_cli("--version")
    assert res.returncode == 0 and res.stdout.startswith("ddpdeploy ")
    top = run_cli("--help")
    assert top.returncode == 0
    from ddpdeploy.cli import COMMANDS

    for name in COMMANDS:
        assert name in top.stdout
        res = run_main(name, "--help")  # each command's help: parsing only
        assert res.returncode == 0
        assert "Example: ddpdeploy" in res.stdout, name


def test_tab_lists_the_commands_without_loading_them():
    """Shell completion runs the program on every Tab: listing the commands reads the table
    only (no command module, no pydantic, which typer's option coercion would import)."""
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from ddpdeploy.__main__ import run\n"
        "sys.argv = ['ddpdeploy']\n"
        "try:\n"
        "    run()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "loaded = [m for m in sys.modules\n"
        "          if m == 'pydantic' or m.startswith('ddpdeploy.commands.')]\n"
        "print('LOADED=' + ','.join(loaded), file=sys.stderr)\n"
    )
    env = {**os.environ, "_DDPDEPLOY_COMPLETE": "complete_bash", "COMP_WORDS": "ddpdeploy re"}
    env["COMP_CWORD"] = "1"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["render", "resume"]
    assert "LOADED=\n" in res.stderr


@pytest.mark.parametrize("timeout", ["0", "0s", "0.0m"])
def test_up_refuses_a_timeout_of_no_time_before_anything_is_made(tmp_path, timeout):
    # Found by the fifth hostile pass: `up --wait --timeout 0` made the job, then "timed
    # out after 0s waiting for PyTorchJob ..." at once, exit 1 (`collect --timeout 0` is
    # refused as bad input).
    env = {"KUBECONFIG": str(tmp_path / "none")}  # refused before any kubeconfig is read
    out = run_main("up", "--image", "r.invalid/t:1", "--timeout", timeout, cwd=tmp_path, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        f"error: --timeout: '{timeout}' is no time to wait; give a duration above 0 (90s, "
        "15m), or leave --timeout out for 2m\n"
    )
