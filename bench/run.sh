#!/usr/bin/env bash
# Benchmark oomdoc against pickle.load on large synthetic snapshots.
#
#   bench/run.sh [100k|1m|all]      (default: all)
#
# Generates any missing snapshot into bench/data/ (bench/gen_bench_snapshot.py): per size, `real` (what torch
# writes: a fresh frames list per allocation, frame dicts shared), `real-python` (the same recorded with
# stacks="python", as `oomdoc.record()` does: Python frames only, none for the autograd engine's allocations),
# `real-wrapped` (the same whose ring buffer wrapped: the second half of a run twice as long, so blocks live from
# before the trace and frees of allocations it never saw, as max_entries makes on any long run), `shared` (one
# list per stack: a best case) and `unshared` (every frame dict written afresh: a worst case); for
# 1m also the real trace torch wrote on an H200 (bench/real/, unpacked into bench/data/). Then for each file
# measures, in the same run:
#   oomdoc:  target/release/oomdoc analyze --format json --no-progress FILE > /dev/null   (best of 3)
#   python:  python3 -c 'import pickle,sys; pickle.load(open(sys.argv[1],"rb"))' FILE      (best of 2; 1 for 1M unshared)
# and prints a Markdown table: best wall time, peak RSS (max over the runs), speed-up and RSS ratio.
# Exits non-zero if oomdoc fails on any file.
#
# Environment: OOMDOC_RUNS (3), PY_RUNS (2; 1 for the 1M unshared file), PYTHON (python3).
set -u -o pipefail

cd "$(dirname "$0")/.."
which=${1:-all}
case "$which" in
  100k) sizes=(100k) ;;
  1m) sizes=(1m) ;;
  all) sizes=(100k 1m) ;;
  -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
  *) echo "usage: bench/run.sh [100k|1m|all]" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3}
OOMDOC=target/release/oomdoc
OOMDOC_RUNS=${OOMDOC_RUNS:-3}
DATA=bench/data
mkdir -p "$DATA"

if [ ! -x "$OOMDOC" ]; then
  echo "== $OOMDOC is missing: cargo build --release" >&2
  cargo build --release >&2 || { echo "cargo build failed" >&2; exit 1; }
fi

TIME_BIN=""
if [ -x /usr/bin/time ] && /usr/bin/time -f "%e %M" -o /dev/null true 2>/dev/null; then
  TIME_BIN=/usr/bin/time
fi

entries_of() { case "$1" in 100k) echo 100000 ;; 1m) echo 1000000 ;; esac; }

# generate what is missing
for sz in "${sizes[@]}"; do
  for v in real real-python real-wrapped shared unshared; do
    f="$DATA/snap-$sz-$v.pickle"
    args=(--variant "$v")
    if [ "$v" = real-python ]; then args=(--variant real --stacks python); fi
    if [ "$v" = real-wrapped ]; then args=(--variant real --wrap 0.5); fi
    if [ ! -s "$f" ]; then
      echo "== generating $f" >&2
      "$PYTHON" bench/gen_bench_snapshot.py --entries "$(entries_of "$sz")" "${args[@]}" -o "$f" >&2 \
        || { echo "generation of $f failed" >&2; exit 1; }
    fi
  done
done

# The real trace torch wrote (bench/real/PROVENANCE.md), unpacked with Python's lzma (no xz binary needed).
REAL_TRACE="$DATA/real-h200-llama-1m.pickle"
if [[ " ${sizes[*]} " == *" 1m "* ]] && [ ! -s "$REAL_TRACE" ]; then
  echo "== unpacking $REAL_TRACE" >&2
  "$PYTHON" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    bench/real/h200-llama-1m.pickle.xz "$REAL_TRACE" || { echo "unpacking $REAL_TRACE failed" >&2; exit 1; }
fi

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# measure CMD...: sets M_WALL (seconds, 3 decimals) and M_RSS (KiB); returns the command's status.
# stdout goes to /dev/null, stderr to $TMP/err.
measure() {
  local rc
  : >"$TMP/t"
  if [ -n "$TIME_BIN" ]; then
    local t0 t1
    t0=$(date +%s%N)
    "$TIME_BIN" -f "%e %M" -o "$TMP/t" "$@" >/dev/null 2>"$TMP/err"
    rc=$?
    t1=$(date +%s%N)
    # GNU time prints "Command exited with non-zero status N" before the format line on failure
    M_RSS=$(awk 'END { print $2 }' "$TMP/t")
    M_WALL=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
  else
    "$PYTHON" bench/measure.py -o "$TMP/t" -- "$@" >/dev/null 2>"$TMP/err"
    rc=$?
    M_WALL=$(awk 'END { print $1 }' "$TMP/t")
    M_RSS=$(awk 'END { print $2 }' "$TMP/t")
  fi
  return $rc
}

min() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "" || b + 0 < a + 0) ? b : a }'; }
max() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "" || b + 0 > a + 0) ? b : a }'; }

rows=()
status=0
for sz in "${sizes[@]}"; do
  files=("$DATA/snap-$sz-real.pickle" "$DATA/snap-$sz-real-python.pickle" "$DATA/snap-$sz-real-wrapped.pickle"
    "$DATA/snap-$sz-shared.pickle")
  if [ "$sz" = 1m ]; then files+=("$REAL_TRACE"); fi
  # Last: Python's 8 GB for the 1M unshared file pushes the other files out of the page cache.
  files+=("$DATA/snap-$sz-unshared.pickle")
  for f in "${files[@]}"; do
    bytes=$(stat -c %s "$f")
    o_wall="" o_rss=""
    for ((i = 1; i <= OOMDOC_RUNS; i++)); do
      if ! measure "$OOMDOC" analyze --format json --no-progress "$f"; then
        echo "oomdoc FAILED on $f:" >&2
        cat "$TMP/err" >&2
        exit 1
      fi
      echo "   oomdoc  $f run $i: ${M_WALL}s ${M_RSS} KiB" >&2
      o_wall=$(min "$o_wall" "$M_WALL")
      o_rss=$(max "$o_rss" "$M_RSS")
    done
    if [ "$f" = "$DATA/snap-1m-unshared.pickle" ]; then py_runs=${PY_RUNS:-1}; else py_runs=${PY_RUNS:-2}; fi
    p_wall="" p_rss=""
    for ((i = 1; i <= py_runs; i++)); do
      if ! measure "$PYTHON" -c 'import pickle,sys; pickle.load(open(sys.argv[1],"rb"))' "$f"; then
        echo "pickle.load FAILED on $f:" >&2
        cat "$TMP/err" >&2
        p_wall="" p_rss=""
        status=1
        break
      fi
      echo "   python  $f run $i: ${M_WALL}s ${M_RSS} KiB" >&2
      p_wall=$(min "$p_wall" "$M_WALL")
      p_rss=$(max "$p_rss" "$M_RSS")
    done
    rows+=("$(awk -v f="$(basename "$f")" -v b="$bytes" -v n="$(entries_of "$sz")" \
      -v ow="$o_wall" -v orss="$o_rss" -v pw="$p_wall" -v prss="$p_rss" 'BEGIN {
        sp = (pw != "" && ow > 0) ? sprintf("%.1f×", pw / ow) : "n/a"
        rr = (prss != "" && prss > 0) ? sprintf("%.1f%%", 100 * orss / prss) : "n/a"
        pws = (pw != "") ? sprintf("%.3f", pw) : "fail"
        prs = (prss != "") ? sprintf("%.0f", prss / 1024) : "fail"
        printf "| %s | %.1f | %d | %.3f | %s | %s | %.0f | %s | %s |", f, b / 1e6, n, ow, pws, sp, orss / 1024, prs, rr
      }')")
  done
done

echo
echo "oomdoc $("$OOMDOC" --version 2>/dev/null | awk '{ print $2 }') · $(nproc) CPUs · $(uname -m) · $("$PYTHON" --version 2>&1) · oomdoc best of $OOMDOC_RUNS, python best of ${PY_RUNS:-2 (1 for 1M unshared)} · $(date -u +%Y-%m-%d)"
echo
echo "| file | size MB | entries | oomdoc s | python s | speed-up | oomdoc RSS MB | python RSS MB | RSS ratio |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
exit $status
