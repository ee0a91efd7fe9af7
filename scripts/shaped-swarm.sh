#!/usr/bin/env bash
# Runs a murmur swarm over a shaped link on one machine: the servers live in one network
# namespace, the workers in another, joined by a veth pair whose two ends are rate-limited
# with tc's token bucket (tbf); murmur's own UDP relay, on the workers' side, adds delay and
# loss (netem is not available everywhere). Needs root (ip netns, tc). Everything it creates
# is removed on exit.
#
#   scripts/shaped-swarm.sh [--workers 2] [--servers 1] [--mbit 100] [--rtt-ms 40]
#                           [--loss 0] [--codec topk:0.01] [--target 0.97]
#                           [--congestion tolerant] [--state-link]
#                           [--own-links] [--slow N --slow-mbit 10] [--push-codec C]
#                           [--metrics-dir DIR] [-- more job flags for the servers]
#
# The workers share one link unless --own-links gives each its own: murmur relays, one per
# worker and shard, then shape the rate as well (--mbit each way, per worker). --slow N puts
# the first N workers on --slow-mbit links instead. --push-codec is every worker's (one the
# job allows: its --codec or --push-codecs, given after --; or auto, with --push-budget-ms).
#
# Every node uses --congestion (murmur's default, tolerant, unless given) and grows its QUIC
# windows to the path it measures; --state-link states the link's speed and round trip to
# the nodes instead (--link-mbit, --link-rtt-ms), which fixes the windows.
#
# It prints the test accuracy after each epoch with the seconds since training began (the sum
# of the epochs' times) and, with --target, the time to that test accuracy, stopping the swarm
# once an epoch reaches it (a gpt job, `-- --model gpt`: the validation loss, and --target is
# a loss in nats per byte that a validation reaches at or below); then worker 0's rounds, and
# how much of its communication ran behind its backward passes. --metrics-dir keeps each
# worker's metrics (worker-R.jsonl, for murmur plot).
#
# Example: four workers on 50 Mbit/s links with 80 ms round trips and 0.1% loss:
#   scripts/shaped-swarm.sh --workers 4 --servers 2 --mbit 50 --rtt-ms 80 --loss 0.001
set -euo pipefail

WORKERS=2 SERVERS=1 MBIT=100 RTT_MS=40 LOSS=0 CODEC=topk:0.01 TARGET= CONGESTION= STATE_LINK=
OWN_LINKS= SLOW=0 SLOW_MBIT=10 PUSH_CODEC= METRICS_DIR=
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --workers) WORKERS=$2; shift 2 ;;
        --servers) SERVERS=$2; shift 2 ;;
        --mbit) MBIT=$2; shift 2 ;;
        --rtt-ms) RTT_MS=$2; shift 2 ;;
        --loss) LOSS=$2; shift 2 ;;
        --codec) CODEC=$2; shift 2 ;;
        --target) TARGET=$2; shift 2 ;;
        --congestion) CONGESTION=$2; shift 2 ;;
        --state-link) STATE_LINK=1; shift ;;
        --own-links) OWN_LINKS=1; shift ;;
        --slow) SLOW=$2; OWN_LINKS=1; shift 2 ;;
        --slow-mbit) SLOW_MBIT=$2; shift 2 ;;
        --push-codec) PUSH_CODEC=$2; shift 2 ;;
        --metrics-dir) METRICS_DIR=$2; shift 2 ;;
        --) shift; EXTRA+=("$@"); break ;;
        -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
        *) echo "shaped-swarm: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [[ $(id -u) -ne 0 ]]; then
    echo "shaped-swarm: needs root for network namespaces and tc" >&2
    exit 1
fi
for tool in ip tc; do
    command -v "$tool" >/dev/null || { echo "shaped-swarm: '$tool' is missing (apt-get install iproute2)" >&2; exit 1; }
done

# An mlp job of one epoch unless the job flags say otherwise (a gpt job counts steps).
GPT=
[[ " ${EXTRA[*]} " == *" --model gpt "* ]] && GPT=1
if [[ -z $GPT && " ${EXTRA[*]} " != *" --epochs "* ]]; then
    EXTRA=(--epochs 1 "${EXTRA[@]}")
fi
if [[ -n $METRICS_DIR ]]; then
    mkdir -p "$METRICS_DIR"
    METRICS_DIR=$(cd "$METRICS_DIR" && pwd)
fi
cd "$(dirname "$0")/.."
cargo build --release --quiet
MURMUR=$PWD/target/release/murmur

TAG=mm$$
NS_S=$TAG-servers NS_W=$TAG-workers
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$NS_S" 2>/dev/null || true
    ip netns del "$NS_W" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Two namespaces joined by a veth pair; each end sends at most MBIT.
ip netns add "$NS_S"
ip netns add "$NS_W"
ip link add "$TAG-s" type veth peer name "$TAG-w"
ip link set "$TAG-s" netns "$NS_S"
ip link set "$TAG-w" netns "$NS_W"
ip -n "$NS_S" addr add 10.77.0.1/24 dev "$TAG-s"
ip -n "$NS_W" addr add 10.77.0.2/24 dev "$TAG-w"
for ns in "$NS_S" "$NS_W"; do ip -n "$ns" link set lo up; done
ip -n "$NS_S" link set "$TAG-s" up
ip -n "$NS_W" link set "$TAG-w" up
# Bucket of at least one packet burst; a queue of about one round trip, as a router's.
BURST=$(awk -v m="$MBIT" 'BEGIN { b = int(m * 1e6 / 8 / 250); print (b < 16000 ? 16000 : b) }')
# With links of their own, the workers' relays shape the rate instead.
if [[ -z $OWN_LINKS ]]; then
    for end in "$NS_S:$TAG-s" "$NS_W:$TAG-w"; do
        tc -n "${end%%:*}" qdisc add dev "${end#*:}" root tbf rate "${MBIT}mbit" burst "$BURST" latency "${RTT_MS}ms"
    done
fi

"$MURMUR" swarm init "$WORK/swarm" >/dev/null 2>"$WORK/credentials.log" ||
    { cat "$WORK/credentials.log" >&2; exit 1; }
for ((s = 0; s < SERVERS; s++)); do
    "$MURMUR" swarm issue "$WORK/swarm" "server-$s" --role "server/$s" >/dev/null 2>>"$WORK/credentials.log" ||
        { cat "$WORK/credentials.log" >&2; exit 1; }
done
names=()
for ((r = 0; r < WORKERS; r++)); do names+=("worker-$r"); done
"$MURMUR" swarm issue "$WORK/swarm" "${names[@]}" --role worker >/dev/null 2>>"$WORK/credentials.log" ||
    { cat "$WORK/credentials.log" >&2; exit 1; }

LINK=()
[[ -n $STATE_LINK ]] && LINK+=(--link-mbit "$MBIT" --link-rtt-ms "$RTT_MS")
[[ -n $CONGESTION ]] && LINK+=(--congestion "$CONGESTION")
HALF_RTT=$(awk -v r="$RTT_MS" 'BEGIN { print r / 2 }')
relays=()
for ((s = 0; s < SERVERS; s++)); do
    port=$((7400 + s))
    ip netns exec "$NS_S" "$MURMUR" server --listen "10.77.0.1:$port" --swarm "$WORK/swarm" \
        --node "server-$s" --shard "$s" --shards "$SERVERS" "${LINK[@]}" \
        --workers "$WORKERS" --codec "$CODEC" "${EXTRA[@]}" \
        >"$WORK/server-$s.out" 2>"$WORK/server-$s.log" &
    PIDS+=($!)
    if [[ -z $OWN_LINKS ]]; then
        # The relay sits in the workers' namespace: workers -> relay (delay, loss) -> veth (rate).
        ip netns exec "$NS_W" "$MURMUR" relay --listen "127.0.0.1:$((7500 + s))" \
            --forward "10.77.0.1:$port" --delay-ms "$HALF_RTT" --loss "$LOSS" --report-every 0 \
            >/dev/null 2>"$WORK/relay-$s.log" &
        PIDS+=($!)
        relays+=("127.0.0.1:$((7500 + s))")
        continue
    fi
    # A relay per worker: its own link's rate, delay and loss.
    for ((r = 0; r < WORKERS; r++)); do
        rate=$MBIT
        ((r < SLOW)) && rate=$SLOW_MBIT
        ip netns exec "$NS_W" "$MURMUR" relay --listen "127.0.0.1:$((7600 + r * SERVERS + s))" \
            --forward "10.77.0.1:$port" --delay-ms "$HALF_RTT" --loss "$LOSS" --mbit "$rate" \
            --queue-ms "$RTT_MS" --report-every 0 >/dev/null 2>"$WORK/relay-$r-$s.log" &
        PIDS+=($!)
    done
done
# Servers print a JSON line once they listen.
for ((s = 0; s < SERVERS; s++)); do
    for _ in $(seq 100); do
        [[ -s "$WORK/server-$s.out" ]] && break
        sleep 0.1
    done
    [[ -s "$WORK/server-$s.out" ]] || { echo "shaped-swarm: server $s did not start:" >&2; cat "$WORK/server-$s.log" >&2; exit 1; }
done
sleep 0.2  # the relays bind at once; give them a moment all the same
# Where worker r reaches the shards: the shared relays, or its own.
connect_of() {
    if [[ -z $OWN_LINKS ]]; then (IFS=,; echo "${relays[*]}"); return; fi
    local own=()
    for ((s = 0; s < SERVERS; s++)); do own+=("127.0.0.1:$((7600 + $1 * SERVERS + s))"); done
    (IFS=,; echo "${own[*]}")
}

links="${MBIT} Mbit/s each way"
[[ -n $OWN_LINKS ]] && links="${MBIT} Mbit/s each way per worker"
((SLOW > 0)) && links+=" (the first $SLOW at ${SLOW_MBIT} Mbit/s)"
[[ -n $PUSH_CODEC ]] && links+=", workers pushing $PUSH_CODEC"
echo "shaped-swarm: $WORKERS workers, $SERVERS servers, $links, ${RTT_MS} ms RTT, loss $LOSS, codec $CODEC"
workers=()
for ((r = 0; r < WORKERS; r++)); do
    own=()
    [[ -n $PUSH_CODEC ]] && own+=(--push-codec "$PUSH_CODEC")
    [[ -n $METRICS_DIR ]] && own+=(--metrics "$METRICS_DIR/worker-$r.jsonl")
    ip netns exec "$NS_W" "$MURMUR" worker --connect "$(connect_of "$r")" --swarm "$WORK/swarm" \
        --node "worker-$r" "${LINK[@]}" "${own[@]}" --json \
        >"$WORK/worker-$r.out" 2>"$WORK/worker-$r.log" &
    workers+=($!)
    PIDS+=($!)
done
# The measurements so far, "round value seconds", one line each, in round order: the test
# accuracy after each epoch (mlp jobs) or the validation loss (gpt jobs). A target is reached
# by an accuracy at or above it, a loss at or below it (SIGN).
evaluated() {
    local event=evaluated field=accuracy
    [[ -n $GPT ]] && event=validated field=valid_loss
    { grep -h "\"event\":\"$event\"" "$WORK"/worker-*.out 2>/dev/null || true; } |
        sed -E "s/.*\"step\":([0-9]+).*\"$field\":([0-9.eE+-]+).*\"seconds\":([0-9.eE+-]+).*/\1 \2 \3/" |
        sort -n -k1,1 | awk '!seen[$1]++'
}
SIGN=1
[[ -n $GPT ]] && SIGN=-1
status=0
if [[ -n $TARGET ]]; then
    # With a target, the run stops once an epoch reaches it (the rest would not change the
    # time to it): the workers are stopped as soon as one reports it.
    while :; do
        if evaluated | awk -v t="$TARGET" -v s="$SIGN" 's * $2 >= s * t { hit = 1 } END { exit !hit }'; then
            echo "shaped-swarm: target reached; stopping the swarm"
            break
        fi
        alive=0
        for p in "${workers[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [[ $alive -eq 1 ]] || break
        sleep 0.5
    done
fi
for p in "${workers[@]}"; do
    if [[ -n $TARGET ]] && kill -0 "$p" 2>/dev/null; then
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    else
        wait "$p" || status=1
    fi
done
if [[ $status -ne 0 ]]; then
    echo "shaped-swarm: a worker failed; its log:" >&2
    for ((r = 0; r < WORKERS; r++)); do tail -n 5 "$WORK/worker-$r.log" >&2; done
    exit 1
fi
# Each measurement is made by one rank in turn: its events, in round order, with the running
# sum of the seconds between them.
evaluated | awk -v target="$TARGET" -v s="$SIGN" '
        function shown(v) {
            return s > 0 ? sprintf("%.2f%%", 100 * v) : sprintf("%.3f nats/byte", v)
        }
        {
            t += $3
            printf "shaped-swarm: round %d: %s %s at %.1f s\n", $1,
                (s > 0 ? "test accuracy" : "validation loss"), shown($2), t
            if (target != "" && !hit && s * $2 >= s * target) {
                hit = 1
                printf "shaped-swarm: time to %s: %.1f s (round %d)\n", shown(target), t, $1
            }
        }
        END { if (target != "" && !hit) printf "shaped-swarm: %s not reached\n", shown(target) }'
if [[ -n $TARGET ]]; then
    # The bytes one worker moved (both ways) until the round that reached the target.
    reached=$(evaluated | awk -v t="$TARGET" -v s="$SIGN" 's * $2 >= s * t { print $1; exit }')
    if [[ -n $reached ]]; then
        { grep -h '"event":"step"' "$WORK/worker-0.out" || true; } |
            sed -E 's/.*"step":([0-9]+).*"pushed":([0-9]+),"pulled":([0-9]+).*/\1 \2 \3/' |
            awk -v r="$reached" '$1 <= r { b += $2 + $3 } END {
                printf "shaped-swarm: one worker moved %.1f MB (both ways) by round %d\n", b / 1e6, r }'
    fi
fi
# The push codec each worker took (--push-codec auto chooses by its link).
for ((r = 0; r < WORKERS; r++)); do
    { grep -h '"event":"joined"' "$WORK/worker-$r.out" || true; } | head -n 1 |
        sed -nE "s/.*\"rank\":([0-9]+).*\"codec\":\"([^\"]*)\".*/shaped-swarm: worker-$r (rank \1) pushes \2/p"
done
# How long the rounds took (a round ends for every worker together): worker 0's, median and
# mean.
{ grep -h '"event":"step"' "$WORK/worker-0.out" || true; } |
    sed -E 's/.*"seconds":([0-9.eE+-]+).*/\1/' | sort -g |
    awk '{ v[NR] = $1; sum += $1 } END { if (NR) printf "shaped-swarm: %d rounds, median %.3f s, mean %.3f s\n", NR, v[int((NR + 1) / 2)], sum / NR }'
# Communication behind compute: from each round's first push to its replies, the part that
# ran while the backward pass was still computing (worker 0's rounds).
{ grep -h '"event":"step"' "$WORK/worker-0.out" || true; } |
    sed -nE 's/.*"computing":([0-9.eE+-]+),"communicating":([0-9.eE+-]+),"hidden":([0-9.eE+-]+).*/\1 \2 \3/p' |
    awk '{ compute += $1; comm += $2; hidden += $3 } END { if (NR) printf "shaped-swarm: worker 0 computed %.1f s and communicated %.1f s, %.1f s of it (%.1f%%) behind its backward passes\n", compute, comm, hidden, 100 * hidden / (comm > 0 ? comm : 1) }'
# The servers gave out ranks in the order the workers joined; rank 0's last event is the one
# summary with an accuracy: accuracy, seconds, bytes.
grep -h '"event":"done".*"final_accuracy":[0-9]' "$WORK"/worker-*.out | tail -n 1 || true
