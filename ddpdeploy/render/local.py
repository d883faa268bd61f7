"""The job as a CPU run (no GPUs, gloo), as `compose --cpu` and every smoke run turn it.

Pure, and below both the compose renderer and the smoke room, which use it. A changed job
is built through validation (`spec_with`), never by copying fields past it.
"""

from __future__ import annotations

from ddpdeploy.spec import JobSpec, spec_with


def cpu_spec(spec: JobSpec) -> JobSpec:
    """The job as a CPU run: no GPUs, gloo, the same processes per node. (A run on another
    port passes it to the launch contract, `port=`: some targets fix the spec's.)"""
    return spec_with(spec, {"gpus": 0, "procs": spec.procs_per_node, "backend": "gloo"})
