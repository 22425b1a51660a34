#!/usr/bin/env bash
# The GPU check: stages run inside a time budget per call, each packing what it did as it ends.
#
#   bash scripts/gpu_check.sh [--from PATH]... STAGE[,STAGE...] [OUT [SWEEP OPTIONS...]]
#
# env           nvidia-smi (clocks, power), versions, env.json fields, matmul and copy ceilings
# tests-triton  the GPU-marked tests of the Triton kernels (pytest -m gpu -k triton)
# tests-rest    the other GPU-marked tests (pytest -m gpu -k 'not triton')
# tests         every GPU-marked test
# first-light   the first-light preset: SDPA and its backends, xformers, triton_flash(_fa2)
# fidelity      a D64/D128 N4096 grid run twice with --profile, then `attnbench fidelity`
# race          the race at D128: triton_flash vs sdpa_flash, sdpa_cudnn, sdpa_efficient
# race-full     the whole race preset (D64 and D128, N 512..16k, xformers, triton_flash_fa2)
# llama         Llama-3-8B prefill (2k-8k), decode (4k-128k cache, batch 1 and 32) and train,
#               with transformers' own attention (hf_*)
# full          the gpu preset
# scaling       the seed's question: naive (to its OOM), SDPA and its backends, triton_flash and
#               xformers (where it can run) at B2 H16 D128 bf16, N 512..32k, causal both, fwd and
#               bwd: time and memory against N, fitted
# launch        benchmarks/launch_cost.py: host and GPU time per call, triton_flash on both
#               launch paths (cached, autotuner)
# lab-fwd       benchmarks/kernel_lab.py --kinds fwd: the forward variants and their controls
# lab-bwd       benchmarks/kernel_lab.py --kinds bwd: the backward variants and their controls
#
# docs/gpu.md is the plan for a 15-minute lease (its calls in priority order) with the
# arithmetic behind it.
# One call runs up to three stages (the device brings back 8 files: a log and an archive per
# stage, and cache.tgz) within ATTNBENCH_BUDGET_S (default 450 s) in all; a stage gets its
# own cap (CAPS below) but always leaves 60 s to each stage after it, and the last stage gets
# what is left. SWEEP OPTIONS come after the stage's own (--timeout 120 included), so they
# win. Each stage writes its output to OUT/<stage>.log as it goes, stops its sweeps
# inside its budget (SIGINT: finished rows stay; ATTNBENCH_RESERVE_S, default 60, at most a
# third of the budget, is kept for the report and packing), and packs its results, reports
# and logs into OUT/<stage>.tgz; Triton's and inductor's caches (.cache/ under the work folder)
# go to OUT/cache.tgz when they pack to 15 MiB or less. OUT: $OUT, else gpu-check/.
#
# Resume across bare machines: archives brought back by earlier calls are unpacked into the
# work folder first, from .lease/ (copy them there, and carry .lease) and from each --from
# PATH (an archive or a folder of them); a sweep whose run already has rows continues it (same
# run id, finished rows never run again). .lease/source (scripts/lease_stamp.sh) gives env.json
# its git commit on a copy without .git. Wheels in .whl/, if any, are installed first
# (scripts/carry_wheels.sh; the plan carries none). ATTNBENCH_WORK (default: the checkout): where results/, reports/,
# logs/ and .cache/ go. ATTNBENCH_DRY_RUN=1: every stage on the CPU with tiny grids.
# ATTNBENCH_PLAN=1: print each stage's budget, expected seconds (EXPECT_S below) and every
# command it would run ('plan:' lines), and run nothing.
#
# Exit status: 0 when every stage's commands succeeded (a sweep or the lab stopped by its budget
# counts as done: its rows stay, and the next call resumes it), else 1; the last line gives
# each stage's exit status ("exits: lab-fwd=0 lab-bwd=0 launch=0").
set -uo pipefail
cd "$(dirname "$0")/.."
STAGES="env tests-triton tests-rest tests first-light fidelity race race-full llama full"
STAGES+=" scaling launch lab-fwd lab-bwd"
declare -A CAPS=([env]=60 [tests-triton]=150 [tests-rest]=180 [tests]=300 [fidelity]=210
    [launch]=90 [lab-fwd]=200 [lab-bwd]=260 [scaling]=330)
# expected seconds on an H100 or H200, Triton's cache cold: measured on the first lease
# (2026-11-26) where the stage ran then, else estimated (docs/gpu.md, "The arithmetic")
declare -A EXPECT_S=([env]=10 [tests-triton]=60 [tests-rest]=45 [tests]=105 [first-light]=105
    [fidelity]=55 [race]=75 [race-full]=270 [llama]=330 [full]=1200 [scaling]=240 [launch]=40
    [lab-fwd]=150 [lab-bwd]=200)
MAX_STAGES=3
CACHE_MAX_MIB=15

fail() {
    echo "gpu_check.sh: error: $*" >&2
    exit 2
}
from=()
while [[ ${1:-} == --from ]]; do
    [[ -n ${2:-} && -e ${2:-} ]] || fail "--from ${2:-}: no such archive or folder"
    from+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")")
    shift 2
done
IFS=, read -ra stages <<<"${1:-}"
out=${2:-${OUT:-gpu-check}}
extra=("${@:3}")
[[ ${#stages[@]} -gt 0 ]] || fail "no stage given (stages: $STAGES)"
for s in "${stages[@]}"; do
    [[ " $STAGES " == *" $s "* ]] || fail "unknown stage '$s' (stages: $STAGES)"
done
((${#stages[@]} <= MAX_STAGES)) ||
    fail "${#stages[@]} stages in one call; at most $MAX_STAGES (the device brings back 8 files)"
call_started=$SECONDS
budget=${ATTNBENCH_BUDGET_S:-450}
reserve_max=${ATTNBENCH_RESERVE_S:-60}
work=${ATTNBENCH_WORK:-.}
dry=${ATTNBENCH_DRY_RUN:-0}
plan=${ATTNBENCH_PLAN:-0}

if [[ $plan == 1 ]]; then
    device=(--device cuda)
    tiny=()
    slug=plan
elif [[ $dry == 1 ]]; then
    device=(--device cpu)
    tiny=(--batch 1 --heads 2 --seq-len 32,64 --head-dim 16 --dtype float32 --rep-ms 2)
    slug=dry-run
fi
if [[ $plan != 1 ]]; then
    mkdir -p "$out" "$work/results" "$work/reports" "$work/logs" "$work/.cache"
    out=$(cd "$out" && pwd)
    work=$(cd "$work" && pwd)
    export PYTHONUNBUFFERED=1
    export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$work/.cache/triton}
    export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$work/.cache/inductor}
    if ! git rev-parse HEAD >/dev/null 2>&1 && [[ -f .lease/source ]]; then
        export ATTNBENCH_GIT_SHA=$(sed -n 's/^sha=//p' .lease/source)
        export ATTNBENCH_GIT_DIRTY=$(sed -n 's/^dirty=//p' .lease/source)
    fi
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/attnbench-site .whl/*.whl &&
            export PYTHONPATH=/tmp/attnbench-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    archives=()
    for p in .lease "${from[@]}"; do
        if [[ -d $p ]]; then
            for a in "$p"/*.tgz; do [[ -f $a ]] && archives+=("$a"); done
        elif [[ -f $p ]]; then
            archives+=("$p")
        fi
    done
    for a in "${archives[@]}"; do  # the earlier calls' results, reports, logs and caches
        tar xzf "$a" -C "$work" && echo "gpu_check.sh: unpacked $a into $work"
    done
    if [[ $dry != 1 ]]; then
        slug=$(python3 -c "import re, torch; print(re.sub('[^a-z0-9]+', '-', \
torch.cuda.get_device_name().lower()).strip('-'))" 2>/dev/null || echo no-gpu)
        device=()
        tiny=()
    fi
fi

# ---------------------------------------------------------------------------- one stage
# run in a subshell: STAGE BUDGET_S; everything it prints goes to OUT/<stage>.log as well. Its
# exit status: 0, or the exit status of the first of its commands that failed (a command
# stopped by the stage's budget, 124 or 137 from timeout, has not failed: it said so).
run_stage() {
    local stage=$1 stage_budget=$2
    local started=$SECONDS status=0
    local reserve=$((reserve_max < stage_budget / 3 ? reserve_max : stage_budget / 3))
    logs=()
    ids=()
    left() {  # seconds left for a step that must leave $1 s of the stage's budget (at least 5)
        local s=$((stage_budget - (SECONDS - started) - $1))
        echo $((s > 5 ? s : 5))
    }
    plan_cmd() {  # the command, as plan mode prints it
        printf 'plan: %s $' "$stage"
        printf ' %q' "$@"
        echo
    }
    ended() {  # RC WHAT: note a command's exit; 1 when it failed (not stopped by the budget)
        case $1 in
        0) return 0 ;;
        124 | 137) echo "stage $stage: $2 stopped by its budget (exit $1)" && return 0 ;;
        *) echo "stage $stage: $2 FAILED (exit $1)"; ((status == 0)) && status=$1; return 1 ;;
        esac
    }
    # a sweep: fixed run id, resumed when it has rows; stopped (SIGINT: finished rows stay)
    # when the stage's budget runs out, leaving the reserve to write the report and pack
    sweep() {
        local id=$1
        shift
        local cmd=(python3 -m attnbench "$@" --timeout 120 "${extra[@]}" --run-id "$id"
                   --row-lines --results-dir "$work/results" --reports-dir "$work/reports")
        if [[ $plan == 1 ]]; then
            plan_cmd "${cmd[@]}"
            return 0
        fi
        local resume=()
        [[ -s $work/results/$id/results.csv ]] && resume=(--resume)
        timeout --signal=INT --kill-after=20 "$(left "$reserve")" "${cmd[@]}" "${resume[@]}" \
            2>&1 | tee -a "$work/logs/$stage-$id.log"
        local rc=${PIPESTATUS[0]}
        logs+=("logs/$stage-$id.log")
        ids+=("$id")
        ended "$rc" "run $id" || return 0
        if [[ $rc != 0 ]]; then  # stopped: report what is there (inside the budget), say so
            if [[ -s $work/results/$id/results.csv ]] &&
                ! timeout --kill-after=5 "$(left 5)" python3 -m attnbench report \
                    "$work/results/$id" --reports-dir "$work/reports" >/dev/null 2>&1; then
                echo "stage $stage: no report for $id within the budget (attnbench report" \
                    "RUN_DIR makes it from the archive)"
            fi
            echo "stage $stage: run $id stopped early (exit $rc); bring its archive to the" \
                "next call to resume it"
        fi
    }
    tests() {  # pytest -m gpu with a -k expression; each test limited to 120 s
        local cmd=(python3 -m pytest -q -m gpu -k "$1" -n 0 -rs -p no:cacheprovider
                   --timeout 120 --junitxml "$work/logs/$stage.xml")
        [[ $plan == 1 ]] && plan_cmd "${cmd[@]}" && return 0
        if [[ $dry != 1 ]] &&
            ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
            echo "stage $stage: no CUDA device; the GPU-marked tests would only skip"
            ended 1 "pytest"
            return 0
        fi
        timeout --signal=INT --kill-after=20 "$(left 20)" "${cmd[@]}" 2>&1 |
            tee "$work/logs/$stage.log"
        local rc=${PIPESTATUS[0]}
        [[ $rc == 5 ]] && echo "stage $stage: no test matched -m gpu -k '$1'"
        ended "$rc" "pytest"
        logs+=("logs/$stage.xml" "logs/$stage.log")
    }
    # a command that is not a sweep: TIMEOUT_SIGNAL LOG COMMAND...
    command_step() {
        local signal=$1 log=$2
        shift 2
        [[ $plan == 1 ]] && plan_cmd "$@" && return 0
        timeout --signal="$signal" --kill-after=20 "$(left 10)" "$@" 2>&1 | tee "$work/$log"
        ended "${PIPESTATUS[0]}" "$(basename "$log" .log)"
        logs+=("$log")
    }
    if [[ $plan == 1 ]]; then
        echo "plan: $stage budget ${stage_budget} s, expected about ${EXPECT_S[$stage]} s"
    else
        echo "stage $stage: budget ${stage_budget} s"
    fi
    case $stage in
    env)
        if [[ $plan == 1 ]]; then
            plan_cmd nvidia-smi --query-gpu=name,driver_version,clocks.sm,... --format=csv
            plan_cmd python3 - "${device[@]}"  # env.json's fields, matmul and copy ceilings
            return 0
        fi
        {
            if command -v nvidia-smi >/dev/null; then
                nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,\
clocks.max.mem,power.draw,power.limit,temperature.gpu,persistence_mode --format=csv
                nvidia-smi -q >"$work/logs/nvidia-smi.txt" 2>&1
                echo "nvidia-smi -q: logs/nvidia-smi.txt"
            else
                echo "nvidia-smi: not on PATH"
            fi
            timeout --kill-after=10 "$(left 10)" python3 - "${device[@]}" <<'PY'
import json, sys, torch
from attnbench.measure import ceilings
from attnbench.run.executing.environment import collect_env
device = "cpu" if "cpu" in sys.argv[1:] else "cuda"
if device == "cuda" and not torch.cuda.is_available():
    sys.exit("stage env: no CUDA device visible to torch; nothing to measure")
env = collect_env(["gpu_check.sh", "env"], 0, device)
dtypes = ["float32"] if device == "cpu" else ["bfloat16", "float16", "float32"]
env["ceilings"] = ceilings.measure(dtypes, device, quick=device == "cpu")
print(json.dumps(env, indent=2))
PY
        } 2>&1 | tee "$work/logs/env.log"
        ended "${PIPESTATUS[0]}" "the environment and ceilings"
        logs+=("logs/env.log")
        [[ -f $work/logs/nvidia-smi.txt ]] && logs+=("logs/nvidia-smi.txt")
        ;;
    tests-triton) tests "triton" ;;
    tests-rest) tests "not triton" ;;
    tests) tests "" ;;
    first-light)
        sweep "first-light-$slug" sweep --preset first-light "${device[@]}" "${tiny[@]}"
        ;;
    fidelity)
        local grid=(--seq-len 4096 --head-dim 64,128 --mode fwd,bwd --causal both --profile all
                    --impls sdpa,sdpa_flash,sdpa_cudnn,triton_flash)
        [[ $dry == 1 ]] && grid=(--impls sdpa,sdpa_flash,sdpa_math --mode fwd,bwd --causal both
                                 --profile all)
        [[ $plan == 1 ]] || rm -rf "$work/results/fidelity-a-$slug" "$work/results/fidelity-b-$slug"
        grid+=(--no-report)  # the fidelity report below is the one this stage is for
        sweep "fidelity-a-$slug" sweep --preset first-light "${device[@]}" "${grid[@]}" "${tiny[@]}"
        sweep "fidelity-b-$slug" sweep --preset first-light "${device[@]}" "${grid[@]}" "${tiny[@]}"
        command_step TERM logs/fidelity.log python3 -m attnbench fidelity \
            "$work/results/fidelity-a-$slug" "$work/results/fidelity-b-$slug" \
            --out "$work/reports/fidelity-$slug"
        logs+=("reports/fidelity-$slug")
        ;;
    race)
        sweep "race-d128-$slug" race "${device[@]}" --head-dim 128 \
            --seq-len 1024,2048,4096,8192,16384 \
            --impls triton_flash,sdpa_flash,sdpa_cudnn,sdpa_efficient "${tiny[@]}"
        ;;
    race-full)
        sweep "race-$slug" race "${device[@]}" "${tiny[@]}"
        ;;
    llama)
        local grid=(--model llama3-8b --phase prefill,decode,train --seq-len-kv 4096,32768,131072
                    --batch 1,32 --impls sdpa,sdpa_flash,sdpa_efficient,sdpa_cudnn,xformers,\
triton_flash,flex,flex_paged,hf_eager,hf_sdpa,hf_flex)
        [[ $dry == 1 ]] && grid=(--model llama3-8b --phase prefill,decode,train --kv-heads 1
                                 --seq-len-kv 64,128 --impls naive,sdpa,flex_paged)
        sweep "llama3-8b-$slug" sweep --preset gpu "${device[@]}" "${tiny[@]}" "${grid[@]}"
        ;;
    full)
        sweep "gpu-$slug" sweep --preset gpu "${device[@]}" "${tiny[@]}"
        ;;
    scaling)  # the seed's question: B fixed, N 512..32k (naive and sdpa_math to their OOM)
        local grid=(--batch 2 --heads 16 --head-dim 128 --seq-len 512,1024,2048,4096,8192,16384,\
32768 --rep-ms 50 --impls naive,sdpa,sdpa_flash,sdpa_efficient,sdpa_cudnn,sdpa_math,\
triton_flash,xformers)
        [[ $dry == 1 ]] && grid=(--impls naive,sdpa --seq-len 16,32,48,64,96,128)
        sweep "scaling-$slug" sweep --preset gpu "${device[@]}" "${tiny[@]}" "${grid[@]}"
        ;;
    launch)
        if [[ $dry == 1 ]]; then
            echo "stage launch: launch_cost.py needs a CUDA GPU; nothing to run in a dry run"
        else
            command_step TERM logs/launch.log python3 benchmarks/launch_cost.py \
                --impls triton_flash,triton_flash_fa2,sdpa_flash,sdpa_cudnn \
                --launch-paths cached,autotuner --seq-len 1024,4096
        fi
        ;;
    lab-fwd | lab-bwd)
        local lab=(--kinds "${stage#lab-}" --out "$work/results/$stage-$slug")
        [[ $dry == 1 ]] && lab+=(--dry-run)
        # the lab writes each row as it goes: it needs seconds, not the reserve, for its table
        command_step INT "logs/$stage.log" python3 benchmarks/kernel_lab.py "${lab[@]}" \
            --budget-s "$(left 20)"
        logs+=("results/$stage-$slug")
        ;;
    esac
    [[ $plan == 1 ]] && return 0
    # pack: one archive per stage, files at the top of OUT (the device brings back 8 files)
    local paths=("${logs[@]}") existing=() p id
    for id in "${ids[@]}"; do paths+=("results/$id" "reports/$id"); done
    for p in "${paths[@]}"; do [[ -e $work/$p ]] && existing+=("$p"); done
    tar czf "$out/$stage.tgz" -C "$work" "${existing[@]}" 2>/dev/null
    echo "stage $stage: packed ${#existing[@]} paths into $out/$stage.tgz in" \
        "$((SECONDS - started)) s"
    return $status
}

# Triton's and inductor's caches, for the next call's machine: whole if they pack small enough,
# else Triton's alone, else not at all (said)
pack_cache() {
    local part mib
    for part in .cache .cache/triton; do
        [[ -n $(find "$work/$part" -type f -print -quit 2>/dev/null) ]] || continue
        tar czf "$out/cache.tgz.part" -C "$work" "$part" 2>/dev/null
        mib=$(($(stat -c %s "$out/cache.tgz.part") / 1048576))
        if ((mib <= CACHE_MAX_MIB)); then
            mv "$out/cache.tgz.part" "$out/cache.tgz"
            echo "cache: $part packed into $out/cache.tgz ($mib MiB)"
            return 0
        fi
        echo "cache: $part packs to $mib MiB, over the $CACHE_MAX_MIB MiB a returned file may hold"
    done
    rm -f "$out/cache.tgz.part"
}

exits=()
expected=0
for i in "${!stages[@]}"; do
    s=${stages[i]}
    later=$(((${#stages[@]} - i - 1) * 60))
    spent=$((SECONDS - call_started))
    [[ $plan == 1 ]] && spent=$expected  # as if each stage before took its expected time
    avail=$((budget - spent - later))
    cap=${CAPS[$s]:-0}
    b=$avail
    ((i + 1 < ${#stages[@]} && cap > 0 && cap < avail)) && b=$cap
    ((b < 30)) && b=30
    if [[ $plan == 1 ]]; then
        run_stage "$s" "$b"
        expected=$((expected + EXPECT_S[$s]))
        continue
    fi
    (run_stage "$s" "$b") 2>&1 | tee "$out/$s.log"
    exits+=("$s=${PIPESTATUS[0]}")
    pack_cache 2>&1 | tee -a "$out/$s.log"
done
if [[ $plan == 1 ]]; then
    echo "plan: ${stages[*]}: expected about $expected s in all, budget $budget s"
    exit 0
fi
echo "gpu_check.sh: ${stages[*]} done in $((SECONDS - call_started)) s; exits: ${exits[*]}"
[[ " ${exits[*]} " != *=[1-9]* ]]
