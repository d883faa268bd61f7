"""Property: for any spec file and flags, `render` either succeeds with objects the API
server accepts (schemas as in test_render_k8s) and YAML that a YAML 1.2 reader reads as the
JSON output, or fails with one line, no traceback, and nothing written."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from k8s_schema import (
    builtin_errors,
    int_format_errors,
    pytorchjob_errors,
    trainjob_errors,
    trainjob_pod_template,
)
from yaml_readers import ruamel_load_all

from ddpdeploy.cli import main

TRICKY = ["1e-3", "0o17", "0x1F", "1_000", ".inf", "yes", "on", "~", "1:30", "012", "+1"]
TRICKY += ["-.5", "null", "true", "2024-01-01", "é", "a: b", "#", " x", "x\n", ""]

# Text as a user (or a shell) can pass it: no NUL, no lone surrogates.
text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12)
word = st.one_of(st.sampled_from(TRICKY), text)
label_value = st.sampled_from(["a", "yes", "on", "012", "1e-3", "true", "null", "y", "v1.2"])
label_key = st.sampled_from(["team", "a.b/c", "yes", "on", "012", "1e-3", "app_x"])
env_name = st.sampled_from(["A", "B_1", "yes", "on", "null", ".inf", "x-y"])
quantity = st.sampled_from(["1Gi", "500Mi", "2", "0.5", "1e3", "100m"])


def opt(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


# Values the API server accepts, tricky strings included wherever Kubernetes allows them.
VALID: dict[str, st.SearchStrategy[Any]] = {
    "name": st.sampled_from(["j", "train-1", "a" * 40]),
    "namespace": st.sampled_from(["default", "team-a"]),
    "image": st.sampled_from(["t:1", "ghcr.io/a/b:v1", "reg:5000/x@sha256:" + "a" * 64]),
    "nodes": st.integers(1, 6),
    "gpus": st.integers(0, 8),
    "procs": st.integers(1, 4),
    "cpu": quantity,
    "memory": quantity,
    "backend": st.sampled_from(["auto", "nccl", "gloo"]),
    "command": st.one_of(
        opt(args=st.lists(st.one_of(word, st.integers()), max_size=4)),
        st.fixed_dictionaries({"script": st.just("train.py"), "args": st.lists(word, max_size=3)}),
        st.fixed_dictionaries({"module": st.just("pkg.train")}),
    ),
    "rendezvous": st.one_of(
        opt(mode=st.just("static"), port=st.integers(1, 65535), joinTimeout=st.integers(1, 999)),
        st.fixed_dictionaries(
            {"mode": st.just("elastic"), "minNodes": st.integers(1, 2)},
            optional={"maxNodes": st.integers(2, 4), "maxRestarts": st.integers(0, 3)},
        ),
    ),
    "checkpoint": st.one_of(
        st.fixed_dictionaries({"claimName": st.just("ckpt")}),
        opt(size=st.just("10Gi"), storageClass=st.just("fast"), mountPath=st.just("/ckpt")),
    ),
    "shmSize": st.sampled_from([None, "1Gi"]),
    "terminationGracePeriodSeconds": st.integers(0, 300),
    "env": st.dictionaries(env_name, st.one_of(word, st.integers(), st.booleans()), max_size=3),
    "imagePullSecrets": st.just(["regcred"]),
    "nodeSelector": st.dictionaries(label_key, label_value, max_size=2),
    "tolerations": st.just([{"key": "nvidia.com/gpu", "operator": "Exists"}]),
    "serviceAccount": st.just("trainer"),
    "priorityClass": st.just("high"),
    "labels": st.dictionaries(label_key, label_value, max_size=3),
    "annotations": st.dictionaries(st.sampled_from(["a.b/c", "note"]), word, max_size=2),
    "runPolicy": opt(backoffLimit=st.integers(0, 5), cleanPodPolicy=st.just("Running")),
    "target": st.sampled_from(["pytorchjob", "trainjob", "indexed-job"]),
    "runtime": st.sampled_from(["torch-distributed", "my-runtime"]),
    "secretEnv": st.dictionaries(
        st.sampled_from(["HF_TOKEN", "WANDB_API_KEY"]),
        st.fixed_dictionaries({"secret": st.just("s"), "key": st.sampled_from(["k", ".a-b_c"])}),
        max_size=2,
    ),
    "security": opt(
        runAsUser=st.integers(1, 2**31 - 1),
        runAsGroup=st.integers(0, 2**31 - 1),
        fsGroup=st.integers(0, 2**31 - 1),
        readOnlyRootFilesystem=st.booleans(),
        automountServiceAccountToken=st.booleans(),
    ),
    "scheduling": opt(
        scheduler=st.sampled_from(["default", "volcano"]), queue=st.sampled_from(["q", "team-a"])
    ),
    "network": opt(
        policy=st.booleans(),
        hostNetwork=st.booleans(),
        rdma=opt(resource=st.just("rdma/ib"), count=st.integers(1, 8)),
        ncclDebug=st.sampled_from(["WARN", "INFO"]),
        ncclSocketIfname=st.sampled_from(["eth0", "^lo,docker"]),
        ncclIbHca=st.just("mlx5_0"),
    ),
}

nasty_int = st.one_of(
    st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**63, 2**70, True, "3", 1.5, "1e3"]),
    st.integers(2**31 - 3, 2**65),
)
nasty_str = st.one_of(word, st.sampled_from(["x\n", "a" * 300, "Bad", "-x", "/", "/dev/shm"]))
nasty_map = st.dictionaries(st.one_of(word, nasty_str), st.one_of(nasty_str, nasty_int), max_size=2)
nasty = st.one_of(nasty_int, nasty_str, nasty_map, st.none(), st.lists(nasty_str, max_size=2))
# One field at a time gets a value outside the valid pool, so a refusal (or a hole) is
# pinned to that field; inner fields get their own nasty values.
INT_FIELDS = ["nodes", "gpus", "procs", "terminationGracePeriodSeconds"]
MAP_FIELDS = ["env", "nodeSelector", "labels", "annotations"]
NASTY: dict[str, st.SearchStrategy[Any]] = {
    **{k: st.one_of(nasty_str, nasty) for k in VALID},
    **{k: nasty_int for k in INT_FIELDS},
    **{k: nasty_map for k in MAP_FIELDS},
    "imagePullSecrets": st.lists(nasty_str, max_size=2),
    "rendezvous": opt(
        mode=st.sampled_from(["static", "elastic", "x"]),
        minNodes=nasty_int,
        maxNodes=nasty_int,
        maxRestarts=nasty_int,
        port=nasty_int,
        joinTimeout=nasty_int,
    ),
    "checkpoint": opt(
        claimName=nasty_str,
        size=nasty_str,
        storageClass=nasty_str,
        accessMode=nasty_str,
        mountPath=nasty_str,
    ),
    "tolerations": st.lists(
        opt(
            key=nasty_str,
            operator=st.sampled_from(["Exists", "Equal", "x"]),
            value=nasty_str,
            effect=st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule", "x"]),
            tolerationSeconds=nasty_int,
        ),
        max_size=2,
    ),
    "runPolicy": opt(
        backoffLimit=nasty_int,
        activeDeadlineSeconds=nasty_int,
        ttlSecondsAfterFinished=nasty_int,
        cleanPodPolicy=nasty_str,
    ),
    "command": opt(script=nasty_str, module=nasty_str, args=st.one_of(nasty_str, nasty_map)),
    "secretEnv": st.dictionaries(
        st.one_of(word, nasty_str), opt(secret=nasty_str, key=nasty_str), max_size=2
    ),
    "security": opt(
        runAsUser=nasty_int, runAsGroup=nasty_int, fsGroup=nasty_int, readOnlyRootFilesystem=nasty
    ),
    "scheduling": opt(scheduler=nasty_str, queue=nasty_str),
    "network": opt(
        policy=nasty,
        hostNetwork=nasty,
        rdma=opt(resource=nasty_str, count=nasty_int),
        ncclDebug=nasty_str,
        ncclSocketIfname=nasty_str,
        ncclIbHca=nasty_str,
    ),
}


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(st.lists(st.sampled_from(sorted(VALID)), unique=True, max_size=8))
    spec = {f: draw(VALID[f]) for f in fields}
    target = draw(st.sampled_from([None, "trainjob", "indexed-job"]))
    if target is not None:
        # Mostly fields the target can carry, so its objects get checked; refusals of the
        # others are covered by the nasty values and by tests/test_targets.py.
        spec["target"] = target
        drop = ["runPolicy", "priorityClass" if target == "trainjob" else "runtime"]
        for name in drop:
            spec.pop(name, None)
        if target == "trainjob" or spec.get("rendezvous", {}).get("mode") == "elastic":
            spec.pop("rendezvous", None)
    # Most examples put a nasty value in one or two fields.
    for wild in draw(st.lists(st.sampled_from(sorted(NASTY)), max_size=2, unique=True)):
        spec[wild] = draw(NASTY[wild])
        event(f"nasty {wild}")
    return spec


VALID_FLAGS = {
    "--name": st.sampled_from(["j", "k-2"]),
    "--namespace": st.sampled_from(["default", "ns"]),
    "--image": st.sampled_from(["t:1", "r.io/x:y"]),
    "--nodes": st.integers(1, 4).map(str),
    "--gpus": st.integers(0, 8).map(str),
    "--procs": st.integers(1, 4).map(str),
    "--elastic": st.sampled_from(["1:2", "2:4"]),
    "--max-restarts": st.integers(0, 3).map(str),
    "--target": st.sampled_from(["pytorchjob", "trainjob", "indexed-job"]),
    "--runtime": st.sampled_from(["torch-distributed", "r.x"]),
    "--scheduler": st.sampled_from(["default", "volcano"]),
    "--queue": st.sampled_from(["q", "team-a"]),
    "--rdma": st.sampled_from(["rdma/ib=1", "nvidia.com/hostdev=2"]),
    "--nccl-debug": st.sampled_from(["WARN", "INFO"]),
}


@st.composite
def flag_sets(draw: st.DrawFn) -> dict[str, str]:
    # Flags win over the file, so most examples give none: the file's values get through.
    flags = (
        draw(st.fixed_dictionaries({}, optional=VALID_FLAGS)) if not draw(st.integers(0, 2)) else {}
    )
    if not draw(st.integers(0, 3)):  # a nasty flag value hides the file's: only now and then
        wild = draw(st.sampled_from(sorted(VALID_FLAGS)))
        flags[wild] = draw(st.one_of(nasty_str, nasty_int.map(str)))
    return flags


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            code = 0
    return code, out.getvalue(), err.getvalue()


# A few of the API server's own checks that no schema carries (k8s.io/apimachinery
# validation; pkg/apis/core/validation): names, labels, annotations, mounts, tolerations.
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def qualified_name_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    prefix_ok = not prefix or (len(prefix) <= 253 and DNS1123_SUBDOMAIN.fullmatch(prefix))
    return bool(prefix_ok and len(name) <= 63 and QUALIFIED_NAME.fullmatch(name))


def label_errors(where: str, labels: dict[str, str]) -> list[str]:
    return [
        f"{where}: label {k!r}={v!r} is invalid"
        for k, v in labels.items()
        if not qualified_name_ok(k) or len(v) > 63 or not LABEL_VALUE.fullmatch(v)
    ]


def meta_errors(meta: dict[str, Any]) -> list[str]:
    errors = label_errors("metadata.labels", meta.get("labels", {}))
    notes = meta.get("annotations", {})
    errors += [f"annotation key {k!r} is invalid" for k in notes if not qualified_name_ok(k)]
    if sum(len(k) + len(v) for k, v in notes.items()) > 256 * 1024:
        errors.append("annotations exceed 256 KiB")
    for field, pattern in (("name", DNS1123_SUBDOMAIN), ("namespace", DNS1123_LABEL)):
        value = meta.get(field)
        if value is not None and not (len(value) <= 253 and pattern.fullmatch(value)):
            errors.append(f"metadata.{field} {value!r} is invalid")
    return errors


def pod_errors(pod: dict[str, Any]) -> list[str]:
    errors = meta_errors(pod["metadata"])
    spec = pod["spec"]
    errors += label_errors("nodeSelector", spec.get("nodeSelector", {}))
    for t in spec.get("tolerations", []):
        if t.get("operator") == "Exists" and t.get("value"):
            errors.append("toleration: operator Exists with a value")
        if "tolerationSeconds" in t and t.get("effect") != "NoExecute":
            errors.append("toleration: tolerationSeconds needs effect NoExecute")
    for c in spec["containers"]:
        paths = [m["mountPath"] for m in c.get("volumeMounts", [])]
        if len(paths) != len(set(paths)):
            errors.append(f"volumeMounts: duplicate mountPath in {paths}")
    return errors


def _template_errors(template: dict[str, Any], namespace: str) -> list[str]:
    wrapped = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "t", "namespace": namespace},
        "template": template,
    }
    return builtin_errors(wrapped) + int_format_errors(wrapped) + pod_errors(template)


def object_errors(obj: dict[str, Any]) -> list[str]:
    errors = int_format_errors(obj) + meta_errors(obj["metadata"])
    namespace = obj["metadata"]["namespace"]
    if obj["kind"] == "TrainJob":
        pod = trainjob_pod_template(obj)
        return errors + trainjob_errors(obj) + _template_errors(pod["template"], namespace)
    if obj["kind"] == "Job":
        errors += pod_errors(obj["spec"]["template"])
    if obj["kind"] != "PyTorchJob":
        return errors + builtin_errors(obj)
    errors += pytorchjob_errors(obj)
    for replica in obj["spec"]["pytorchReplicaSpecs"].values():
        errors += _template_errors(replica["template"], namespace)
    return errors


def assert_valid(obj: dict[str, Any]) -> None:
    assert object_errors(obj) == []


def assert_one_line(code: int, out: str, err: str) -> None:
    assert code in (1, 2), (code, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err


@settings(
    # DDPDEPLOY_PROPERTY_EXAMPLES=2000 for a longer hunt by hand.
    max_examples=int(os.environ.get("DDPDEPLOY_PROPERTY_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=specs(), flags=flag_sets(), train_args=st.lists(word, max_size=3))
def test_render_is_valid_or_one_line(spec, flags, train_args):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        spec.setdefault("image", "t:1")
        path.write_text(yaml.safe_dump(spec), encoding="utf-8")
        argv = ["render", "-f", str(path)]
        for flag, value in flags.items():
            argv += [flag, value]
        tail = ["--", *train_args] if train_args else []
        code, out, err = run([*argv, "-o", "json", *tail])
        out_dir = Path(tmp) / "deploy"
        dir_code, _, dir_err = run([*argv, "--out-dir", str(out_dir), *tail])
        assert dir_code == code, dir_err
        event("rendered" if code == 0 else "refused: " + err.replace(str(path), "FILE")[7:40])
        if code != 0:
            assert_one_line(code, out, err)
            assert not out_dir.exists()
            return
        assert err == ""
        doc = json.loads(out)
        objects = doc["items"] if doc["kind"] == "List" else [doc]
        for obj in objects:
            event(f"rendered {obj['kind']}")
            assert_valid(obj)
        yaml_code, yaml_out, _ = run([*argv, "-o", "yaml", *tail])
        assert yaml_code == 0
        assert ruamel_load_all(yaml_out) == objects
        folder = {p.name: p.read_text(encoding="utf-8") for p in out_dir.glob("*.yaml")}
        kustomization = ruamel_load_all(folder.pop("kustomization.yaml"))[0]
        assert kustomization["resources"] == sorted(folder, key=kustomization["resources"].index)
        assert [ruamel_load_all(folder[n])[0] for n in kustomization["resources"]] == objects
