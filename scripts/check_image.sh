#!/usr/bin/env bash
# The project on the lent GPU machine's software, checked on this CPU machine: a venv with the
# image's versions (Python 3.12; torch 2.11.0, PyPI's CUDA 13 build, which runs here without a
# driver; triton 3.6.0; numpy 2.5.2; the test tools the image has; no xformers and no ray, as
# on the image), then the default test suite and the dry run of the three calls of docs/gpu.md.
#
#   bash scripts/check_image.sh [VENV]     # VENV default: /work/venvs/attnbench-image
#
# PYTHON picks the interpreter (default: python3.12 on PATH, else pyenv's 3.12). The venv is
# reused when its versions match. Exit code 0 only when the suite and every dry call pass.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
venv=${1:-/work/venvs/attnbench-image}
IMAGE=(torch==2.11.0 triton==3.6.0 numpy==2.5.2)
TOOLS=(pandas seaborn matplotlib tqdm nvidia-ml-py pytest pytest-xdist pytest-timeout
    pytest-benchmark)

python=${PYTHON:-$(command -v python3.12 || ls -d "$HOME"/.pyenv/versions/3.12*/bin/python 2>/dev/null | tail -1)}
if [[ -z $python || ! -x $python ]]; then
    echo "check_image.sh: error: no Python 3.12 found; set PYTHON=/path/to/python3.12" >&2
    exit 2
fi
case $venv in "$repo"/*)
    echo "check_image.sh: error: $venv is inside the repository; give a folder outside it" >&2
    exit 2
    ;;
esac
if [[ ! -x $venv/bin/python ]]; then
    "$python" -m venv "$venv" || exit 1
fi
want=$(printf '%s\n' "${IMAGE[@]}")
have=$("$venv/bin/python" -m pip freeze 2>/dev/null | grep -E '^(torch|triton|numpy)==' | sort)
if [[ $have != $(sort <<<"$want") ]] || ! "$venv/bin/python" -c "import pytest, pandas" 2>/dev/null; then
    echo "check_image.sh: installing ${IMAGE[*]} ${TOOLS[*]} into $venv (torch's CUDA wheels: GBs)"
    "$venv/bin/python" -m pip install -q "${IMAGE[@]}" "${TOOLS[@]}" || exit 1
fi
export PATH=$venv/bin:$PATH PYTHONPATH=$repo PYTHONUNBUFFERED=1
python3 -c "import platform, torch, triton, numpy; print('check_image.sh: Python', \
platform.python_version(), '| torch', torch.__version__, '| triton', triton.__version__, \
'| numpy', numpy.__version__, '| CUDA visible:', torch.cuda.is_available())"

failed=()
echo "check_image.sh: the default test suite"
python3 -m pytest -q -p no:cacheprovider || failed+=("the default test suite")

# the plan's three calls, each on a fresh work folder (a bare machine) fed only by the archives
# the calls before it brought back
dry=$(mktemp -d /tmp/attnbench-image-dry-XXXXXX)
mkdir -p "$dry/lease"
calls=("xformers,fidelity,launch" "lab-fwd" "lab-bwd")
for i in "${!calls[@]}"; do
    echo "check_image.sh: dry call $((i + 1)): ${calls[i]}"
    out=$dry/out$((i + 1))
    call_started=$SECONDS
    if ATTNBENCH_DRY_RUN=1 ATTNBENCH_WORK=$dry/work$((i + 1)) bash scripts/gpu_check.sh \
        --from "$dry/lease" \
        "${calls[i]}" "$out" >"$dry/call$((i + 1)).log" 2>&1 &&
        [[ $(grep -c "^stage .*: packed" "$dry/call$((i + 1)).log") == $(tr , '\n' <<<"${calls[i]}" | wc -l) ]]; then
        cp "$out"/*.tgz "$dry/lease/"
        tail -n 1 "$dry/call$((i + 1)).log"
        took=$((SECONDS - call_started))
        ((took <= ${ATTNBENCH_BUDGET_S:-450} + 30)) ||
            failed+=("dry call $((i + 1)) took $took s, past its budget")
    else
        failed+=("dry call $((i + 1)) (${calls[i]}): $dry/call$((i + 1)).log")
        tail -n 20 "$dry/call$((i + 1)).log"
    fi
done
if ((${#failed[@]})); then
    printf 'check_image.sh: FAILED: %s\n' "${failed[@]}"
    exit 1
fi
rm -rf "$dry"
echo "check_image.sh: passed (the suite and the three dry calls) on the image's versions"
