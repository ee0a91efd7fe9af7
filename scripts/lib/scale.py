#!/usr/bin/env python3
"""How a swarm's costs grow with its size (issue 20, item 10): for N workers (2 to 32 by
default) a local swarm (`murmur swarm`, one process per node, loopback) runs the same job for
a fixed number of rounds, and this reports, per N: each worker's payload bytes per round
pushed and pulled, the shards' CPU time per round (user + system, from /proc), and the round
time.

On a machine with fewer cores than workers the workers' own computing is shared out, so the
round time grows with N for that reason alone: it is reported beside the shards' CPU time per
round, which is the part a real swarm (one machine per worker) pays on its servers. Prints a
table, then the JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

from swarm_procs import cpu_seconds, pid_of

def run(a, workers, rounds):
    folder = tempfile.mkdtemp(prefix="murmur-scale-")
    metrics = os.path.join(folder, "metrics.jsonl")
    cmd = [a.bin, "swarm", "--dir", folder, "--workers", str(workers), "--servers",
           str(a.servers), "--epochs", "1000", "--max-steps", str(rounds), "--device", "cpu",
           "--codec", a.codec, "--batch", str(a.batch), "--quiet", "--metrics", metrics]
    # One thread per worker: the workers share the machine's cores.
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    server_cpu = {}  # pid -> the last CPU seconds seen
    while proc.poll() is None:
        for pid in filter(None, (pid_of(folder, f"server-{s}") for s in range(a.servers))):
            seconds = cpu_seconds(pid)
            if seconds is not None:
                server_cpu[pid] = seconds
        time.sleep(0.25)
    out, err = proc.communicate()
    wall = time.time() - started
    lines = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
    steps = [l for l in lines if "bytes_up" in l]
    per_round = defaultdict(list)
    for l in steps:
        per_round[l["step"]].append(l.get("step_seconds", 0.0))
    rounds = max(per_round, default=0)
    # A round takes as long as its slowest worker; the first rounds include start-up.
    settled = [max(v) for s, v in per_round.items() if s > min(10, rounds // 2)]
    result = {
        "workers": workers,
        "servers": a.servers,
        "rounds": rounds,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "push_bytes_per_worker_round": round(statistics.mean(l["bytes_up"] for l in steps))
        if steps else None,
        "pull_bytes_per_worker_round": round(statistics.mean(l["bytes_down"] for l in steps))
        if steps else None,
        "server_cpu_s": sum(server_cpu.values()),
        "round_s_median": round(statistics.median(settled), 4) if settled else None,
    }
    if proc.returncode != 0:
        result["stderr_tail"] = err.strip().splitlines()[-15:]
    subprocess.run(["rm", "-rf", folder])
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default="target/release/murmur")
    p.add_argument("--workers", default="2,4,8,16,32", help="the swarm sizes, comma separated")
    p.add_argument("--servers", type=int, default=1, help="shards")
    p.add_argument("--rounds", default="50,250",
                   help="two run lengths: the shards' CPU per round is the difference of their "
                   "CPU time over the difference of rounds, which leaves start-up out")
    p.add_argument("--codec", default="topk:0.01")
    p.add_argument("--batch", type=int, default=128, help="the job's batch per worker")
    a = p.parse_args()
    short, long = (int(r) for r in a.rounds.split(","))
    runs = []
    for n in (int(w) for w in a.workers.split(",")):
        first, second = run(a, n, short), run(a, n, long)
        second["start_up_run"] = first
        per_round = (second["server_cpu_s"] - first["server_cpu_s"]) / max(long - short, 1)
        second["server_cpu_ms_per_round"] = round(1000 * per_round, 2)
        second["exit_code"] = first["exit_code"] or second["exit_code"]
        runs.append(second)
        print(f"N={n}: {second}", file=sys.stderr, flush=True)
    head = ["workers", "push B/round", "pull B/round", "shard CPU ms/round", "round s"]
    print("".join(f"{h:>20}" for h in head))
    for r in runs:
        row = [r["workers"], r["push_bytes_per_worker_round"], r["pull_bytes_per_worker_round"],
               r["server_cpu_ms_per_round"], r["round_s_median"]]
        print("".join(f"{str(v):>20}" for v in row))
    print(json.dumps(runs))
    if any(r["exit_code"] != 0 for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
