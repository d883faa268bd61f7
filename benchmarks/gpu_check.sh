#!/usr/bin/env bash
# One command for a machine with CUDA: every GPU-only test (marked `gpu`, or skipped without
# CUDA: nccl, torch SyncBatchNorm, bf16 autocast, bit-exact resume on nccl) and the trainer
# benchmark on nccl, in under 5 minutes, then one summary table. Exit 0 only if all passed.
#   PYTHON=...              the interpreter (default python3); without torch and pytest it
#                           gets its own venv in .cache/gpu-venv (needs PyPI)
#   GPU_CHECK_DRY_RUN=1     go through every step without CUDA (tests skip, benchmark on
#                           gloo, shortened), to check this script itself
set -uo pipefail
cd "$(dirname "$0")/.."
dry="${GPU_CHECK_DRY_RUN:-}"

if [ -z "$dry" ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: skipped: no CUDA device here (nvidia-smi finds none)"
    exit 0
fi

py="${PYTHON:-python3}"
if ! "$py" -c "import torch, pytest" 2>/dev/null; then
    echo "gpu_check: $py lacks torch or pytest; installing them into .cache/gpu-venv" >&2
    python3 -m venv .cache/gpu-venv && .cache/gpu-venv/bin/pip install -q torch pytest || exit 1
    py=.cache/gpu-venv/bin/python
fi
if [ -z "$dry" ] && ! "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: skipped: $py's torch $("$py" -c 'import torch; print(torch.__version__)')" \
        "sees no CUDA device"
    exit 0
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "gpu_check: GPU-only tests (log: pytest output below)" >&2
PYTHONPATH=benchmarks timeout 170 "$py" -m pytest -p gpu_select -q -rA tests/train \
    --junitxml="$out/tests.xml" >&2
echo $? >"$out/tests.rc"

backend=nccl bench=(--trials 2)  # 8 torchrun starts with CUDA init fit in 110 s
if [ -n "$dry" ]; then backend=gloo bench=(--trials 1 --steps 40 --large-steps 20); fi
if [[ "$("$py" benchmarks/bench_trainer.py --help 2>&1)" == *--backend* ]]; then
    echo "gpu_check: benchmarks/bench_trainer.py --backend $backend ${bench[*]}" >&2
    timeout 110 "$py" benchmarks/bench_trainer.py --backend "$backend" "${bench[@]}" \
        >"$out/bench.out" 2>"$out/bench.err"
    echo $? >"$out/bench.rc"
    cat "$out/bench.out" "$out/bench.err" >&2
else
    echo "bench_trainer.py has no --backend flag: the nccl benchmark cannot run" >"$out/bench.out"
    echo none >"$out/bench.rc"
fi
"$py" benchmarks/gpu_summary.py "$out"
