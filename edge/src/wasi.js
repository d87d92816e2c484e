// What both edge hosts share: the minimal WASI the guest imports (it does no I/O;
// stdout/stderr lines, e.g. a panic message, go to the console), the versioned import
// names jco looks up, and the error a facade call throws. Used by host.js (the mock
// conformance harness) and jspi-host.js (the deployment over nodes).

/** Why a facade call did not produce the guest's answer. */
export class CallError extends Error {
  /** kind: 'facade' (payload: the guest's typed error) or 'trap'. */
  constructor(kind, payload, message) {
    super(message);
    this.kind = kind;
    this.payload = payload;
  }
}

// ---- minimal WASI: the guest does no I/O; stdout/stderr (panic messages) go to the console ----

class WasiError {
  toDebugString() {
    return 'wasi error';
  }
}
class Pollable {
  block() {}
  ready() {
    return true;
  }
}
class InputStream {}
class OutputStream {
  constructor(sink) {
    this.sink = sink;
    this.dec = new TextDecoder();
    this.buf = '';
  }
  checkWrite() {
    return 1048576n;
  }
  write(contents) {
    this.buf += this.dec.decode(contents, { stream: true });
    let nl;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      this.sink(this.buf.slice(0, nl));
      this.buf = this.buf.slice(nl + 1);
    }
  }
  blockingWriteAndFlush(contents) {
    this.write(contents);
    this.blockingFlush();
  }
  flush() {
    this.blockingFlush();
  }
  blockingFlush() {
    if (this.buf) {
      this.sink(this.buf);
      this.buf = '';
    }
  }
  subscribe() {
    return new Pollable();
  }
}
class TerminalInput {}
class TerminalOutput {}

export function wasiImports() {
  const stdout = new OutputStream((l) => console.log(`[guest stdout] ${l}`));
  const stderr = new OutputStream((l) => console.error(`[guest stderr] ${l}`));
  const stdin = new InputStream();
  return {
    'wasi:cli/environment': { getEnvironment: () => [], getArguments: () => [], initialCwd: () => undefined },
    'wasi:cli/exit': {
      exit: (status) => {
        throw new Error(`guest called wasi:cli/exit with ${status?.tag ?? 'ok'}`);
      },
    },
    'wasi:cli/stderr': { getStderr: () => stderr },
    'wasi:cli/stdin': { getStdin: () => stdin },
    'wasi:cli/stdout': { getStdout: () => stdout },
    'wasi:cli/terminal-input': { TerminalInput },
    'wasi:cli/terminal-output': { TerminalOutput },
    'wasi:cli/terminal-stderr': { getTerminalStderr: () => undefined },
    'wasi:cli/terminal-stdin': { getTerminalStdin: () => undefined },
    'wasi:cli/terminal-stdout': { getTerminalStdout: () => undefined },
    'wasi:io/error': { Error: WasiError },
    'wasi:io/poll': { Pollable, poll: (list) => new Uint32Array(list.map((_, i) => i)) },
    'wasi:io/streams': { InputStream, OutputStream },
  };
}

/** Add `@0.2.6`-style versioned aliases next to the unversioned names jco looks up. */
export function withVersions(imports) {
  const out = { ...imports };
  for (const [name, v] of Object.entries(imports)) {
    out[`${name}@${name.startsWith('wasi:') ? '0.2.6' : '0.2.0'}`] = v;
  }
  return out;
}

