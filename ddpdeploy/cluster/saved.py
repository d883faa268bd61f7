"""The spec and run record a job carries (annotations on the job and on its checkpoint PVC,
so that `resume` can recreate a job even after `down`), read back strictly, and the spec
`scale` makes from a live job. Pure functions over dicts.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import ValidationError

from ddpdeploy.cluster.labels import INSTANCE_LABEL
from ddpdeploy.contract import RunRecord, facts_env, record_from_env
from ddpdeploy.errors import UserError
from ddpdeploy.obj import Obj
from ddpdeploy.render.pod import checkpoint_claim_name
from ddpdeploy.spec import OWN_DOMAIN, JobSpec, canonical_json, spec_with
from ddpdeploy.spec import load as specfile
from ddpdeploy.targets import layout_for_kind

SPEC_ANNOTATION = f"{OWN_DOMAIN}/spec"
# What `up --build` knew of the image beyond the spec (contract.RunRecord: its digest and git
# facts), saved beside the spec for `scale` and `resume` to render with: one annotation per
# fact, named by the env the pods get it as. Annotations rather than the pod template's env:
# the PVC keeps them through `down`, as it keeps the spec, and they read the same on every
# target (a TrainJob keeps its env under spec.trainer). One key each, not one JSON value: a
# value that is dropped is then left out of the next apply alone, and a key someone else
# edited (so owns) is left to them rather than conflicting with the apply of the others.
RECORD_PREFIX = f"record.{OWN_DOMAIN}/"


def spec_json(spec: JobSpec) -> str:
    # The bytes whose sha256 the pods get as DDPDEPLOY_SPEC_SHA256 (one home: spec/).
    return canonical_json(spec)


def with_saved_spec(
    objects: list[Obj], spec: JobSpec, record: RunRecord | None = None
) -> list[Obj]:
    """Copies of ``objects``, each annotated with the spec that rendered them and the facts
    of ``record`` they were rendered with (no record: no record annotations)."""
    saved = spec_json(spec)
    facts = record_annotations(record) if record is not None else {}
    out = []
    for obj in objects:
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("annotations", {}).update({SPEC_ANNOTATION: saved, **facts})
        out.append(obj)
    return out


def record_annotations(record: RunRecord) -> dict[str, str]:
    return {RECORD_PREFIX + name: value for name, value in facts_env(record).items()}


def saved_record(obj: Obj, image: str | None = None) -> tuple[RunRecord | None, str | None]:
    """The run record saved on ``obj`` (None when it has none), for `scale` and `resume` to
    render with, and one warning line (or None). Text from the cluster: a value that is not
    what a build gives (contract.record_from_env; ``image``: the spec's, whose pinned digest
    a digest must be) is dropped, never copied into new pods, and the line names it (not
    its value)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    env = {
        key.removeprefix(RECORD_PREFIX): value
        for key, value in annotations.items()
        if key.startswith(RECORD_PREFIX)
    }
    record, dropped = record_from_env(env, image)
    warning = None
    if dropped:
        where = f"{obj.get('kind')} {meta.get('namespace')}/{meta.get('name')}"
        names = ", ".join(RECORD_PREFIX + name for name in dropped)
        warning = f"{where}: its run record is malformed in {names}; left out of the new pods"
    return (record if facts_env(record) else None), warning


def saved_spec(obj: Obj) -> JobSpec | None:
    """The spec saved on ``obj`` (None when it has none), read like a spec file: bounded,
    strict and validated; and it must be the spec of this very object: same job (its
    instance label), same namespace, and the object's own name (the job, or its PVC).
    Anything else is refused in one line: an edited annotation must not choose what runs."""
    meta = obj.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(SPEC_ANNOTATION)
    if not text:
        return None
    where = f"{obj.get('kind')} {meta.get('namespace')}/{meta.get('name')}"
    spec = _read_saved(text, where)
    instance = (meta.get("labels") or {}).get(INSTANCE_LABEL)

    names = {spec.name, checkpoint_claim_name(spec)}
    if (
        spec.namespace != meta.get("namespace")
        or meta.get("name") not in names
        or (instance is not None and instance != spec.name)
    ):
        raise UserError(
            f"{where}: the saved spec ({SPEC_ANNOTATION}) names job {spec.namespace}/"
            f"{spec.name}, not this object's; refusing it (it was edited; `ddpdeploy up` "
            "again with the spec you mean)",
            exit_code=1,
        )
    return spec


def _read_saved(text: Any, where: str) -> JobSpec:

    def refuse(why: str) -> UserError:
        return UserError(
            f"{where}: the saved spec ({SPEC_ANNOTATION}) is unreadable: {why}", exit_code=1
        )

    if not isinstance(text, str) or len(text.encode()) > specfile.MAX_BYTES:
        raise refuse(f"larger than {specfile.MAX_BYTES // 1024} KiB")
    try:
        doc = specfile.resolve(specfile.parse(text), JobSpec)
    except specfile.SpecSyntaxError as exc:
        raise refuse(str(exc)) from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise refuse(" ".join(str(getattr(exc, "problem", None) or exc).split())[:200]) from None
    if not isinstance(doc, dict):
        raise refuse("not a mapping of fields")
    try:
        return JobSpec.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise refuse(f"{loc}: {first['msg']}" if loc else first["msg"]) from None


def scaled_spec(job: Obj, nodes: int) -> JobSpec:
    """The job's saved spec at ``nodes`` nodes, within its elastic MIN:MAX.

    Re-rendering it and applying as the same field manager changes exactly the Worker
    count and the saved spec, and keeps later applies by `up` and `resume` free of
    conflicts with another manager."""
    name, kind = job["metadata"]["name"], job.get("kind", "job")
    layout = layout_for_kind(job.get("apiVersion", ""), kind)
    bounds = layout.elastic_range(job) if layout and layout.can_scale else None
    if bounds is None:
        raise UserError(
            f"--nodes: {kind} {name} is not elastic; only jobs started with "
            "--elastic MIN:MAX can be scaled (down and up again to change the size of another)"
        )
    low, high = bounds
    if not low <= nodes <= high:
        raise UserError(f"--nodes: {nodes} is outside the job's elastic range {low}:{high}")
    spec = saved_spec(job)
    if spec is None:
        raise UserError(f"{kind} {name} has no saved spec: only jobs `ddpdeploy up` made scale")
    return spec_with(spec, nodes=nodes)
