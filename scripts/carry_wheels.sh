#!/usr/bin/env bash
# Wheels for the lent GPU machine, which reaches no package index: downloaded here, for the
# image's Python (3.12, CPython) and platform (manylinux, x86_64), into .whl/ (ignored by git).
# Name .whl among the paths a call carries; scripts/gpu_check.sh installs every wheel in it
# (--no-deps, into /tmp/attnbench-site) before anything runs. A call carries 64 MiB in all.
#
#   bash scripts/carry_wheels.sh                # the WHEELS below
#   bash scripts/carry_wheels.sh NAME==VERSION  # these instead
#
# --no-deps: a wheel's own needs are not fetched; list each that the image lacks (the image's
# packages: the device tool's KINDS.md). Keep one version of each package in .whl/.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
    # 0.0.35 is the newest xformers that installs beside torch 2.11 (it needs torch>=2.10 and
    # numpy, both on the image); its C++/CUDA extension is built for torch 2.10 + CUDA 12 and
    # does not load on the image's torch 2.11+cu130, so its rows run PyTorch's kernels and say
    # so (backend pytorch:*). Carry it to show that, not as a baseline.
    "xformers==0.0.35"
)
PYTHON_VERSION=3.12
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
    manylinux2014_x86_64 manylinux1_x86_64)
LIMIT_MIB=48  # of the 64 MiB a call carries; the rest is the checkout and .lease

wanted=("$@")
((${#wanted[@]})) || wanted=("${WHEELS[@]}")
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp "${platform_args[@]}" -d .whl "${wanted[@]}"
mib=$(($(du -sb .whl | cut -f1) / 1048576))
echo "carry_wheels.sh: .whl holds $mib MiB: $(ls .whl | tr '\n' ' ')"
if ((mib > LIMIT_MIB)); then
    echo "carry_wheels.sh: warning: over $LIMIT_MIB MiB; a call carries 64 MiB in all" >&2
fi
