"""The apply path of `up` against an in-memory stand-in for the Kube adapter: create-only,
take-back that reports the first error, ownership refusals, and a replace that an
interrupt cannot stop half-way."""

from __future__ import annotations

import os
import signal

import pytest
from fakekube import FakeKube

from ddpdeploy.cluster import apply as deploy
from ddpdeploy.cluster.find import find_job
from ddpdeploy.cluster.saved import scaled_spec, with_saved_spec
from ddpdeploy.errors import OperationError
from ddpdeploy.obj import Obj
from ddpdeploy.signals import catch_signals
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import render_objects


def objects(name: str = "j", image: str = "r.invalid/t:1"):
    doc = {"image": image, "name": name, "namespace": "ns", "checkpoint": {"size": "1Gi"}}
    spec = JobSpec.model_validate(doc)
    return spec, with_saved_spec(render_objects(spec), spec)


@pytest.fixture
def kube() -> FakeKube:
    fake = FakeKube()
    fake.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    return fake


def up(kube: FakeKube, replace: bool = False, image: str = "r.invalid/t:1") -> list[str]:
    said: list[str] = []
    spec, objs = objects(image=image)
    plan = deploy.preflight(kube, spec, objs, create_namespace=False)
    deploy.apply(kube, plan, replace, said.append)
    return said


def ours(kube: FakeKube) -> list[tuple[str, str]]:
    return [k for k in kube.kinds() if k[0] != "Namespace"]


ALL = [("NetworkPolicy", "j"), ("PersistentVolumeClaim", "j-checkpoints"), ("PyTorchJob", "j")]


def test_a_new_job_is_created_create_only(kube):
    said = up(kube)
    assert ours(kube) == ALL
    assert said == [
        "created PersistentVolumeClaim ns/j-checkpoints",
        "created NetworkPolicy ns/j",
        "created PyTorchJob ns/j",
    ]
    assert [c for c in kube.calls if c[0] == "create"] == [
        ("create", "PersistentVolumeClaim", "j-checkpoints"),
        ("create", "NetworkPolicy", "j"),
        ("create", "PyTorchJob", "j"),
    ]


def test_the_apis_conflict_decides_a_race_and_the_loser_takes_nothing_back(kube):
    spec, objs = objects()
    plan = deploy.preflight(kube, spec, objs, create_namespace=False)
    up(kube, image="r.invalid/winner:1")  # another `up` gets there between read and create
    with pytest.raises(OperationError, match="just created by someone else") as err:
        deploy.apply(kube, plan, False, lambda _: None)
    assert "took back" not in str(err.value)
    assert ours(kube) == ALL
    job = kube.get("kubeflow.org/v1", "PyTorchJob", "j", "ns")
    assert "winner" in job["metadata"]["annotations"]["ddpdeploy.dev/spec"]


def test_the_loser_keeps_what_it_created_beside_the_winners_job(kube):
    # This run creates the PVC and NetworkPolicy, then another `up` creates the job first:
    # the winner's job needs that PVC (the winner applies it), so nothing is taken back.
    _, winner = objects(image="r.invalid/winner:1")
    kube.hooks[("create", "PyTorchJob")] = lambda: kube.add(winner[-1])
    with pytest.raises(OperationError, match="just created by someone else") as err:
        up(kube)
    assert "took back" not in str(err.value)
    assert ours(kube) == ALL


def test_take_back_reports_the_first_error_then_what_it_removed(kube):
    def refuse() -> None:
        raise OperationError("creating PyTorchJob j: the API server refused it: nope")

    def also_fail() -> None:
        raise OperationError("deleting NetworkPolicy j: Read timed out")

    kube.hooks[("create", "PyTorchJob")] = refuse
    kube.hooks[("delete", "NetworkPolicy")] = also_fail
    with pytest.raises(OperationError) as err:
        up(kube)
    text = str(err.value)
    assert text.startswith("creating PyTorchJob j: the API server refused it: nope; took back")
    assert "deleted PersistentVolumeClaim ns/j-checkpoints" in text
    assert "could NOT delete NetworkPolicy ns/j (deleting NetworkPolicy j: Read timed out)" in text
    assert ours(kube) == [("NetworkPolicy", "j")]


def test_a_failed_say_takes_everything_back(kube):
    def full(text: str) -> None:
        raise OSError(28, "No space left on device")

    spec, objs = objects()
    plan = deploy.preflight(kube, spec, objs, create_namespace=False)
    with pytest.raises(OSError):
        deploy.apply(kube, plan, False, full)
    assert ours(kube) == []


def test_foreign_objects_are_refused_before_any_change(kube):
    spec, objs = objects()
    theirs = {**objs[1], "metadata": {**objs[1]["metadata"], "labels": {"owner": "me"}}}
    kube.add(theirs)  # a NetworkPolicy j of someone else's
    with pytest.raises(OperationError, match="NetworkPolicy ns/j exists and is not ours"):
        deploy.preflight(kube, spec, objs, create_namespace=False)
    assert [c for c in kube.calls if c[0] in ("create", "apply", "delete")] == []


@pytest.fixture
def signals():
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    catch_signals()
    yield
    for sig, handler in old.items():
        signal.signal(sig, handler)


def test_an_interrupt_during_a_replace_still_creates_the_new_job(kube, signals):
    up(kube)
    old = kube.get("kubeflow.org/v1", "PyTorchJob", "j", "ns")["metadata"]["uid"]
    kube.hooks[("delete", "PyTorchJob")] = lambda: os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(OperationError) as err:
        up(kube, replace=True)
    assert err.value.exit_code == 130
    assert (
        str(err.value)
        == "interrupted (SIGINT): PyTorchJob ns/j was replaced (the change is complete)"
    )
    assert kube.get("kubeflow.org/v1", "PyTorchJob", "j", "ns")["metadata"]["uid"] != old


def test_an_interrupt_before_the_job_takes_back_what_was_created(kube, signals):
    kube.hooks[("create", "PyTorchJob")] = lambda: os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(OperationError) as err:
        up(kube)
    assert err.value.exit_code == 143
    assert str(err.value).startswith("interrupted (SIGTERM): PyTorchJob ns/j was not created; ")
    assert "deleted NetworkPolicy ns/j, PersistentVolumeClaim ns/j-checkpoints" in str(err.value)
    assert ours(kube) == []


def test_an_interrupt_after_the_job_says_it_was_created_then_taken_back(kube, signals):
    # Found by the third hostile pass: SIGINT right after `created PyTorchJob` said the job
    # "was not created" and then that it was deleted. The next call after the create (the
    # check that the PVC is still there) is where the signal lands.
    def after_create() -> None:
        kube.hooks[("get", "PersistentVolumeClaim")] = lambda: os.kill(os.getpid(), signal.SIGINT)

    kube.hooks[("create", "PyTorchJob")] = after_create
    with pytest.raises(OperationError) as err:
        up(kube)
    assert err.value.exit_code == 130
    assert str(err.value) == (
        "interrupted (SIGINT): PyTorchJob ns/j was created; took back what it had created: "
        "deleted PyTorchJob ns/j, NetworkPolicy ns/j, PersistentVolumeClaim ns/j-checkpoints"
    )
    assert ours(kube) == []


def test_a_pvc_deleted_while_up_runs_takes_the_job_back(kube):
    # `down --purge` at the same moment: the claim goes Terminating after our create.
    def purge() -> None:
        pvc = kube.objects[("PersistentVolumeClaim", "ns", "j-checkpoints")]
        pvc["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    kube.hooks[("create", "PyTorchJob")] = purge
    with pytest.raises(OperationError) as err:
        up(kube)
    text = str(err.value)
    assert text.startswith("PersistentVolumeClaim ns/j-checkpoints was deleted while `up` ran")
    assert "deleted PyTorchJob ns/j" in text
    assert ("PyTorchJob", "j") not in ours(kube)


def test_the_winner_of_a_race_sets_what_the_loser_created_beside_the_job(kube):
    spec, objs = objects(image="r.invalid/winner:1")
    plan = deploy.preflight(kube, spec, objs, create_namespace=False)
    _, loser_objs = objects(image="r.invalid/loser:1")
    # The loser creates the PVC and NetworkPolicy first, then loses the job to us.
    for obj in loser_objs[:-1]:
        kube.add(obj)
    said: list[str] = []
    deploy.apply(kube, plan, False, said.append)
    assert said[0] == "created PyTorchJob ns/j"
    pvc = kube.get("v1", "PersistentVolumeClaim", "j-checkpoints", "ns")
    assert "winner" in pvc["metadata"]["annotations"]["ddpdeploy.dev/spec"]


# --- scale: the same apply path, in place ---------------------------------------------


def elastic(kube: FakeKube) -> Obj:
    doc = {"image": "r.invalid/t:1", "name": "j", "namespace": "ns", "nodes": 2}
    rdzv = {"mode": "elastic", "minNodes": 1, "maxNodes": 3}
    spec = JobSpec.model_validate({**doc, "rendezvous": rdzv, "checkpoint": {"size": "1Gi"}})
    plan = deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)
    deploy.apply(kube, plan, False, lambda _: None)
    return kube.get("kubeflow.org/v1", "PyTorchJob", "j", "ns")


def scale(kube: FakeKube, job: Obj, nodes: int, said: list[str]) -> list[Obj]:
    spec = scaled_spec(job, nodes)
    plan = deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)
    return deploy.apply(kube, plan, False, said.append, in_place=True)


def workers(kube: FakeKube) -> int:
    job = kube.get("kubeflow.org/v1", "PyTorchJob", "j", "ns")
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]


def test_scale_applies_the_job_in_place(kube):
    job = elastic(kube)
    kube.calls.clear()
    said: list[str] = []
    assert scale(kube, job, 3, said) == []  # nothing created
    assert workers(kube) == 3
    assert (
        kube.get("kubeflow.org/v1", "PyTorchJob", "j", "ns")["metadata"]["uid"]
        == (job["metadata"]["uid"])
    )
    assert not [c for c in kube.calls if c[0] in ("create", "delete")]
    assert ("dry-run", "PyTorchJob", "j") in kube.calls  # the server checked it first
    assert said[-1] == "applied PyTorchJob ns/j"


def test_scale_takes_back_what_it_created_when_the_job_apply_fails(kube):
    job = elastic(kube)
    kube.delete("networking.k8s.io/v1", "NetworkPolicy", "j", "ns")

    def refuse() -> None:
        raise OperationError("applying PyTorchJob j: forbidden")

    kube.hooks[("apply", "PyTorchJob")] = refuse
    with pytest.raises(OperationError) as err:
        scale(kube, job, 3, [])
    assert str(err.value) == (
        "applying PyTorchJob j: forbidden; took back what it had created: deleted "
        "NetworkPolicy ns/j"
    )
    assert workers(kube) == 2
    assert ("NetworkPolicy", "j") not in ours(kube)


def test_scale_of_a_job_deleted_meanwhile_changes_nothing(kube):
    job = elastic(kube)
    kube.delete("kubeflow.org/v1", "PyTorchJob", "j", "ns")
    before = kube.kinds()
    with pytest.raises(OperationError, match="no longer exists.*nothing was changed"):
        scale(kube, job, 3, [])
    assert kube.kinds() == before


def test_scale_refuses_a_companion_that_is_not_ours(kube):
    job = elastic(kube)
    np = kube.get("networking.k8s.io/v1", "NetworkPolicy", "j", "ns")
    np["metadata"]["labels"] = {}
    kube.add(np)
    with pytest.raises(OperationError, match="NetworkPolicy ns/j exists and is not ours"):
        scale(kube, job, 3, [])
    assert workers(kube) == 2


# --- down: the one delete path ---------------------------------------------------------


def test_down_deletes_ours_and_keeps_the_pvc(kube):
    up(kube)
    found = find_job(kube, "j", "ns", verb="deleted", required=False)
    said: list[str] = []
    deploy.delete(found, False, said.append)
    assert ours(kube) == [("PersistentVolumeClaim", "j-checkpoints")]
    assert said[:2] == ["deleted PyTorchJob ns/j", "deleted NetworkPolicy ns/j"]
    assert said[2].startswith("kept PersistentVolumeClaim ns/j-checkpoints")
    with pytest.raises(OperationError, match="^no job j .* in namespace ns; nothing deleted$"):
        deploy.delete(find_job(kube, "j", "ns", verb="deleted", required=False), False, print)


# Found by the fourth hostile pass: a nodeSelector no node matches was "2 pod(s) requesting
# cpu 0.1, memory 768Mi each do not fit the cluster: no schedulable node matches nodeSelector;
# lower --cpu (per node) or --memory (per node) or --nodes, or add nodes": a size fix that
# places nothing, and no word of the selector.
def test_a_node_selector_no_node_matches_names_itself_and_its_fix(kube):
    kube.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}},
              "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}})  # fmt: skip
    doc = {"image": "r.invalid/t:1", "name": "j", "namespace": "ns", "cpu": "1",
           "nodeSelector": {"pool": "gpu-a"}}  # fmt: skip
    spec = JobSpec.model_validate(doc)
    with pytest.raises(OperationError) as err:
        deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)
    assert str(err.value) == (
        "no schedulable node matches the job's nodeSelector pool=gpu-a: its 1 pod(s) would "
        "stay Pending; fix nodeSelector in the spec, or label a node with it (kubectl label "
        "node NODE KEY=VALUE)"
    )
    assert ours(kube) == [("Node", "n1")]


# Found by the fourth hostile pass: a secretEnv naming a Secret that is not there passed
# `up` without a word; its pods then sat in CreateContainerConfigError (`up --wait` ended on
# it), where a missing checkpoint claim is a warning before anything is made.
def test_a_missing_secret_or_key_of_secret_env_is_a_warning(kube):
    kube.add({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "ns"},
              "data": {"token": "eA=="}})  # fmt: skip
    doc = {"image": "r.invalid/t:1", "name": "j", "namespace": "ns",
           "secretEnv": {"A": {"secret": "hf", "key": "token"},
                         "B": {"secret": "hf", "key": "other"},
                         "C": {"secret": "gone", "key": "k"}}}  # fmt: skip
    spec = JobSpec.model_validate(doc)
    checked = deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)
    tail = "; the job's containers cannot be created (CreateContainerConfigError) until it does"
    assert checked.warnings == [
        "secretEnv.B: Secret ns/hf has no key other" + tail,
        "secretEnv.C: Secret ns/gone does not exist" + tail,
    ]
    assert "eA==" not in repr(checked.warnings)


def _quota(name: str, hard: dict, used: dict | None = None, scopes: list | None = None) -> Obj:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"hard": hard, **({"scopes": scopes} if scopes else {})},
            "status": {"hard": hard, "used": used or {}}}  # fmt: skip


# Found by the fourth hostile pass: a ResourceQuota that could not hold the job's pods
# (pods=1 for 2 nodes) passed `up` and its dry run (the quota counts pods, not the job);
# the operator's creates were refused and `up --wait` said "no pod j-worker-1 yet" until
# its timeout, `status` the same, without a word of the quota.
def test_a_quota_that_cannot_hold_the_pods_is_refused_before_anything_is_made(kube):
    kube.add(_quota("q1", {"pods": "1", "requests.cpu": "150m"}))
    kube.add(_quota("scoped", {"pods": "0"}, scopes=["BestEffort"]))  # not ours to judge
    doc = {"image": "r.invalid/t:1", "name": "j", "namespace": "ns", "nodes": 2,
           "gpus": 0, "procs": 1, "cpu": "100m"}  # fmt: skip
    spec = JobSpec.model_validate(doc)
    with pytest.raises(OperationError) as err:
        deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)
    assert str(err.value) == (
        "ResourceQuota ns/q1 allows pods 1; the job's 2 pod(s) ask for pods 2: the operator "
        "could not create them; lower --cpu, --memory or --nodes, or ask for a larger quota"
    )


def test_a_quota_used_up_by_others_now_is_a_warning(kube):
    kube.add(_quota("q3", {"requests.cpu": "300m", "limits.memory": "4Gi"},
                    {"requests.cpu": "200m", "limits.memory": "1Gi"}))  # fmt: skip
    doc = {"image": "r.invalid/t:1", "name": "j", "namespace": "ns", "nodes": 2,
           "gpus": 0, "procs": 1, "cpu": "100m", "memory": "1Gi"}  # fmt: skip
    spec = JobSpec.model_validate(doc)
    checked = deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)
    assert checked.warnings == [
        "ResourceQuota ns/q3: requests.cpu 0.2 of 0.3 is used; the job's 2 pod(s) ask for "
        "requests.cpu 0.2: some wait uncreated until that frees up"
    ]


class NoSchedulers(FakeKube):
    """A cluster without Volcano's and Kueue's CRDs."""

    def has_kind(self, api_version: str, kind: str) -> bool:
        return kind not in ("PodGroup", "LocalQueue")


# Found by the fifth hostile pass: `up --scheduler volcano` (or `--queue q`) on a cluster
# without Volcano (Kueue) passed; its pods sat Pending with no event (the job Suspended)
# until --timeout, and `status` said only "Pending — 1 pods created" ("Suspended").
@pytest.mark.parametrize(
    ("scheduling", "says"),
    [
        ({"scheduler": "volcano"}, "--scheduler volcano: Volcano is not installed in the cluster"),
        ({"queue": "q"}, "--queue q: Kueue is not installed in the cluster"),
    ],
    ids=["volcano", "kueue"],
)
def test_a_scheduler_or_queue_the_cluster_lacks_is_refused(scheduling, says):
    kube = NoSchedulers()
    kube.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    doc = {"image": "r.invalid/t:1", "name": "j", "namespace": "ns", "scheduling": scheduling}
    spec = JobSpec.model_validate(doc)
    with pytest.raises(OperationError) as err:
        deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)
    assert str(err.value).startswith(says)
    assert "install" in str(err.value) and "drop --" in str(err.value)
    assert ours(kube) == []


# Found by the fifth hostile pass: `up --host-network --nodes 2` on a one-node cluster
# passed the preflight (the CPU and memory fit) and was applied; the second pod could never
# be scheduled ("didn't have free ports for the requested pod ports").
def test_host_network_pods_need_a_node_each(kube):
    kube.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}},
              "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}})  # fmt: skip
    doc = {"image": "r.invalid/t:1", "name": "j", "namespace": "ns", "nodes": 2, "gpus": 0,
           "cpu": "1", "memory": "1Gi", "network": {"hostNetwork": True}}  # fmt: skip
    spec = JobSpec.model_validate(doc)
    with pytest.raises(OperationError) as err:
        deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)
    assert str(err.value).startswith(
        "--host-network: each of the job's 2 pods needs a node of its own"
    )
    assert "lower --nodes to at most 1" in str(err.value)
    spec = JobSpec.model_validate({**doc, "nodes": 1})
    deploy.preflight(kube, spec, with_saved_spec(render_objects(spec), spec), False)


# Found by the fifth hostile pass: a mistyped -n (a namespace that does not exist) was "no
# job j1 ... in namespace hostile5-zz; `ddpdeploy list -n hostile5-zz` shows the jobs",
# as if the job were gone; the same from down, resume and collect.
def test_no_job_in_a_namespace_that_does_not_exist_says_so(kube):
    gone = ": the namespace does not exist; check -n (`kubectl get namespaces` lists them)"
    with pytest.raises(OperationError) as err:
        find_job(kube, "j", "typo", hint="; hint")
    assert str(err.value) == "no job j (PyTorchJob, TrainJob or Job) in namespace typo" + gone
    with pytest.raises(OperationError) as err:
        find_job(kube, "j", "ns", hint="; hint")
    assert str(err.value).endswith(" in namespace ns; hint")
    with pytest.raises(OperationError) as err:
        deploy.delete(find_job(kube, "j", "typo", verb="deleted", required=False), False, print)
    assert str(err.value).endswith("namespace typo" + gone)
    with pytest.raises(OperationError) as err:
        deploy.resumable(find_job(kube, "j", "typo", verb="resumed", required=False), print)
    assert str(err.value) == "no saved spec for j in namespace typo" + gone


def _up_cli(kube: FakeKube, monkeypatch, capsys, *more: str) -> tuple[int, list[str]]:
    """`ddpdeploy up` itself, connected to the stand-in (its connect replaced)."""
    from ddpdeploy.cli import main

    monkeypatch.setattr("ddpdeploy.cluster.find.connect", lambda _config, _context: kube)
    args = ["up", "--image", "r.invalid/t:1", "--name", "j", "-n", "ns", "--no-wait", *more]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    return int(exit_.value.code or 0), capsys.readouterr().err.splitlines()


def test_an_interrupt_between_the_preflight_and_the_first_change_says_nothing_changed(
    kube, signals, monkeypatch, capsys, tmp_path
):
    # Found by CI: SIGINT right after the preflight's last warning landed before apply's
    # own handler and ended as "aborted (SIGINT); nothing more was done".
    refuse = deploy._refuse_existing

    def interrupted_first(*args, **kwargs) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        refuse(*args, **kwargs)

    monkeypatch.setattr(deploy, "_refuse_existing", interrupted_first)
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    code, err = _up_cli(kube, monkeypatch, capsys, "-f", str(spec))
    assert code == 130, err
    assert err[-1] == "error: interrupted (SIGINT): stopped before any change; nothing was changed"
    assert ours(kube) == []


@pytest.mark.parametrize("replace", [False, True], ids=["new", "replace"])
def test_an_interrupt_held_off_by_the_claims_save_says_what_the_change_was(
    kube, signals, monkeypatch, capsys, tmp_path, replace
):
    kube.add(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "j-checkpoints", "namespace": "ns"},
            "spec": {"resources": {"requests": {"storage": "1Gi"}}},
        }
    )
    spec = tmp_path / "ddpdeploy.yaml"
    spec.write_text("checkpoint: {size: 1Gi}\n")
    if replace:
        assert _up_cli(kube, monkeypatch, capsys, "-f", str(spec), "--adopt-pvc")[0] == 0
    save = deploy._save_on_adopted_claim

    def interrupted_save(*args, **kwargs) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # held off until the save is done
        save(*args, **kwargs)

    monkeypatch.setattr(deploy, "_save_on_adopted_claim", interrupted_save)
    more = ["--replace"] if replace else []
    code, err = _up_cli(kube, monkeypatch, capsys, "-f", str(spec), "--adopt-pvc", *more)
    assert code == 143, err
    assert any(line.startswith("saved the spec on PersistentVolumeClaim") for line in err), err
    done = "was replaced" if replace else "was submitted"
    assert err[-1] == (
        f"error: interrupted (SIGTERM): PyTorchJob ns/j {done} (the change is complete)"
    )
    assert ("PyTorchJob", "j") in ours(kube)
