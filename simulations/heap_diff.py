#!/usr/bin/env python3
"""What a mesh member's heap holds after its catch-up that the same member restarted on its data does not:
one member of a mesh of publishers run under heaptrack, its live allocations by call site, twice.

    simulations/heap_diff.py --bin GLIBC_BUILD --populate-bin PATH_TO_DISCOVERY_BENCH \
        [--publishers 10] [--agents 10000] [--settle 45] [--top 25]

GLIBC_BUILD is the daemon built with the system allocator, which heaptrack can follow: `src/main.rs` with
its `#[global_allocator]` attribute removed, `cargo build --release --bin agentmesh`, the binary copied
aside. The agents are split over the publishers as `join_big.py` splits them (one data directory each,
written by the discovery bench's `--populate`), started in turn, all bootstrapping to the first;
`--traced` (the last by default) runs under `heaptrack`. Once every publisher holds every agent `active` and `--settle` seconds have passed (its store
reopened, its workers idle), that process is killed, so that everything it held counts as not freed; it is
then started again on its data directory, under heaptrack again, and killed the same way once it holds
every agent again and the same time has passed. Both recordings are read with `heaptrack_print` (the
bytes not freed, by stack) and compared by call site: a call site is the innermost frames of the stack that
name a source file outside the standard library's and the runtime's plumbing. Prints JSON: both totals,
and the call sites that grew most and shrank most. Needs `heaptrack` (Debian's package) on the PATH.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

from daemon import Daemon, mesh_arguments, populate, wait_full_view

# Frames that say where memory was asked for only in general: allocation, collections, futures, the runtime.
PLUMBING = ("/rustc", "alloc.rs", "boxed.rs", "raw_vec", "vec/mod.rs", "sync.rs", "function.rs",
            "panicking.rs", "panic.rs", "unwind_safe", "future.rs", "harness.rs", "core.rs", "raw.rs",
            "worker.rs", "coop", "instrument.rs", "unsafe_cell", "mod.rs", "spec_", "into_iter", "clone.rs",
            "string.rs", "collect", "map.rs", "iterator.rs")


def kill(binary, data_dir):
    """Kills the daemon on `data_dir` (and the heaptrack process around it) at once: nothing is freed."""
    subprocess.run(["pkill", "-KILL", "-f", f"{binary} run .*--data-dir {data_dir}( |$)"], check=False)


def traced(binary, out, work):
    """A script that runs `binary` under heaptrack, writing to `out`, for `Daemon` to start."""
    path = os.path.join(work, f"heaptrack-{os.path.basename(out)}.sh")
    with open(path, "w") as f:
        # heaptrack's own messages go to stdout: kept out of this script's JSON (the daemon logs to stderr).
        f.write(f'#!/bin/sh\nexec heaptrack -o "{out}" "{binary}" "$@" >/dev/null\n')
    os.chmod(path, 0o755)
    return path


def recording(prefix):
    for suffix in (".zst", ".gz", ""):
        if os.path.exists(prefix + suffix):
            return prefix + suffix
    raise SystemExit(f"no heaptrack recording at {prefix}")


def written(prefix, deadline_s=60):
    """Waits until heaptrack's interpreter, which outlives the process it traced, has written the whole
    recording: its size unchanged for a second."""
    deadline = time.time() + deadline_s
    size = -1
    while time.time() < deadline:
        try:
            now = os.path.getsize(recording(prefix))
        except SystemExit:
            now = -1
        if now == size and now > 0:
            return
        size = now
        time.sleep(1.0)
    raise SystemExit(f"the heaptrack recording at {prefix} was not finished within {deadline_s} s")


def not_freed(prefix, work):
    """Bytes not freed, by stack (heaptrack_print's folded stacks, cost type `leaked`)."""
    folded = os.path.join(work, os.path.basename(prefix) + ".folded")
    subprocess.run(["heaptrack_print", "-f", recording(prefix), "--print-leaks", "0", "--print-peaks", "0",
                    "--print-allocators", "0", "--print-temporary", "0",
                    "--print-flamegraph", folded, "--flamegraph-cost-type", "leaked"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stacks = collections.Counter()
    with open(folded) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if n.isdigit():
                stacks[stack] += int(n)
    return stacks


def call_site(stack, depth=3):
    frames = [f for f in stack.split(";") if "(" in f and not any(p in f for p in PLUMBING)]
    return " | ".join(f[:90] for f in frames[-depth:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mesh_arguments(ap, publishers=10, timeout=400)
    ap.add_argument("--settle", type=float, default=45)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--traced", type=int, default=-1,
                    help="which publisher runs under heaptrack, in their start order (-1: the last)")
    opts = ap.parse_args()
    binary = os.path.abspath(opts.bin)

    work = tempfile.mkdtemp(prefix="agentmesh-heap-")
    dirs = populate(opts.populate_bin, work, opts.agents, opts.publishers)
    daemons = []
    try:
        k = opts.traced % opts.publishers
        result = {"publishers": opts.publishers, "agents": opts.agents, "settle_s": opts.settle, "traced": k}
        addr = None
        for phase in ("caught_up", "restarted"):
            out = os.path.join(work, phase)
            if phase == "caught_up":
                # In their order, the traced one in its turn: an early member holds the view while the
                # later ones join, a late one catches up with a mesh that holds it already.
                for i, d in enumerate(dirs):
                    program = traced(binary, out, work) if i == k else binary
                    daemon = Daemon(program, d, ["--bootstrap", addr] if addr else [])
                    addr = addr or daemon.addr()
                    if i == k:
                        member = daemon
                    else:
                        daemons.append(daemon)
            else:
                member = Daemon(traced(binary, out, work), dirs[k], ["--bootstrap", daemons[0].addr()])
            wait_full_view(daemons + [member], opts.agents, opts.timeout, phase)
            time.sleep(opts.settle)
            kill(binary, dirs[k])
            member.proc.wait()
            written(out)
            result[phase] = out
        before, after = not_freed(result["caught_up"], work), not_freed(result["restarted"], work)
        sites_before, sites_after = collections.Counter(), collections.Counter()
        for stack, n in before.items():
            sites_before[call_site(stack)] += n
        for stack, n in after.items():
            sites_after[call_site(stack)] += n
        diff = sorted(set(sites_before) | set(sites_after), key=lambda s: sites_after[s] - sites_before[s])
        row = lambda s: {"caught_up_mb": round(sites_before[s] / 1e6, 2),
                         "restarted_mb": round(sites_after[s] / 1e6, 2), "site": s}
        result.update({
            "not_freed_mb": {"caught_up": round(sum(before.values()) / 1e6, 2),
                             "restarted": round(sum(after.values()) / 1e6, 2)},
            "held_more_after_the_catch_up": [row(s) for s in diff[:opts.top]],
            "held_more_after_the_restart": [row(s) for s in reversed(diff[-opts.top // 2:])],
        })
        print(json.dumps(result, indent=2))
    finally:
        for d in daemons:
            d.stop()
        kill(binary, dirs[opts.traced % opts.publishers])


if __name__ == "__main__":
    sys.exit(main())
