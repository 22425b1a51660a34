#!/usr/bin/env bash
# The GPU check, one stage per call, each inside a time budget:
#
#   bash scripts/gpu_check.sh STAGE [OUT [SWEEP OPTIONS...]]
#                             STAGE: env tests first-light race fidelity llama full
#
# env          nvidia-smi, versions, the matmul and copy ceilings                   (~1 min)
# tests        the GPU-marked tests, each with a time limit                          (~5 min)
# first-light  the first-light preset: SDPA and its backends, xformers, triton_flash (~6 min)
# race         the race preset: triton_flash vs SDPA's backends and xformers         (~7 min)
# fidelity     a small grid twice with --profile, then `attnbench fidelity`          (~3 min)
# llama        Llama-3-8B prefill (2k-8k) and decode (4k-128k cache, batch 1, 32)     (~6 min)
# full         the gpu preset; resumable: call it again to continue                  (~60 min)
#
# Each stage prints one line per finished row, stops itself inside its budget (ATTNBENCH_BUDGET_S,
# default 480 s, of which ATTNBENCH_RESERVE_S, default 60, is kept for the report and packing),
# writes a report from whatever rows it has, and packs its results, reports and logs into
# OUT/<stage>.tgz (OUT: $OUT, else gpu-check/). Sweeps keep their rows in results/ (under
# ATTNBENCH_WORK, default the checkout) with a fixed run id, so calling a stage again on the same
# machine resumes it. SWEEP OPTIONS are added to every sweep of the stage. Wheels in .whl/
# (xformers) are installed first. ATTNBENCH_DRY_RUN=1 runs every stage on the CPU with tiny
# grids, to check the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
out=${2:-${OUT:-gpu-check}}
extra=("${@:3}")
budget=${ATTNBENCH_BUDGET_S:-480}
reserve=${ATTNBENCH_RESERVE_S:-60}
work=${ATTNBENCH_WORK:-.}
dry=${ATTNBENCH_DRY_RUN:-0}
stages="env tests first-light race fidelity llama full"
if [[ ! " $stages " == *" $stage "* ]]; then
    echo "gpu_check.sh: error: unknown stage '$stage' (stages: $stages)" >&2
    exit 2
fi
mkdir -p "$out" "$work/results" "$work/reports" "$work/logs"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/attnbench-site .whl/*.whl && export PYTHONPATH=/tmp/attnbench-site
fi
ab() { python3 -m attnbench "$@"; }
started=$SECONDS
left() {  # seconds left for a step that must leave $1 s of the budget (at least 5)
    local s=$((budget - (SECONDS - started) - $1))
    echo $((s > 5 ? s : 5))
}
logs=()

if [[ $dry == 1 ]]; then
    device=(--device cpu)
    tiny=(--batch 1 --heads 2 --seq-len 32,64 --head-dim 16 --dtype float32 --rep-ms 2)
    slug=dry-run
else
    device=()
    tiny=()
    slug=$(python3 -c "import re, torch; print(re.sub('[^a-z0-9]+', '-', \
torch.cuda.get_device_name().lower()).strip('-'))" 2>/dev/null || echo no-gpu)
fi

# a sweep stage: fixed run id, resumed when it has rows; stopped (SIGINT: finished rows stay)
# when the budget runs out, leaving 60 s to write the report and pack
sweep() {
    local id=$1
    shift
    local resume=()
    [[ -s $work/results/$id/results.csv ]] && resume=(--resume)
    timeout --signal=INT --kill-after=20 "$(left "$reserve")" \
        python3 -m attnbench "$@" "${extra[@]}" --run-id "$id" --row-lines --timeout 120 \
        --results-dir "$work/results" --reports-dir "$work/reports" "${resume[@]}" \
        2>&1 | tee -a "$work/logs/$stage-$id.log"
    local rc=${PIPESTATUS[0]}
    logs+=("logs/$stage-$id.log")
    if [[ $rc != 0 ]]; then  # stopped: report what is there, and say so
        [[ -s $work/results/$id/results.csv ]] &&
            { ab report "$work/results/$id" --reports-dir "$work/reports" >/dev/null 2>&1 || true; }
        echo "stage $stage: run $id stopped early (exit $rc); call the stage again to resume"
    fi
    ids+=("$id")
    return 0
}
ids=()

case $stage in
env)
    {
        nvidia-smi -q 2>&1 | head -80 || echo "nvidia-smi: not found"
        python3 - "${device[@]}" <<'PY'
import json, sys, platform, torch
from attnbench.measure import ceilings
from attnbench.store.env import collect_env
device = "cpu" if "cpu" in sys.argv[1:] else "cuda"
if device == "cuda" and not torch.cuda.is_available():
    sys.exit("stage env: no CUDA device visible to torch; nothing to measure")
env = collect_env(["gpu_check.sh", "env"], 0, device)
dtypes = ["float32"] if device == "cpu" else ["bfloat16", "float16", "float32"]
env["ceilings"] = ceilings.measure(dtypes, device, quick=device == "cpu")
print(json.dumps(env, indent=2))
PY
    } 2>&1 | tee "$work/logs/env.log"
    logs+=("logs/env.log")
    ;;
tests)
    if [[ $dry != 1 ]] && ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        echo "stage tests: no CUDA device; the GPU-marked tests would only skip" \
            | tee "$work/logs/tests.log"
    else
        timeout --signal=INT --kill-after=20 "$(left 30)" \
            python3 -m pytest -q -m gpu -n 0 -rs -p no:cacheprovider --timeout 300 \
            --junitxml "$work/logs/tests.xml" 2>&1 | tee "$work/logs/tests.log"
        logs+=("logs/tests.xml")
    fi
    logs+=("logs/tests.log")
    ;;
first-light)
    sweep "first-light-$slug" sweep --preset first-light "${device[@]}" "${tiny[@]}"
    ;;
race)
    sweep "race-$slug" race "${device[@]}" "${tiny[@]}"
    ;;
fidelity)
    grid=(--seq-len 4096 --head-dim 64,128 --impls sdpa,sdpa_flash,sdpa_cudnn,triton_flash
          --mode fwd,bwd --causal both --profile all)
    [[ $dry == 1 ]] && grid=(--impls sdpa,sdpa_flash,sdpa_math --mode fwd,bwd --causal both
                             --profile all)
    rm -rf "$work/results/fidelity-a-$slug" "$work/results/fidelity-b-$slug"  # both fresh
    sweep "fidelity-a-$slug" sweep --preset first-light "${device[@]}" "${tiny[@]}" "${grid[@]}"
    sweep "fidelity-b-$slug" sweep --preset first-light "${device[@]}" "${tiny[@]}" "${grid[@]}"
    ab fidelity "$work/results/fidelity-a-$slug" "$work/results/fidelity-b-$slug" \
        --out "$work/reports/fidelity-$slug" 2>&1 | tee "$work/logs/fidelity.log"
    logs+=("logs/fidelity.log")
    ;;
llama)
    grid=(--model llama3-8b --phase prefill,decode --seq-len-kv 4096,32768,131072 --batch 1,32
          --impls sdpa,sdpa_flash,sdpa_efficient,sdpa_cudnn,xformers,triton_flash,flex,flex_paged)
    [[ $dry == 1 ]] && grid=(--model llama3-8b --phase prefill,decode --kv-heads 1
                             --seq-len-kv 64,128 --impls naive,sdpa,flex_paged)
    sweep "llama3-8b-$slug" sweep --preset gpu "${device[@]}" "${tiny[@]}" "${grid[@]}"
    ;;
full)
    sweep "gpu-$slug" sweep --preset gpu "${device[@]}" "${tiny[@]}"
    ;;
esac

# pack: one tarball per stage (the device tool brings back few files, at most 2 folders deep)
paths=("${logs[@]}")
for id in "${ids[@]}"; do
    paths+=("results/$id" "reports/$id")
done
[[ $stage == fidelity ]] && paths+=("reports/fidelity-$slug")
existing=()
for p in "${paths[@]}"; do [[ -e $work/$p ]] && existing+=("$p"); done
tar czf "$out/$stage.tgz" -C "$work" "${existing[@]}" 2>/dev/null
echo "stage $stage: packed ${#existing[@]} paths into $out/$stage.tgz in $((SECONDS - started)) s"
