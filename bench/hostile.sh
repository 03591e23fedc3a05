#!/usr/bin/env bash
# Time and peak memory of the release binary on the hostile inputs of fuzz/hostile.py (about 1 MiB each):
# each must finish in well under a second in no more than about 64× its size.
#   bench/hostile.sh            # builds the release binary if needed
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 fuzz/hostile.py "$dir"
printf '%-48s %8s %10s %10s  %s\n' input "size" "time" "peak RSS" "outcome"
for f in "$dir"/*; do
  size=$(stat -c %s "$f")
  start=$(date +%s.%N)
  out=$( { /usr/bin/time -f '%M' target/release/oomdoc analyze "$f" --no-progress >/dev/null 2>"$dir/.err"; } 2>&1 || true)
  end=$(date +%s.%N)
  rss_kib=$(tail -n 1 "$dir/.err" | grep -E '^[0-9]+$' || echo "$out")
  outcome=$(head -n 1 "$dir/.err" | grep -q '^oomdoc: error' && echo "refused (exit 2)" || echo "read")
  printf '%-48s %7.2fM %9.3fs %9.1fM  %s\n' "$(basename "$f")" "$(echo "$size/1048576" | bc -l)" \
    "$(echo "$end - $start" | bc -l)" "$(echo "${rss_kib:-0}/1024" | bc -l)" "$outcome"
done
