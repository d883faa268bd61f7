"""Build (and optionally push) the training image: the flow behind `build` and `up --build`.

Progress goes to the Report the caller passes; the caller gets the image reference back and
decides what to print.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ddpdeploy.adapters import docker_engine as engine
from ddpdeploy.adapters import git
from ddpdeploy.adapters.docker_streams import PUSH_DONE, BuildProgress, PushProgress
from ddpdeploy.contract import RunRecord
from ddpdeploy.errors import UserError
from ddpdeploy.image import plan
from ddpdeploy.image.context import (
    check_script,
    context_file,
    dockerfile,
    requirements,
    scan_trainer,
    scan_workspace,
)
from ddpdeploy.paths import docker_dir, trainer_dir
from ddpdeploy.report import Progress, Quiet, Report
from ddpdeploy.spec import ImageRef, JobSpec


@dataclass(frozen=True)
class BuiltImage:
    """An image ddpdeploy built: its reference and what the build knows of it (its
    labels' revision and dirty flag, the engine's ID or the registry's digest)."""

    reference: str  # repo:tag, or repo@sha256:… when pushed
    digest: str  # the pushed manifest's digest, else the engine's image ID
    git_commit: str | None
    git_dirty: bool | None

    def record(self) -> RunRecord:
        """What the pods are told of the image (the launch contract's RunRecord)."""
        return RunRecord(
            image_digest=self.digest, git_commit=self.git_commit, git_dirty=self.git_dirty
        )


def build_image(
    spec: JobSpec,
    *,
    workspace: Path,
    base_image: str | None = None,
    push: bool = False,
    system_packages: str | None = None,
    network: str | None = None,
    no_cache: bool = False,
    push_flag: str = "--push",
    report: Report | None = None,
) -> BuiltImage:
    """Build the workspace image; its reference is `repo:tag`, or `repo@sha256:…` when
    pushed.

    `push_flag` names the flag that asked for the push, for the one-line error without a
    repository (`up --build` pushes without a --push flag of its own).
    """
    report = report or Quiet()
    job = _inputs(spec, workspace, base_image, push, system_packages, push_flag)
    # The engine first: with no engine, say so before reading a single workspace file.
    client = engine.connect()
    local, tag, new_tag = _build_tagged(report, client, job, no_cache, network)
    if not push:
        return local
    try:
        digest = _push_with_progress(report, client, job.repository, tag)
    except BaseException:
        # A failed or interrupted command leaves nothing tagged that was not there before.
        if new_tag:
            engine.untag(client, job.repository, tag)
        raise
    report.say(f"pushed {job.repository}:{tag}")
    return BuiltImage(f"{job.repository}@{digest}", digest, local.git_commit, local.git_dirty)


@dataclass(frozen=True)
class _Inputs:
    """A build's inputs as checked: the workspace folder, the repository, the base image
    and the extra system packages."""

    workspace: Path
    repository: str
    base: str
    packages: str
    script: str | None  # command.script: the image must hold it


def _inputs(
    spec: JobSpec,
    workspace: Path,
    base_image: str | None,
    push: bool,
    system_packages: str | None,
    push_flag: str,
) -> _Inputs:
    """The flags checked, before the engine is asked anything."""

    workspace = workspace.resolve()
    if not workspace.is_dir():
        raise UserError(f"--workspace: {workspace} is not a folder")
    repository = plan.repository_for(spec.image, spec.name)
    if push and not spec.image:
        raise UserError(
            f"{push_flag} needs a repository to push to: pass --image REGISTRY/REPO "
            "(e.g. ghcr.io/me/train) or set image: in ddpdeploy.yaml"
        )
    base = _image_ref("--base-image", base_image or plan.DEFAULT_BASE_IMAGE)
    packages = _apt_packages(system_packages or "")
    return _Inputs(workspace, repository, base, packages, spec.command.script)


def _build_tagged(
    report: Report, client: Any, job: _Inputs, no_cache: bool, network: str | None
) -> tuple[BuiltImage, str, bool]:
    """(the image as built here, its content tag, whether the tag is new): the workspace's
    context and git facts hashed into the tag, then a build unless that image is here."""

    revision, dirty = git.revision(job.workspace), git.dirty(job.workspace)
    source = git.source(job.workspace)
    build_args = plan.build_args(job.base, job.packages, revision, source, dirty)
    entries = _context_entries(job.workspace, job.script)
    with context_file(entries) as (context, context_sha256):
        inputs = plan.inputs_hash(context_sha256, build_args)
        tag = plan.content_tag(inputs, revision)
        built_id, new_tag = _build_or_reuse(
            report, client, job, context, build_args, inputs, tag, no_cache, network
        )
    return BuiltImage(f"{job.repository}:{tag}", built_id, revision, dirty), tag, new_tag


def _build_or_reuse(
    report: Report,
    client: Any,
    job: _Inputs,
    context: Any,
    build_args: dict[str, str],
    inputs: str,
    tag: str,
    no_cache: bool,
    network: str | None,
) -> tuple[str, bool]:
    """(image ID, whether the tag is new): the tagged image when it was built from these
    inputs on this base image, else a build through the engine, tagged."""
    base, repository = job.base, job.repository
    labels = _input_labels(client, base, inputs)
    current = None if no_cache else _up_to_date(client, f"{repository}:{tag}", labels)
    if current is not None:
        report.say(f"up to date: {repository}:{tag} (same inputs and base)")
        return current, False
    result = _build_with_progress(
        report, client, context, build_args, labels, base, no_cache, network
    )
    built_id = result.image_id or ""
    new_tag = engine.tag(client, built_id, repository, tag)
    cached = len(result.cached_steps)
    report.say(f"built {repository}:{tag} ({cached}/{len(result.steps)} steps cached)")
    return built_id, new_tag


# On every image we build: what it was built from, so the next build of the same inputs can
# skip the engine (a cached build still costs a context upload and ~20 cache lookups).
INPUTS_LABEL = "io.ddpdeploy.inputs-sha256"
BASE_ID_LABEL = "io.ddpdeploy.base-image-id"


def _input_labels(client: Any, base: str, inputs: str) -> dict[str, str]:
    """The build's inputs as labels: the inputs' hash and, when the base is here already,
    its image ID (the hash names the base by reference only, which a pull can move)."""
    labels = {INPUTS_LABEL: inputs}
    found = engine.image_labels(client, base)
    if found is not None:
        labels[BASE_ID_LABEL] = found[0]
    return labels


def _up_to_date(client: Any, ref: str, labels: dict[str, str]) -> str | None:
    """The image ID of ``ref`` when it is here and was built from exactly these inputs on
    this base image; None when it must be built."""
    if BASE_ID_LABEL not in labels:
        return None  # the base is not here: the build pulls it, and we cannot tell
    found = engine.image_labels(client, ref)
    if found is None or any(found[1].get(k) != v for k, v in labels.items()):
        return None
    return found[0]


def _context_entries(workspace: Path, script: str | None) -> list[plan.ContextEntry]:
    """What goes into the build context: your code (with the job's script, if it names
    one), the trainer, the Dockerfile, requirements."""

    kept = scan_workspace(workspace)
    check_script(workspace, script)  # as smoke --local checked it
    return plan.plan_context(
        kept,
        scan_trainer(trainer_dir()),
        dockerfile(docker_dir()),
        requirements(workspace, kept),
    )


def _image_ref(flag: str, value: str) -> str:
    """The spec's own image-reference rule: a bad one is bad input, not an engine error."""
    from pydantic import TypeAdapter, ValidationError

    try:
        return str(TypeAdapter(ImageRef).validate_python(value))
    except ValidationError as exc:
        message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise UserError(f"{flag}: {message}") from None


# A Debian package name, optionally with =version or /release (apt-get install's syntax).
_APT_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]*(:[a-z0-9-]+)?(=[A-Za-z0-9.+~:-]+|/[a-z0-9.-]+)?")


def _apt_packages(value: str) -> str:
    """The names go into a shell word list: refuse anything that is not a package name."""
    for word in value.split():
        if not _APT_PACKAGE.fullmatch(word):
            raise UserError(
                f"--system-packages: {word!r} is not a Debian package name; give names "
                "separated by spaces, e.g. 'git libgomp1=12.2.0-14'"
            )
    return " ".join(value.split())


def _build_with_progress(
    report: Report,
    client: Any,
    context: IO[bytes],
    build_args: dict[str, str],
    labels: dict[str, str],
    base: str,
    no_cache: bool,
    network: str | None,
) -> BuildProgress:
    with report.progress("build") as shown:
        shown.update(info="sending context")
        result = engine.build(
            client,
            context,
            build_args,
            base,
            _on_build(shown, build_args),
            no_cache=no_cache,
            network=network,
            labels=labels,
        )
        shown.update(completed=result.total)
    return result


def _on_build(
    shown: Progress, build_args: dict[str, str] | None = None
) -> Callable[[BuildProgress], None]:
    """The build's progress: where it is, and a line per step where that is all a log shows."""
    seen: set[int] = set()

    def on_build(state: BuildProgress) -> None:
        step = state.current
        if step is None:
            return
        instruction = _as_used(" ".join(step.instruction.split()), build_args or {})
        cached = " (cached)" if step.cached else ""
        shown.update(
            total=state.total,
            completed=step.number - 1,
            info=f"step {step.number}/{state.total} {instruction[:60]}{cached}",
        )
        if step.number not in seen:
            seen.add(step.number)
            shown.step(f"step {step.number}/{state.total}: {instruction[:100]}")

    return on_build


_ARG_DEFAULT = re.compile(r"ARG ([A-Za-z_][A-Za-z0-9_]*)=")


def _as_used(instruction: str, build_args: dict[str, str]) -> str:
    """An ``ARG NAME=default`` step with the value this build passed for NAME instead: the
    log shows what was used (the CUDA base image's name under --base-image was not)."""
    found = _ARG_DEFAULT.match(instruction)
    if found is None or found[1] not in build_args:
        return instruction
    value = build_args[found[1]]
    shown = value if value and not re.search(r"[\s\"'\\]", value) else json.dumps(value)
    return f"ARG {found[1]}={shown}"


def _push_with_progress(report: Report, client: Any, repository: str, tag: str) -> str:
    with report.progress("push", unit="bytes") as shown:
        return str(engine.push(client, repository, tag, _on_push(shown)))


def _on_push(shown: Progress) -> Callable[[PushProgress], None]:
    """The push's progress: its bytes, and a line per layer once it is settled."""
    done: set[str] = set()

    def on_push(state: PushProgress) -> None:
        layers = state.layers.values()
        shown.update(
            completed=sum(current for _, current, _ in layers),
            total=sum(total for _, _, total in layers) or None,
        )
        for layer, (status, _, _) in state.layers.items():
            if layer not in done and status.startswith(PUSH_DONE):
                done.add(layer)
                shown.step(f"layer {layer}: {status}")

    return on_push
