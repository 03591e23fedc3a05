#!/usr/bin/env bash
# Every fixture's report, in every format, from two builds of oomdoc: the refactors and speed work of the
# project must leave them byte-identical.
#   bench/compare_outputs.sh OLD_BINARY [NEW_BINARY]      (NEW: target/release/oomdoc)
# Prints each input whose output differs and exits 1 if any does.
set -u
cd "$(dirname "$0")/.."
old=$1
new=${2:-target/release/oomdoc}
inputs=()
for f in fixtures/real/*.pickle fixtures/generated/*/*.pickle fixtures/real-gpu/*/snapshot.pickle \
         fixtures/real/nvidia-smi/* fixtures/real/ncu/* fixtures/real/logs/*.log fixtures/profilers/*.csv \
         fixtures/profilers/*.txt fixtures/profilers/*.sqlite; do
  [ -f "$f" ] && inputs+=("$f")
done
# the job-level combinations the README shows
inputs+=("fixtures/generated/joint/nccl-with-smi.pickle fixtures/generated/joint/nccl-with-smi.nvidia-smi.csv fixtures/generated/joint/nccl-with-smi.train.log")
for d in fixtures/real-gpu/*/; do
  inputs+=("${d}snapshot.pickle ${d}stderr.log ${d}nvidia-smi.csv")
done
for f in fixtures/generated/verdict/*.nvidia-smi.csv; do
  inputs+=("${f%.nvidia-smi.csv}.pickle $f")
done
n=0; bad=0
for in in "${inputs[@]}"; do
  for fmt in json text markdown; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    a=$("$old" analyze $in --format "$fmt" --color never 2>&1)
    # shellcheck disable=SC2086
    b=$("$new" analyze $in --format "$fmt" --color never 2>&1)
    if [ "$a" != "$b" ]; then
      bad=$((bad + 1))
      echo "differs ($fmt): $in"
    fi
  done
done
echo "$n reports compared, $bad differ"
[ "$bad" -eq 0 ]
