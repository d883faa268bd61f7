"""checkov over every target's rendered objects: no failed check outside the allowlist
(tests/checkov/allowlist.yaml, each entry with its reason), and no stale entry in it.

checkov skips custom resources (a PyTorchJob's pods would go unchecked), so every pod
template inside an object is also scanned as a Pod of its own.

checkov is large and lives in a venv of its own, outside the clone: `.ci/checkov-setup.sh`
makes it and prints its path; set DDPDEPLOY_CHECKOV to that path (CI does). Without it this
test skips, unless DDPDEPLOY_REQUIRE_CHECKOV=1, where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from checkov_scan import allowlist, checkov_path
from k8s_schema import trainjob_pod_template

from ddpdeploy.errors import UserError
from ddpdeploy.obj import Obj
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import TARGETS as LAYOUTS
from ddpdeploy.targets import render_objects

pytestmark = pytest.mark.slow  # checkov runs a scanner process per folder

# Every target the renderer knows (ddpdeploy.targets); each case renders for it with
# `target:` set, where the target takes the case (the others are refused in one line, as
# tests/test_targets.py checks).
TARGETS: dict[str, Callable[[JobSpec], list[Obj]]] = dict.fromkeys(LAYOUTS, render_objects)

CASES: dict[str, Obj] = {
    "defaults": {"image": "ghcr.io/team/train:v1", "nodes": 2},
    "gpu-team-namespace": {
        "name": "llm",
        "namespace": "team-a",
        "image": "ghcr.io/team/train:v1",
        "nodes": 2,
        "gpus": 8,
        "cpu": "32",
        "memory": "256Gi",
        "checkpoint": {"size": "100Gi"},
        "secretEnv": {"HF_TOKEN": {"secret": "hf", "key": "token"}},
        "imagePullSecrets": ["regcred"],
        "scheduling": {"scheduler": "volcano", "queue": "research"},
        "network": {"ncclDebug": "INFO"},
    },
    "elastic-kueue": {
        "namespace": "team-a",
        "image": "ghcr.io/team/train:v1",
        "nodes": 2,
        "rendezvous": {"mode": "elastic", "minNodes": 1, "maxNodes": 3},
        "scheduling": {"queue": "team-a"},
    },
    "rdma-host-network": {
        "image": "ghcr.io/team/train:v1",
        "nodes": 2,
        "gpus": 8,
        "network": {"rdma": {"resource": "rdma/hca_shared_devices_a"}, "hostNetwork": True},
    },
    "loosened": {
        "image": "ghcr.io/team/train:v1",
        "security": {
            "readOnlyRootFilesystem": False,
            "automountServiceAccountToken": True,
            "runAsUser": 2000,
        },
        "network": {"policy": False},
    },
}


def _spec(target: str, case: str) -> JobSpec | None:
    try:
        spec = JobSpec.model_validate({**CASES[case], "target": target})
        render_objects(spec)
    except (ValueError, UserError):  # pydantic's ValidationError is a ValueError
        return None
    return spec


RUNS = [(t, c) for t in TARGETS for c in CASES if _spec(t, c) is not None]


def pod_templates(node: Any) -> Iterator[Obj]:
    """Every PodTemplateSpec (a dict whose spec has containers) inside ``node``."""
    if isinstance(node, dict):
        if isinstance(node.get("spec"), dict) and "containers" in node["spec"]:
            yield node
        for value in node.values():
            yield from pod_templates(value)
    elif isinstance(node, list):
        for value in node:
            yield from pod_templates(value)


def as_pods(obj: Obj) -> list[Obj]:
    meta = obj["metadata"]
    if obj["kind"] == "TrainJob":
        # Its patch holds part of a pod; scan the pod Trainer runs (runtime + trainer + patch).
        template = trainjob_pod_template(obj)["template"]
        name = f"{meta['name']}-trainjob-pod-0"
        pod_meta = {**template.get("metadata", {}), "name": name, "namespace": meta["namespace"]}
        return [{"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template["spec"]}]
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **template.get("metadata", {}),
                "name": f"{meta['name']}-{obj['kind'].lower()}-pod-{i}",
                "namespace": meta["namespace"],
            },
            "spec": template["spec"],
        }
        for i, template in enumerate(pod_templates(obj.get("spec")))
        if obj["kind"] != "Pod"
    ]


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """(target/case) -> the ids of the checks checkov fails there; one checkov run."""
    checkov = checkov_path()
    folder = tmp_path_factory.mktemp("checkov")
    for target, case in RUNS:
        spec = _spec(target, case)
        assert spec is not None
        objects = TARGETS[target](spec)
        docs = [*objects, *(pod for obj in objects for pod in as_pods(obj))]
        assert any(d["kind"] == "Pod" for d in docs), "no pod template found to scan"
        (folder / f"{target}--{case}.yaml").write_text(yaml.safe_dump_all(docs))
    res = subprocess.run(
        [checkov, "-d", str(folder), "--framework", "kubernetes", "--quiet", "--compact"]
        + ["-o", "json", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    assert res.returncode in (0, 1), res.stderr[-3000:]  # 1: some check failed
    report = json.loads(res.stdout)
    out: dict[str, set[str]] = {f.stem: set() for f in folder.iterdir()}
    for reports in report if isinstance(report, list) else [report]:
        for check in reports.get("results", {}).get("failed_checks", []):
            out[Path(check["file_path"]).stem].add(check["check_id"])
    return out


def allowed(target: str, case: str) -> set[str]:
    """Entries name cases, or `target--case` for one target's case only."""
    return {
        c
        for c, e in allowlist().items()
        if e["cases"] == "all" or case in e["cases"] or f"{target}--{case}" in e["cases"]
    }


@pytest.mark.parametrize(("target", "case"), RUNS)
def test_no_failed_check_outside_the_allowlist(failures, target, case):
    unexpected = failures[f"{target}--{case}"] - allowed(target, case)
    assert not unexpected, f"checkov fails {sorted(unexpected)} for {target}/{case}"


def test_every_allowlist_entry_is_still_needed(failures):
    for check, entry in allowlist().items():
        cases = CASES if entry["cases"] == "all" else entry["cases"]
        failing = [
            c
            for c in cases
            if check in failures.get(c, set())  # a `target--case` entry
            or any(check in failures.get(f"{t}--{c}", set()) for t in TARGETS)
        ]
        assert failing, f"{check} is allowlisted but no case fails it: remove the entry"
