// Host defaults the edge runtime shares with the Rust host.

/** The floor rules `wasmtime.toml` embeds (`[floor] rules`); used when a scenario gives
 * none. edge/test/conformance.test.mjs checks they still match wasmtime.toml. */
export const DEFAULT_FLOOR = [
  ['rm', '-rf', '/'],
  ['git', 'push', '**'],
  ['shutdown', '**'],
  ['reboot', '**'],
];
