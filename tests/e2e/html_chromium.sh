#!/usr/bin/env bash
# The HTML report in a real browser: headless Chromium, with every network route closed, loads the report of a real
# OOM; the DOM shows the verdict and the OOM request; no console error; the screenshot is not blank.
#   tests/e2e/html_chromium.sh BINARY [CHROMIUM]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$1
chromium=${2:-$(command -v chromium || command -v chromium-browser || command -v google-chrome)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" analyze fixtures/real-gpu/leaked-references/snapshot.pickle -o "$dir/report.html"
# No network: a proxy on a closed port, every host unresolvable, Chromium's own background traffic off.
flags=(--headless=new --no-sandbox --disable-gpu --no-first-run --hide-scrollbars --disable-background-networking
       --disable-component-update --disable-sync --disable-default-apps --no-default-browser-check
       --proxy-server=127.0.0.1:9 "--host-resolver-rules=MAP * ~NOTFOUND" --enable-logging=stderr --v=0)
timeout 120 "$chromium" "${flags[@]}" --dump-dom "file://$dir/report.html" > "$dir/dom.html" 2> "$dir/console.txt"
fail() { echo "html e2e: FAILED: $1" >&2; exit 1; }
grep -q 'GPU 0 ran out of memory asking for 16.0 MiB' "$dir/dom.html" || fail "the DOM does not show the verdict"
grep -q 'needed a 16.0 MiB block' "$dir/dom.html" || fail "the DOM does not show the OOM request"
grep -q '<svg class="timeline"' "$dir/dom.html" || fail "no timeline in the DOM"
if grep -E 'CONSOLE|Uncaught|ERR_' "$dir/console.txt" | grep -v -E 'google|gvt1|gstatic' > "$dir/errors.txt"; then
  [ -s "$dir/errors.txt" ] && fail "console errors: $(head -3 "$dir/errors.txt")"
fi
timeout 120 "$chromium" "${flags[@]}" --window-size=1280,1100 --screenshot="$dir/shot.png" "file://$dir/report.html" \
  2> /dev/null
# Not blank: the decoded pixels hold many distinct values (a blank page is one colour).
python3 - "$dir/shot.png" <<'PY' || fail "the screenshot is blank"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat = 8, b""
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    if kind == b"IDAT":
        idat += data[pos + 8:pos + 8 + n]
    pos += 12 + n
raw = zlib.decompress(idat)
distinct = len(set(raw[i:i + 3] for i in range(0, min(len(raw), 4_000_000), 3)))
sys.exit(0 if distinct > 50 else 1)
PY
[ -n "${OOMDOC_SCREENSHOT:-}" ] && cp "$dir/shot.png" "$OOMDOC_SCREENSHOT"
echo "html e2e: ok (no network, verdict and OOM request in the DOM, no console errors, screenshot not blank)"
