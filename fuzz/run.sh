#!/usr/bin/env bash
# Builds and runs the fuzz targets with libFuzzer on the stable toolchain (see README.md).
#   fuzz/run.sh build                      build every target
#   fuzz/run.sh smoke SECONDS              run each target for SECONDS on its corpus; any crash fails
#   fuzz/run.sh run TARGET [libFuzzer flags…]   one long campaign (corpus in fuzz/corpus/TARGET)
#   fuzz/run.sh list                       the targets
set -euo pipefail
cd "$(dirname "$0")"
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
# What cargo-fuzz passes (without a sanitizer, which needs nightly): edge and comparison coverage for libFuzzer,
# debug assertions and overflow checks on, so an arithmetic overflow is a crash here rather than a wrong number.
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
BIN="target/$TRIPLE/release"
TARGETS=$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^oomdoc-fuzz$')

seed() { # the seed corpus of a target: fixtures and real artifacts of its kind
  local t=$1 dir=corpus/$1
  mkdir -p "$dir"
  [ -n "$(ls -A "$dir" 2>/dev/null)" ] && return 0
  local src=()
  case $t in
    pickle|snapshot) src=(../fixtures/real/*.pickle ../fixtures/generated/*/*.pickle ../fixtures/real-gpu/*/*.pickle ../fixtures/bad/*.pickle) ;;
    oom_log|vllm_log) src=(../fixtures/real/logs/* ../fixtures/generated/joint/*.log ../fixtures/real-gpu/*/*.log) ;;
    nvidia_smi) src=(../fixtures/real/nvidia-smi/* ../fixtures/generated/joint/*.csv ../fixtures/real-gpu/*/nvidia-smi.csv) ;;
    nsys_csv) src=(../fixtures/profilers/*.csv ../fixtures/profilers/*.txt ../fixtures/real/nsys/*/*.csv) ;;
    nsys_sqlite) src=(../fixtures/profilers/*.sqlite) ;;
    ncu) src=(../fixtures/real/ncu/* ../fixtures/profilers/ncu*) ;;
    rule_file) src=(../rules/*.toml ../fixtures/user-rules/*.toml) ;;
    when_expr) for f in ../rules/*.toml; do
                 python3 -c 'import sys,tomllib
d=tomllib.load(open(sys.argv[1],"rb"))
for i,c in enumerate(d.get("case",[d])):
  w=c.get("when")
  if w: open(sys.argv[2]+"/"+d["id"]+str(i),"w").write(w)' "$f" "$dir"
               done ;;
    categories) src=(../rules/categories.toml ../fixtures/user-rules/categories.toml) ;;
    budget_config) src=(../fixtures/models/*.json) ;;
    job) src=(../fixtures/generated/joint/*.csv ../fixtures/generated/joint/*.log ../fixtures/real/nvidia-smi/*.txt ../fixtures/profilers/*.csv ../fixtures/real/ncu/*) ;;
  esac
  case $t in pickle|snapshot) python3 seeds.py "$dir" ;; archive) python3 seeds.py --archives "$dir" ;; esac
  local i=0
  for f in "${src[@]}"; do
    [ -f "$f" ] || continue
    if [ "$t" = nsys_csv ] || [ "$t" = job ]; then
      { printf '\x0%d' $((i % 6)); cat "$f"; } > "$dir/seed$i"
    else
      cp "$f" "$dir/seed$i"
    fi
    i=$((i + 1))
  done
}

# Longest input tried: 16 KiB, but 64 KiB for SQLite databases, whose real seeds are 40–64 KiB (cut short, a
# database is malformed at its header and the reader's deeper paths are never reached).
max_len() { case $1 in nsys_sqlite) echo "${MAX_LEN:-65536}" ;; *) echo "${MAX_LEN:-16384}" ;; esac; }

case ${1:-} in
  build) cargo build --release --locked --target "$TRIPLE" ;;
  list) echo "$TARGETS" ;;
  smoke)
    secs=${2:-20}
    cargo build --release --locked --target "$TRIPLE"
    for t in $TARGETS; do
      seed "$t"
      mkdir -p "artifacts/$t"
      echo "fuzz: $t for ${secs}s"
      "$BIN/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len "$t")" \
        -artifact_prefix="artifacts/$t/" -print_final_stats=1 "corpus/$t" 2>&1 | grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ *DONE)|^==[0-9]+== ERROR|panicked at|^SUMMARY' || true
      if [ -n "$(ls -A "artifacts/$t" 2>/dev/null)" ]; then
        echo "fuzz: $t found a crash: $(ls "artifacts/$t")" >&2
        exit 1
      fi
    done ;;
  run)
    t=$2; shift 2
    seed "$t"
    mkdir -p "artifacts/$t"
    exec "$BIN/$t" -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len "$t")" -artifact_prefix="artifacts/$t/" "$@" "corpus/$t" ;;
  *) sed -n '2,7p' "$0"; exit 2 ;;
esac
