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

# The deployment's build (gen-jspi/): the same guest with JSPI, every `substrate`
# import async (each is a signed fetch to a node) and every export async; the lists
# come from the WIT (scripts/async-lists.mjs), so a new substrate call cannot be missed.
wit="$root/wit/sandbox.wit"
mapfile -t async_imports < <(node "$here/scripts/async-lists.mjs" imports "$wit")
mapfile -t async_exports < <(node "$here/scripts/async-lists.mjs" exports "$wit")
# A process substitution's failure does not stop the script: an unreadable WIT would
# give empty lists, and jco would then make a build whose imports never suspend.
if [[ ${#async_imports[@]} -eq 0 || ${#async_exports[@]} -eq 0 ]]; then
  echo "edge/build.sh: no async imports or exports listed from $wit" >&2
  exit 1
fi
rm -rf "$here/gen-jspi"
"$jco" transpile "$wasm" --out-dir "$here/gen-jspi" --name stockade \
  --instantiation async --no-typescript --quiet --async-mode jspi \
  --async-imports "${async_imports[@]}" --async-exports "${async_exports[@]}"
got="$(cd "$here/gen-jspi" && ls -1 *.wasm | sort | tr '\n' ' ' | sed 's/ $//')"
if [[ "$got" != "$expected" ]]; then
  echo "edge/build.sh: jco (jspi) produced core modules [$got], deploy-config.mjs expects [$expected]" >&2
  exit 1
fi
# Every substrate import the guest uses must have become a suspending one (the guest
# may leave some of the listed ones unused: the fence's apply-grant, run and kill-all go
# in `batch`), every export a promising one.
n_imports="$(grep -c 'manuallyAsync = true' "$here/gen-jspi/stockade.js" || true)"
n_used="$(sed -nE "s/^const \{([^}]*)\} = imports\['stockade:sandbox\/substrate'\];$/\1/p" "$here/gen-jspi/stockade.js" | tr ',' '\n' | grep -c '[A-Za-z]' || true)"
n_exports="$(grep -cE '^  [A-Za-z0-9]+ = WebAssembly\.promising\(exports1\[' "$here/gen-jspi/stockade.js" || true)"
if [[ "$n_used" -eq 0 || "$n_used" -gt "${#async_imports[@]}" || "$n_imports" != "$n_used" || "$n_exports" != "${#async_exports[@]}" ]]; then
  echo "edge/build.sh: jco made $n_imports async imports of the $n_used substrate imports the guest uses (${#async_imports[@]} listed) and $n_exports async exports of ${#async_exports[@]} listed" >&2
  exit 1
fi
echo "edge/build.sh: transpiled $wasm -> $here/gen-jspi (JSPI: ${#async_imports[@]} async imports, ${#async_exports[@]} async exports)"
# The API's OpenAPI document beside the guest: `/mcp` builds its tools' input schemas
# from it (src/mcp.js), as host/src/mcp/tools.rs does at compile time.
cp "$root/docs/openapi.json" "$here/gen-jspi/openapi.json"
