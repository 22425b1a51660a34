#!/usr/bin/env bash
# Wheels for the lent GPU machine, which reaches no package index: downloaded here, for the
# image's Python (3.12, CPython) and platform (manylinux, x86_64), into .whl/ (ignored by git).
# Name .whl among the paths a call carries; scripts/gpu_check.sh installs every wheel in it
# (--no-deps, into /tmp/attnbench-site) before anything runs. A call carries 64 MiB in all.
#
#   bash scripts/carry_wheels.sh NAME==VERSION...
#
# --no-deps: a wheel's own needs are not fetched; list each that the image lacks (the image's
# packages: the device tool's KINDS.md). Keep one version of each package in .whl/.
# No xformers: every release on PyPI was built for another torch than the image's, and then
# xformers refuses every operator (docs/gpu.md, "xformers on the image").
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_VERSION=3.12
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
    manylinux2014_x86_64 manylinux1_x86_64)
LIMIT_MIB=48  # of the 64 MiB a call carries; the rest is the checkout and .lease

if (($# == 0)); then
    echo "carry_wheels.sh: error: name the wheels to carry (NAME==VERSION ...)" >&2
    exit 2
fi
platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp "${platform_args[@]}" -d .whl "$@"
mib=$(($(du -sb .whl | cut -f1) / 1048576))
echo "carry_wheels.sh: .whl holds $mib MiB: $(ls .whl | tr '\n' ' ')"
if ((mib > LIMIT_MIB)); then
    echo "carry_wheels.sh: warning: over $LIMIT_MIB MiB; a call carries 64 MiB in all" >&2
fi
