#!/usr/bin/env bash
# Time to accuracy on a shaped link: a swarm trained to a target over scripts/shaped-swarm.sh,
# f32 data parallelism every step against compressed and local-steps configurations, each
# arm stopped once a measurement reaches the target. Two jobs (--model):
#   mlp  the MNIST swarm (4 workers, 2 shards, MLP 784-512-256-10), to a test accuracy
#        measured after each epoch (default target 0.97)
#   gpt  the byte-level GPT on Shakespeare (2 workers, 1 shard, the engine's 4 layers of
#        width 64 over 64-byte contexts, batch 16 a worker), to a validation loss in nats
#        per byte measured every 10 (every step) or 16 (local steps) batches (default target 2.5: reached or below)
# Needs root (network namespaces). For each arm it prints the time to the target (the
# rounds' training seconds added up), the MB one worker moved by then, and how much of
# worker 0's communication ran behind its backward passes; it writes a table (summary.md),
# each arm's log and metrics, and a figure of accuracy or loss and bytes against seconds of
# training (tta.svg, `murmur plot --against seconds`).
#
#   scripts/tta.sh [--model mlp] [--mbit 100] [--rtt-ms 40] [--loss 0] [--target T]
#                  [--arms A,B,...] [--out DIR]
#
# mlp arms (the local-steps arms of docs/results/local-steps.md; default all three):
#   f32       f32 pushes and replies, every step (warm-up 188 rounds)
#   sign-h64  sign codes with error feedback, 64 local steps a round, outer averaging
#   f32-h32   f32, 32 local steps a round, outer Nesterov (0.7, 0.9)
# gpt arms (600 batches of schedule each; default f32, f32-h8, sign-h16):
#   f32       f32 every step
#   topk      top-1% pushes and replies with error feedback, every step
#   f32-h8    f32, 8 local steps a round, outer Nesterov (0.7, 0.9)
#   sign-h8   sign codes with error feedback, 8 local steps a round, outer averaging
#   sign-h16  the same with 16 local steps a round
#
# Examples, the acceptance link of issue 22 (about 15 and 5 minutes, most of it the f32 arm):
#   scripts/tta.sh --mbit 100 --rtt-ms 40 --out /tmp/tta
#   scripts/tta.sh --model gpt --mbit 100 --rtt-ms 40 --out /tmp/tta-gpt
set -euo pipefail

MODEL=mlp MBIT=100 RTT_MS=40 LOSS=0 TARGET= ARMS= OUT=
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL=$2; shift 2 ;;
        --mbit) MBIT=$2; shift 2 ;;
        --rtt-ms) RTT_MS=$2; shift 2 ;;
        --loss) LOSS=$2; shift 2 ;;
        --target) TARGET=$2; shift 2 ;;
        --arms) ARMS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
        *) echo "tta: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$MODEL" in
    mlp)
        WORKERS=4 SERVERS=2 TARGET=${TARGET:-0.97} ARMS=${ARMS:-f32,sign-h64,f32-h32}
        TITLE="MNIST to $TARGET over $MBIT Mbit/s, $RTT_MS ms (4 workers)"
        ;;
    gpt)
        WORKERS=2 SERVERS=1 TARGET=${TARGET:-2.5} ARMS=${ARMS:-f32,f32-h8,sign-h16}
        TITLE="GPT to $TARGET nats/byte over $MBIT Mbit/s, $RTT_MS ms (2 workers)"
        ;;
    *) echo "tta: unknown model $MODEL (mlp or gpt)" >&2; exit 2 ;;
esac
OUT=${OUT:-$(mktemp -d /tmp/tta.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."

MLP=(--batch 64 --epochs 8 --min-compress-bytes 4096 --shares equal --quorum 1)
# A gpt arm of H local steps a round runs 600/H rounds (the same batches and learning-rate
# schedule, its warm-up a tenth of it), validating every E rounds: gpt_rounds H E.
GPT=(--model gpt --dataset shakespeare --batch 16 --min-compress-bytes 4096 --shares equal --quorum 1)
gpt_rounds() { echo "--steps $((600 / $1)) --max-steps $((600 / $1)) --eval-every $2"; }
arm_flags() {
    case "$MODEL/$1" in
        mlp/f32) echo "--codec f32 -- ${MLP[*]} --warmup 188" ;;
        mlp/sign-h64) echo "--codec sign -- ${MLP[*]} --warmup 3 --local-steps 64 --outer-lr 1 --outer-momentum 0" ;;
        mlp/f32-h32) echo "--codec f32 -- ${MLP[*]} --warmup 6 --local-steps 32" ;;
        gpt/f32) echo "--codec f32 -- ${GPT[*]} $(gpt_rounds 1 10)" ;;
        gpt/topk) echo "--codec topk:0.01 -- ${GPT[*]} $(gpt_rounds 1 10)" ;;
        gpt/f32-h8) echo "--codec f32 -- ${GPT[*]} $(gpt_rounds 8 2) --local-steps 8" ;;
        gpt/sign-h8) echo "--codec sign -- ${GPT[*]} $(gpt_rounds 8 2) --local-steps 8 --outer-lr 1 --outer-momentum 0" ;;
        gpt/sign-h16) echo "--codec sign -- ${GPT[*]} $(gpt_rounds 16 1) --local-steps 16 --outer-lr 1 --outer-momentum 0" ;;
        *) echo "tta: unknown $MODEL arm $1 (see --help)" >&2; return 2 ;;
    esac
}

IFS=, read -ra arms <<<"$ARMS"
for arm in "${arms[@]}"; do arm_flags "$arm" >/dev/null; done
{
    echo "$MODEL swarm ($WORKERS workers, $SERVERS shards). Link: $MBIT Mbit/s each way, $RTT_MS ms round trip, loss $LOSS; target $TARGET; $(date -u +%F)"
    echo
    echo "| arm | time to target | round | MB one worker moved | communication behind the backward pass |"
    echo "|---|---:|---:|---:|---:|"
} >"$OUT/summary.md"
files=() labels=()
for arm in "${arms[@]}"; do
    echo "tta: $arm"
    # shellcheck disable=SC2046 # the arm's flags are words
    scripts/shaped-swarm.sh --workers "$WORKERS" --servers "$SERVERS" --mbit "$MBIT" --rtt-ms "$RTT_MS" \
        --loss "$LOSS" --target "$TARGET" --metrics-dir "$OUT/$arm" $(arm_flags "$arm") |
        tee "$OUT/$arm.log"
    cat "$OUT/$arm"/worker-*.jsonl >"$OUT/$arm.jsonl"
    files+=("$OUT/$arm.jsonl")
    labels+=("$arm")
    time=$(sed -nE 's/^shaped-swarm: time to [^:]+: ([0-9.]+) s \(round ([0-9]+)\)/\1 s|\2/p' "$OUT/$arm.log")
    if [[ -z $time ]]; then
        # Not reached: the last measurement instead, "round N: validation loss X ..." or
        # "round N: test accuracy X% ...".
        last=$(sed -nE 's/^shaped-swarm: round ([0-9]+): [a-z ]+ ([0-9.]+%?).*/\2 at round \1/p' "$OUT/$arm.log" | tail -n 1)
        time="not reached (${last:-no measurement})|-"
    fi
    mb=$(sed -nE 's/^shaped-swarm: one worker moved ([0-9.]+) MB.*/\1/p' "$OUT/$arm.log")
    hidden=$(sed -nE 's/.*communicated ([0-9.]+) s, ([0-9.]+) s of it \(([0-9.]+)%\).*/\3% of \1 s/p' "$OUT/$arm.log")
    echo "| $arm | ${time%%|*} | ${time#*|} | ${mb:--} | ${hidden:-?} |" >>"$OUT/summary.md"
done
label_flags=()
for l in "${labels[@]}"; do label_flags+=(--label "$l"); done
target/release/murmur plot "${files[@]}" "${label_flags[@]}" --against seconds \
    --title "$TITLE" --out "$OUT/tta.svg"
cat "$OUT/summary.md"
echo "tta: logs, metrics, summary.md and tta.svg in $OUT"
