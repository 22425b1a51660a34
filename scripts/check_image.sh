#!/usr/bin/env bash
# The project on the lent GPU machine's software, checked on this CPU machine: a venv with the
# image's versions (Python 3.12; torch 2.11.0, PyPI's CUDA 13 build, which runs here without a
# driver; triton 3.6.0; numpy 2.5.2; transformers 5.17.0; the test tools the image has; no
# xformers and no ray, as on the image), then the default test suite and the dry run of the
# calls of docs/gpu.md's plan, each on a fresh work folder fed only by the archives of the
# calls before it.
#
#   bash scripts/check_image.sh [VENV]     # VENV default: /work/venvs/attnbench-image
#
# The interpreter: PYTHON if set (it must be a Python 3.12), else the first Python 3.12 that
# runs among python3.12 on PATH, pyenv's versions and `uv python find 3.12`; none: exit 2 with
# what was tried. The venv is reused when its versions match. Exit code 0 only when the suite
# and every dry call pass (each call's gpu_check.sh exit 0: every stage's commands succeeded).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
venv=${1:-/work/venvs/attnbench-image}
IMAGE=(torch==2.11.0 triton==3.6.0 numpy==2.5.2 transformers==5.17.0)
TOOLS=(pandas seaborn matplotlib tqdm nvidia-ml-py pytest pytest-xdist pytest-timeout
    pytest-benchmark build)
CALLS=("lab-fwd,lab-bwd,launch" "scaling" "llama" "fidelity")  # docs/gpu.md's plan

fail() {
    echo "check_image.sh: error: $*" >&2
    exit 2
}
is312() { [[ -n $1 && -x $1 ]] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }
if [[ -n ${PYTHON:-} ]]; then
    is312 "$PYTHON" || fail "PYTHON=$PYTHON is not a Python 3.12 that runs"
    python=$PYTHON
else
    tried=()
    shopt -s nullglob
    candidates=($(type -ap python3.12) "$HOME"/.pyenv/versions/3.12*/bin/python3.12)
    shopt -u nullglob
    command -v uv >/dev/null && candidates+=("$(uv python find 3.12 2>/dev/null)")
    python=
    for c in "${candidates[@]}"; do
        [[ -n $c ]] || continue
        if is312 "$c"; then python=$c && break; fi
        tried+=("$c")
    done
    [[ -n $python ]] || fail "no Python 3.12 that runs (tried: ${tried[*]:-nothing found}); \
install one (pyenv install 3.12, uv python install 3.12) or set PYTHON=/path/to/python3.12"
fi
case $venv in "$repo"/*) fail "$venv is inside the repository; give a folder outside it" ;; esac
if [[ ! -x $venv/bin/python ]]; then
    "$python" -m venv "$venv" || exit 1
fi
want=$(printf '%s\n' "${IMAGE[@]}" | sort)
have=$("$venv/bin/python" -m pip freeze 2>/dev/null |
    grep -E '^(torch|triton|numpy|transformers)==' | sed 's/+.*//' | sort)
if [[ $have != "$want" ]] || ! "$venv/bin/python" -c "import pytest, pandas, xdist" 2>/dev/null; then
    echo "check_image.sh: installing ${IMAGE[*]} ${TOOLS[*]} into $venv (torch's CUDA wheels: GBs)"
    "$venv/bin/python" -m pip install -q "${IMAGE[@]}" "${TOOLS[@]}" || exit 1
fi
export PATH=$venv/bin:$PATH PYTHONPATH=$repo PYTHONUNBUFFERED=1
python3 -c "import platform, sys, torch, triton, numpy, transformers; print('check_image.sh: \
Python', platform.python_version(), 'at', sys.executable, '(base', sys.base_prefix + ')', \
'| torch', torch.__version__, '| triton', triton.__version__, '| numpy', numpy.__version__, \
'| transformers', transformers.__version__, '| CUDA visible:', torch.cuda.is_available())"

failed=()
echo "check_image.sh: the default test suite"
python3 -m pytest -q -p no:cacheprovider || failed+=("the default test suite")

dry=$(mktemp -d /tmp/attnbench-image-dry-XXXXXX)
mkdir -p "$dry/lease"
for i in "${!CALLS[@]}"; do
    n=$((i + 1))
    echo "check_image.sh: dry call $n: ${CALLS[i]}"
    call_started=$SECONDS
    ATTNBENCH_DRY_RUN=1 ATTNBENCH_WORK=$dry/work$n bash scripts/gpu_check.sh --from "$dry/lease" \
        "${CALLS[i]}" "$dry/out$n" >"$dry/call$n.log" 2>&1
    rc=$?
    stages=$(tr , '\n' <<<"${CALLS[i]}" | wc -l)
    if [[ $rc == 0 && $(grep -c "^stage .*: packed" "$dry/call$n.log") == "$stages" ]]; then
        cp "$dry/out$n"/*.tgz "$dry/lease/"
        tail -n 1 "$dry/call$n.log"
        took=$((SECONDS - call_started))
        ((took <= ${ATTNBENCH_BUDGET_S:-450} + 30)) ||
            failed+=("dry call $n took $took s, past its budget")
    else
        failed+=("dry call $n (${CALLS[i]}), exit $rc: $dry/call$n.log")
        tail -n 20 "$dry/call$n.log"
    fi
done
if ((${#failed[@]})); then
    printf 'check_image.sh: FAILED: %s\n' "${failed[@]}"
    exit 1
fi
rm -rf "$dry"
echo "check_image.sh: passed (the suite and ${#CALLS[@]} dry calls) on the image's versions"
