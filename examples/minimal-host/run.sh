#!/usr/bin/env bash
# The minimal host example: transpile the guest component with the jco edge/ pins, then
# run the conformance scenarios through host.mjs (Node). Prints one line per scenario
# and `N passed, M failed, K skipped`; exits 1 on any failure.
#
# Needs the guest component the Rust build writes (host/runtime/build.rs), or another
# one in $STOCKADE_GUEST_WASM, and jco from `(cd edge && npm ci)`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
wasm="${STOCKADE_GUEST_WASM:-$root/target/guest/wasm32-wasip2/release/stockade_guest.wasm}"
jco="$root/edge/node_modules/.bin/jco"
if [[ ! -f "$wasm" ]]; then
  echo "examples/minimal-host/run.sh: no guest component at $wasm" >&2
  echo "  build it with: cargo build -p stockade-runtime   (or set STOCKADE_GUEST_WASM)" >&2
  exit 1
fi
if [[ ! -x "$jco" ]]; then
  echo "examples/minimal-host/run.sh: no jco at $jco; install it: (cd edge && npm ci)" >&2
  exit 1
fi
command -v node >/dev/null || { echo "examples/minimal-host/run.sh: no node on PATH" >&2; exit 1; }
out="$root/target/minimal-host"
rm -rf "$out"
"$jco" transpile "$wasm" --out-dir "$out" --name stockade --instantiation async --no-typescript --quiet
# jco writes ES modules; Node reads a .js file as one only under "type": "module".
echo '{ "type": "module" }' >"$out/package.json"
exec node "$here/host.mjs" "$out" "$root/tests/scenarios/conformance.json"
