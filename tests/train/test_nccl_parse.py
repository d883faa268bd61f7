"""ddpkit's NCCL debug-text parser on real NCCL output (tests/fixtures/nccl, sources in
SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")  # ddpkit imports it; the parser itself is pure
import ddpkit  # noqa: E402  (train/, on pyproject.toml's pythonpath)

ROOT = Path(__file__).resolve().parents[2]

FIXTURES = ROOT / "tests" / "fixtures" / "nccl"


def parsed(name: str) -> dict:
    return ddpkit.nccl_transports((FIXTURES / name).read_text())


@pytest.mark.parametrize(
    ("name", "net", "transport", "paths"),
    [
        ("ib.log", "IB", "IB", ["NET/IB"]),
        ("roce.log", "RoCE", "RoCE", []),
        ("socket.log", "Socket", "Socket", ["NET/Socket", "P2P/IPC"]),
        ("socket_lo.log", "Socket", "Socket", []),
        ("p2p.log", None, "P2P", ["P2P/IPC"]),
        ("p2p_direct.log", None, "P2P", ["P2P/direct"]),
    ],
)
def test_fixture_transport(name: str, net: str | None, transport: str, paths: list[str]) -> None:
    got = parsed(name)
    assert (got["net"], got["transport"], got["paths"]) == (net, transport, paths)


def test_devices_and_version() -> None:
    assert parsed("ib.log")["devices"] == [f"mlx5_{i}/IB" for i in range(4)]
    roce = parsed("roce.log")
    assert roce["devices"] == ["mlx5_10/RoCE", "mlx5_11/RoCE"]
    assert roce["version"] == "2.19.3+cuda12.3"
    assert parsed("socket.log")["no_rdma_device"] is True


def test_rdma_fallback_warning_names_host_and_causes() -> None:
    warning = ddpkit.rdma_fallback_warning("node-3", parsed("socket.log"))
    assert warning is not None and "node-3" in warning and "no RDMA device" in warning
    lo = ddpkit.rdma_fallback_warning("node-1", parsed("socket_lo.log"))
    assert lo is not None and "IPC_LOCK" in lo and "NCCL_IB_HCA" in lo
    for name in ("ib.log", "roce.log", "p2p.log"):
        assert ddpkit.rdma_fallback_warning("h", parsed(name)) is None


def test_empty_or_foreign_text_is_unknown() -> None:
    got = ddpkit.nccl_transports("hello\nNCCL WARN something\n")
    assert got["net"] is None and got["transport"] == "unknown" and got["paths"] == []


def test_flight_recorder_env_both_spellings_user_values_win(tmp_path: Path) -> None:
    env = {"DDPDEPLOY_CHECKPOINT_DIR": str(tmp_path), "TORCH_FR_BUFFER_SIZE": "7"}
    ddpkit.flight_recorder_env(env)
    prefix = str(tmp_path / "nccl_trace_rank_")
    assert env["TORCH_FR_BUFFER_SIZE"] == "7" and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix
