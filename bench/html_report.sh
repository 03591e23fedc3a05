#!/usr/bin/env bash
# The HTML report on the 1M-entry real-shaped bench snapshot: its size (at most 5 MB), the time to write it beside
# the JSON report's, and its structure (the sections, at most 1,200 timeline buckets, a bounded flame graph, one
# inline script, nothing fetched).
#   bench/html_report.sh [BINARY]        (generates bench/data/snap-1m-real.pickle when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/oomdoc}
snap=bench/data/snap-1m-real.pickle
if [ ! -f "$snap" ]; then
  mkdir -p bench/data
  python3 bench/gen_bench_snapshot.py --entries 1000000 --variant real -o "$snap" >&2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
t_json=$( { /usr/bin/time -f %e "$bin" analyze "$snap" -f json --no-progress > "$out/r.json"; } 2>&1 )
# Only the time: oomdoc's own line on stderr ("wrote …") is not part of it.
/usr/bin/time -f %e -o "$out/t_html" "$bin" analyze "$snap" -o "$out/r.html" --no-progress 2>/dev/null
t_html=$(cat "$out/t_html")
size=$(stat -c %s "$out/r.html")
fail() { echo "html bench: FAILED: $1" >&2; exit 1; }
[ "$size" -le 5000000 ] || fail "the page is $size bytes (over 5 MB)"
h=$out/r.html
for want in 'id="verdict"' '<svg class="timeline"' '<svg class="flame"' '<h3>Segments at the moment' \
            '<h3>Largest live allocations</h3>'; do
  grep -q "$want" "$h" || fail "no $want"
done
buckets=$(grep -o '<rect class="hit"' "$h" | wc -l)
frames=$(grep -o '<g class="fl t' "$h" | wc -l)
[ "$buckets" -le 1200 ] || fail "$buckets timeline buckets"
[ "$frames" -le 6000 ] || fail "$frames flame-graph frames"
[ "$(grep -o '<script' "$h" | wc -l)" -eq 1 ] || fail "not exactly one inline script"
grep -Eiq '(src|href)="(https?:)?//' "$h" && fail "a URL that reaches out"
echo "html report of $snap: $size bytes, $buckets timeline buckets, $frames flame-graph frames; $t_html s (JSON: $t_json s)"
