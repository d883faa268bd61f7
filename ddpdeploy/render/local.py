"""The job as a CPU run (no GPUs, gloo), as `compose --cpu` and every smoke run turn it.

Pure, and below both the compose renderer and the smoke room, which use it. A changed job
is built through validation (`respec`), never by copying fields past it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpdeploy.spec import JobSpec


def respec(spec: JobSpec, patch: Mapping[str, Any]) -> JobSpec:
    """``spec`` changed by ``patch`` (file keys, camelCase; nested mappings merge), validated
    like a spec file."""
    data = spec.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return JobSpec.model_validate(_merge(data, patch))


def _merge(base: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def cpu_spec(spec: JobSpec) -> JobSpec:
    """The job as a CPU run: no GPUs, gloo, the same processes per node. (A run on another
    port passes it to the launch contract, `port=`: some targets fix the spec's.)"""
    return respec(spec, {"gpus": 0, "procs": spec.procs_per_node, "backend": "gloo"})
