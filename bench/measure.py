#!/usr/bin/env python3
"""Run a command; write "WALL_SECONDS MAX_RSS_KIB" to -o FILE (like `/usr/bin/time -f "%e %M" -o FILE`).

    python3 bench/measure.py -o out.txt -- CMD [ARG...]

Used by bench/run.sh when /usr/bin/time is missing. The exit status is the command's.
"""
import resource
import subprocess
import sys
import time


def main():
    args = sys.argv[1:]
    if len(args) < 4 or args[0] != "-o" or args[2] != "--":
        sys.exit(__doc__)
    out, cmd = args[1], args[3:]
    t0 = time.perf_counter()
    rc = subprocess.call(cmd)
    wall = time.perf_counter() - t0
    rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    with open(out, "w") as f:
        f.write("%.3f %d\n" % (wall, rss_kib))
    sys.exit(rc if rc >= 0 else 128 - rc)


if __name__ == "__main__":
    main()
