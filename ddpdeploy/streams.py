"""Streams of chunks from outside systems (container logs, exec output, archives): whole
lines out of chunks, and chunks as a file. No project imports: every layer may use it."""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import AnyStr, Generic


class LineSplitter(Generic[AnyStr]):
    """Whole lines from chunks (bytes or text) that may end anywhere, even mid-line:
    `feed` returns the lines each chunk completes (without their newline), `finish` the
    unterminated rest."""

    def __init__(self, empty: AnyStr) -> None:
        self._pending: AnyStr = empty
        self._empty: AnyStr = empty

    def feed(self, chunk: AnyStr) -> list[AnyStr]:
        whole: list[AnyStr] = (self._pending + chunk).split(self._newline())
        self._pending = whole.pop()
        return whole

    def finish(self) -> list[AnyStr]:
        rest, self._pending = self._pending, self._empty
        return [rest] if rest else []

    def _newline(self) -> AnyStr:
        return b"\n" if isinstance(self._empty, bytes) else "\n"


class ChunkReader(io.RawIOBase):
    """An iterable of byte chunks as a raw, readable stream (wrap it in io.BufferedReader
    for many small reads, e.g. tarfile's)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._chunk = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._chunk:
            nxt = next(self._chunks, None)
            if nxt is None:
                return 0
            self._chunk = memoryview(nxt)
        n = min(len(buffer), len(self._chunk))
        buffer[:n] = self._chunk[:n]
        self._chunk = self._chunk[n:]
        return n
