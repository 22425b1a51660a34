#!/usr/bin/env bash
# The whole GPU check in one call, on a CUDA machine (no internet needed):
#   bash scripts/gpu_check.sh [all|tests|sweep|bench] [OUT_DIR]
# tests: the full suite with the GPU-only tests enabled; sweep: the gpu preset (CSV, env.json and
# report); bench: the Triton kernel race against every SDPA backend and xformers.
# Wheels missing on that machine (xformers, ...) are installed from .whl/ if the folder exists.
# Everything produced is also packed into OUT_DIR/gpu_check.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-all}
out=${2:-${OUT:-gpu-check}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/attnbench-site .whl/*.whl && export PYTHONPATH=/tmp/attnbench-site
fi
python3 - <<'PY' | tee "$out/device.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu",
      torch.cuda.get_device_name() if torch.cuda.is_available() else None)
PY
stamp=$(date -u +%Y%m%d-%H%M%S)
slug=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))" 2>/dev/null || echo cpu)
status=0
if [[ $stage == all || $stage == tests ]]; then
    python3 -m pytest -q -rs 2>&1 | tee "$out/tests.log" || status=1
fi
if [[ $stage == all || $stage == sweep ]]; then
    python3 scripts/sweep.py --preset gpu --run-id "gpu-$slug-$stage-$stamp" --no-progress \
        2>&1 | tee "$out/sweep.log" || status=1
fi
if [[ $stage == all || $stage == bench ]]; then
    python3 scripts/bench_kernel.py --out "results/kernel_bench/$slug.csv" \
        2>&1 | tee "$out/bench.log" || status=1
fi
tar czf "$out/gpu_check.tgz" results reports benchmarks/*.md 2>/dev/null
exit $status
