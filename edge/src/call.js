// What both edge hosts share: the versioned import names jco looks up and the error a
// facade call throws. Used by host.js (the mock conformance harness) and jspi-host.js
// (the deployment over nodes). The guest imports no WASI (host/build.rs stubs std's:
// a panic's message reaches the `log` import), so the hosts give it none.

/** Why a facade call did not produce the guest's answer. */
export class CallError extends Error {
  /** kind: 'facade' (payload: the guest's typed error) or 'trap'. */
  constructor(kind, payload, message) {
    super(message);
    this.kind = kind;
    this.payload = payload;
  }
}

/** The host-facing `events` exports, by jco name; every other call is the facade's. */
const EVENTS = new Set(['onStop', 'expiring', 'endLifetime']);

/** The export `name` of an instance: an `events` function or a facade one. */
export function exported(inst, name) {
  const f = (EVENTS.has(name) ? inst.events : inst.facade)[name];
  if (typeof f !== 'function') throw new Error(`the guest exports no ${name}`);
  return f;
}

/** Add `@0.2.0` versioned aliases next to the unversioned names jco looks up. */
export function withVersions(imports) {
  const out = { ...imports };
  for (const [name, v] of Object.entries(imports)) {
    out[`${name}@0.2.0`] = v;
  }
  return out;
}

