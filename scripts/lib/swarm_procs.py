"""The processes of a local swarm (`murmur swarm`) as the benchmark scripts watch them: found
by their swarm folder and node name, so a script only ever touches the swarm it started."""

import os
import subprocess

TICKS = os.sysconf("SC_CLK_TCK")


def pid_of(folder, node):
    """The pid of this swarm's process for `node`, or None."""
    pattern = f"--swarm={folder} --node={node} "
    out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    return pids[0] if pids else None


def rss_kb(pid):
    """Resident memory of `pid` in kB, or None once it has gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pid):
    """User + system CPU seconds of `pid` so far, or None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name may hold spaces: fields count from after its closing paren.
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return None
