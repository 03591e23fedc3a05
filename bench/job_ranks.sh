#!/usr/bin/env bash
# A job of many ranks: time and peak RSS of `oomdoc analyze` over 1, 100 and 1,000 rank files against one file's.
#   bench/job_ranks.sh [BINARY] [SNAPSHOT]
# The ranks are links to one real 3 MB snapshot (fixtures/real/cs336-kk-fullstep-57gb.pickle by default), named
# rank0.pickle … rankN.pickle, so the files come from the page cache as a node's local disk would give them.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/oomdoc}
snap=$(realpath "${2:-fixtures/real/cs336-kk-fullstep-57gb.pickle}")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 0 999); do ln -s "$snap" "$dir/rank$i.pickle"; done
cores=$(nproc)
measure() { # ranks format -> "seconds kilobytes" (best of 3 for time, its RSS)
  local n=$1 fmt=$2 best="" rss=""
  local files=()
  for i in $(seq 0 $((n - 1))); do files+=("$dir/rank$i.pickle"); done
  for _ in 1 2 3; do
    /usr/bin/time -f "%e %M" -o "$dir/t" "$bin" analyze --no-progress --format "$fmt" "${files[@]}" > /dev/null || true
    read -r t m < "$dir/t"
    if [ -z "$best" ] || awk "BEGIN{exit !($t < $best)}"; then best=$t; rss=$m; fi
  done
  echo "$best $rss"
}
echo "| ranks | format | time | peak RSS | 'ranks × one file ÷ $cores cores' | time / that |"
echo "|---:|---|---:|---:|---:|---:|"
single() { # one file's time: the mean of 20 runs (finer than /usr/bin/time's 10 ms)
  local s e
  s=$(date +%s.%N)
  for _ in $(seq 20); do "$bin" analyze --no-progress --format "$1" "$dir/rank0.pickle" > /dev/null || true; done
  e=$(date +%s.%N)
  awk "BEGIN{printf \"%.3f\", ($e - $s) / 20}"
}
for fmt in text json; do
  read -r _ m1 < <(measure 1 "$fmt")
  t1=$(single "$fmt")
  for n in 1 100 1000; do
    if [ "$n" = 1 ]; then t=$t1; m=$m1; else read -r t m < <(measure "$n" "$fmt"); fi
    ideal=$(awk "BEGIN{printf \"%.3f\", $n * $t1 / ($n > 1 ? $cores : 1)}")
    echo "| $n | $fmt | ${t} s | $((m / 1024)) MB | ${ideal} s | $(awk "BEGIN{printf \"%.2f\", $t / $ideal}") |"
  done
done
