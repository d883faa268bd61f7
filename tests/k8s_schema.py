"""Rendered objects against real schemas: the PyTorchJob CRD's openAPIV3Schema (through
jsonschema, unknown fields rejected) and kubernetes-validate for built-in kinds."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# Copies in the repository, with their sources and licenses in schemas/SOURCES.md.
SCHEMAS = Path(__file__).resolve().parent / "schemas"
K8S_VERSION = "1.37"  # the newest minor kubernetes-validate ships schemas for


def structural_to_jsonschema(node: Any) -> Any:
    """A Kubernetes structural schema -> draft 2020-12 JSON schema with the apiserver's
    meaning: int-or-string, nullable, and unknown fields pruned = rejected here."""
    if isinstance(node, list):
        return [structural_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: structural_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-")}
    out.pop("description", None)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.pop("anyOf", None)
        pattern = out.pop("pattern", None)
        string: dict[str, Any] = {"type": "string"}
        if pattern:
            string["pattern"] = pattern
        out["anyOf"] = [{"type": "integer"}, string]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("nullable", None)
    if (
        out.get("type") == "object"
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        # The apiserver prunes unknown fields silently; for us they are rendering bugs.
        out["additionalProperties"] = False
        out.setdefault("properties", {})
    return out


# The CRDs are megabytes of YAML: libyaml's safe loader reads them in a tenth of the pure
# Python one's time (the same safe tags; the pure one where libyaml is missing).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def crd_validator(filename: str, version: str) -> jsonschema.Draft202012Validator:
    crd = yaml.load((SCHEMAS / filename).read_text(), Loader=_SAFE_LOADER)
    (ver,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = structural_to_jsonschema(copy.deepcopy(ver["schema"]["openAPIV3Schema"]))
    # metadata is validated by the apiserver's ObjectMeta, not the CRD: allow it here and
    # check it with kubernetes-validate through the pod template wrapper instead.
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft202012Validator(schema)


def pytorchjob_errors(obj: dict[str, Any]) -> list[str]:
    validator = crd_validator("kubeflow.org_pytorchjobs.yaml", "v1")
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]


@cache
def _kubernetes_validate() -> Any:
    """kubernetes_validate, its schema files read once a run: its validate() reads and parses
    them on every call (the shared definitions are megabytes of JSON), and they do not change
    while the tests run. The validation itself is the library's own."""
    import kubernetes_validate
    from kubernetes_validate import utils

    utils.schema_contents = cache(utils.schema_contents)
    return kubernetes_validate


def builtin_errors(obj: dict[str, Any]) -> list[str]:
    """kubernetes-validate --strict for a built-in kind (PVC, PodTemplate, …)."""
    kubernetes_validate = _kubernetes_validate()
    if obj["apiVersion"].split("/")[0].endswith(".volcano.sh"):
        # Volcano's PodGroup is a CRD, not built in; kubernetes-validate >= 1.35 knows the
        # built-in scheduling.k8s.io PodGroup of the same kind and would judge it by that.
        return []
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


def trainjob_errors(obj: dict[str, Any]) -> list[str]:
    validator = crd_validator("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1")
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]


@cache
def _runtime() -> dict[str, Any]:
    return yaml.safe_load((SCHEMAS / "torch_distributed_runtime.yaml").read_text())


def trainjob_pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod Trainer v2 would run for this TrainJob on the torch-distributed runtime
    (schemas/torch_distributed_runtime.yaml), as a PodTemplate: the runtime's `node` pod
    with the TrainJob's trainer fields and its runtime patch merged in (lists by name)."""
    (rjob,) = _runtime()["spec"]["template"]["spec"]["replicatedJobs"]
    pod = copy.deepcopy(rjob["template"]["spec"]["template"])
    trainer = obj["spec"]["trainer"]
    (container,) = pod["spec"]["containers"]
    container.update({k: trainer[k] for k in ("image", "command", "args", "env") if k in trainer})
    if "resourcesPerNode" in trainer:
        container["resources"] = trainer["resourcesPerNode"]
    for patch in obj["spec"].get("runtimePatches", []):
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            assert job["name"] == rjob["name"]
            template = job["template"]["spec"]["template"]
            for key, value in template.get("metadata", {}).items():
                pod.setdefault("metadata", {}).setdefault(key, {}).update(value)
            for key, value in template.get("spec", {}).items():
                if key != "containers":
                    pod["spec"][key] = value
            for c in template.get("spec", {}).get("containers", []):
                assert c["name"] == container["name"]
                container.update({k: v for k, v in c.items() if k != "name"})
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "t", "namespace": obj["metadata"]["namespace"]},
        "template": pod,
    }


# The schemas say `format: int32` / `int64`; jsonschema ignores formats it does not know,
# the API server refuses numbers out of range.
INT_FORMATS = jsonschema.FormatChecker()
INT_FORMATS.checks("int32")(lambda v: not isinstance(v, int) or -(2**31) <= v < 2**31)
INT_FORMATS.checks("int64")(lambda v: not isinstance(v, int) or -(2**63) <= v < 2**63)
CRDS = {
    "PyTorchJob": ("kubeflow.org_pytorchjobs.yaml", "v1"),
    "TrainJob": ("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1"),
}


def int_format_errors(obj: dict[str, Any]) -> list[str]:
    """Numbers out of their int32/int64 range, for our CRDs and built-in kinds alike."""
    checked = _format_validator(obj["kind"], obj["apiVersion"])
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in checked.iter_errors(obj)
        if e.validator == "format"
    ]


@cache
def _format_validator(kind: str, api_version: str) -> jsonschema.Draft202012Validator:
    """The kind's schema (our CRD's, or kubernetes-validate's strict one) with the int
    formats checked; built once per kind."""
    if kind in CRDS:
        schema, registry = crd_validator(*CRDS[kind]).schema, None
    else:
        from referencing import Registry, Resource

        schema_contents = _kubernetes_validate().utils.schema_contents
        group, _, version = api_version.rpartition("/")
        group = group.split(".")[0]
        name = f"{kind.lower()}-{group + '-' if group else ''}{version}.json"
        root = f"kubernetes-json-schema/v{K8S_VERSION}.0-local-strict"
        schema = schema_contents(f"{root}/{name}", K8S_VERSION)
        defs = schema_contents(f"{root}/_definitions.json", K8S_VERSION)
        registry = Resource.from_contents(schema) @ (Resource.from_contents(defs) @ Registry())
    kwargs = {"registry": registry} if registry is not None else {}
    return jsonschema.Draft202012Validator(schema, format_checker=INT_FORMATS, **kwargs)
