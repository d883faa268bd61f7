"""The compose project through the docker SDK (adapters.compose.engine_plan, start_project):
what it reads from the rendered file, and against a real engine that it creates the same
containers as the compose CLI (the pod's settings, names, labels, network aliases).

The plan tests need no engine; the engine tests are slow like every docker test."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from ddpdeploy.errors import OperationError
from ddpdeploy.smoke.compose import ROLE_LABEL, compose_job, render_compose
from ddpdeploy.smoke.composerun import PROJECT_LABEL, ComposeRun, compose_cli, engine_plan
from ddpdeploy.smoke.launch import nodes_of
from ddpdeploy.spec import JobSpec
from ddpdeploy.targets import launch_contract


def spec_of(image: str = "ex/img:1", **extra: Any) -> JobSpec:
    doc = {"name": "eng", "image": image, "nodes": 2, "procs": 1, "shmSize": "64Mi", **extra}
    return JobSpec.model_validate(doc)


def test_the_rendered_file_is_read_whole_dependencies_first() -> None:
    spec = spec_of(
        target="trainjob",  # nodes reached at host.subdomain: a network alias
        checkpoint={"size": "1Gi"},  # a volume and the one-shot helper that owns it
        secretEnv={"HF_TOKEN": {"secret": "hf", "key": "token"}},
        security={"fsGroup": 2000},
    )
    plan = engine_plan(render_compose(spec, cpu=True))
    assert plan is not None
    helper, *nodes = plan
    assert helper.name == "eng-volume-init" and helper.network is None and not helper.after
    contract = launch_contract(compose_job(spec, cpu=True))
    for service, node in zip(nodes, contract.nodes, strict=True):
        assert service.after == ["eng-volume-init"]
        assert service.aliases == [node.hostname, node.address] and node.address != node.hostname
        # Render's $$ (compose's escape) is undone: the command is the pod's, byte for byte.
        assert service.create["entrypoint"] == contract.container_command()
        assert service.create["stop_timeout"] == spec.termination_grace_period_seconds
        assert service.host["read_only"] is True and service.host["cap_drop"] == ["ALL"]
        # A static job's node is not restarted.
        assert service.host["restart_policy"] == {"Name": "no", "MaximumRetryCount": 0}
        assert service.host["group_add"] == ["2000"]
        assert set(service.host["tmpfs"]) == {"/tmp", "/home/ddp"}


def test_an_elastic_node_restarts_on_failure_within_the_backoff_limit() -> None:
    rdzv = {"mode": "elastic", "minNodes": 2, "maxNodes": 2}
    plan = engine_plan(render_compose(spec_of(rendezvous=rdzv, runPolicy={"backoffLimit": 3})))
    assert plan is not None
    assert plan[0].host["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 3}


def test_a_secret_env_name_is_passed_only_when_set_here(monkeypatch: pytest.MonkeyPatch) -> None:
    project = render_compose(spec_of(secretEnv={"HF_TOKEN": {"secret": "hf", "key": "t"}}))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    plan = engine_plan(project)
    assert plan is not None and "HF_TOKEN" not in plan[0].create["environment"]
    monkeypatch.setenv("HF_TOKEN", "s3cr$t")
    plan = engine_plan(project)
    assert plan is not None and plan[0].create["environment"]["HF_TOKEN"] == "s3cr$t"


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["services"]["eng-master-0"].update(ports=["80:80"]),  # a key it reads not
        lambda p: p["services"]["eng-master-0"].update(image="img:${TAG}"),  # interpolation
        lambda p: p["services"]["eng-master-0"].update(stop_grace_period="1m30s"),
        lambda p: p.update(configs={}),
        lambda p: p["networks"]["ddp"].update(driver="overlay"),
        lambda p: p["services"]["eng-master-0"].update(networks=["ddp", "other"]),
    ],
)
def test_anything_else_goes_to_the_compose_cli(change: Any) -> None:
    project = render_compose(spec_of())
    assert engine_plan(project) is not None
    change(project)
    assert engine_plan(project) is None


def test_a_gpu_file_goes_to_the_compose_cli() -> None:
    assert engine_plan(render_compose(spec_of(gpus=1), cpu=False)) is None


# ---- against the engine -----------------------------------------------------------------


@pytest.fixture
def started(engine: Any, base_image: str) -> Iterator[dict[str, ComposeRun]]:
    """The same rendered project (base image: no torchrun, so the nodes soon exit) started
    through the SDK and through the compose CLI."""
    spec = spec_of(
        base_image,
        target="indexed-job",
        checkpoint={"size": "1Gi"},
        security={"fsGroup": 2000},
    )
    job = compose_job(spec, cpu=True)
    project, nodes = render_compose(spec, cpu=True), nodes_of(launch_contract(job))
    runs: dict[str, ComposeRun] = {}
    try:
        runs["sdk"] = ComposeRun(project, nodes, spec.name, client=engine)
        runs["cli"] = ComposeRun(project, nodes, spec.name, client=engine, cli=compose_cli())
        yield runs
    finally:
        for run in runs.values():
            run.stop()


def _settings(run: ComposeRun, container: Any) -> dict[str, Any]:
    """What the pod's settings and the project's wiring became, the project name masked."""
    container.reload()
    attrs, name = container.attrs, run.project_name
    config, host = attrs["Config"], attrs["HostConfig"]
    nets = attrs["NetworkSettings"]["Networks"]
    masked = re.sub(re.escape(name), "P", str(sorted(nets)))
    # The CLI also aliases the container's short ID; the SDK adds nothing of its own.
    aliases = {a for n in nets.values() for a in (n.get("Aliases") or []) if a != container.id[:12]}
    return {
        "name": attrs["Name"].replace(name, "P"),
        "config": {k: config.get(k) for k in ("Hostname", "User", "Entrypoint", "Image")},
        "cmd": config.get("Cmd") or None,
        "env": sorted(config["Env"]),
        "stop_timeout": config.get("StopTimeout"),
        "labels": {
            k: v.replace(name, "P")
            for k, v in config["Labels"].items()
            if k in (ROLE_LABEL, PROJECT_LABEL, "com.docker.compose.service")
        },
        "host": {
            k: host.get(k) or None
            for k in (
                "ReadonlyRootfs",
                "CapDrop",
                "CapAdd",
                "SecurityOpt",
                "GroupAdd",
                "Tmpfs",
                "ShmSize",
                "RestartPolicy",
            )
        },
        "network_mode": host["NetworkMode"].replace(name, "P"),
        "networks": masked,
        "aliases": aliases,
        "mounts": sorted(
            (m["Type"], m.get("Name", "").replace(name, "P"), m["Destination"])
            for m in attrs["Mounts"]
            if m.get("Name", "").startswith(name)
        ),
    }


@pytest.mark.docker
def test_the_sdk_creates_what_the_compose_cli_creates(
    started: dict[str, ComposeRun], engine: Any
) -> None:
    sdk, cli = started["sdk"], started["cli"]
    flt = {"label": f"{PROJECT_LABEL}={sdk.project_name}"}
    made = engine.containers.list(all=True, filters=flt)
    assert sorted(c.labels[ROLE_LABEL] for c in made) == ["node", "node", "volume-init"]
    assert (
        engine.containers.get(f"{sdk.project_name}_eng-volume-init_1").attrs["State"]["ExitCode"]
        == 0
    )  # the helper ran first, and owned the volume
    for node in sdk.nodes:
        ours = _settings(sdk, sdk.node(node.name).container)
        theirs = _settings(cli, cli.node(node.name).container)
        assert ours == theirs
        assert ours["host"]["ReadonlyRootfs"] and ours["host"]["CapDrop"] == ["ALL"]
        assert node.name in ours["aliases"] and len(ours["aliases"]) == 2  # name, address
    assert sdk.volumes() == [f"{sdk.project_name}_checkpoints"]


@pytest.mark.docker
def test_teardown_removes_the_sdk_project_and_only_it(
    started: dict[str, ComposeRun], engine: Any
) -> None:
    sdk, cli = started["sdk"], started["cli"]
    assert sdk.leftovers()
    sdk.stop()
    assert sdk.leftovers() == []
    assert cli.leftovers()  # the other project is not ours to remove
    sdk.stop()  # idempotent


@pytest.mark.docker
def test_an_image_that_cannot_be_had_is_one_line_and_leaves_nothing(engine: Any) -> None:
    spec = spec_of("ddpdeploy-test/no-such-image:1", checkpoint={"size": "1Gi"})
    project, nodes = render_compose(spec), nodes_of(launch_contract(compose_job(spec)))
    before = {n.name for n in engine.networks.list()} | {v.name for v in engine.volumes.list()}
    with pytest.raises(OperationError) as err:
        ComposeRun(project, nodes, spec.name, client=engine)
    text = str(err.value)
    assert "\n" not in text
    image = "ddpdeploy-test/no-such-image:1"
    assert text.startswith(f"compose up failed: image {image} is not here and pulling it failed: ")
    after = {n.name for n in engine.networks.list()} | {v.name for v in engine.volumes.list()}
    assert not {x for x in after - before if x.startswith(f"ddpdeploy-{spec.name}-")}
