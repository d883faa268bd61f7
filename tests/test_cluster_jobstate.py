"""Job conditions and pod statuses -> state and reason, as the API reports them."""

from __future__ import annotations

import pytest

from ddpdeploy.cluster.capacity import (
    fitted_resources,
    gpu_nodes,
    gpu_nodes_free,
    limit_range_breaches,
)
from ddpdeploy.cluster.jobstate import (
    conditions_state,
    job_size,
    job_state,
    logs_show_rank0,
    pod_view,
    start_event,
)
from ddpdeploy.cluster.saved import scaled_spec, with_saved_spec
from ddpdeploy.commands.options import spec_from_flags
from ddpdeploy.errors import UserError
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import layout_of, render_objects


def job(*conds: tuple[str, str], target: str = "pytorchjob") -> dict:
    conditions = [{"type": t, "status": "True", "message": m} for t, m in conds]
    layout = layout_of(target)
    return {
        "apiVersion": layout.api_version,
        "kind": layout.kind,
        "metadata": {"name": "j"},
        "status": {"conditions": conditions},
    }


def pod(name="j-master-0", phase="Pending", waiting=None, restarts=0, sched=None, last=None):
    status: dict = {"phase": phase}
    if waiting:
        cs = {"name": "pytorch", "image": "img:1", "restartCount": restarts}
        cs["state"] = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
        if last:
            cs["lastState"] = {"terminated": {"exitCode": last[0], "reason": last[1]}}
        status["containerStatuses"] = [cs]
    if sched:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": sched}
        ]
    labels = {
        "training.kubeflow.org/replica-type": "master",
        "training.kubeflow.org/replica-index": "0",
    }
    return {"metadata": {"name": name, "labels": labels}, "status": status}


CASES = [
    ("no job", None, [], "NotFound", True, False),
    ("created", job(("Created", "")), [], "Pending", False, False),
    ("pods pending", job(("Created", "")), [pod()], "Pending", False, False),
    ("running", job(("Running", "")), [pod(phase="Running")], "Running", False, False),
    ("pod running first", job(), [pod(phase="Running")], "Running", False, False),
    ("succeeded", job(("Running", ""), ("Succeeded", "done")), [], "Succeeded", True, True),
    ("failed", job(("Failed", "backoff limit")), [pod(phase="Failed")], "Failed", True, False),
    (
        "image pull backoff",
        job(("Created", "")),
        [pod(waiting=("ImagePullBackOff", "Back-off pulling image"))],
        "ImagePullBackOff",
        True,
        False,
    ),
    (
        "err image pull",
        job(),
        [pod(waiting=("ErrImagePull", "not found"))],
        "ErrImagePull",
        True,
        False,
    ),
    (
        # A node that only lacks room now: what runs there may end, an autoscaler may add
        # one (`up` warned that the pods wait); waited out, not the end.
        "unschedulable for now",
        job(),
        [pod(sched="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")],
        "Unschedulable",
        False,
        False,
    ),
    (
        "unschedulable for now on one node of three",
        job(),
        [
            pod(
                sched="0/3 nodes are available: 1 Too many pods, 2 node(s) didn't match Pod's "
                "node affinity/selector."
            )
        ],
        "Unschedulable",
        False,
        False,
    ),
    (
        "unschedulable on every node whatever runs",
        job(),
        [
            pod(
                sched="0/2 nodes are available: 2 node(s) had taint {gpu: only}, that the pod "
                "didn't tolerate."
            )
        ],
        "Unschedulable",
        True,
        False,
    ),
    (
        "a newer scheduler's preemption clause",
        job(),
        [
            pod(
                sched="0/1 nodes are available: 1 node(s) didn't match Pod's node "
                "affinity/selector. preemption: 0/1 nodes are available: 1 Insufficient cpu."
            )
        ],
        "Unschedulable",
        True,
        False,
    ),
    # Found by the fifth hostile pass: a claim an Immediate StorageClass's provisioner has
    # not bound yet (seconds after `up` made it) ended `up --wait` at once, Unschedulable.
    (
        "a claim not bound yet",
        job(),
        [pod(sched="0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims.")],
        "Unschedulable",
        False,
        False,
    ),
    (
        "crash loop",
        job(("Running", "")),
        [
            pod(
                phase="Running",
                waiting=("CrashLoopBackOff", "back-off"),
                restarts=4,
                last=(1, "Error"),
            )
        ],
        "CrashLoopBackOff",
        True,
        False,
    ),
    (
        "restarting",
        job(("Restarting", "restarting")),
        [pod(phase="Running")],
        "Restarting",
        False,
        False,
    ),
    (
        "terminal beats stuck",
        job(("Failed", "x")),
        [pod(waiting=("ErrImagePull", ""))],
        "Failed",
        True,
        False,
    ),
]


@pytest.mark.parametrize(
    ("what", "job_obj", "pods", "state", "done", "ok"), CASES, ids=[c[0] for c in CASES]
)
def test_job_state(what, job_obj, pods, state, done, ok):
    got = job_state(job_obj, pods)
    assert (got.state, got.done, got.ok) == (state, done, ok)


def test_reasons_name_the_pod_and_the_cause():
    sched = job_state(job(), [pod(sched="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")])
    assert sched.reason == "pod j-master-0: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    crash = job_state(
        job(), [pod(waiting=("CrashLoopBackOff", "b"), restarts=5, last=(137, "OOMKilled"))]
    )
    assert (crash.state, crash.reason) == (
        "OOMKilled",
        "pod j-master-0: container pytorch went over its memory limit and was killed "
        "(restarted 5 times); raise --memory (per node: request and limit)",
    )
    pull = job_state(job(), [pod(waiting=("ImagePullBackOff", "Back-off pulling image"))])
    assert pull.reason == "pod j-master-0: cannot pull image img:1: Back-off pulling image"


def test_pod_view():
    view = pod_view(
        pod(phase="Running", waiting=("CrashLoopBackOff", "b"), restarts=2), layout_of("pytorchjob")
    )
    assert (view.replica, view.index, view.phase, view.restarts) == ("master", 0, "Running", 2)
    assert view.detail == "CrashLoopBackOff: b"


def spec(*flags: str, **values):
    return spec_from_flags(None, {f"--{k}": v for k, v in values.items()}, list(flags) or None)


def test_job_size_and_saved_spec_round_trip():
    s = spec(image="t:1", nodes=3, gpus=8)
    objs = with_saved_spec(render_objects(s), s)
    assert job_size(objs[-1]) == (3, 8)
    from ddpdeploy.cluster.saved import saved_spec

    assert saved_spec(objs[-1]) == s
    assert render_objects(s)[-1]["metadata"].get("annotations") is None  # render unchanged


def node(name, gpus, unschedulable=False):
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def test_gpu_capacity():
    nodes = [node("a", 8), node("b", 8, unschedulable=True), node("c", 4)]
    assert gpu_nodes(nodes, 8) == (2, 1)
    busy = {
        "spec": {"nodeName": "a", "containers": [{"resources": {"limits": {"nvidia.com/gpu": 2}}}]},
        "status": {"phase": "Running"},
    }
    assert gpu_nodes_free(nodes, [busy], 8) == 0
    assert gpu_nodes_free(nodes, [busy], 4) == 2


def test_scaled_spec_respects_the_elastic_range():
    s = spec(image="t:1", nodes=2, elastic="1:3")
    job_obj = with_saved_spec(render_objects(s), s)[-1]
    assert scaled_spec(job_obj, 3) == spec_from_flags(
        None, {"--image": "t:1", "--nodes": 3, "--elastic": "1:3"}
    )
    with pytest.raises(UserError, match="outside the job's elastic range 1:3"):
        scaled_spec(job_obj, 4)
    static = render_objects(spec(image="t:1", nodes=2))[-1]
    with pytest.raises(UserError, match="not elastic"):
        scaled_spec(static, 2)
    with pytest.raises(UserError, match="no saved spec"):
        scaled_spec(render_objects(s)[-1], 2)


def test_rank0_is_found_by_the_start_event():
    assert logs_show_rank0(["waiting for DNS", '{"event": "start", "world_size": 4}'])
    assert not logs_show_rank0(["ddptrain: warning: x", "{not json", '{"event": "step"}'])


def test_rank0_of_a_plain_script_is_found_by_torchruns_prefix():
    # No events: the line torchrun prefixed with global rank 0 (PET_TEE) says where it ran.
    assert logs_show_rank0(["[rank2]:epoch 0", "[rank0]:[GPU0] Epoch 0 | Steps: 8"])
    assert not logs_show_rank0(["[rank2]:epoch 0", "[rank3]:[rank0] not a prefix", "[rank10]:x"])


def test_rank0_is_found_after_another_ranks_partial_line():
    # torchrun's tee runs the next rank's line on from a rank's partial line (one without
    # its newline): rank 0's part of it is rank 0's.
    assert logs_show_rank0(["[rank2]:loading[rank0]:epoch 0"])
    assert start_event(['[rank1]:partial[rank0]:{"event": "start", "world_size": 4}']) == {
        "event": "start", "world_size": 4
    }  # fmt: skip


@pytest.mark.parametrize(
    ("target", "condition", "state"),
    [
        ("pytorchjob", "Succeeded", "Succeeded"),
        ("trainjob", "Complete", "Succeeded"),
        ("indexed-job", "Complete", "Succeeded"),
        ("pytorchjob", "Complete", "Pending"),  # not PyTorchJob's condition
        ("trainjob", "Succeeded", "Pending"),
    ],
)
def test_job_state_reads_each_targets_own_success_condition(target, condition, state):
    assert job_state(job((condition, "done"), target=target), []).state == state
    assert job_state(job(("Failed", "x"), target=target), []).state == "Failed"


def test_job_state_of_a_kind_no_target_reads():
    got = job_state({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "j"}}, [])
    assert (got.state, got.done) == ("Unknown", True)


def test_gpu_counts_read_as_quantities():
    nodes = [node("a", "8"), node("b", "1k"), node("c", "bad"), node("d", 0)]
    assert gpu_nodes(nodes, 8) == (2, 2)  # a and b (1000 devices); c and d hold none


def test_c10d_rank0_is_looked_for_where_torch_puts_it():
    from ddpdeploy.cluster.watch import c10d_order

    def pod(name: str, phase: str, ip: str | None = None) -> dict:
        return {"metadata": {"name": name}, "status": {"phase": phase, "podIP": ip}}

    pods = [
        pod("j-worker-0", "Running", "10.0.0.9"),
        pod("j-worker-1", "Running", "10.0.0.12"),  # "10.0.0.12" < "10.0.0.9" as strings
        pod("j-worker-2", "Pending"),
        pod("j-worker-3", "Succeeded", "10.0.0.1"),
        pod("j-worker-10", "Running"),
        pod("j-worker-4", "Running"),
    ]
    # torch numbers a c10d round's nodes in the order of their addresses as strings.
    assert [p["metadata"]["name"] for p in c10d_order(pods)] == [
        "j-worker-1", "j-worker-0", "j-worker-4", "j-worker-10", "j-worker-3"
    ]  # fmt: skip


def test_an_earlier_runs_pod_held_by_a_finalizer_is_shown_with_the_new_job():
    from ddpdeploy.cluster.labels import ours
    from ddpdeploy.cluster.watch import job_pods

    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "j", "uid": "new"}}  # fmt: skip
    old = {
        "metadata": {
            "name": "j-worker-0",
            "labels": ours("j"),
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "j",
                    "uid": "old",
                    "controller": True,
                }
            ],  # fmt: skip
            "deletionTimestamp": "2026-12-02T09:40:00Z",
            "finalizers": ["example.com/hold"],
        }
    }
    # It keeps the name the new job's pod needs: that is what status and a wait must say.
    assert job_pods(job, [old]) == [old]
    old["metadata"]["finalizers"] = []  # still stopping: it holds the name too
    assert job_pods(job, [old]) == [old]
    old["metadata"]["finalizers"] = ["example.com/hold"]
    old["metadata"]["labels"] = {**ours("j"), "app.kubernetes.io/instance": "other"}
    assert job_pods(job, [old]) == []


def test_an_earlier_runs_pod_still_stopping_is_why_the_new_pods_are_missing():
    # Found by the third hostile pass: `down` then `resume` showed "Pending — no pods yet"
    # for the 2 minutes the old pods (no finalizers) took to stop, holding the new names.
    from ddpdeploy.cluster.labels import ours
    from ddpdeploy.cluster.watch import job_pods

    new = {**job(("Created", "")), "metadata": {"name": "j", "uid": "new"}}
    new["spec"] = {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 1}}}

    def old_pod(name: str, phase: str) -> dict:
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j",
                 "uid": "old", "controller": True}  # fmt: skip
        return {
            "metadata": {"name": name, "labels": ours("j"), "ownerReferences": [owner],
                         "deletionTimestamp": "2026-12-02T09:40:00Z",
                         "deletionGracePeriodSeconds": 120},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "pytorch", "state": {"running": {}}, "restartCount": 0}]},
        }  # fmt: skip

    olds = [old_pod("j-master-0", "Running"), old_pod("j-worker-0", "Running")]
    pods = job_pods(new, olds)
    assert pods == olds
    state = job_state(new, pods)
    assert (state.state, state.done) == ("Pending", False)
    assert state.reason == (
        "pods j-master-0, j-worker-0 of an earlier run of this job are still stopping (grace "
        "period, until 2026-12-02T09:40:00Z at the latest); the new pods start when they are gone"
    )
    # One new pod runs beside an old one still stopping: it alone counts.
    mine = pod(name="j-master-0", phase="Running")
    mine["metadata"]["ownerReferences"] = [{"kind": "PyTorchJob", "uid": "new", "controller": True}]
    state = job_state(new, [mine, olds[1]])
    assert state.state == "Running"
    assert state.reason == (
        "1/2 pods running; pod j-worker-0 of an earlier run of this job is still stopping "
        "(grace period, until 2026-12-02T09:40:00Z at the latest); the new pods start when it "
        "is gone"
    )
    # An old pod whose name the job no longer needs (it was scaled down) holds up nothing
    # (cluster2 F1: "the new pods start when they are gone" of a job whose pods all ran).
    extra = old_pod("j-worker-7", "Running")
    worker = pod(name="j-worker-0", phase="Running")
    worker["metadata"]["ownerReferences"] = mine["metadata"]["ownerReferences"]
    state = job_state(new, [mine, worker, extra])
    assert (state.state, state.reason) == ("Running", "2/2 pods running")
    # Elastic 1:2 at its maximum (cluster3 F11): no new pod waits for j-worker-5's name, so
    # it is named without "the new pods start when it is gone".
    elastic = {**new, "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}},
                               "elasticPolicy": {"minReplicas": 1, "maxReplicas": 2}}}  # fmt: skip
    w0, w1 = (pod(name=f"j-worker-{i}", phase="Running") for i in (0, 1))
    for p in (w0, w1):
        p["metadata"]["ownerReferences"] = mine["metadata"]["ownerReferences"]
    stopping = (
        "pod j-worker-5 of an earlier run of this job is still stopping (grace period, until "
        "2026-12-02T09:40:00Z at the latest)"
    )
    state = job_state(elastic, [w0, w1, old_pod("j-worker-5", "Running")])
    assert (state.state, state.reason) == ("Running", f"2/2 pods running; {stopping}")
    # Below its maximum a name it may still make is waited for; one beyond it is not.
    state = job_state(elastic, [w0, old_pod("j-worker-1", "Running")])
    assert state.reason == (
        f"1/1 pods running; {stopping.replace('5', '1', 1)}; the new pods start when it is gone"
    )
    state = job_state(elastic, [w0, old_pod("j-worker-5", "Running")])
    assert state.reason == f"1/1 pods running; {stopping}"


def test_a_pod_the_operator_could_not_make_counts_against_the_jobs_size() -> None:
    # Found by the third hostile pass: someone else's pod held pn-worker-0, the operator
    # could not make ours, and status said "1/1 pods running" of a 2-node job.
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pn", "namespace": "ns"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}},
        "status": {"conditions": [{"type": "Running", "status": "True"}]},
    }
    state = job_state(job, [pod(name="pn-worker-1", phase="Running")])
    assert (state.state, state.reason) == ("Running", "1/2 pods running; no pod pn-worker-0 yet")
    both = [pod(name="pn-worker-0", phase="Running"), pod(name="pn-worker-1", phase="Running")]
    assert job_state(job, both).reason == "2/2 pods running"
    # An elastic range may run below its maximum: nothing is missing there.
    job["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 2}
    assert job_state(job, [pod(name="pn-worker-1", phase="Running")]).reason == "1/1 pods running"


@pytest.mark.parametrize(
    ("conds", "state", "reason"),
    [
        ((), "Pending", "no condition yet; its pods could not be read"),
        ((("Created", "made"), ("Running", "up")), "Running", "up; its pods could not be read"),
        ((("Running", "up"), ("Restarting", "")), "Restarting", "its pods could not be read"),
        # Left by the fifth hostile pass: the operator's full stop made ".;".
        (
            (("Running", "PyTorchJob j is running."),),
            "Running",
            "PyTorchJob j is running; its pods could not be read",
        ),
        ((("Running", "up"), ("Succeeded", "done")), "Succeeded", "done"),
        ((("Running", "up"), ("Failed", "boom")), "Failed", "boom"),
    ],
)
def test_the_state_of_a_job_whose_pods_are_unread_is_its_conditions(conds, state, reason):
    # Found by the fourth hostile pass (left open then): `status` had no state to show
    # when the pods could not be listed.
    got = conditions_state(job(*conds))
    assert (got.state, got.reason) == (state, reason)


def _limit_range(*items: dict) -> dict:
    return {"metadata": {"name": "lr"}, "spec": {"limits": list(items)}}


OUR_POD = {"containers": [{"name": "pytorch", "resources": {
    "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}}]}  # fmt: skip


@pytest.mark.parametrize(
    ("items", "broken"),
    [
        # Defaults above the request, a memory ratio of 1 (limit = request): kept.
        ([{"type": "Container", "default": {"cpu": "4"}, "defaultRequest": {"cpu": "1"}}], []),
        ([{"type": "Pod", "maxLimitRequestRatio": {"memory": "1"}}], []),
        ([{"type": "PersistentVolumeClaim", "max": {"storage": "1Gi"}}], []),
        # max with the API server's default from it: the max is named first (`up` says it).
        (
            [{"type": "Container", "max": {"cpu": "1"}, "default": {"cpu": "1"}}],
            [("cpu", "max", "request"), ("cpu", "default", "request")],
        ),
        # GPUs: a max on an extended resource our pods do not set is a limit they lack.
        (
            [{"type": "Container", "max": {"nvidia.com/gpu": "1"}}],
            [("nvidia.com/gpu", "max", "limit")],
        ),
        ([{"type": "Pod", "min": {"cpu": "3"}}], [("cpu", "min", "request")]),
    ],
    ids=["defaults-kept", "ratio-kept", "pvc-skipped", "max-over-default", "gpu-max", "pod-min"],
)
def test_limit_range_breaches(items, broken):
    # Found by the fourth hostile pass (left open then): `up` checked no LimitRange.
    got = limit_range_breaches([_limit_range(*items)], OUR_POD)
    assert [(b.resource, b.bound, b.what) for b in got] == broken


@pytest.mark.parametrize(
    "item",
    [{"type": "Pod", "max": {"cpu": "4"}}, {"type": "Pod", "maxLimitRequestRatio": {"cpu": "2"}}],
    ids=["pod-max", "pod-ratio"],
)
def test_a_cpu_limit_the_pods_lack_is_not_told_to_set_with_cpu(item):
    # Found by the fifth hostile pass: a Pod LimitRange's cpu max (or ratio) was told "set
    # --cpu", which sets the request; ddpdeploy sets no CPU limit, so that changed nothing.
    (breach,) = limit_range_breaches([_limit_range(item)], OUR_POD)
    line = breach.line()
    assert "set --cpu" not in line and "(--cpu)" not in line
    assert "ddpdeploy sets no CPU limit (--cpu is the request)" in line
    assert "default cpu limit" in line


def test_counts_take_the_number_of_their_noun():
    # Left by the fifth hostile pass: "1 pods created", "scaled ... to 1 nodes".
    from ddpdeploy.formats import counted

    assert job_state(job(("Created", "")), [pod()]).reason == "1 pod created"
    assert job_state(job(("Created", "")), [pod(), pod("j-worker-0")]).reason == "2 pods created"
    assert [counted(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]


@pytest.mark.parametrize("mode", ["static", "c10d"])
def test_the_operators_init_container_is_checked_against_a_limit_range(mode):
    # Left by the fifth hostile pass: only the templates were checked, while the operator adds
    # init-pytorch (limits 100m / 20Mi) to a static job's workers, which a min memory refuses.
    spec = JobSpec.model_validate({"image": "t:1", "nodes": 2, "rendezvous": {"mode": mode}})
    layout = layout_of("pytorchjob")
    (obj,) = [o for o in render_objects(spec) if o["kind"] == "PyTorchJob"]
    ranges = [_limit_range({"type": "Container", "min": {"memory": "64Mi"}})]
    got = [
        b
        for template, added in zip(
            layout.pod_templates(obj), layout.added_containers(obj), strict=True
        )
        for b in limit_range_breaches(ranges, template, added)
    ]
    if mode == "c10d":  # Worker replicas only: the operator adds nothing
        assert got == []
        return
    (breach,) = got
    assert (breach.added, breach.what, breach.got) == ("init-pytorch", "request", 10 * 2**20)
    assert breach.line(layout.added_by).startswith(
        "bounds memory per container (min 64Mi), which the container init-pytorch breaks "
        "(memory request 10Mi); it is the training operator's init container on the workers"
    )


HELPER = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


@pytest.mark.parametrize(
    "items",
    [
        [{"type": "Container", "min": {"memory": "512Mi", "cpu": "500m"}}],
        [{"type": "Container", "max": {"memory": "128Mi", "cpu": "50m"}}],
        [{"type": "Container", "maxLimitRequestRatio": {"memory": "2", "cpu": "1"}}],
        [{"type": "Container", "default": {"cpu": "50m"}}],  # a default limit below 100m
        [{"type": "Pod", "min": {"memory": "300Mi"}}, {"type": "Container", "max": {"cpu": 1}}],
    ],
    ids=["min", "max", "ratio", "default-below", "pod-min"],
)
def test_a_small_pod_of_ours_is_fitted_inside_a_limit_range(items):
    # Left by the fifth hostile pass: collect's helper (64Mi, 256Mi, 100m) was refused by a
    # namespace whose LimitRange asked more (or allowed less), and collect could not read.
    ranges = [_limit_range(*items)]
    fitted = fitted_resources(ranges, HELPER)
    assert limit_range_breaches(ranges, {"containers": [{"resources": fitted}]}) == []
    assert limit_range_breaches(ranges, {"containers": [{"resources": HELPER}]}) != []


def test_a_small_pod_of_ours_is_left_as_it_is_without_a_limit_range():
    assert fitted_resources([], HELPER) is HELPER
    contradiction = [
        _limit_range({"type": "Pod", "min": {"memory": "1Gi"}}, {"type": "Container", "max": {
            "memory": "512Mi"}})
    ]  # fmt: skip
    fitted = fitted_resources(contradiction, HELPER)
    (breach,) = limit_range_breaches(contradiction, {"containers": [{"resources": fitted}]})
    assert (breach.type, breach.resource, breach.bound) == ("Pod", "memory", "min")
