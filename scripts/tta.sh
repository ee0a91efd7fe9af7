#!/usr/bin/env bash
# Time to accuracy on a shaped link: the MNIST swarm (4 workers, 2 shards, MLP 784-512-256-10)
# trained to a test-accuracy target over scripts/shaped-swarm.sh, f32 data parallelism every
# step against the best configurations with local steps, each arm stopped once an epoch
# reaches the target. Needs root (network namespaces). For each arm it prints the time to the
# target (the epochs' training seconds added up), the MB one worker moved by then, and how
# much of worker 0's communication ran behind its backward passes; it writes a table
# (summary.md), each arm's log and metrics, and a figure of accuracy and bytes against
# seconds of training (tta.svg, `murmur plot --against seconds`).
#
#   scripts/tta.sh [--mbit 100] [--rtt-ms 40] [--loss 0] [--target 0.97]
#                  [--arms f32,sign-h64,f32-h32] [--out DIR]
#
# Arms (the local-steps arms of docs/results/local-steps.md):
#   f32       f32 pushes and replies, every step (warm-up 188 rounds)
#   sign-h64  sign codes with error feedback, 64 local steps a round, outer averaging
#   f32-h32   f32, 32 local steps a round, outer Nesterov (0.7, 0.9)
#
# Example, the acceptance link of issue 22 (about 15 minutes, most of it the f32 arm):
#   scripts/tta.sh --mbit 100 --rtt-ms 40 --out /tmp/tta
set -euo pipefail

MBIT=100 RTT_MS=40 LOSS=0 TARGET=0.97 ARMS=f32,sign-h64,f32-h32 OUT=
while [[ $# -gt 0 ]]; do
    case "$1" in
        --mbit) MBIT=$2; shift 2 ;;
        --rtt-ms) RTT_MS=$2; shift 2 ;;
        --loss) LOSS=$2; shift 2 ;;
        --target) TARGET=$2; shift 2 ;;
        --arms) ARMS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "tta: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-$(mktemp -d /tmp/tta.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."

COMMON=(--batch 64 --epochs 8 --min-compress-bytes 4096 --shares equal --quorum 1)
arm_flags() {
    case "$1" in
        f32) echo "--codec f32 -- ${COMMON[*]} --warmup 188" ;;
        sign-h64) echo "--codec sign -- ${COMMON[*]} --warmup 3 --local-steps 64 --outer-lr 1 --outer-momentum 0" ;;
        f32-h32) echo "--codec f32 -- ${COMMON[*]} --warmup 6 --local-steps 32" ;;
        *) echo "tta: unknown arm $1 (f32, sign-h64, f32-h32)" >&2; return 2 ;;
    esac
}

IFS=, read -ra arms <<<"$ARMS"
for arm in "${arms[@]}"; do arm_flags "$arm" >/dev/null; done
{
    echo "Link: $MBIT Mbit/s each way, $RTT_MS ms round trip, loss $LOSS; target $TARGET; $(date -u +%F)"
    echo
    echo "| arm | time to target | round | MB one worker moved | communication behind the backward pass |"
    echo "|---|---:|---:|---:|---:|"
} >"$OUT/summary.md"
files=() labels=()
for arm in "${arms[@]}"; do
    echo "tta: $arm"
    # shellcheck disable=SC2046 # the arm's flags are words
    scripts/shaped-swarm.sh --workers 4 --servers 2 --mbit "$MBIT" --rtt-ms "$RTT_MS" \
        --loss "$LOSS" --target "$TARGET" --metrics-dir "$OUT/$arm" $(arm_flags "$arm") |
        tee "$OUT/$arm.log"
    cat "$OUT/$arm"/worker-*.jsonl >"$OUT/$arm.jsonl"
    files+=("$OUT/$arm.jsonl")
    labels+=("$arm")
    time=$(sed -nE 's/^shaped-swarm: time to [0-9.]+%: ([0-9.]+) s \(round ([0-9]+)\)/\1 s|\2/p' "$OUT/$arm.log")
    [[ -n $time ]] || time="not reached|-"
    mb=$(sed -nE 's/^shaped-swarm: one worker moved ([0-9.]+) MB.*/\1/p' "$OUT/$arm.log")
    hidden=$(sed -nE 's/.*communicated ([0-9.]+) s, ([0-9.]+) s of it \(([0-9.]+)%\).*/\3% of \1 s/p' "$OUT/$arm.log")
    echo "| $arm | ${time%%|*} | ${time#*|} | ${mb:-?} | ${hidden:-?} |" >>"$OUT/summary.md"
done
label_flags=()
for l in "${labels[@]}"; do label_flags+=(--label "$l"); done
target/release/murmur plot "${files[@]}" "${label_flags[@]}" --against seconds \
    --title "MNIST to $TARGET over $MBIT Mbit/s, $RTT_MS ms (4 workers)" --out "$OUT/tta.svg"
cat "$OUT/summary.md"
echo "tta: logs, metrics, summary.md and tta.svg in $OUT"
