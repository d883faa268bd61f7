"""FakeKube (tests/fakekube.py) against what it stands in for: the KubeApi protocol the
cluster room uses (names at run time, signatures through mypy), and lists filtered by
namespace and label selector as the API server filters them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakekube import FakeKube, matches

from ddpdeploy.adapters.kube import KubeApi
from ddpdeploy.cluster.labels import ours_selector, selector
from ddpdeploy.targets import TARGETS

ROOT = Path(__file__).resolve().parents[1]


def pod(fake: FakeKube, name: str, namespace: str, **labels: str) -> None:
    meta = {"name": name, "namespace": namespace, "labels": labels}
    fake.add({"apiVersion": "v1", "kind": "Pod", "metadata": meta})


def names(objs: list) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_fakekube_has_what_kubeapi_names():
    # (Kube is held to the protocol by mypy --strict on ddpdeploy/, at the end of kube.py.)
    assert isinstance(FakeKube(), KubeApi)
    assert not isinstance(object(), KubeApi)


def test_list_honours_namespace_and_the_selectors_the_product_builds():
    fake = FakeKube()
    managed = {"app.kubernetes.io/managed-by": "ddpdeploy"}
    pod(fake, "a-0", "a", **managed, **{"app.kubernetes.io/instance": "j"})
    pod(fake, "a-1", "a", **managed, **{"app.kubernetes.io/instance": "k"})
    pod(fake, "b-0", "b", **managed, **{"app.kubernetes.io/instance": "j"})
    pod(fake, "a-foreign", "a", owner="me")
    fake.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})

    assert names(fake.list("v1", "Pod", "a")) == ["a-0", "a-1", "a-foreign"]
    assert names(fake.list("v1", "Pod")) == ["a-0", "a-1", "a-foreign", "b-0"]  # every ns
    assert names(fake.list("v1", "Pod", "a", labels=ours_selector())) == ["a-0", "a-1"]
    assert names(fake.list("v1", "Pod", "a", labels=ours_selector("j"))) == ["a-0"]
    assert names(fake.list("v1", "Pod", None, labels=ours_selector("j"))) == ["a-0", "b-0"]
    assert names(fake.list("v1", "Pod", "c", labels=ours_selector())) == []
    assert names(fake.list("v1", "Node")) == ["n1"]  # cluster-scoped
    items, _ = fake.listed("v1", "Pod", "a", fields="metadata.name=a-1")
    assert names(items) == ["a-1"]

    for layout in TARGETS.values():  # each target's pod selector, as `status` lists pods
        pod(fake, f"{layout.kind}-pod", "t", **layout.pod_selector("j"))
        got = fake.list("v1", "Pod", "t", labels=selector(layout.pod_selector("j")))
        assert names(got) == [f"{layout.kind}-pod"], layout.kind


@pytest.mark.parametrize(
    ("term", "labels", "expected"),
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "1"}, True),
        ("a=1", {"a": "2"}, False),
        ("a!=1", {"a": "2"}, True),
        ("a!=1", {}, True),
        ("a", {"a": ""}, True),
        ("a", {"b": "1"}, False),
        ("!a", {"b": "1"}, True),
        ("a=1,b=2", {"a": "1", "b": "2"}, True),
        ("a=1,b=2", {"a": "1"}, False),
        ("", {}, True),
    ],
)
def test_selector_terms(term, labels, expected):
    assert matches(term, labels) is expected


def test_set_based_selectors_are_refused_not_ignored():
    with pytest.raises(NotImplementedError):
        matches("a in (1, 2)", {"a": "1"})


@pytest.mark.slow  # mypy: 10-40 s cold
def test_fakekube_is_a_kubeapi_to_mypy(tmp_path):
    """tests/kubeapi_check.py passes mypy --strict; a fake whose `list` lost a parameter
    does not (the check is not vacuous)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    broken = tmp_path / "broken_check.py"
    broken.write_text(
        "from fakekube import FakeKube\n"
        "from ddpdeploy.adapters.kube import KubeApi\n"
        "from ddpdeploy.obj import Obj\n\n\n"
        "class Broken(FakeKube):\n"
        "    def list(self, api_version: str, kind: str) -> list[Obj]:  # type: ignore[override]\n"
        "        return []\n\n\n"
        "BROKEN: KubeApi = Broken()\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "tests/kubeapi_check.py", str(broken)],
        cwd=ROOT,
        env={**os.environ, "MYPYPATH": str(ROOT / "tests")},
        capture_output=True,
        text=True,
    )
    errors = [line for line in res.stdout.splitlines() if ": error:" in line]
    assert errors and all(line.startswith(str(broken)) for line in errors), res.stdout
    assert any("incompatible types" in line.lower() for line in errors), res.stdout
