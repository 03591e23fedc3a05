#!/usr/bin/env bash
# Every fixture's report, in every format: the refactors and speed work of the project must leave them
# byte-identical.
#   bench/compare_outputs.sh OLD_BINARY [NEW_BINARY]   two builds against each other (NEW: target/release/oomdoc)
#   bench/compare_outputs.sh --check [BINARY]          against bench/expected-outputs.sha256 (CI runs this)
#   bench/compare_outputs.sh --update [BINARY]         rewrites that file: a change that means to change reports
#                                                      updates it, and the commit's diff of it names each report
#                                                      that changed (its message says why)
# Prints each input whose output differs and exits 1 if any does.
set -u
cd "$(dirname "$0")/.."
expected=bench/expected-outputs.sha256
mode=pair
case "${1:-}" in
  --check) mode=check; shift ;;
  --update) mode=update; shift ;;
esac
if [ "$mode" = pair ]; then
  old=${1:?usage: bench/compare_outputs.sh OLD_BINARY [NEW_BINARY] | --check [BINARY] | --update [BINARY]}
  new=${2:-target/release/oomdoc}
else
  new=${1:-target/release/oomdoc}
fi
inputs=()
for f in fixtures/real/*.pickle fixtures/generated/*/*.pickle fixtures/real-gpu/*/snapshot.pickle \
         fixtures/real/nvidia-smi/* fixtures/real/ncu/* fixtures/real/logs/*.log fixtures/profilers/*.csv \
         fixtures/profilers/*.txt fixtures/profilers/*.sqlite; do
  [ -f "$f" ] && inputs+=("$f")
done
# the job-level combinations the README shows
inputs+=("fixtures/generated/joint/nccl-with-smi.pickle fixtures/generated/joint/nccl-with-smi.nvidia-smi.csv fixtures/generated/joint/nccl-with-smi.train.log")
for d in fixtures/real-gpu/*/; do
  case "$d" in */frameworks/) continue ;; esac
  if [ -f "${d}snapshot.pickle" ]; then
    inputs+=("${d}snapshot.pickle ${d}stderr.log ${d}nvidia-smi.csv")
  else
    inputs+=("$d")  # captured by oomdoc's helpers: oom-0.pickle and its log, read as the folder
  fi
done
# the framework corpus, each folder as the job left it (the DDP ones are jobs of four ranks)
for d in fixtures/real-gpu/frameworks/*/; do
  inputs+=("$d")
done
for f in fixtures/generated/verdict/*.nvidia-smi.csv; do
  inputs+=("${f%.nvidia-smi.csv}.pickle $f")
done
n=0; bad=0
digests=$(mktemp)
trap 'rm -f "$digests"' EXIT
for in in "${inputs[@]}"; do
  for fmt in json text markdown; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    b=$("$new" analyze $in --format "$fmt" --color never 2>&1)
    if [ "$mode" = pair ]; then
      # shellcheck disable=SC2086
      a=$("$old" analyze $in --format "$fmt" --color never 2>&1)
      if [ "$a" != "$b" ]; then
        bad=$((bad + 1))
        echo "differs ($fmt): $in"
      fi
    else
      printf '%s  %s %s\n' "$(printf '%s' "$b" | sha256sum | cut -c1-64)" "$fmt" "$in" >> "$digests"
    fi
  done
done
case "$mode" in
  update)
    cp "$digests" "$expected"
    echo "$n reports written to $expected"
    ;;
  check)
    if ! diff -q "$expected" "$digests" >/dev/null; then
      diff "$expected" "$digests" | grep '^>' | awk '{ sub(/^> [0-9a-f]+  /, ""); f = $1; sub(/^[a-z]+ /, ""); print "differs (" f "): " $0 }' | head -50
      bad=$(diff "$expected" "$digests" | grep -c '^>')
      [ "$bad" -le 50 ] || echo "… and $((bad - 50)) more (diff the file --update writes with git diff to see them all)"
    fi
    echo "$n reports compared with $expected, $bad differ"
    [ "$bad" -eq 0 ] || echo "a change meant to change these: bench/compare_outputs.sh --update, and say why" >&2
    ;;
  pair) echo "$n reports compared, $bad differ" ;;
esac
[ "$bad" -eq 0 ]
