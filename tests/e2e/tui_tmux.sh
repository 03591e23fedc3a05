#!/usr/bin/env bash
# Drives the real `oomdoc tui` binary in tmux and checks what the screen shows:
# open an OOM fixture, jump to the OOM, filter, open a stack, look at segments and findings, quit.
# Usage: tests/e2e/tui_tmux.sh [path/to/oomdoc]   (default: target/release/oomdoc)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-target/release/oomdoc}
FIXTURE=fixtures/generated/rules/fragmentation-fire.pickle
SESSION=oomdoc-e2e-$$
export TMUX_TMPDIR=$(mktemp -d)
trap 'tmux kill-server 2>/dev/null || true; rm -rf "$TMUX_TMPDIR"' EXIT

fail() {
  echo "tui e2e: FAIL: $1" >&2
  echo "---- screen ----" >&2
  tmux capture-pane -p -t "$SESSION" >&2 || true
  exit 1
}
screen() { tmux capture-pane -p -t "$SESSION"; }
# Waits until the screen contains $1 (a fixed string), up to 5 s.
expect() {
  for _ in $(seq 50); do
    if screen | grep -qF -- "$1"; then return 0; fi
    sleep 0.1
  done
  fail "expected to see: $1"
}
expect_not() {
  sleep 0.3
  if screen | grep -qF -- "$1"; then fail "did not expect to see: $1"; fi
}
keys() { tmux send-keys -t "$SESSION" "$@"; }

tmux new-session -d -s "$SESSION" -x 120 -y 36 "$BIN tui $FIXTURE; echo oomdoc-exited-\$?; sleep 5"

# 1. It opens at the OOM, with the finding announced.
expect "event 173/173: OOM 300 MiB"
expect "1 finding (Tab)"
expect "live allocations (59)"

# 2. Go to the start, then jump back to the OOM with o.
keys Home
expect "event 1/173"
keys o
expect "event 173/173: OOM 300 MiB"

# 3. Filter by a function name in the stack.
keys /
expect "filter:"
keys -l build_model
keys Enter
expect "filter: build_model"
expect "live allocations (16)"
expect_not "in forward"

# 4. Open the stack of the selected allocation: every frame, the user's bold, library frames dim.
keys Down Enter
expect "jobs/evaluate.py:170 in build_model"
expect "modules/module.py:1341 in convert"

# 5. Segments: the map and the request that did not fit.
keys Escape Tab
expect "segments at the cursor (35)"
expect "OOM: a request for 300 MiB could not be placed"
expect "largest free block 248 MiB · too small"

# 6. Findings with evidence and the fix.
keys Tab
expect "Fragmentation: the free memory was there"
expect "expandable_segments:True"

# 7. Help, then quit; the process exits 0 and the terminal is restored.
keys '?'
expect "jump to the OOM"
keys Escape
keys q
expect "oomdoc-exited-0"

# 8. Two runs: `oomdoc tui A B` opens on their difference; D shows the open run, r the other; q quits.
tmux kill-session -t "$SESSION" 2>/dev/null || true
A=fixtures/real-gpu/fragmentation/snapshot.pickle
B=fixtures/real-gpu/fragmentation-expandable/snapshot.pickle
tmux new-session -d -s "$SESSION" -x 120 -y 36 "$BIN tui $A $B; echo oomdoc-exited-\$?; sleep 5"
expect "difference of the two runs"
expect "The OOM is gone."
expect "resolved  fragmentation"
keys D
expect_not "difference of the two runs"
expect "rank 0"
keys q
expect "oomdoc-exited-0"
echo "tui e2e: ok (opened at the OOM, jumped, filtered, opened a stack, segments, findings, help, quit; two runs open on their difference)"
