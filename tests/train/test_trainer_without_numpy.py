"""The trainer needs no numpy: torch does not require it, so a user's venv may lack it.

Every process here runs with a sitecustomize that makes `import numpy` fail, so the test
means the same with or without numpy installed; a probe in the workers proves it took
effect (torch's own numpy bridge, which *_object collectives use, is unavailable there).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trainer_harness import TRAINER, Launcher, Proc, base_env, done_hash, start_event  # noqa: E402

pytestmark = pytest.mark.slow  # torchrun agents

BLOCK_NUMPY = """
import sys


class _NoNumpy:
    \"\"\"The path finder, blind to numpy: `import numpy` and find_spec act as if absent.\"\"\"

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [
    _NoNumpy(f) if getattr(f, "__name__", "") == "PathFinder" else f for f in sys.meta_path
]
"""

# A --dataset factory that records, per rank, whether numpy and torch's bridge to it work.
PROBE = """
import json, os
import ddptrain_model
import torch


def make():
    try:
        import numpy  # noqa: F401
        importable = True
    except ImportError:
        importable = False
    try:
        torch.zeros(1).numpy()
        bridge = True
    except RuntimeError:
        bridge = False
    with open(f"probe-{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump({"numpy": importable, "bridge": bridge}, f)
    return ddptrain_model.SyntheticClassification()
"""

ARGS = ["--batch-size", "16", "--bn", "--dataset", "probe_data:make", "--log-every", "4"]


@pytest.fixture
def no_numpy(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_NUMPY)
    (tmp_path / "probe_data.py").write_text(PROBE)
    return {"PYTHONPATH": str(site)}


def _probes(d: Path, n: int) -> list[dict[str, bool]]:
    return [json.loads((d / f"probe-{r}.json").read_text()) for r in range(n)]


def test_checkpoint_and_resume_without_numpy(tmp_path: Path, no_numpy: dict[str, str]) -> None:
    ck = tmp_path / "ck"
    with Launcher(tmp_path) as L:
        # Checkpoints at steps 2, 4, 6 and 8 (RNG states of both ranks gathered) ...
        ref = L.run_ok([*ARGS, "--steps", "8", "--checkpoint-dir", str(ck), "--checkpoint-every",
                        "2", "--keep", "4"], env=no_numpy, name="ref")  # fmt: skip
        assert _probes(tmp_path, 2) == [{"numpy": False, "bridge": False}] * 2
        # ... then a resume from step 4's, as if the run had stopped there.
        for f in [*ck.glob("ckpt-step-000000006.*"), *ck.glob("ckpt-step-000000008.*")]:
            f.unlink()
        q = L.run_ok([*ARGS, "--steps", "8", "--checkpoint-dir", str(ck)], env=no_numpy,
                     name="second")  # fmt: skip
    st = start_event(q)
    assert st["resumed"] and st["resume_step"] == 4
    assert done_hash(q) == done_hash(ref)
    assert "Numpy is not available" not in q.stderr


def test_no_numpy_warning_on_stderr(tmp_path: Path, no_numpy: dict[str, str]) -> None:
    """Bad arguments still give exactly one stderr line: torch's import-time numpy warning
    is filtered out."""
    with Launcher(tmp_path) as L:
        p = Proc(
            [sys.executable, str(TRAINER), "--steps", "0"], tmp_path, "bad", base_env(no_numpy)
        )
        L.procs.append(p)
        assert p.wait(60) == 2
        ok = Proc([sys.executable, str(TRAINER), *ARGS, "--steps", "2"], tmp_path, "ok",
                  base_env(no_numpy))  # fmt: skip
        L.procs.append(ok)
        assert ok.wait(60) == 0, ok.tail()
    assert _probes(tmp_path, 1) == [{"numpy": False, "bridge": False}]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddptrain: error:"), p.stderr
    assert ok.stderr.strip() == "", ok.stderr
    done_hash(ok)
