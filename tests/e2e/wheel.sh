#!/usr/bin/env bash
# The Python wheel as a user gets it: maturin from the package registry into a venv builds the wheel from this
# checkout (sharing the release build: only the stripped binary is linked again), a fresh venv without torch
# installs it, and the installed entry point and module are checked; then the capture helpers' suite runs against
# the installed package.
#   tests/e2e/wheel.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=$root/target/ci-wheel
rm -rf "$work"
mkdir -p "$work"
fail() { echo "wheel e2e: FAILED: $1" >&2; exit 1; }

if ! python3 -m venv "$work/build" 2>/dev/null; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo -n"
    ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv) >/dev/null 2>&1 || true
  fi
  python3 -m venv "$work/build" || fail "python3 -m venv does not work here (python3-venv missing)"
fi
if ! "$work/build/bin/pip" install -q --disable-pip-version-check 'maturin>=1.5,<2' 2>"$work/pip.log"; then
  # Only an unreachable package registry excuses this check, and it says so loudly.
  echo "ci: WARNING: maturin could not be installed from the package registry: wheel NOT built or tested" >&2
  tail -3 "$work/pip.log" >&2
  exit 0
fi
"$work/build/bin/maturin" build --release --locked --quiet -o "$work/wheels"
wheel=$(ls "$work"/wheels/oomdoc-*.whl)
echo "wheel: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

python3 -m venv "$work/user"
venv=$work/user
"$venv/bin/pip" install -q --disable-pip-version-check --no-index "$wheel"
# From outside the checkout, so nothing but the installed package can be imported.
cd /
"$venv/bin/oomdoc" --version | grep -q '^oomdoc ' || fail "oomdoc --version"
"$venv/bin/oomdoc" analyze "$root/fixtures/real/cs336-kk-fullstep-57gb.pickle" --top 3 > "$work/report.txt" \
  || fail "oomdoc analyze through the installed entry point"
grep -q '^Verdict' "$work/report.txt" || fail "the installed oomdoc printed no verdict"
"$venv/bin/python" - "$venv" <<'PY' || fail "import oomdoc"
import importlib.util, os, sys
assert importlib.util.find_spec("torch") is None, "torch must not be installed in this venv"
import oomdoc
assert "torch" not in sys.modules, "import oomdoc imported torch"
assert os.path.realpath(oomdoc.__file__).startswith(os.path.realpath(sys.argv[1])), oomdoc.__file__
assert os.path.realpath(oomdoc.binary()) == os.path.realpath(os.path.join(sys.argv[1], "bin", "oomdoc")), oomdoc.binary()
print("import oomdoc:", oomdoc.__version__, "binary:", oomdoc.binary())
PY
"$venv/bin/python" -m oomdoc --version | grep -q '^oomdoc ' || fail "python -m oomdoc --version"
# The helpers' suite against the installed package: the stand-in torch from the checkout, the binary found beside
# this Python (no OOMDOC_BIN).
(cd "$root" && env -u OOMDOC_BIN -u RANK -u LOCAL_RANK PYTHONPATH="$root/tests/python/fake_torch" \
  "$venv/bin/python" -m unittest discover -s tests/python -t tests/python) 2> "$work/unittest.log" \
  || { cat "$work/unittest.log" >&2; fail "the capture helpers' suite against the installed wheel"; }
tail -1 "$work/unittest.log"
echo "wheel e2e: ok"
