"""The compose project through the docker SDK (smoke.composerun.engine_plan, start_project),
the one way `smoke --docker` starts a rendered file: what it reads from the file, that it
refuses anything else by name, that every job smoke renders is one it starts, and against a
real engine that it creates the same containers as the compose CLI does from the same file
(the pod's settings, names, labels, network aliases).

The plan tests need no engine; the engine tests are slow like every docker test."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpdeploy.errors import OperationError
from ddpdeploy.render.output import to_yaml
from ddpdeploy.smoke.compose import ROLE_LABEL, compose_job, compose_plan, render_compose
from ddpdeploy.smoke.composerun import PROJECT_LABEL, SERVICE_LABEL, ComposeRun, engine_plan
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
        # A c10d node restarts and rejoins the rendezvous (static: tested below).
        assert service.host["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 0}
        assert service.host["group_add"] == ["2000"]
        assert set(service.host["tmpfs"]) == {"/tmp", "/home/ddp", "/var/log/torchrun"}


def test_a_static_node_is_not_restarted() -> None:
    plan = engine_plan(render_compose(spec_of(rendezvous={"mode": "static"})))
    assert {s.host["restart_policy"]["Name"] for s in plan} == {"no"}


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
    ("change", "named"),
    [
        (lambda p: p["services"]["eng-worker-0"].update(ports=["80:80"]), "ports"),
        (lambda p: p["services"]["eng-worker-0"].update(image="img:${TAG}"), "interpolation"),
        (lambda p: p["services"]["eng-worker-0"].update(stop_grace_period="1m30s"), "1m30s"),
        (lambda p: p.update(configs={}), "configs"),
        (lambda p: p["networks"]["ddp"].update(driver="overlay"), "overlay"),
        (lambda p: p["services"]["eng-worker-0"].update(networks=["ddp", "x"]), "2 networks"),
    ],
)
def test_anything_else_is_refused_by_name(change: Any, named: str) -> None:
    project = render_compose(spec_of())
    engine_plan(project)
    change(project)
    with pytest.raises(OperationError, match="smoke --docker does not start") as err:
        engine_plan(project)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_a_gpu_file_is_refused_by_name() -> None:
    with pytest.raises(OperationError, match="deploy"):
        engine_plan(render_compose(spec_of(gpus=1), cpu=False))


JOBS = [
    {"target": target, **extra}
    for target in ("pytorchjob", "trainjob", "indexed-job")
    for extra in (
        {},
        {"checkpoint": {"size": "1Gi"}, "security": {"fsGroup": 2000}},
        {"secretEnv": {"HF_TOKEN": {"secret": "hf", "key": "t"}}, "env": {"A": "x $y"}},
        {"security": {"readOnlyRootFilesystem": False}, "gpus": 2, "procs": 2},
    )
] + [{"rendezvous": {"mode": "elastic", "minNodes": 1, "maxNodes": 2}}]


@pytest.mark.parametrize("extra", JOBS)
def test_every_job_smoke_renders_is_one_it_starts(extra: dict[str, Any]) -> None:
    spec = spec_of(**extra)
    plan = engine_plan(compose_plan(spec, "ex/img:1", {}).project)
    assert {s.name for s in plan} >= {n.hostname for n in launch_contract(spec).nodes}


# ---- against the engine -----------------------------------------------------------------


class CliProject:
    """The same file started by the compose CLI (Debian's docker-compose, or `docker
    compose`), the yardstick the SDK path is held to; removed by `down` at the end."""

    def __init__(self, project: dict[str, Any], folder: Path, engine: Any) -> None:
        legacy = shutil.which("docker-compose")
        self.cli = [legacy] if legacy else ["docker", "compose"]
        self.engine, self.project_name = engine, f"ddpdeploy-cli-{folder.name[-8:]}".lower()
        self.file = folder / "compose.yaml"
        self.file.write_text(to_yaml(project))
        self._compose("up", "-d", "--no-build")

    def _compose(self, *args: str) -> None:
        cmd = [*self.cli, "-p", self.project_name, "-f", str(self.file), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr

    def _filter(self, **more: str) -> dict[str, list[str]]:
        labels = {PROJECT_LABEL: self.project_name, **more}
        return {"label": [f"{k}={v}" for k, v in labels.items()]}

    def container(self, service: str) -> Any:
        (found,) = self.engine.containers.list(
            all=True, filters=self._filter(**{SERVICE_LABEL: service})
        )
        return found

    def leftovers(self) -> list[str]:
        return [c.name for c in self.engine.containers.list(all=True, filters=self._filter())]

    def down(self) -> None:
        self._compose("down", "--volumes", "--timeout", "5")


@pytest.fixture
def started(engine: Any, base_image: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The same rendered project (base image: no torchrun, so the nodes soon exit) started
    through the SDK (ComposeRun) and through the compose CLI."""
    spec = spec_of(
        base_image,
        target="indexed-job",
        checkpoint={"size": "1Gi"},
        security={"fsGroup": 2000},
    )
    job = compose_job(spec, cpu=True)
    project, nodes = render_compose(spec, cpu=True), nodes_of(launch_contract(job))
    runs: dict[str, Any] = {}
    try:
        runs["sdk"] = ComposeRun(project, nodes, spec.name, client=engine)
        runs["cli"] = CliProject(project, tmp_path, engine)
        yield runs
    finally:
        if "sdk" in runs:
            runs["sdk"].stop()
        if "cli" in runs:
            runs["cli"].down()


def _settings(project_name: str, container: Any) -> dict[str, Any]:
    """What the pod's settings and the project's wiring became, the project name masked."""
    container.reload()
    attrs, name = container.attrs, project_name
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
def test_the_sdk_creates_what_the_compose_cli_creates_and_removes_only_that(
    started: dict[str, Any], engine: Any
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
        ours = _settings(sdk.project_name, sdk.node(node.name).container)
        theirs = _settings(cli.project_name, cli.container(node.name))
        assert ours == theirs
        assert ours["host"]["ReadonlyRootfs"] and ours["host"]["CapDrop"] == ["ALL"]
        assert node.name in ours["aliases"] and len(ours["aliases"]) == 2  # name, address
    assert sdk.volumes() == [f"{sdk.project_name}_checkpoints"]

    # Teardown removes the SDK's project, and only it.
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


@pytest.mark.docker
def test_what_teardown_cannot_remove_is_named(engine: Any, base_image: str) -> None:
    """A container of someone else's on the project's network (a fault the engine makes on
    demand): the network cannot go, the rest goes, and one line names what is left."""
    spec = spec_of(base_image)
    project, nodes = render_compose(spec, cpu=True), nodes_of(launch_contract(spec))
    run = ComposeRun(project, nodes, spec.name, client=engine)
    network = f"{run.project_name}_ddp"
    stranger = engine.containers.run(base_image, ["sleep", "300"], network=network, detach=True)
    try:
        with pytest.raises(OperationError) as err:
            run.stop()
        text = str(err.value)
        assert "\n" not in text and f"network {network}:" in text
        assert "docker network rm" in text
        assert [c.name for c in engine.containers.list(all=True, filters=run._filter())] == []
    finally:
        stranger.remove(force=True)
        engine.networks.get(network).remove()
