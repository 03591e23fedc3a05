#!/usr/bin/env bash
# The Linux aarch64 wheel, cross-built here and run under qemu: maturin with zig as the cross linker builds a
# manylinux2014 aarch64 wheel from this checkout; its binary, run by qemu-aarch64 on a real snapshot, must give
# the same JSON report as the host build. Not in CI (it downloads the aarch64 standard library, zig and qemu);
# run it by hand when the build or its C dependencies change. The release workflow (.github/workflows/wheels.yml)
# builds the published wheels in the manylinux containers instead.
#   tests/e2e/wheel_aarch64.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
work=target/ci-wheel-aarch64
rm -rf "$work" && mkdir -p "$work"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check 'maturin>=1.5,<2' ziglang
rustup target add aarch64-unknown-linux-gnu >/dev/null
command -v qemu-aarch64 >/dev/null || apt-get install -y -qq qemu-user >/dev/null
[ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || apt-get install -y -qq libc6-arm64-cross >/dev/null
PATH="$PWD/$work/venv/bin:$PATH" maturin build --release --locked --quiet --target aarch64-unknown-linux-gnu --zig \
  --compatibility manylinux2014 -o "$work/wheels"
wheel=$(ls "$work"/wheels/oomdoc-*aarch64*.whl)
python3 -m zipfile -e "$wheel" "$work/unpacked"
bin=$(ls "$work"/unpacked/oomdoc-*.data/scripts/oomdoc)
chmod +x "$bin"  # zipfile does not keep the mode
snap=fixtures/real-gpu/leaked-references/snapshot.pickle
a=$(qemu-aarch64 -L /usr/aarch64-linux-gnu "$bin" analyze "$snap" --format json | sha256sum)
b=$(target/release/oomdoc analyze "$snap" --format json | sha256sum)
[ "$a" = "$b" ] || { echo "wheel aarch64: FAILED: the aarch64 binary's report differs from the host's" >&2; exit 1; }
echo "wheel aarch64: ok ($(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB; same report as the host build)"
