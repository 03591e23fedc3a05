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
grep -q 'ran out of memory asking for 16.0 MiB' "$dir/dom.html" || fail "the DOM does not show the verdict"
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

# The page's script at work: the same report with a driver appended that clicks a flame-graph frame, double-clicks
# back, and turns the wheel over the timeline, then writes what it saw into the DOM.
sed 's#</body>#<script>(()=>{const out=[];\
const fl=document.querySelector("svg.flame"),gs=[...fl.querySelectorAll("g[data-a]")];\
const body=gs.find(g=>g.querySelector("text").textContent.startsWith("body (capture/leaked_references.py:18)"));\
body.dispatchEvent(new MouseEvent("click",{bubbles:true}));\
out.push("zoomed-width="+Math.round(+body.querySelector("rect").getAttribute("width")));\
out.push("hidden="+gs.filter(g=>g.style.display==="none").length);\
fl.dispatchEvent(new MouseEvent("dblclick",{bubbles:true}));\
out.push("reset-hidden="+gs.filter(g=>g.style.display==="none").length);\
const tl=document.querySelector("svg.timeline"),r=tl.getBoundingClientRect();\
tl.dispatchEvent(new WheelEvent("wheel",{deltaY:-600,clientX:r.left+r.width*0.75,clientY:r.top+10,bubbles:true,cancelable:true}));\
out.push("transform="+tl.querySelector("g.zoom").getAttribute("transform"));\
out.push("first-event="+tl.querySelector(".ev0").textContent);\
const p=document.createElement("pre");p.id="e2e";p.textContent=out.join(" ");document.body.appendChild(p);})();</script></body>#' \
  "$dir/report.html" > "$dir/driven.html"
timeout 120 "$chromium" "${flags[@]}" --window-size=1280,1100 --dump-dom "file://$dir/driven.html" \
  > "$dir/driven-dom.html" 2> "$dir/driven-console.txt"
seen=$(grep -o '<pre id="e2e">[^<]*' "$dir/driven-dom.html" | sed 's/<pre id="e2e">//')
[ -n "$seen" ] || fail "the driver saw nothing: $(grep -E 'Uncaught|CONSOLE' "$dir/driven-console.txt" | head -2)"
echo "html e2e: driven: $seen"
echo "$seen" | grep -q 'zoomed-width=1199' || fail "a clicked frame does not fill the width"
echo "$seen" | grep -Eq 'hidden=[1-9]' || fail "zooming hid no frame outside the clicked one"
echo "$seen" | grep -q 'reset-hidden=0 ' || fail "double-click did not bring every frame back"
echo "$seen" | grep -Eq 'scale\((1\.[0-9]*[1-9][0-9]*|[2-9][0-9.]*) 1\)' || fail "the wheel did not zoom the timeline"
echo "$seen" | grep -q 'first-event=event 0$' && fail "the axis did not follow the zoom"
if grep -E 'Uncaught|ERR_' "$dir/driven-console.txt" | grep -v -E 'google|gvt1|gstatic' > "$dir/errors.txt"; then
  [ -s "$dir/errors.txt" ] && fail "console errors while driven: $(head -3 "$dir/errors.txt")"
fi
# Two runs on one picture (oomdoc diff -o diff.html): the real fragmentation pair, and two ranks of the real
# four-rank DDP job (rank 0 against rank 2, which ran out) aligned by time. Both series drawn (each polyline with
# its points), both verdicts, no console error, offline.
g=fixtures/real-gpu
for pair in "fragmentation $g/fragmentation/snapshot.pickle $g/fragmentation-expandable/snapshot.pickle event" \
    "ddp-ranks $g/frameworks/ddp-gloo-ranks/snapshot-rank0.pickle.xz $g/frameworks/ddp-gloo-ranks/oom-2.pickle.xz time"; do
  set -- $pair
  "$bin" diff "$2" "$3" --align "$4" -o "$dir/diff-$1.html"
  timeout 120 "$chromium" "${flags[@]}" --dump-dom "file://$dir/diff-$1.html" > "$dir/diff-dom.html" \
    2> "$dir/diff-console.txt"
  for series in before after; do
    n=$(grep -o "<polyline class=\"$series alloc\" points=\"[^\"]*\"" "$dir/diff-dom.html" | tr ' ' '\n' | grep -c ',' || true)
    [ "$n" -ge 10 ] || fail "diff $1: the $series series has $n points"
  done
  grep -q "data-align=\"$4\"" "$dir/diff-dom.html" || fail "diff $1: not aligned by $4"
  [ "$(grep -c '<h3>before</h3>\|<h3>after</h3>' "$dir/diff-dom.html")" -ge 2 ] || fail "diff $1: the two verdicts"
  if grep -E 'CONSOLE|Uncaught|ERR_' "$dir/diff-console.txt" | grep -v -E 'google|gvt1|gstatic' > "$dir/errors.txt"; then
    [ -s "$dir/errors.txt" ] && fail "diff $1: console errors: $(head -3 "$dir/errors.txt")"
  fi
  if [ -n "${OOMDOC_DIFF_SCREENSHOT:-}" ] && [ "$1" = fragmentation ]; then
    timeout 120 "$chromium" "${flags[@]}" --window-size=1280,1400 --screenshot="$OOMDOC_DIFF_SCREENSHOT" \
      "file://$dir/diff-$1.html" 2> /dev/null
  fi
done
echo "html e2e: ok (no network, verdict and OOM request in the DOM, no console errors, screenshot not blank, flame zoom and timeline zoom work; diff.html draws both runs)"
