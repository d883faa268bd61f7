"""What the cluster's nodes can hold, from node and pod objects (pure), for `up`'s
preflight: whole GPUs free for the job's pods, and how many pods of the job's CPU and memory
requests the nodes' allocatable holds."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from ddpdeploy.obj import Obj
from ddpdeploy.spec import quantity

GPU = "nvidia.com/gpu"


def _quantity_int(value: Any) -> int:
    """A count the API reports as a quantity ("8"), whole; 0 when it is none."""
    try:
        return int(quantity(value)[1])
    except (ValueError, OverflowError):  # OverflowError: an infinite amount
        return 0


def gpu_nodes(nodes: list[Obj], gpus: int) -> tuple[int, int]:
    """(nodes whose allocatable GPUs hold ``gpus`` at all, schedulable ones among them)."""
    fit = ready = 0
    for node in nodes:
        alloc = _quantity_int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))
        if alloc < gpus:
            continue
        fit += 1
        if not (node.get("spec") or {}).get("unschedulable"):
            ready += 1
    return fit, ready


def gpu_requests_by_node(pods: list[Obj]) -> dict[str, int]:
    """GPUs that running or pending-but-bound pods hold, per node name."""
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in (pod.get("spec") or {}).get("containers") or []:
            limits = (c.get("resources") or {}).get("limits") or {}
            used[node] = used.get(node, 0) + _quantity_int(limits.get(GPU, 0))
    return used


def gpu_nodes_free(nodes: list[Obj], pods: list[Obj], gpus: int) -> int:
    """Nodes that have ``gpus`` free right now."""
    used = gpu_requests_by_node(pods)
    free = 0
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "")
        alloc = _quantity_int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))
        if alloc - used.get(name, 0) >= gpus and not (node.get("spec") or {}).get("unschedulable"):
            free += 1
    return free


# --- CPU and memory: what the scheduler counts --------------------------------------------

CPU, MEMORY = "cpu", "memory"
FIT_RESOURCES = (CPU, MEMORY)
Resources = dict[str, Decimal]


def _amount(value: Any) -> Decimal:
    """A quantity's amount in base units (cores, bytes); 0 when it is none."""
    try:
        amount = quantity(value)[1]
    except (ValueError, TypeError):
        return Decimal(0)
    return amount if amount.is_finite() else Decimal(0)


def _container_requests(container: Obj) -> Resources:
    """A container's requests; a resource with a limit and no request requests its limit
    (as the API server defaults it)."""
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    return {r: _amount(requests.get(r, limits.get(r, 0))) for r in FIT_RESOURCES}


def pod_requests(pod_spec: Obj) -> Resources:
    """What the scheduler counts for a pod: per resource, its containers' requests summed, or
    one init container's when that is larger (they run one at a time, before the others)."""
    total = {r: Decimal(0) for r in FIT_RESOURCES}
    for container in pod_spec.get("containers") or []:
        for r, v in _container_requests(container).items():
            total[r] += v
    for container in pod_spec.get("initContainers") or []:
        for r, v in _container_requests(container).items():
            total[r] = max(total[r], v)
    return total


def _matches(node: Obj, node_selector: dict[str, str]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in node_selector.items())


def _how_many(free: Resources, want: Resources) -> int:
    """Pods of ``want`` that ``free`` holds; a resource ``free`` does not name (a node that
    reports no allocatable for it) or the pod does not ask for does not limit them."""
    counts = [
        int(free[r] // want[r]) if free[r] > 0 else 0 for r in want if want[r] > 0 and r in free
    ]
    return max(0, min(counts)) if counts else 1 << 30


@dataclass(frozen=True)
class Fit:
    """How many pods of one size the nodes they may go to hold."""

    nodes: int  # schedulable nodes that match the job's nodeSelector
    pods: int  # pods of the size their allocatable holds, nothing else running
    pods_now: int | None  # the same beside the pods there now (None: not known)
    short: tuple[str, ...]  # the resources that alone hold fewer than asked for
    largest: Resources  # the allocatable (as reported) of the node holding the most such pods


def fit(
    nodes: list[Obj],
    want: Resources,
    count: int,
    node_selector: dict[str, str] | None = None,
    pods: list[Obj] | None = None,
) -> Fit:
    """Whether ``count`` pods of ``want`` fit the schedulable nodes that match
    ``node_selector``, each node's allocatable less (with ``pods``) what bound pods request.
    Taints, affinity and pod limits per node are not counted: a fit here can still be
    refused by the scheduler, a misfit cannot be scheduled."""
    used: dict[str, Resources] = {}
    for pod in pods or []:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        held = used.setdefault(node, {r: Decimal(0) for r in FIT_RESOURCES})
        for r, v in pod_requests(pod.get("spec") or {}).items():
            held[r] += v
    fitting = [
        n
        for n in nodes
        if not (n.get("spec") or {}).get("unschedulable") and _matches(n, node_selector or {})
    ]
    total, now, best, largest = 0, 0, -1, {r: Decimal(0) for r in FIT_RESOURCES}
    alone, reported = {r: 0 for r in FIT_RESOURCES}, set()
    for node in fitting:
        alloc_obj = (node.get("status") or {}).get("allocatable") or {}
        alloc = {r: _amount(alloc_obj[r]) for r in FIT_RESOURCES if r in alloc_obj}
        holds = _how_many(alloc, want)
        total += holds
        if holds > best:
            best, largest = holds, alloc
        for r in alloc:
            alone[r] += _how_many({r: alloc[r]}, {r: want[r]})
            reported.add(r)
        name = (node.get("metadata") or {}).get("name", "")
        held = used.get(name, {r: Decimal(0) for r in FIT_RESOURCES})
        now += _how_many({r: v - held[r] for r, v in alloc.items()}, want)
    short = tuple(r for r in FIT_RESOURCES if r in reported and want[r] > 0 and alone[r] < count)
    return Fit(len(fitting), total, now if pods is not None else None, short, largest)


def shown(resource: str, amount: Decimal) -> str:
    """An amount as a person reads it: cores as given (2, 0.4), bytes in Gi or Mi."""
    if resource == MEMORY:
        gib = amount / (1 << 30)
        return f"{gib:.3g}Gi" if gib >= 1 else f"{amount / (1 << 20):.0f}Mi"
    return f"{amount.normalize():f}"


# --- ResourceQuota: what the namespace lets the job's pods ask for -------------------------

# A quota's keys that the job's pods count against, each with what it counts: a pod, its
# requests, its memory limit, its GPUs (an extended resource is quota'd as requests.*).
_QUOTA_KEYS = {
    "pods": "pods",
    "count/pods": "pods",
    "cpu": CPU,
    "requests.cpu": CPU,
    "memory": MEMORY,
    "requests.memory": MEMORY,
    "limits.memory": "limits.memory",
    f"requests.{GPU}": GPU,
}


def pod_quota_use(pod_spec: Obj) -> Resources:
    """What one pod counts against a ResourceQuota, by what each key counts (pods, cpu,
    memory, limits.memory, GPUs)."""
    use = {"pods": Decimal(1), **pod_requests(pod_spec)}
    limits = [
        (c.get("resources") or {}).get("limits") or {} for c in pod_spec.get("containers") or []
    ]
    use["limits.memory"] = sum((_amount(lim.get(MEMORY, 0)) for lim in limits), Decimal(0))
    use[GPU] = sum((_amount(lim.get(GPU, 0)) for lim in limits), Decimal(0))
    return use


@dataclass(frozen=True)
class QuotaShort:
    """One key of a quota that the job's pods overrun: what it allows, what is used of it
    now, and what the pods ask for together."""

    quota: str
    key: str
    hard: Decimal
    used: Decimal
    asked: Decimal

    @property
    def never(self) -> bool:
        """The pods overrun it even with nothing else using it."""
        return self.asked > self.hard

    def amount(self, value: Decimal) -> str:
        counts = _QUOTA_KEYS[self.key]
        return shown(MEMORY if counts in (MEMORY, "limits.memory") else CPU, value)


def quota_shorts(quotas: list[Obj], one_pod: Resources, count: int) -> list[QuotaShort]:
    """The keys of the namespace's quotas that ``count`` pods of ``one_pod`` overrun. A
    quota with scopes is skipped: which pods it counts is not known here."""
    out = []
    for quota in quotas:
        spec, status = quota.get("spec") or {}, quota.get("status") or {}
        if spec.get("scopes") or spec.get("scopeSelector"):
            continue
        hard = status.get("hard") or spec.get("hard") or {}
        used = status.get("used") or {}
        name = (quota.get("metadata") or {}).get("name", "")
        for key, counts in _QUOTA_KEYS.items():
            if key not in hard or one_pod.get(counts, Decimal(0)) <= 0:
                continue
            asked = one_pod[counts] * count
            limit, now = _amount(hard[key]), _amount(used.get(key, 0))
            if asked > limit - now:
                out.append(QuotaShort(name, key, limit, now, asked))
    return out


# --- LimitRange: what the namespace lets one container or pod set --------------------------

# The flag that sets each resource a LimitRange bounds (the spec field otherwise).
_FLAGS = {CPU: "--cpu", MEMORY: "--memory", GPU: "--gpus"}


@dataclass(frozen=True)
class LimitBreach:
    """One bound of a LimitRange that the job's pods break: the API server refuses them
    when the operator creates them."""

    limit_range: str
    type: str  # Container or Pod
    resource: str
    bound: str  # max, min, maxLimitRequestRatio, default (a default limit below the request)
    allowed: Decimal
    what: str  # limit, request, limit/request
    got: Decimal | None  # None: the pod sets none
    added: str = ""  # the name of a container the controller adds that breaks it, if one did

    def line(self, added_by: str = "") -> str:
        """What is wrong and what to change, without the LimitRange's name. ``added_by``:
        who adds the container that breaks it (the target's ``added_by``)."""
        if self.added:
            got = "none" if self.got is None else self.amount(self.got)
            return (
                f"bounds {self.resource} per {self.type.lower()} ({self.bound} "
                f"{self.amount(self.allowed)}), which the container {self.added} breaks "
                f"({self.resource} {self.what} {got}); it is {added_by or 'not ddpdeploy'}: "
                "the namespace's admin can change the LimitRange, or use another namespace"
            )
        return self._ours()

    def _ours(self) -> str:
        r, allowed = self.resource, self.amount(self.allowed)
        per = f"per {self.type.lower()}"
        flag = _FLAGS.get(r, f"the spec's {r}")
        if r == CPU and self.got is None and self.what != "request":
            # No flag sets a CPU limit (--cpu is the request): only a default limit can.
            return (
                f"requires a cpu limit {per} ({self.bound} {allowed}); the job's pods set none: "
                "ddpdeploy sets no CPU limit (--cpu is the request); a LimitRange of type "
                "Container with a default cpu limit gives them one (the namespace's admin), "
                "or use another namespace"
            )
        if self.bound == "maxLimitRequestRatio":
            got = "none" if self.got is None else f"{self.got.normalize():f}"
            return (
                f"allows a {r} limit at most {allowed}x the request {per}; the job's pods "
                f"have {got}; set a {r} limit within that of the request ({flag})"
            )
        if self.bound == "default":
            return (
                f"gives containers without a {r} limit a default limit of {allowed}, below "
                f"the job's {r} request {self.amount(self.got or Decimal(0))}; lower {flag} "
                f"to at most {allowed}"
            )
        if self.got is None:
            return (
                f"requires a {r} {self.what} {per} ({self.bound} {allowed}); the job's pods "
                f"set none; set {flag}"
            )
        got = self.amount(self.got)
        if self.bound == "max":
            return (
                f"allows {r} at most {allowed} {per}; the job's pods' {r} {self.what} is "
                f"{got}; lower {flag} to at most {allowed}"
            )
        return (
            f"requires {r} at least {allowed} {per}; the job's pods' {r} {self.what} is "
            f"{got}; raise {flag} to at least {allowed}"
        )

    def amount(self, value: Decimal) -> str:
        return shown(self.resource, value) if self.resource in FIT_RESOURCES else f"{value:f}"


def _resource_list(values: Any) -> Resources:
    if not isinstance(values, dict):
        return {}
    out: Resources = {}
    for name, value in values.items():
        try:
            amount = quantity(value)[1]
        except (ValueError, TypeError):
            continue
        if amount.is_finite():
            out[str(name)] = amount
    return out


def _checked(
    name: str, kind: str, item: Obj, requests: Resources, limits: Resources
) -> list[LimitBreach]:
    """The bounds of one LimitRange item (``kind``: Container or Pod) that ``requests``
    and ``limits`` break, as the LimitRanger admission plugin checks them."""
    out = []
    for r, bound in _resource_list(item.get("max")).items():
        if r not in limits:
            out.append(LimitBreach(name, kind, r, "max", bound, "limit", None))
        elif limits[r] > bound:
            out.append(LimitBreach(name, kind, r, "max", bound, "limit", limits[r]))
        elif r in requests and requests[r] > bound:
            out.append(LimitBreach(name, kind, r, "max", bound, "request", requests[r]))
    for r, bound in _resource_list(item.get("min")).items():
        if r not in requests:
            out.append(LimitBreach(name, kind, r, "min", bound, "request", None))
        elif requests[r] < bound:
            out.append(LimitBreach(name, kind, r, "min", bound, "request", requests[r]))
        elif r in limits and limits[r] < bound:
            out.append(LimitBreach(name, kind, r, "min", bound, "limit", limits[r]))
    for r, bound in _resource_list(item.get("maxLimitRequestRatio")).items():
        req, lim = requests.get(r, Decimal(0)), limits.get(r, Decimal(0))
        ratio = lim / req if req > 0 and lim > 0 else None
        if ratio is None or ratio > bound:
            out.append(
                LimitBreach(name, kind, r, "maxLimitRequestRatio", bound, "limit/request", ratio)
            )
    return out


def limit_range_breaches(
    ranges: list[Obj], pod_spec: Obj, added: list[Obj] | None = None
) -> list[LimitBreach]:
    """The LimitRange bounds (type Container or Pod) that a pod of ``pod_spec`` breaks once
    its controller has added the init containers ``added`` (a breach of theirs names them) and
    the namespace's defaults are applied to it: a container without a limit (ours set no
    CPU limit) or request gets the first LimitRange's ``default``/``defaultRequest`` for it
    (the API server itself fills ``default`` from ``max`` when a LimitRange leaves it out),
    and a default limit below the container's request makes the pod invalid."""
    items = [
        ((r.get("metadata") or {}).get("name", ""), item)
        for r in ranges
        for item in ((r.get("spec") or {}).get("limits") or [])
        if isinstance(item, dict)
    ]
    containers = [
        c
        for c in [*(pod_spec.get("containers") or []), *(pod_spec.get("initContainers") or [])]
        if isinstance(c, dict)
    ]
    theirs = list(added or [])
    out: list[LimitBreach] = []
    pod_requests_sum: Resources = {}
    pod_limits_sum: Resources = {}
    for container in containers + theirs:
        found = len(out)
        resources = container.get("resources") or {}
        requests = _resource_list(resources.get("requests"))
        limits = _resource_list(resources.get("limits"))
        for r, v in limits.items():  # the API server's own default: request = limit
            requests.setdefault(r, v)
        for name, item in items:
            if item.get("type") != "Container":
                continue
            for r, v in _resource_list(item.get("default")).items():
                if r not in limits:
                    limits[r] = v
                    if r in requests and requests[r] > v:
                        out.append(
                            LimitBreach(name, "Container", r, "default", v, "request", requests[r])
                        )
            for r, v in _resource_list(item.get("defaultRequest")).items():
                requests.setdefault(r, v)
        for name, item in items:
            if item.get("type") == "Container":
                out += _checked(name, "Container", item, requests, limits)
        if any(container is c for c in theirs):
            out[found:] = [replace(b, added=str(container.get("name"))) for b in out[found:]]
        if container in (pod_spec.get("containers") or []):
            for r, v in requests.items():
                pod_requests_sum[r] = pod_requests_sum.get(r, Decimal(0)) + v
            for r, v in limits.items():
                pod_limits_sum[r] = pod_limits_sum.get(r, Decimal(0)) + v
    for name, item in items:
        if item.get("type") == "Pod":
            out += _checked(name, "Pod", item, pod_requests_sum, pod_limits_sum)
    # One line per bound, whichever container broke it first; a default limit below the
    # request last: a bound the LimitRange states (its max, which the default comes from)
    # is what to name.
    unique: dict[tuple[str, str, str, str], LimitBreach] = {}
    for breach in sorted(out, key=lambda b: b.bound == "default"):
        unique.setdefault((breach.limit_range, breach.type, breach.resource, breach.bound), breach)
    return list(unique.values())


def fitted_resources(ranges: list[Obj], resources: Obj) -> Obj:
    """``resources`` (the requests and limits of a one-container pod of ours that needs
    little, like collect's helper) moved inside the cpu and memory bounds of ``ranges``,
    each resource given a request and a limit so that no default of theirs applies: raised
    to each min, lowered to each max, a request raised until limit/request keeps each
    maxLimitRequestRatio. A bound nothing can keep (a min above a max) is left for
    limit_range_breaches to name."""
    items = [
        item
        for r in ranges
        for item in ((r.get("spec") or {}).get("limits") or [])
        if isinstance(item, dict) and item.get("type") in ("Container", "Pod")
    ]
    if not items:
        return resources
    requests = _resource_list(resources.get("requests"))
    limits = _resource_list(resources.get("limits"))
    for r in FIT_RESOURCES:
        bounded = any(_resource_list(item.get(k)).get(r) is not None for item in items for k in (
            "min", "max", "maxLimitRequestRatio", "default", "defaultRequest"))  # fmt: skip
        if not bounded or r not in requests:
            continue
        req = requests[r]
        lim = limits.get(r, req)  # an explicit limit: a default one could sit below req
        for item in items:
            low = _resource_list(item.get("min")).get(r)
            high = _resource_list(item.get("max")).get(r)
            ratio = _resource_list(item.get("maxLimitRequestRatio")).get(r)
            if low is not None:
                req, lim = max(req, low), max(lim, low)
            if high is not None:
                lim = min(lim, high)
                req = min(req, lim)
            if ratio is not None and ratio > 0:
                req = max(req, lim / ratio)
        step = Decimal("0.001") if r == CPU else Decimal(1)
        requests[r] = req.quantize(step, rounding="ROUND_CEILING")
        limits[r] = max(lim.quantize(step, rounding="ROUND_FLOOR"), requests[r])

    def text(r: str, v: Decimal) -> str:
        if r == CPU:
            return f"{int(v * 1000)}m"
        return f"{int(v) >> 20}Mi" if int(v) % (1 << 20) == 0 else f"{int(v)}"

    out: Obj = {"requests": {r: text(r, v) for r, v in requests.items()}}
    if limits:
        out["limits"] = {r: text(r, v) for r, v in limits.items()}
    return out
