"""The local run's rendezvous port: chosen below the kernel's ephemeral range (where no
outgoing connection can take it before torchrun binds it), and when another program binds
it first anyway, the failure says so rather than showing torchrun's traceback alone."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from cli_runner import run_main

from ddpdeploy.commands import smoke as smoke_command
from ddpdeploy.events import port_taken

# What torch 2.13's agent prints when its TCPStore's port is bound already.
TAKEN = (
    "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
    "network address. port: 40047, useIpv6: false, code: -98, name: EADDRINUSE, message: "
    "address already in use"
)


def test_a_taken_port_is_named_with_the_way_out():
    said = port_taken(["Traceback (most recent call last):", "  ...", TAKEN])
    assert said is not None and said.startswith("its rendezvous port 40047 was bound by")
    assert said.endswith("run again (smoke chooses a new free port each run)")
    assert port_taken(["ValueError: port 40047"]) is None


def test_the_port_is_below_the_ephemeral_range_and_free(monkeypatch):
    low = smoke_command._ephemeral_low()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        candidates = iter([busy, 20001])
        monkeypatch.setattr(smoke_command.random, "sample", lambda r, k: list(candidates))
        assert smoke_command._free_port() == 20001  # the bound one is passed over
    monkeypatch.undo()
    if low > smoke_command._LOW_PORT:
        assert all(smoke_command._LOW_PORT <= smoke_command._free_port() < low for _ in range(20))


@pytest.mark.slow  # starts torchrun
def test_a_run_whose_port_another_program_bound_says_so(monkeypatch, tmp_path: Path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        # The race cannot be timed on demand: the port is taken before the run starts.
        monkeypatch.setattr(smoke_command, "_free_port", lambda: port)
        res = run_main("smoke", "--local", "--steps", "3", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert f"its rendezvous port {port} was bound by another program" in res.stderr
