"""The pure part of `ddpdeploy build`: the build context's plan, the build args, the image's
content tag and its repository. No file, engine or clock here: the adapters
(ddpdeploy.image.context, .docker_engine) scan the disk, write the tar, talk to the
engine, and feed these functions what they found.

The context the engine receives has two folders (named in ddpdeploy.image_layout):

    CONTEXT_BUILD/Dockerfile           docker/Dockerfile of this package
    CONTEXT_BUILD/requirements.txt     the workspace's requirements.txt, or empty
    CONTEXT_BUILD/train/...            the built-in trainer (ddpdeploy.paths.trainer_dir())
    CONTEXT_WORKSPACE/...              the user's files, filtered by their .dockerignore
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

from ddpdeploy.image_layout import CONTEXT_BUILD, CONTEXT_WORKSPACE, DOCKERFILE, dockerfile_args

DEFAULT_BASE_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
REQUIREMENTS = "requirements.txt"

# Left out of every context before the user's .dockerignore applies (a `!.git` line there
# brings it back): git history would change the context hash on every commit and bloat the
# code layer; bytecode is rebuilt anyway.
DEFAULT_IGNORES = (".git", "**/__pycache__", "**/*.pyc")


@dataclass(frozen=True)
class LocalFile:
    """A file as a scan of the disk found it: its path below the scanned folder, where it
    is, and what the tar must record (nothing is read here)."""

    rel: str
    source: PurePath
    executable: bool = False
    link_target: str | None = None  # a symlink, stored as such, never followed


@dataclass(frozen=True)
class ContextEntry:
    """One file of the build context: copied from ``source`` or given as ``data``."""

    arcname: str
    source: PurePath | None = None
    data: bytes | None = None
    executable: bool = False
    link_target: str | None = None

    @property
    def mode(self) -> int:
        return 0o755 if self.executable else 0o644


def dockerignore_patterns(text: str) -> list[str]:
    """Patterns of a .dockerignore file, read the way the docker SDK and CLI read them."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _under(folder: str, files: Iterable[LocalFile]) -> list[ContextEntry]:
    return [
        ContextEntry(f"{folder}/{f.rel}", f.source, None, f.executable, f.link_target)
        for f in files
    ]


def plan_context(
    workspace: Iterable[LocalFile],
    trainer: Iterable[LocalFile],
    dockerfile_text: str,
    requirements: bytes,
) -> list[ContextEntry]:
    """Every file of the context, sorted by name so the tar and its hash are stable.

    ``requirements`` is the workspace's requirements.txt when its .dockerignore keeps it,
    else empty: the Dockerfile's dependency layer always has a file to copy.
    """
    entries = _under(CONTEXT_WORKSPACE, workspace) + _under(f"{CONTEXT_BUILD}/train", trainer)
    entries += [
        ContextEntry(DOCKERFILE, data=dockerfile_text.encode()),
        ContextEntry(f"{CONTEXT_BUILD}/{REQUIREMENTS}", data=requirements),
    ]
    return sorted(entries, key=lambda e: e.arcname)


def build_args(
    base_image: str,
    system_packages: str,
    revision: str | None,
    source: str,
    dirty: bool | None = None,
) -> dict[str, str]:
    """The Dockerfile's build args: the image layout plus this build's inputs (``dirty``:
    the workspace had uncommitted changes; a label beside the revision's)."""
    return {
        **dockerfile_args(),
        "BASE_IMAGE": base_image,
        "SYSTEM_PACKAGES": system_packages,
        "REVISION": revision or "",
        "DIRTY": "" if dirty is None else str(dirty).lower(),
        "SOURCE": source,
    }


def inputs_hash(context_sha256: str, build_args: Mapping[str, str]) -> str:
    """sha256 over the context tar's digest and the build args: equal hash, equal inputs."""
    digest = hashlib.sha256(f"context {context_sha256}\0".encode())
    for key in sorted(build_args):
        digest.update(f"arg {key}={build_args[key]}\0".encode())
    return digest.hexdigest()


def content_tag(ctx_hash: str, revision: str | None = None) -> str:
    """An immutable tag: the git revision (for people) plus the context hash (for truth).

    The hash covers uncommitted changes and every other input (trainer, Dockerfile, base
    image), so one tag never names two different images.
    """
    if revision:
        return f"git-{revision[:12]}-{ctx_hash[:12]}"
    return f"ctx-{ctx_hash[:16]}"


def split_reference(ref: str) -> tuple[str, str | None, str | None]:
    """``repo[:tag][@digest]`` -> (repo, tag, digest); a registry port is not a tag."""
    digest = None
    if "@" in ref:
        ref, digest = ref.split("@", 1)
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = ref.rsplit(":", 1)
        return repo, tag, digest
    return ref, None, digest


def repository_for(image: str | None, job_name: str) -> str:
    """The repository to tag: the spec's image without its tag/digest, else ddpdeploy/<job>."""
    if image:
        return split_reference(image)[0]
    return f"ddpdeploy/{job_name}"
