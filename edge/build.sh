#!/usr/bin/env bash
# Transpile the guest component with jco into edge/gen/ (async instantiation: the
# Worker supplies every import itself, WASI included, and instantiates per call).
# The guest comes from $STOCKADE_GUEST_WASM, or the host build's default output.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
wasm="${STOCKADE_GUEST_WASM:-$root/target/guest/wasm32-wasip2/release/stockade_guest.wasm}"
if [[ ! -f "$wasm" ]]; then
  echo "edge/build.sh: no guest component at $wasm" >&2
  echo "  build it with: cargo build -p stockade-host   (or set STOCKADE_GUEST_WASM)" >&2
  exit 1
fi
jco="$here/node_modules/.bin/jco"
if [[ ! -x "$jco" ]]; then
  echo "edge/build.sh: jco is not installed; run: (cd edge && npm ci)" >&2
  exit 1
fi
rm -rf "$here/gen"
"$jco" transpile "$wasm" --out-dir "$here/gen" --name stockade \
  --instantiation async --no-typescript --quiet
# config.capnp embeds exactly these core modules; fail loudly if the guest's shape changed.
expected="stockade.core.wasm stockade.core2.wasm stockade.core3.wasm"
got="$(cd "$here/gen" && ls -1 *.wasm | sort | tr '\n' ' ' | sed 's/ $//')"
if [[ "$got" != "$expected" ]]; then
  echo "edge/build.sh: jco produced core modules [$got], config.capnp and src/host.js expect [$expected]" >&2
  exit 1
fi
echo "edge/build.sh: transpiled $wasm -> $here/gen"
