"""A kubeconfig the client cannot use ends in one line naming the file (no traceback, no
`ERROR:root:` from the client's logging); a failing exec credential plugin is named as such.
No apiserver needed: each fails while loading the kubeconfig, before any request."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_runner import run_cli, run_main

from ddpdeploy.adapters.kube import KUBECONFIG_LIMIT

ROOT = Path(__file__).resolve().parents[1]


def status(kubeconfig: Path, tmp_path: Path, *more: str, run=run_cli):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "KUBECONFIG": ""}
    return run("status", "ddp-train", "--kubeconfig", str(kubeconfig), *more, env=env)


def one_line(out) -> str:
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "ERROR:" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


# A file that is not a kubeconfig mapping is refused by ddpdeploy's own read of it, before
# the client is asked: those cases run through cli.main here. One the client trips over
# (`users: 5`) runs in a fresh interpreter, where the client's logging would reach stderr.
@pytest.mark.parametrize(
    ("text", "expected", "run"),
    [
        ("- a\n- b\n", "holds a list, not a kubeconfig mapping", run_main),
        ("just words\n", "holds a string, not a kubeconfig mapping", run_main),
        ("42\n", "holds a number, not a kubeconfig mapping", run_main),
        ("clusters: [\n", "is not valid YAML at line 2", run_main),
        ("a: b\n\tc: d\n", "is not valid YAML at line 2", run_main),
        ("apiVersion: v1\nusers: 5\nclusters: [a]\n", "is malformed", run_cli),
    ],
    ids=["list", "string", "number", "yaml-open", "yaml-tab", "malformed"],
)
def test_unusable_kubeconfig_is_one_line_naming_it(tmp_path, text, expected, run):
    config = tmp_path / "config"
    config.write_text(text)
    line = one_line(status(config, tmp_path, run=run))
    assert expected in line and str(config) in line


def test_a_missing_kubeconfig_flag_is_named(tmp_path):
    # Found by the second hostile pass: the client's "Invalid kube-config file. No
    # configuration found." did not say that the file named is not there.
    out = status(tmp_path / "nope", tmp_path, run=run_main)
    assert out.returncode == 2 and out.stderr == (
        f"error: --kubeconfig {tmp_path / 'nope'}: no such file; point --kubeconfig at one\n"
    )


def test_kubeconfig_from_env_is_named_too(tmp_path):
    config = tmp_path / "config"
    config.write_text("- a\n")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "KUBECONFIG": str(config)}
    line = one_line(run_main("list", env=env))
    assert f"kubeconfig {config} holds a list" in line


def exec_kubeconfig(tmp_path: Path, server: str, script: str) -> Path:
    plugin = tmp_path / "plugin.sh"
    plugin.write_text(script)
    plugin.chmod(0o755)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    return path


def test_failing_exec_plugin_is_named_not_the_network(tmp_path):
    # Port 1 refuses: before, the plugin's failure was a stray log line and the command went
    # on without credentials (to "cannot reach", or RBAC's system:anonymous).
    script = "#!/bin/sh\necho 'token expired: run my-login' >&2\nexit 1\n"
    line = one_line(status(exec_kubeconfig(tmp_path, "https://127.0.0.1:1", script), tmp_path))
    assert "exec credential plugin failed" in line
    assert "token expired: run my-login" in line
    assert "cannot reach" not in line


def test_exec_plugin_with_no_token_in_its_output(tmp_path):
    script = (
        '#!/bin/sh\necho \'{"apiVersion": "client.authentication.k8s.io/v1beta1", '
        '"kind": "ExecCredential", "status": {}}\'\n'
    )
    line = one_line(status(exec_kubeconfig(tmp_path, "https://127.0.0.1:1", script), tmp_path))
    assert "exec credential plugin failed (exec: missing token" in line


def test_unreachable_server_is_one_line_without_the_clients_retry_warning(tmp_path):
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    # urllib3's "Retrying" warning reaches stderr once anything put a handler on the root
    # logger (the client's logging.error does): held now, it must stay out of the line.
    line = one_line(status(path, tmp_path))
    assert line.startswith("error: connecting: cannot reach the Kubernetes API at https://")


def _capped() -> None:
    # Without the size check the client read /dev/zero until the OOM killer came: a cap on
    # the child's memory makes that a quick failure here instead.
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def fresh(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m ddpdeploy ARGS` in a fresh interpreter, its memory capped; a FIFO that
    hangs it ends in TimeoutExpired (the child killed), failing the test."""
    return subprocess.run(
        [sys.executable, "-m", "ddpdeploy", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_capped,
    )


def not_a_kubeconfig(tmp_path: Path, kind: str) -> Path:
    if kind == "device":
        return Path("/dev/zero")
    if kind == "folder":
        return tmp_path
    path = tmp_path / kind
    if kind == "FIFO":
        os.mkfifo(path)
    else:  # one byte past the limit; real kubeconfigs are KBs
        with path.open("wb") as out:
            out.truncate(KUBECONFIG_LIMIT + 1)
    return path


SAYS = {
    "device": "is not a regular file (a device)",
    "FIFO": "is not a regular file (a FIFO)",
    "folder": "is not a regular file (a folder)",
    "huge": "is larger than 4 MiB; is it a kubeconfig?",
}
FIX = {
    "--kubeconfig": "; point --kubeconfig at a kubeconfig file",
    "KUBECONFIG": "; fix KUBECONFIG or pass --kubeconfig FILE",
}


@pytest.mark.parametrize("kind", list(SAYS))
def test_a_kubeconfig_flag_that_is_no_regular_file_or_huge_is_one_line(tmp_path, kind):
    # Found by the third hostile pass: --kubeconfig /dev/zero was read until the process was
    # OOM-killed, a FIFO hung status forever, and a 50 MB file took more than 90 s.
    path = not_a_kubeconfig(tmp_path, kind)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "KUBECONFIG": ""}
    res = fresh("status", "ddp-train", "--kubeconfig", str(path), env=env)
    fix = "" if kind == "huge" else FIX["--kubeconfig"]
    assert res.returncode == 2, res.stderr[-500:]
    assert res.stderr == f"error: --kubeconfig: {path} {SAYS[kind]}{fix}\n"


@pytest.mark.parametrize("kind", ["device", "FIFO", "huge"])
def test_every_path_in_the_kubeconfig_variable_is_checked(tmp_path, kind):
    # The same through KUBECONFIG, which may list several files (empty entries skipped, as
    # the client does); `logs` here: every cluster verb loads the kubeconfig in one place.
    good = exec_kubeconfig(tmp_path, "https://127.0.0.1:1", "#!/bin/sh\nexit 1\n")
    path = not_a_kubeconfig(tmp_path, kind)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "KUBECONFIG": f"{good}::{path}"}
    res = fresh("logs", "ddp-train", env=env)
    fix = "" if kind == "huge" else FIX["KUBECONFIG"]
    assert res.returncode == 2, res.stderr[-500:]
    assert res.stderr == f"error: KUBECONFIG: {path} {SAYS[kind]}{fix}\n"


def contexts_kubeconfig(tmp_path: Path, count: int, current: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": f"ctx{i}", "context": {"cluster": "c", "user": "u"}} for i in range(count)
        ],
        "current-context": current,
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_context_not_in_the_kubeconfig_names_those_that_are(tmp_path):
    # Found by the fourth hostile pass (left open then): `--context nope` said only the
    # client's "Expected object with name nope in .../contexts list", exit 1, naming
    # neither the contexts there are nor the current one.
    path = contexts_kubeconfig(tmp_path, 12, current="ctx3")
    out = status(path, tmp_path, "--context", "nope", run=run_main)
    assert out.returncode == 2, out.stderr
    names = ", ".join(f"ctx{i}" for i in range(10))
    assert out.stderr == (
        f"error: --context: no context nope in the kubeconfig ({path}); it has 12: {names} "
        "and 2 more; current-context: ctx3; pass one of those (`kubectl config "
        "get-contexts` lists them)\n"
    )


def test_a_current_context_not_in_the_kubeconfig_is_named(tmp_path):
    # Found by the fourth hostile pass (left open then): the same, for a file whose
    # current-context names no context.
    path = contexts_kubeconfig(tmp_path, 2, current="gone")
    out = status(path, tmp_path, run=run_main)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        f"error: kubeconfig ({path}): its current-context gone is not one of its contexts; "
        "it has 2: ctx0, ctx1; pass --context NAME or fix current-context\n"
    )


@pytest.mark.parametrize("current", ["", None], ids=["empty", "missing"])
def test_no_current_context_is_named_with_the_contexts(tmp_path, current):
    # Found by the fifth hostile pass: a kubeconfig whose current-context was empty or
    # missing said only the client's "Invalid kube-config file. Expected object with name
    # in .../contexts list" (or "Expected key current-context"), exit 1.
    path = contexts_kubeconfig(tmp_path, 2, current="")
    if current is None:
        doc = yaml.safe_load(path.read_text())
        del doc["current-context"]
        path.write_text(yaml.safe_dump(doc))
    out = status(path, tmp_path, run=run_main)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        f"error: kubeconfig ({path}): no current-context is set; it has 2: ctx0, ctx1; pass "
        "--context NAME or set one (`kubectl config use-context NAME`)\n"
    )


def test_an_empty_context_is_the_current_one_as_kubectl_reads_it(tmp_path):
    # Found by the fifth hostile pass: `--context ""` (an unset $CTX) was the client's
    # "Expected object with name in .../contexts list", exit 1; kubectl takes the current one.
    path = contexts_kubeconfig(tmp_path, 2, current="gone")
    out = status(path, tmp_path, "--context", "", run=run_main)
    assert out.returncode == 2, out.stderr
    assert "its current-context gone is not one of its contexts" in out.stderr
