"""Edge values through load + render: whatever renders is valid for the API server.

Every case is a spec file (so YAML reading is part of it) plus flags. A case either fails
with one line (exit code 2), or renders objects that pass the PyTorchJob CRD schema with its
int32/int64 formats checked, kubernetes-validate --strict for built-in kinds, and the
apiserver's own checks that no OpenAPI schema carries (label syntax, annotation size,
toleration rules, unique mount paths), written here from the Kubernetes validation rules."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from k8s_schema import (
    builtin_errors,
    crd_validator,
    int_format_errors,
    pytorchjob_errors,
    trainjob_errors,
    trainjob_pod_template,
)

from ddpdeploy.commands.options import spec_from_flags
from ddpdeploy.errors import UserError
from ddpdeploy.targets import render_objects

I32, I64 = 2**31, 2**63
BIG = [2**31 - 1, 2**31, 2**63, 2**70, 10**23]
# field (as YAML) -> edge values (as YAML text). Each case sets one field on a valid base.
EDGES: dict[str, list[str]] = {
    "nodes": ["1", "2", "0", "-1", "true", "2.0", "0x10", *map(str, BIG)],
    "gpus": ["0", "8", "-1", "yes", *map(str, BIG)],
    "procs": ["1", "0", *map(str, BIG)],
    "terminationGracePeriodSeconds": ["0", "-1", *map(str, BIG)],
    "runPolicy": [f"{{activeDeadlineSeconds: {v}}}" for v in ["1", "0", *map(str, BIG)]]
    + [f"{{backoffLimit: {v}}}" for v in ["0", *map(str, BIG)]]
    + [f"{{ttlSecondsAfterFinished: {v}}}" for v in ["0", *map(str, BIG)]],
    "rendezvous": [
        f"{{mode: elastic, minNodes: 1, maxNodes: {v}}}" for v in ["1", "2", *map(str, BIG)]
    ]
    + [f"{{port: {v}}}" for v in ["1", "65535", "65536", "0"]]
    + [f"{{joinTimeout: {v}}}" for v in ["1", *map(str, BIG)]],
    "memory": ["16", "16Gi", "0", "16m", "1e9", "0.5Gi", "'16Gi\\n'", "-1Gi"],
    "cpu": ["4", "0.5", "500m", "0", "0.0001", "1e3", "'4\\n'"],
    "shmSize": ["'0'", "1Gi", "null", "64Mi"],
    "checkpoint": [
        "{claimName: c}",
        "{claimName: c, mountPath: /dev/shm}",
        "{claimName: c, mountPath: /dev/shm/}",
        "{claimName: c, mountPath: /}",
        "{claimName: c, mountPath: /ckpt}",
        "{size: 1Gi, storageClass: fast.rwx}",
        "{size: 1Gi, storageClass: Fast_RWX}",
        "{size: 1Gi, storageClass: '" + "a" * 254 + "'}",
        "{claimName: 'c\\n'}",
        "{size: 0Gi}",
        "{size: '16'}",
    ],
    "tolerations": [
        "[{key: a, operator: Exists}]",
        "[{key: a, operator: Exists, value: b}]",
        "[{key: a, value: b, effect: NoExecute, tolerationSeconds: 5}]",
        "[{key: a, value: b, effect: NoSchedule, tolerationSeconds: 5}]",
        "[{key: a, value: b, tolerationSeconds: 5}]",
        "[{operator: Exists}]",
        "[{value: b}]",
        "[{key: 'a b', operator: Exists}]",
        "[{key: a, value: 'b c'}]",
        f"[{{key: a, operator: Exists, effect: NoExecute, tolerationSeconds: {2**70}}}]",
    ],
    "nodeSelector": [
        "{nvidia.com/gpu.product: H100}",
        "{'bad key': x}",
        "{a: 'b c'}",
        "{a: 1.10}",
        "{a: on}",
        "{'" + "a" * 254 + "/x': y}",
        "{'a/" + "b" * 64 + "': y}",
        "{a: '" + "b" * 64 + "'}",
    ],
    "labels": ["{team: a}", "{'" + "p" * 250 + ".io/x': y}", "{'a\\n': b}", "{a: 'b\\n'}"],
    "annotations": [
        "{a.b/c: x}",
        "{a.b/c: '" + "x" * (256 * 1024) + "'}",
        "{a.b/c: '" + "x" * (200 * 1024) + "', d.e/f: '" + "y" * (60 * 1024) + "'}",
        "{'bad key': x}",
    ],
    "env": [
        "{A: '1'}",
        "{A: 0777}",
        "{WORLD_SIZE: '3'}",
        "{PET_NNODES: '2'}",
        "{MASTER_ADDR: x}",
        "{A: '$(B)'}",
        "{'1A': x}",
        "{'A\\n': x}",
    ],
    "image": [
        "train:v1",
        "'train:v1\\n'",
        "'r/" + "a" * 260 + ":v1'",
        "'train@sha256:" + "a" * 63 + "'",
        "'train@sha256:" + "a" * 64 + "'",
        "'Train:v1'",
    ],
    "imagePullSecrets": ["[regcred]", "[a.b]", "['A']", "['" + "a" * 254 + "']"],
    "serviceAccount": ["trainer", "a.b", "'A'"],
    "priorityClass": ["high", "'A'"],
    "command": [
        "{args: [--tag, 1.10, 012, 0x1F, 1:30, on]}",
        "{args: ['$(HOME)']}",
        "{script: train.py, args: ['a$$b']}",
        "{module: pkg.train}",
        "{module: 'a b'}",
        "train.py",
        "[ab]",
    ],
    "name": ["a", "|\n  abc", "'" + "a" * 60 + "'", "A"],
    "namespace": ["team-a", "'team\\n'", "'a.b'"],
    "target": ["pytorchjob", "trainjob", "indexed-job", "argo", "'TrainJob'", "null"],
    "runtime": ["torch-distributed", "'A'", "'" + "a" * 254 + "'"],
}
CASES = [(field, value) for field, values in EDGES.items() for value in values]


@cache
def _crd_validator_with_formats() -> jsonschema.Draft202012Validator:
    checker = jsonschema.FormatChecker()
    checker.checks("int32")(lambda v: not isinstance(v, int) or -I32 <= v < I32)
    checker.checks("int64")(lambda v: not isinstance(v, int) or -I64 <= v < I64)
    schema = crd_validator("kubeflow.org_pytorchjobs.yaml", "v1").schema
    return jsonschema.Draft202012Validator(schema, format_checker=checker)


_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"


def _qualified_name_ok(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (len(prefix) > 253 or not re.fullmatch(_SUBDOMAIN, prefix)):
        return False
    return len(name) <= 63 and bool(re.fullmatch(_NAME, name))


def _metadata_errors(meta: dict[str, Any]) -> list[str]:
    errors = []
    for key, value in (meta.get("labels") or {}).items():
        if not _qualified_name_ok(key) or len(value) > 63 or not re.fullmatch(f"({_NAME})?", value):
            errors.append(f"label {key!r}: {value!r}")
    annotations = meta.get("annotations") or {}
    errors += [f"annotation key {k!r}" for k in annotations if not _qualified_name_ok(k)]
    if sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) > 256 * 1024:
        errors.append("annotations over 256 KiB")
    return errors


def _pod_errors(pod: dict[str, Any]) -> list[str]:
    errors = []
    for key, value in (pod.get("nodeSelector") or {}).items():
        if not _qualified_name_ok(key) or len(value) > 63 or not re.fullmatch(f"({_NAME})?", value):
            errors.append(f"nodeSelector {key!r}: {value!r}")
    for t in pod.get("tolerations") or []:
        if t.get("key") and not _qualified_name_ok(t["key"]):
            errors.append(f"toleration key {t['key']!r}")
        if not t.get("key") and t.get("operator") != "Exists":
            errors.append("toleration without key needs Exists")
        if t.get("operator") == "Exists" and t.get("value"):
            errors.append("toleration Exists with a value")
        if "tolerationSeconds" in t and t.get("effect") != "NoExecute":
            errors.append("tolerationSeconds without NoExecute")
    for c in pod["containers"]:
        paths = [m["mountPath"] for m in c.get("volumeMounts", [])]
        if len(set(paths)) != len(paths):
            errors.append(f"duplicate mountPath in {paths}")
        if c["image"] != c["image"].strip():
            errors.append("image with surrounding whitespace")
    return errors


def _template_errors(template: dict[str, Any], namespace: str) -> list[str]:
    errors = _metadata_errors(template["metadata"]) + _pod_errors(template["spec"])
    return errors + builtin_errors(
        {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t", "namespace": namespace},
            "template": template,
        }
    )


def api_errors(obj: dict[str, Any]) -> list[str]:
    """What a real API server would refuse in ``obj``, as far as the schemas here tell."""
    errors = _metadata_errors(obj["metadata"]) + int_format_errors(obj)
    namespace = obj["metadata"]["namespace"]
    if obj["kind"] == "NetworkPolicy":
        return errors + builtin_errors(obj)
    if obj["kind"] == "PersistentVolumeClaim":
        sc = obj["spec"].get("storageClassName")
        if sc is not None and (len(sc) > 253 or not re.fullmatch(_SUBDOMAIN, sc)):
            errors.append(f"storageClassName {sc!r}")
        return errors + builtin_errors(obj)
    if obj["kind"] == "Service":
        return errors + builtin_errors(obj)
    if obj["kind"] == "Job":
        template = obj["spec"]["template"]
        return errors + builtin_errors(obj) + _template_errors(template, namespace)
    if obj["kind"] == "TrainJob":
        pod = trainjob_pod_template(obj)["template"]
        return errors + trainjob_errors(obj) + _template_errors(pod, namespace)
    validator = _crd_validator_with_formats()
    errors += pytorchjob_errors(obj)
    errors += [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]
    for replica in obj["spec"]["pytorchReplicaSpecs"].values():
        errors += _template_errors(replica["template"], namespace)
    return errors


def outcome(tmp_path: Path, field: str, value: str) -> list[dict[str, Any]] | str:
    path = tmp_path / "ddpdeploy.yaml"
    image = "" if field == "image" else "image: train:v1\n"
    path.write_text(f"{image}{field}: {value}\n")
    try:
        return render_objects(spec_from_flags(path))
    except UserError as exc:
        assert exc.exit_code == 2
        return str(exc)


@pytest.mark.parametrize(("field", "value"), CASES, ids=[f"{f}={v[:30]}" for f, v in CASES])
def test_what_renders_is_valid_for_the_api_server(tmp_path, field, value):
    result = outcome(tmp_path, field, value)
    if isinstance(result, str):
        assert "\n" not in result and result.startswith(str(tmp_path))
        return
    for obj in result:
        assert api_errors(obj) == [], obj["kind"]


def test_the_matrix_has_both_outcomes(tmp_path):
    results = [outcome(tmp_path, f, v) for f, v in CASES]
    rendered = sum(not isinstance(r, str) for r in results)
    assert rendered >= 40 and len(results) - rendered >= 80


def test_the_oracle_refuses_what_the_api_server_would():
    job = render_objects(spec_from_flags(None, {"--image": "train:v1", "--nodes": 2}))[-1]
    assert api_errors(job) == []
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 2**31
    job["metadata"]["labels"]["bad key"] = "x"
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 2**70
    pod["tolerations"] = [{"key": "a", "operator": "Exists", "value": "b"}]
    pod["containers"][0]["volumeMounts"].append({"name": "x", "mountPath": "/dev/shm"})
    errors = "\n".join(api_errors(job))
    for expected in ["2147483648", "bad key", "1180591620717411303424", "Exists with", "duplicate"]:
        assert expected in errors


def test_random_combinations_render_valid_or_fail_in_one_line(tmp_path):
    # A seeded property test: documents combining several edge values at once (flags too),
    # so checks that only hold field by field are caught.
    import random

    rng = random.Random(8)
    flags_pool = [{"--nodes": 3}, {"--gpus": 2**40}, {"--elastic": "1:4"}, {"--procs": 2}]
    flags_pool += [{"--target": t} for t in ("trainjob", "indexed-job")]
    path = tmp_path / "ddpdeploy.yaml"
    rendered = 0
    for _ in range(100):
        fields = rng.sample(sorted(EDGES), rng.randint(1, 4))
        lines = [f"{f}: {rng.choice(EDGES[f])}" for f in fields if f != "image"]
        path.write_text("image: train:v1\n" + "\n".join(lines) + "\n")
        flags = rng.choice([{}, {}, *flags_pool])
        try:
            objects = render_objects(spec_from_flags(path, flags))
        except UserError as exc:
            assert exc.exit_code == 2 and "\n" not in str(exc), path.read_text()
            continue
        rendered += 1
        for obj in objects:
            assert api_errors(obj) == [], path.read_text()
    assert rendered >= 10
