#!/usr/bin/env bash
# The CUDA paths that CI (CPU only) never runs, in one go on a machine with NVIDIA GPUs; each
# part's figures go to a file in OUT, and OUT/summary.md lists every part with its command, exit
# status and seconds. Nothing in the test suite needs this script.
#
#   bash scripts/device_check.sh [--out DIR] [--procs N] [--quick]
#
# Parts (each runs even when an earlier one failed; the script exits 1 if any failed):
#   timer        StepTimer with CUDA events against a real training step (benchmarks/timer.py)
#   calibrate    `seqbalance calibrate --device cuda`: the TimeModel of this GPU
#   bench        `seqbalance bench --device cuda` (NCCL, one GPU per process), planned with
#                that TimeModel
#   bench-slow   the same with `--slow-rank 1:1.5`: balanced, balanced_adaptive (the closed
#                loop) and balanced_oracle                                     (needs 2 GPUs)
#   rebalancer   the overlapped Rebalancer on NCCL (benchmarks/rebalance.py)  (needs 2 GPUs)
# With one GPU the last two are listed as skipped in the summary, never left out silently.
#
# Options:
#   --out DIR    where the figures go (default: device_check_out)
#   --procs N    processes = GPUs used (default: every visible GPU, at most 4)
#   --quick      fewer steps and samples (a first look in a few minutes)
# Exit status: 0 all parts passed, 1 a part failed, 2 bad arguments or no CUDA device.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

usage() { sed -n '2,/^set /p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
fail() { echo "device_check.sh: $1" >&2; exit 2; }

out="device_check_out"
procs=""
quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --out) [ $# -ge 2 ] || fail "--out needs a folder"; out="$2"; shift 2 ;;
        --procs)
            [ $# -ge 2 ] || fail "--procs needs a number"
            [[ "$2" =~ ^[1-9][0-9]*$ ]] || fail "--procs must be a positive integer, got '$2'"
            procs="$2"; shift 2 ;;
        --quick) quick=1; shift ;;
        *) fail "unknown argument '$1' (see --help)" ;;
    esac
done

python=${PYTHON:-python}
# One interpreter for both answers: importing torch takes seconds.
found="$("$python" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0, torch.__version__)' 2>/dev/null)" \
    || fail "cannot import torch with '$python' (install seqbalance[torch]; PYTHON= picks the interpreter)"
read -r gpus torch_version <<< "$found"
if [ "$gpus" -lt 1 ]; then
    fail "no CUDA device visible to torch ($torch_version): this script checks the GPU paths and runs only where one is"
fi
if [ -z "$procs" ]; then
    procs=$(( gpus < 4 ? gpus : 4 ))
elif [ "$procs" -gt "$gpus" ]; then
    fail "--procs $procs exceeds the $gpus visible GPU(s): one GPU per process"
fi

steps=20; timer_steps=30; sizes=()
if [ "$quick" = 1 ]; then steps=8; timer_steps=10; sizes=(--quick); fi
mkdir -p "$out" || fail "cannot create --out folder '$out'"
summary="$out/summary.md"
{
    echo "# seqbalance device check"
    echo
    device="$("$python" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")')"
    echo "$device; commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), procs $procs, $(date -u +%FT%TZ)"
    echo
    echo "| part | exit | seconds | output | command |"
    echo "|---|---:|---:|---|---|"
} > "$summary"

failed=0
part() {  # part NAME OUTPUT_FILE COMMAND...
    local name="$1" file="$2" started status
    shift 2
    echo "== $name: $*" >&2
    started=$SECONDS
    "$@" > "$out/$file" 2> "$out/$name.log"
    status=$?
    [ "$status" = 0 ] || { failed=1; echo "   $name failed (exit $status): see $out/$name.log" >&2; }
    echo "| $name | $status | $(( SECONDS - started )) | $file | \`$*\` |" >> "$summary"
}
skip() {  # skip NAME REASON
    echo "== $1: SKIPPED ($2)" >&2
    echo "| $1 | skipped | | | $2 |" >> "$summary"
}

part timer timer.md "$python" benchmarks/timer.py --device cuda --steps "$timer_steps"
part calibrate calibrate.json "$python" -m seqbalance calibrate --device cuda \
    --output "$out/time_model.json" --json
model=()
[ -s "$out/time_model.json" ] && model=(--time-model "$out/time_model.json")
part bench bench.json "$python" -m seqbalance bench --device cuda --procs "$procs" \
    --steps "$steps" "${model[@]}" --json
if [ "$procs" -ge 2 ]; then
    part bench-slow bench_slow.json "$python" -m seqbalance bench --device cuda --procs "$procs" \
        --steps "$steps" "${model[@]}" --slow-rank 1:1.5 \
        --strategies balanced,balanced_adaptive,balanced_oracle --json
    part rebalancer rebalancer.md "$python" benchmarks/rebalance.py --device cuda \
        --world-size "$procs" "${sizes[@]}" --out "$out/rebalancer_section.md"
else
    skip bench-slow "needs 2 GPUs (a slow rank among equals); $gpus visible"
    skip rebalancer "NCCL needs one GPU per rank, 2 ranks at least; $gpus visible"
fi
echo >&2
cat "$summary" >&2
exit "$failed"
