#!/usr/bin/env python3
"""Compare builds of oomdoc on one snapshot, in interleaved runs, beside Python's pickle.load of the same file.

    python3 bench/ab.py FILE ROUNDS BINARY...        e.g. bench/ab.py bench/data/snap-1m-real.pickle 9 /tmp/old target/release/oomdoc

Each round runs every binary once, in a shuffled order, after one uncounted run, then pickle.load. The order
matters on a small machine: the first run after pickle.load (which takes and frees ~500 MB) measured 20% slower
than the next, so a fixed order favours whichever binary comes later. Prints each one's median and best wall
time and its peak RSS.
"""
import os
import random
import statistics
import subprocess
import sys
import time


def run(cmd):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit("failed: %s" % " ".join(cmd))
    return time.perf_counter() - t0, ru.ru_maxrss / 1024


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__.strip().split("\n\n")[1])
    f, rounds, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    cmds = {b: [b, "analyze", f, "--format", "json", "--no-progress"] for b in bins}
    res = {k: [] for k in ["pickle.load"] + bins}
    rng = random.Random(1)
    for _ in range(rounds):
        order = bins[:]
        rng.shuffle(order)
        run(cmds[order[0]])
        for b in order:
            res[b].append(run(cmds[b]))
        res["pickle.load"].append(
            run([sys.executable, "-c", "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))", f]))
    for k, xs in res.items():
        w = sorted(x[0] for x in xs)
        print("%-28s median %.3f s  best %.3f s  peak RSS %.0f MiB" % (k, statistics.median(w), w[0],
                                                                       max(x[1] for x in xs)))


if __name__ == "__main__":
    main()
