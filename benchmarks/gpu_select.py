"""pytest plugin for benchmarks/gpu_check.sh: keep only the GPU-only tests.

A test is GPU-only when it is marked `gpu`, or carries a skipif whose reason names CUDA, a
GPU or nccl (the way tests/train skips them on CPU). Everything else is deselected.
"""

from __future__ import annotations

import re

import pytest

GPU_REASON = re.compile(r"cuda|gpu|nccl", re.IGNORECASE)


def is_gpu_only(item: pytest.Item) -> bool:
    if item.get_closest_marker("gpu") is not None:
        return True
    reasons = (str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif"))
    return any(GPU_REASON.search(r) for r in reasons)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep = [i for i in items if is_gpu_only(i)]
    config.hook.pytest_deselected(items=[i for i in items if not is_gpu_only(i)])
    items[:] = keep
