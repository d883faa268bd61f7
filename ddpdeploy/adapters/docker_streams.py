"""Reading the docker engine's build and push streams: its JSON events in, the state a
progress display and a one-line error need out.

Knowledge of one outside system's output, so it lives with the adapters; pure (no I/O),
so it is tested with recorded events.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ddpdeploy.streams import LineSplitter

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$", re.ASCII)
# The engine colours a step's stderr (ESC[91m … ESC[0m); logs and messages want plain text.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NONZERO = re.compile(r"^The command .* returned a non-zero code: (\d+)$", re.S | re.ASCII)


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
    _lines: LineSplitter[str] = field(default_factory=lambda: LineSplitter(""))

    @property
    def current(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def feed(self, event: Mapping[str, object]) -> None:
        aux = event.get("aux")
        if isinstance(aux, Mapping):
            image_id = aux.get("ID")
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
            for chunk in self._lines.feed(text):
                self._line(chunk.rstrip("\r"))

    def finish(self) -> None:
        for rest in self._lines.finish():
            self._line(rest)

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
