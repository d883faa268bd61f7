"""The pure part of `ddpdeploy build`: what goes into the build context, the image's content
tag, and reading the engine's build and push streams. No docker import here: the adapter
(ddpdeploy.adapters.docker_engine) does the I/O and feeds these functions.

The context the engine receives has two folders, so the user's workspace needs no Dockerfile:

    ddpdeploy-build/Dockerfile         docker/Dockerfile of this source tree
    ddpdeploy-build/requirements.txt   the workspace's requirements.txt, or empty
    ddpdeploy-build/train/...          the built-in trainer (ddpdeploy.paths.trainer_dir())
    workspace/...                      the user's files, filtered by their .dockerignore
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_BASE_IMAGE = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"
BUILD_DIR = "ddpdeploy-build"  # reserved: our files in the context
WORKSPACE_DIR = "workspace"  # the user's files in the context
DOCKERFILE = f"{BUILD_DIR}/Dockerfile"
REQUIREMENTS = "requirements.txt"
# A fixed mtime (1980-01-01, the earliest a zip can hold) so identical files give identical
# tar entries whatever their checkout time; the image content does not depend on when.
FIXED_MTIME = 315532800
TAIL_LINES = 20


@dataclass(frozen=True)
class ContextEntry:
    """One file of the build context: read from ``source`` or given as ``data``."""

    arcname: str
    source: Path | None = None
    data: bytes | None = None
    executable: bool = False
    link_target: str | None = None  # a symlink, stored as such

    @property
    def mode(self) -> int:
        return 0o755 if self.executable else 0o644

    def content(self) -> bytes:
        if self.link_target is not None:
            return self.link_target.encode()
        if self.data is not None:
            return self.data
        assert self.source is not None
        return self.source.read_bytes()


# Left out of every context before the user's .dockerignore applies (a `!.git` line there
# brings it back): git history would change the context hash on every commit and bloat the
# code layer; bytecode is rebuilt anyway.
DEFAULT_IGNORES = (".git", "**/__pycache__", "**/*.pyc")


def dockerignore_patterns(text: str) -> list[str]:
    """Patterns of a .dockerignore file, read the way the docker SDK and CLI read them."""
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _entry(arcname: str, path: Path) -> ContextEntry:
    if path.is_symlink():
        return ContextEntry(arcname, source=path, link_target=str(path.readlink()))
    return ContextEntry(arcname, source=path, executable=bool(path.stat().st_mode & 0o111))


def trainer_files(trainer_dir: Path) -> list[str]:
    """The trainer's files relative to its folder, without caches."""
    return sorted(
        str(p.relative_to(trainer_dir))
        for p in trainer_dir.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def plan_context(
    workspace: Path,
    workspace_files: Iterable[str],
    trainer_dir: Path,
    dockerfile_text: str,
) -> list[ContextEntry]:
    """Every file of the build context, sorted by name so the tar and its hash are stable.

    ``workspace_files`` are the paths the .dockerignore keeps (the docker SDK's
    ``exclude_paths``); directories among them are skipped, their files are listed.
    """
    kept = sorted(
        rel
        for rel in workspace_files
        if (workspace / rel).is_symlink() or (workspace / rel).is_file()
    )
    entries = [_entry(f"{WORKSPACE_DIR}/{rel}", workspace / rel) for rel in kept]
    entries += [
        _entry(f"{BUILD_DIR}/train/{rel}", trainer_dir / rel) for rel in trainer_files(trainer_dir)
    ]
    # requirements.txt counts only if the .dockerignore keeps it, like any other file.
    req = workspace / REQUIREMENTS
    req_data = req.read_bytes() if REQUIREMENTS in kept and req.is_file() else b""
    entries += [
        ContextEntry(DOCKERFILE, data=dockerfile_text.encode()),
        ContextEntry(f"{BUILD_DIR}/{REQUIREMENTS}", data=req_data),
    ]
    return sorted(entries, key=lambda e: e.arcname)


def context_hash(entries: Iterable[ContextEntry], build_args: Mapping[str, str]) -> str:
    """sha256 over names, modes, contents and build args: equal hash, equal image inputs."""
    digest = hashlib.sha256()
    for entry in entries:
        body = entry.content()
        kind = "l" if entry.link_target is not None else "f"
        digest.update(f"{kind} {entry.mode:o} {len(body)} {entry.arcname}\0".encode())
        digest.update(body)
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


_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
# The engine colours a step's stderr (ESC[91m … ESC[0m); logs and messages want plain text.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NONZERO = re.compile(r"^The command .* returned a non-zero code: (\d+)$", re.S)


@dataclass
class Step:
    number: int
    instruction: str
    cached: bool = False
    output: list[str] = field(default_factory=list)


@dataclass
class BuildProgress:
    """State of a classic-builder build, fed one decoded JSON event at a time.

    The engine streams ``{"stream": "Step 3/12 : COPY …"}``, ``{"stream": " ---> Using
    cache"}``, the steps' output, pull ``{"status": …}`` events, ``{"aux": {"ID": …}}`` with
    the image id and, on failure, ``{"error": …}``.
    """

    total: int = 0
    steps: list[Step] = field(default_factory=list)
    image_id: str | None = None
    error: str | None = None
    log: list[str] = field(default_factory=list)
    _partial: str = ""

    @property
    def current(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def feed(self, event: Mapping[str, object]) -> None:
        if isinstance(event.get("aux"), Mapping):
            image_id = event["aux"].get("ID")  # type: ignore[union-attr]
            if isinstance(image_id, str):
                self.image_id = image_id
        if "error" in event or "errorDetail" in event:
            detail = event.get("errorDetail")
            message = detail.get("message") if isinstance(detail, Mapping) else None
            self.error = str(message or event.get("error") or "unknown error").strip()
            self.log.append(f"ERROR: {self.error}")
        if isinstance(event.get("status"), str):
            # Pulls of the base image during FROM; keep the gist, not every progress tick.
            status = str(event["status"])
            if not event.get("progressDetail"):
                ident = event.get("id")
                self._line(f"{ident}: {status}" if ident else status)
        text = event.get("stream")
        if isinstance(text, str):
            # Output can split mid-line between events: only whole lines are parsed.
            chunks = (self._partial + text).split("\n")
            self._partial = chunks.pop()
            for chunk in chunks:
                self._line(chunk.rstrip("\r"))

    def finish(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""

    def _line(self, line: str) -> None:
        line = _ANSI.sub("", line)
        self.log.append(line)
        match = _STEP.match(line)
        if match:
            self.total = int(match[2])
            self.steps.append(Step(int(match[1]), match[3].strip()))
            return
        step = self.current
        if step is None:
            return
        stripped = line.strip()
        if stripped == "---> Using cache":
            step.cached = True
        elif stripped.startswith("--->") or stripped.startswith("Removing intermediate"):
            pass  # builder bookkeeping, not the step's own output
        else:
            step.output.append(line)

    @property
    def cached_steps(self) -> list[int]:
        return [s.number for s in self.steps if s.cached]

    def failure_message(self, base_image: str, tail: int = 3) -> str:
        """One line for a failed build: which step, the engine's error, the step's last output."""
        step = self.current
        error = " ".join((self.error or "the build stopped without an error").split())
        if step is None:
            return f"the engine rejected the build: {error}"
        if step.instruction.upper().startswith("FROM"):
            return (
                f"base image {base_image} is not available locally and could not be pulled "
                f"({error}); pull it first or pass --base-image IMAGE"
            )
        # The engine repeats the whole command; the step already names it.
        nonzero = _NONZERO.match(error)
        if nonzero:
            error = f"exit code {nonzero[1]}"
        lines = [_short(ln, 200) for ln in step.output if ln.strip()][-tail:]
        where = f"step {step.number}/{self.total} `{_short(step.instruction)}` failed ({error})"
        return f"{where}; last output: {' | '.join(lines)}" if lines else where


def _short(text: str, width: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# Push statuses after which a layer is in the registry ("Mounted from other/repo" too).
PUSH_DONE = ("Pushed", "Layer already exists", "Mounted from")
_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


@dataclass
class PushProgress:
    """State of an image push: per-layer status and bytes, the digest, or the error."""

    layers: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    digest: str | None = None
    error: str | None = None

    def feed(self, event: Mapping[str, object]) -> None:
        if "error" in event or "errorDetail" in event:
            detail = event.get("errorDetail")
            message = detail.get("message") if isinstance(detail, Mapping) else None
            self.error = " ".join(str(message or event.get("error")).split())
            return
        aux = event.get("aux")
        if isinstance(aux, Mapping) and isinstance(aux.get("Digest"), str):
            self.digest = str(aux["Digest"])
        status = event.get("status")
        if not isinstance(status, str):
            return
        match = _DIGEST.search(status)
        if match:
            self.digest = match[1]
        ident = event.get("id")
        # Layer events carry a short layer id; "The push refers to …" and tag lines do not.
        if isinstance(ident, str) and re.fullmatch(r"[0-9a-f]{12}", ident):
            detail = event.get("progressDetail")
            current = total = 0
            if isinstance(detail, Mapping):
                current = int(detail.get("current") or 0)
                total = int(detail.get("total") or 0)
            _, old_current, old_total = self.layers.get(ident, ("", 0, 0))
            if status.startswith(PUSH_DONE):
                current = total = max(old_total, total, old_current, 1)
            self.layers[ident] = (status, current or old_current, total or old_total)

    @property
    def auth_failure(self) -> bool:
        text = (self.error or "").lower()
        return any(
            word in text
            for word in ("unauthorized", "denied", "authentication required", "no basic auth")
        )
