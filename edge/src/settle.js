// The host's settle after a facade call, shared by both edge hosts (src/host.js over
// the mock, src/jspi-host.js over nodes), as host/runtime/src/runtime/settle.rs `settle` does
// for the Rust host: a call that traps has what it started killed, and a fence it left
// open is torn down, then revoked (invariant 1: teardown, then revoke, on every path).
// The guest's selective teardown is not available here; killing a declared process is
// the lesser wrong. A substrate whose calls answer synchronously (the mock) is awaited
// the same: a sync throw inside the try is caught as a rejection would be.

/**
 * Settle what one call left behind. `ctx`: the call's record, {openFences:
 * [[container, 'applied' | 'apply-failed']], started: [[container, id]],
 * unresolvedKeys?: [key]} (emptied here); `trapped`: the call ended without an answer
 * of the guest's (a trap, not a facade error); `log(level, event, fields)`.
 */
export async function settle(substrate, ctx, { trapped, log }) {
  if (trapped) {
    // A trapped call returned no id: what it started is nobody's. Killed before any
    // open fence is revoked below.
    for (const [container, id] of ctx.started.splice(0)) {
      let killed = true;
      try {
        await substrate.killProcess(container, id);
      } catch {
        killed = false;
      }
      log('warn', 'host killed a process started by a trapped call', [
        ['container', container],
        ['id', id],
        ['killed', String(killed)],
      ]);
    }
  }
  // A batch opened by `ensure` that got no answer, whose container the guest never
  // learnt (it trapped first, or `current` failed): the key's current container is
  // the one its fence may be open on (none: nothing is open). Torn down below.
  for (const key of (ctx.unresolvedKeys ?? []).splice(0)) {
    let container;
    try {
      container = await substrate.current(key);
    } catch (e) {
      log('warn', 'a fence the call may have left open names no container, and current failed', [
        ['key', key],
        ['error', String(e?.val ?? e?.message ?? e?.tag ?? e)],
      ]);
      continue;
    }
    if (container !== undefined && !ctx.openFences.some(([c, st]) => c === container && st === 'applied')) {
      ctx.openFences.push([container, 'applied']);
    }
  }
  for (const [container, state] of ctx.openFences.splice(0)) {
    if (state === 'apply-failed') {
      // A failed apply opened nothing and ran nothing: revoked in case a substrate
      // failed half-way, nothing killed (a declared process survives bad input).
      let revoked = true;
      try {
        await substrate.revokeGrant(container);
      } catch {
        revoked = false;
      }
      log('info', 'a failed apply opened nothing: revoked, nothing killed', [
        ['container', container],
        ['revoked', String(revoked)],
      ]);
      continue;
    }
    let killed = true;
    let revoked = true;
    try {
      await substrate.killAll(container);
    } catch {
      killed = false;
    }
    try {
      await substrate.revokeGrant(container);
    } catch {
      revoked = false;
    }
    log('warn', 'host tore down and revoked a fence the call left open', [
      ['container', container],
      ['killed_all', String(killed)],
      ['revoked', String(revoked)],
    ]);
  }
}
