#!/usr/bin/env python3
"""The churn benchmark (issue 20): a local swarm (`murmur swarm --respawn`) trains the MNIST
MLP once without churn and once while, every 30-60 s (seeded), a worker is killed with SIGKILL
(the swarm starts it again) or frozen with SIGSTOP for 10-20 s, and once, half-way, a server
shard is killed (the swarm restarts it from its state). It kills and freezes only the
processes of the swarm it started (matched by their swarm folder).

Reports, for both runs: final test accuracy, the longest a round stalled (per round, the
fastest live worker's round time, so a frozen worker's own freeze does not count), worker
rounds missed or late (pushed after a shard's quorum closed the round without them), the
resident memory of each shard one minute in and at the end, and the samples each epoch
trained against the epoch's size: shard 0 hands the samples out and counts, per epoch, those
whose push it summed (its log's "epoch N of the job's samples done" lines; the shares of late
or dead workers go back to its queue). Prints a table, then the JSON.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

from swarm_procs import pid_of, rss_kb


def median_mb(kbs):
    """The median of resident-memory samples in kB, in MB (None without samples)."""
    if not kbs:
        return None
    kbs = sorted(kbs)
    return kbs[len(kbs) // 2] / 1024


def run(a, churn):
    folder = tempfile.mkdtemp(prefix="murmur-churn-")
    metrics = os.path.join(folder, "metrics.jsonl")
    cmd = [a.bin, "swarm", "--dir", folder, "--workers", str(a.workers), "--servers",
           str(a.servers), "--epochs", str(a.epochs), "--device", a.device, "--codec", a.codec,
           "--quiet", "--respawn", "--metrics", metrics, "--late-pushes", a.late_pushes]
    # One thread per worker: the workers share the machine's cores.
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    rng = random.Random(a.seed)
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    rss = defaultdict(list)  # shard -> [(seconds, kB)]
    log = []
    frozen = []  # (resume at, pid, worker)
    next_churn = started + rng.uniform(a.every_min, a.every_max)
    churns = 0
    server_killed = False
    last_sample = 0.0
    while proc.poll() is None:
        now = time.time()
        if now - last_sample >= 5:
            last_sample = now
            for shard in range(a.servers):
                pid = pid_of(folder, f"server-{shard}")
                kb = rss_kb(pid) if pid else None
                if kb:
                    rss[shard].append((now - started, kb))
        for item in list(frozen):
            if now >= item[0]:
                os.kill(item[1], signal.SIGCONT)
                frozen.remove(item)
                log.append(f"{now - started:6.1f} s: worker {item[2]} thawed")
        if churn and now >= next_churn:
            churns += 1
            # The third event is the shard's (about half-way through a 10-minute run).
            if churns == 3 and not server_killed:
                shard = rng.randrange(a.servers)
                pid = pid_of(folder, f"server-{shard}")
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    server_killed = True
                    log.append(f"{now - started:6.1f} s: shard {shard} killed")
            else:
                worker = rng.randrange(a.workers)
                pid = pid_of(folder, f"worker-{worker}")
                if pid and rng.random() < 0.5:
                    os.kill(pid, signal.SIGKILL)
                    log.append(f"{now - started:6.1f} s: worker {worker} killed")
                elif pid:
                    pause = rng.uniform(10, 20)
                    os.kill(pid, signal.SIGSTOP)
                    frozen.append((now + pause, pid, worker))
                    log.append(f"{now - started:6.1f} s: worker {worker} frozen for {pause:.0f} s")
            next_churn = now + rng.uniform(a.every_min, a.every_max)
        time.sleep(0.2)
    for _, pid, _ in frozen:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    out, err = proc.communicate()
    seconds = time.time() - started
    lines = [json.loads(l) for l in open(metrics)]
    outcome = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    steps = [l for l in lines if l.get("loss") is not None or "bytes_up" in l]
    per_round = defaultdict(list)
    per_rank = defaultdict(set)
    late = 0
    for l in steps:
        per_round[l["step"]].append(l.get("step_seconds", 0.0))
        per_rank[l["rank"]].add(l["step"])
        # A late push (a shard closed the round on its quorum without it) trained nothing.
        late += bool(l.get("late"))
    # Shard 0's count (its log goes on across its restarts).
    done = re.compile(r"epoch (\d+) of the job's samples done: (\d+) of (\d+) seen, in (\d+) "
                      r"rounds, (\d+) given back")
    per_epoch, given_back = {}, {}
    with open(os.path.join(folder, "logs", "server-0.log"), errors="replace") as f:
        for m in filter(None, map(done.search, f)):
            per_epoch[int(m.group(1))] = int(m.group(2))
            given_back[int(m.group(1))] = int(m.group(5))
    total = max(per_round) if per_round else 0
    stalls = {s: min(v) for s, v in per_round.items()}
    longest = max(stalls.items(), key=lambda kv: kv[1]) if stalls else (0, 0.0)
    missed = sum(total - len(per_rank.get(r, ())) for r in range(a.workers))
    epoch_size = a.train
    # Every worker evaluates the last round: identical replicas give one accuracy.
    last_accuracy = {l["rank"]: l["accuracy"] for l in lines
                     if l.get("accuracy") is not None and l["step"] == total}
    samples = dict(sorted(per_epoch.items()))
    result = {
        "churn": churn,
        "seconds": round(seconds, 1),
        "exit_code": proc.returncode,
        "final_test_accuracy": outcome.get("final_test_accuracy"),
        "last_accuracy_by_rank": last_accuracy,
        "replicas_agree": len(set(last_accuracy.values())) <= 1,
        "rounds": total,
        "longest_stall_s": round(longest[1], 2),
        "longest_stall_round": longest[0],
        "worker_rounds_missed": missed,
        "worker_rounds_late": late,
        "server_rss_mb": {
            shard: {
                "at_1_min": next((kb for t, kb in v if t >= 60), v[0][1]) / 1024,
                "end": v[-1][1] / 1024,
                # Levels: the median of the samples of the second minute and of the last
                # minute. Shard 0's resident memory swings by a snapshot or two (6.4 MB each,
                # one arriving every few seconds) from sample to sample; a level is what a
                # leak would move.
                "second_minute": median_mb([kb for t, kb in v if 60 <= t < 120]),
                "last_minute": median_mb([kb for t, kb in v if t >= v[-1][0] - 60]),
            }
            for shard, v in rss.items() if v
        },
        # Every minute, for seeing a trend rather than two points.
        "server_rss_mb_by_minute": {
            shard: [round(kb / 1024) for t, kb in v if int(t) % 60 < 5]
            for shard, v in rss.items()
        },
        "samples_per_epoch": samples,
        "samples_given_back_per_epoch": dict(sorted(given_back.items())),
        "epoch_size": epoch_size,
        "respawned": outcome.get("respawned"),
        "servers_restarted": outcome.get("servers_restarted"),
        "events": log,
    }
    if proc.returncode != 0:
        result["stderr_tail"] = err.strip().splitlines()[-15:]
    subprocess.run(["rm", "-rf", folder])
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default="target/release/murmur")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=120,
                   help="80 took 6.4 min without churn on a 2-core AMD EPYC; 120 passes 10")
    p.add_argument("--device", default="cpu")
    p.add_argument("--codec", default="topk:0.01")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--every-min", type=float, default=30)
    p.add_argument("--every-max", type=float, default=60)
    p.add_argument("--batch", type=int, default=128, help="the job's batch per worker")
    p.add_argument("--train", type=int, default=60000, help="training samples")
    p.add_argument("--late-pushes", choices=["requeue", "fold"], default="requeue",
                   help="what the workers do with a push that came after its round closed")
    p.add_argument("--arms", choices=["both", "calm", "churn"], default="both",
                   help="both (the benchmark), or one run alone (for a quick look at memory)")
    a = p.parse_args()
    runs = [run(a, arm == "churn") for arm in (["calm", "churn"] if a.arms == "both" else [a.arms])]
    names = ["churn" if r["churn"] else "no churn" for r in runs]
    print(f"{'':28}" + "".join(f"{n:>14}" for n in names))
    for key, label in [("final_test_accuracy", "final test accuracy"), ("seconds", "wall seconds"),
                       ("rounds", "rounds"), ("longest_stall_s", "longest round stall (s)"),
                       ("worker_rounds_missed", "worker rounds missed"),
                       ("worker_rounds_late", "worker rounds late (dropped)"),
                       ("replicas_agree", "replicas agree at the end"),
                       ("respawned", "workers started again"),
                       ("servers_restarted", "shards started again")]:
        print(f"{label:28}" + "".join(f"{str(r[key]):>14}" for r in runs))
    for shard in sorted({s for r in runs for s in r["server_rss_mb"]}):
        for r, name in zip(runs, names):
            m = r["server_rss_mb"].get(shard, {})
            print(f"shard {shard} RSS MB ({name}): "
                  f"{m.get('at_1_min', 0):.0f} at 1 min, {m.get('end', 0):.0f} at the end; "
                  f"median {m.get('second_minute') or 0:.0f} over the second minute, "
                  f"{m.get('last_minute') or 0:.0f} over the last; "
                  f"by minute {r['server_rss_mb_by_minute'].get(shard, [])}")
    for r, name in zip(runs, names):
        counts = set(r["samples_per_epoch"].values())
        exact = counts == {r["epoch_size"]} and len(r["samples_per_epoch"]) == a.epochs
        print(f"samples per epoch ({name}): "
              f"{min(counts, default=0)}..{max(counts, default=0)} of {r['epoch_size']}"
              f" over {len(r['samples_per_epoch'])} epochs"
              f" ({'exact' if exact else 'NOT exact'}), "
              f"{sum(r['samples_given_back_per_epoch'].values())} given back and trained later")
        if r["events"]:
            print("churn events:\n  " + "\n  ".join(r["events"]))
    print(json.dumps(runs))
    if any(r["exit_code"] != 0 for r in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
