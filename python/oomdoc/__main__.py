"""python -m oomdoc run [OPTIONS] -- SCRIPT [ARGS…] | -m MODULE [ARGS…]   (any other command: the oomdoc binary)"""
import argparse
import os
import runpy
import sys

from . import _binary
from ._capture import parse_interval_ms, record

USAGE = """\
usage: python -m oomdoc run [--out DIR] [--smi INTERVAL] [--max-entries N] [--stacks python|all]
                            [--no-verdict] -- SCRIPT [ARGS…]
       python -m oomdoc run [OPTIONS] -- -m MODULE [ARGS…]
       torchrun [TORCHRUN OPTIONS] -m oomdoc run [OPTIONS] -- SCRIPT [ARGS…]
       python -m oomdoc COMMAND …        (analyze, tui, diff, budget, …: the oomdoc binary)
"""


def _run_parser():
    p = argparse.ArgumentParser(
        prog="python -m oomdoc run",
        description="Runs a Python training script with the allocator's history recorded; at an out-of-memory "
        "error the snapshot is dumped (one per rank) and oomdoc's verdict is printed to stderr.",
        epilog="example: torchrun --nproc-per-node 8 -m oomdoc run --out oom/ --smi 200ms -- train.py --lr 3e-4",
    )
    p.add_argument("--out", default=".", metavar="DIR", help="folder for oom-<rank>.pickle (default: .)")
    p.add_argument("--smi", metavar="INTERVAL", help="also log nvidia-smi every INTERVAL (200ms, 1s) into DIR")
    p.add_argument("--max-entries", type=int, default=100_000, metavar="N", help="events kept (default 100000)")
    p.add_argument("--stacks", choices=["python", "all"], default="python", help="'all' adds C++ frames (slower)")
    p.add_argument("--no-verdict", action="store_true", help="dump the snapshot but do not analyse it")
    return p


def run(argv):
    if "--" in argv:
        cut = argv.index("--")
        options, target = argv[:cut], argv[cut + 1 :]
    else:
        # Without `--`, the options end at the first word that is not one of ours.
        options, target = [], list(argv)
        takes_value = {"--out", "--smi", "--max-entries", "--stacks"}
        while target and target[0].startswith("-") and target[0] != "-m":
            word = target.pop(0)
            options.append(word)
            if word in takes_value and target:
                options.append(target.pop(0))
    parser = _run_parser()
    args = parser.parse_args(options)
    if not target or (target[0] == "-m" and len(target) < 2):
        parser.error("give the script to run after `--` (SCRIPT [ARGS…] or -m MODULE [ARGS…])")
    if args.smi is not None:
        try:
            parse_interval_ms(args.smi)
        except ValueError as e:
            parser.error(f"--smi: {e}")
    recorder = record(
        path="oom-{rank}.pickle" if args.out == "." else os.path.join(args.out, "oom-{rank}.pickle"),
        max_entries=args.max_entries,
        stacks=args.stacks,
        verdict=not args.no_verdict,
        smi=args.smi,
    )
    with recorder:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            script = target[0]
            sys.argv = list(target)
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    if argv[0] == "run":
        return run(argv[1:])
    exe = _binary.binary()
    if exe is None:
        sys.stderr.write("oomdoc: the oomdoc executable was not found (reinstall: pip install --force-reinstall oomdoc)\n")
        return 2
    if os.name == "nt":
        import subprocess

        return subprocess.call([exe, *argv])
    try:
        os.execv(exe, [exe, *argv])
    except OSError as e:
        sys.stderr.write(f"oomdoc: could not run {exe}: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
