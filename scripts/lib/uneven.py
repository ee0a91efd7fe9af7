#!/usr/bin/env python3
"""A swarm with one slow worker (issue 20, item 8): a local swarm (`murmur swarm`, one process
per node, loopback) trains the MNIST MLP with four workers, all fast; then with the first
worker three times slower (`--slow-worker 3`), once with shares by speed (the default,
`--shares speed`: shard 0 cuts each round by the samples per second each worker pushed
lately, so the slow worker gets about a third of a batch) and once with equal shares
(`--shares equal`: every round waits for the slow worker, or, where the quorum's wait passes
first, closes without it and gives its share back). Every arm trains the same samples (shard 0
hands out each epoch exactly once), so samples per second compare the arms directly.

The devices are emulated, a simulated clock (`--emulate-device-ms`): every worker computes as a
device that takes that many milliseconds a sample would, the slow one three times as many, each
sleeping for what its real compute leaves. So the round times follow the devices, as on
machines of their own, and not the cores the nodes share here: a sleeping worker frees its core
for the others, but they keep their own devices' pace. A worker whose real compute overruns
its emulated device logs it (counted as `emulation_overruns`; emulate a slower device then).
Prints a table, then the JSON.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

ARMS = {
    "all fast": ([], "speed"),
    "one 3x slow, shares by speed": (["--slow-worker", "3"], "speed"),
    "one 3x slow, equal shares": (["--slow-worker", "3"], "equal"),
    # Late every round: its pushes folded into its error feedback instead of dropped.
    "one 3x slow, equal shares, fold": (["--slow-worker", "3", "--late-pushes", "fold"],
                                        "equal"),
}
# The arms run when none are named (the fold arm is the late-push comparison's, run by name).
DEFAULT_ARMS = ["all fast", "one 3x slow, shares by speed", "one 3x slow, equal shares"]


def overruns(logs):
    """Rounds in which a worker's real compute overran its emulated device, summed over the
    workers: each logs how many at its end ("N of M rounds computed longer than ...")."""
    count = 0
    for name in os.listdir(logs) if os.path.isdir(logs) else []:
        with open(os.path.join(logs, name), errors="replace") as f:
            for line in f:
                m = re.search(r"(\d+) of \d+ rounds computed longer than the emulated device",
                              line)
                count += int(m.group(1)) if m else 0
    return count


def run(a, name):
    extra, shares = ARMS[name]
    folder = tempfile.mkdtemp(prefix="murmur-uneven-")
    metrics = os.path.join(folder, "metrics.jsonl")
    cmd = [a.bin, "swarm", "--dir", folder, "--workers", "4", "--servers", "1",
           "--epochs", str(a.epochs), "--train-limit", str(a.train), "--batch", str(a.batch),
           "--device", "cpu", "--codec", a.codec, "--shares", shares, "--quiet",
           "--metrics", metrics, "--emulate-device-ms", str(a.device_ms)] + extra
    # One thread per worker: the workers share the machine's cores.
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.time() - started
    lines = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
    per_round = defaultdict(list)
    shares = defaultdict(list)
    late = 0
    for l in lines:
        if "bytes_up" in l:
            per_round[l["step"]].append(l.get("step_seconds", 0.0))
            shares[l["rank"]].append(l.get("samples", 0))
            late += bool(l.get("late"))
    # A round lasts as long as its slowest worker's step (each waits for the round's close).
    train_s = sum(max(v) for v in per_round.values())
    outcome = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
    samples = a.epochs * a.train
    result = {
        "arm": name,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "train_s": round(train_s, 1),
        "rounds": len(per_round),
        "samples": samples,
        "samples_per_s": round(samples / train_s, 1) if train_s else None,
        "worker_rounds_late": late,
        # Each rank's mean share a round (the slow worker's is the smallest where the cut
        # follows the speeds).
        "mean_share_by_rank": {r: round(sum(v) / len(v), 1) for r, v in sorted(shares.items())},
        "final_test_accuracy": outcome.get("final_test_accuracy"),
        # Rounds in which a worker's real compute took longer than its emulated device.
        "emulation_overruns": overruns(os.path.join(folder, "logs")),
    }
    if proc.returncode != 0:
        result["stderr_tail"] = proc.stderr.strip().splitlines()[-15:]
    subprocess.run(["rm", "-rf", folder])
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default="target/release/murmur")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train", type=int, default=60000, help="training samples")
    p.add_argument("--batch", type=int, default=256, help="the job's batch per worker")
    p.add_argument("--codec", default="topk:0.1")
    p.add_argument("--device-ms", type=float, default=1.0,
                   help="milliseconds a sample of the emulated fast device")
    p.add_argument("--arms", default=";".join(DEFAULT_ARMS),
                   help="separated by ;, of: " + "; ".join(ARMS))
    a = p.parse_args()
    runs = [run(a, name.strip()) for name in a.arms.split(";")]
    fast = next((r["samples_per_s"] for r in runs if r["arm"] == "all fast"), None)
    print(f"{'arm':32}{'samples/s':>11}{'of fast':>9}{'rounds':>8}{'late':>6}{'accuracy':>10}"
          "  mean share by rank")
    for r in runs:
        ratio = f"{r['samples_per_s'] / fast:.2f}" if fast and r["samples_per_s"] else "-"
        acc = r["final_test_accuracy"]
        print(f"{r['arm']:32}{r['samples_per_s'] or 0:>11.1f}{ratio:>9}{r['rounds']:>8}"
              f"{r['worker_rounds_late']:>6}{(acc or 0) * 100:>9.2f}%  "
              f"{' '.join(str(v) for v in r['mean_share_by_rank'].values())}")
    print(json.dumps(runs))
    if any(r["exit_code"] != 0 for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
