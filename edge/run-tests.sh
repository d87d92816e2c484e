#!/usr/bin/env bash
# The edge suite from a fresh clone, after the Rust build produced the guest
# (target/guest/wasm32-wasip2/release/stockade_guest.wasm, or $STOCKADE_GUEST_WASM):
# install the pinned npm packages, transpile the guest with jco (plain and JSPI), run
# the unit tests, the conformance scenarios in workerd, and the deployment's tests
# (workerd with the deploy config over `stockade node`s: target/debug/stockade or
# $STOCKADE_EXE; test/deploy-linux.test.mjs needs root and cgroup v2 and fails loudly
# without). Non-interactive (CI=true, no stdin, root are fine).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export CI="${CI:-true}"
export npm_config_yes=true
npm ci --no-audit --no-fund --loglevel=error </dev/null
bash build.sh </dev/null
node --test --test-reporter=spec test/ </dev/null
