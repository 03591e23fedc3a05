#!/usr/bin/env bash
# The verdict scored on programs it was not tuned on, by both generators, in one run:
#   1. fixtures/gen_scenarios.py: 240 simulated programs per failure class, near misses and healthy controls; each
#      rule's recall and precision on the half it was tuned on and on the half held back;
#   2. fixtures/gen_programs.py: a second generator written apart from the rules (its own allocator model), programs
#      recorded whole, wrapped or late, with stacks all, python or none; the primary cause and the holder.
# Usage: bench/score.sh [N for the second generator, default 160] [SEED, default 1]
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-160}"
seed="${2:-1}"
cargo build --release --quiet
echo "== first generator: fixtures/gen_scenarios.py (cargo test --release --test it scenarios)"
cargo test --release --quiet --test it scenarios -- --nocapture 2>&1 | sed -n '/^rule /,/^test result/p' | grep -v '^test result'
echo
echo "== second generator: fixtures/gen_programs.py --score --n $n --seed $seed"
python3 fixtures/gen_programs.py --score --n "$n" --seed "$seed" --bin target/release/oomdoc
