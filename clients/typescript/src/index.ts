/**
 * Stockade's TypeScript client: every facade call of the HTTP API, live output
 * included. fetch-based (Node 18+, browsers, workers); the request and response types
 * are generated from docs/openapi.json (`npm run gen`).
 *
 *   const sb = new Stockade({ server: "http://127.0.0.1:8787", token });
 *   const out = await sb.exec("ci", ["pytest", "-q"], { grant: [{ host: "pypi.org" }] });
 *   for await (const ev of sb.execStream("ci", ["make", "test"])) { ... }
 */
import type { components } from "./schema.js";

type Schemas = components["schemas"];
/** A command and its options, as the API takes it. */
export type Command = Schemas["Command"];
/** One egress rule of a grant. */
export type Rule = Schemas["Rule"];
/** A denied egress request. */
export type Denial = Schemas["Denial"];
/** One entry of `egress(key)`: an admitted request (`decision: "allow"`) or a denial. */
export type EgressEvent = Schemas["EgressEvent"];
/** A detached process's state as the API answers it. */
export type DetachedState = Schemas["DetachedState"];
/** A preview door onto a port of the key's container: its random token and URL. */
export type Preview = Schemas["Preview"];
/** A named snapshot of a key's /workspace: its name and when it was taken (ms). */
export type Snapshot = Schemas["Snapshot"];
/** A known key (given a lifetime, metadata or a network, until it is forgotten):
 * whether its container runs, its lifetime (null: it has none), its metadata, its
 * network (null: it has none). */
export type SandboxInfo = Schemas["SandboxInfo"];
/** A grant as the API takes and answers it: its rules and `ask` (absent: false); a
 * key's network is one. */
export type Grant = Schemas["Grant"];
/** When a key's lifetime ends (ms since the Unix epoch) and what its end does. */
export type Lifetime = Schemas["Lifetime"];

/** A lifetime to give a key: exactly one of `endsInMs` (from the server's now) and
 * `endsAtMs` (ms since the Unix epoch); `onEnd` defaults to
 * "abort" (the key forgotten), "checkpoint" keeps it known. */
export interface LifetimeOptions {
  endsInMs?: number;
  endsAtMs?: number;
  onEnd?: "abort" | "checkpoint";
}

/** A scoped consumer token as listed (never its secret; docs/TENANTS.md). */
export type TokenInfo = Schemas["TokenInfo"];

/** What a fenced command produced (bytes decoded from the API's base64). */
export interface ExecOutcome {
  exitCode: number;
  stdout: Uint8Array;
  stderr: Uint8Array;
  timedOut: boolean;
  truncated: boolean;
  killed: number;
  denials: number;
  /** Egress requests the fence admitted. */
  admitted: number;
  limits: string[];
  /** stdout as text. */
  text: string;
}

/** A chunk of live output. */
export interface Output {
  type: "stdout" | "stderr";
  data: Uint8Array;
}

/** The last event of a streamed exec: the outcome, without the output. */
export interface Exit {
  type: "exit";
  exitCode: number;
  timedOut: boolean;
  truncated: boolean;
  killed: number;
  denials: number;
  admitted: number;
  limits: string[];
}

/** An artifact under /artifacts. */
export interface Artifact {
  name: string;
  size: number;
}

/** Options of exec and start (argv is separate). */
export interface ExecOptions {
  cwd?: string;
  env?: Record<string, string>;
  timeoutMs?: number;
  grant?: Rule[];
  approval?: string;
  stdin?: string | Uint8Array;
  /** Abort the call: for a streamed exec, the command is killed and its grant revoked. */
  signal?: AbortSignal;
}

/** The server refused a call: its HTTP status and stable error code. */
export class StockadeError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(`${code} (HTTP ${status}): ${message}`);
    this.name = "StockadeError";
  }
}

const b64 = {
  decode: (s: string): Uint8Array => Uint8Array.from(atob(s), (c) => c.charCodeAt(0)),
  encode: (b: Uint8Array): string => btoa(Array.from(b, (x) => String.fromCharCode(x)).join("")),
};

const q = (s: string, keepSlash = false): string =>
  keepSlash ? s.split("/").map(encodeURIComponent).join("/") : encodeURIComponent(s);

/** A client of one Stockade server. */
export class Stockade {
  readonly server: string;
  readonly token: string;

  constructor(opts: { server?: string; token: string }) {
    this.server = (opts.server ?? "http://127.0.0.1:8787").replace(/\/+$/, "");
    this.token = opts.token;
  }

  private async request(
    method: string,
    path: string,
    body?: BodyInit,
    contentType = "application/json",
    token = this.token,
    signal?: AbortSignal,
  ): Promise<Response> {
    const headers: Record<string, string> = { authorization: `Bearer ${token}` };
    if (body !== undefined) headers["content-type"] = contentType;
    const r = await fetch(this.server + path, { method, headers, body, signal });
    if (!r.ok) {
      const text = await r.text();
      let code = "failed";
      let message = text;
      try {
        const e = JSON.parse(text).error;
        code = e.code;
        message = e.message;
      } catch {
        /* not the API's error shape */
      }
      throw new StockadeError(r.status, code, message);
    }
    return r;
  }

  protected async json<T>(method: string, path: string, body?: unknown, token?: string): Promise<T> {
    const r = await this.request(
      method,
      path,
      body === undefined ? undefined : JSON.stringify(body),
      "application/json",
      token,
    );
    return (await r.json()) as T;
  }

  private static command(argv: string[], o: ExecOptions): Command {
    // The schema's argv is non-empty (a tuple type); the server checks it.
    const c: Command = { argv: argv as Command["argv"] };
    if (o.cwd !== undefined) c.cwd = o.cwd;
    if (o.env !== undefined) c.env = o.env;
    if (o.timeoutMs !== undefined) c.timeout_ms = o.timeoutMs;
    if (o.grant !== undefined) c.grant = { rules: o.grant };
    if (o.approval !== undefined) c.approval = o.approval;
    if (typeof o.stdin === "string") c.stdin = o.stdin;
    else if (o.stdin !== undefined) c.stdin_base64 = b64.encode(o.stdin);
    return c;
  }

  /** Is the server up? */
  async health(): Promise<boolean> {
    return (await this.json<{ ok: boolean }>("GET", "/v1/health")).ok;
  }

  /** Run a fenced command and wait for it; `grant` opens egress only while it runs
   * (absent: the key's network, `setNetwork`, if it has one). */
  async exec(key: string, argv: string[], o: ExecOptions = {}): Promise<ExecOutcome> {
    const r = await this.request(
      "POST",
      `/v1/sandboxes/${q(key)}/exec`,
      JSON.stringify(Stockade.command(argv, o)),
      "application/json",
      this.token,
      o.signal,
    );
    const v = (await r.json()) as Schemas["ExecOutcome"] & { stdout_base64: string; stderr_base64: string };
    const stdout = b64.decode(v.stdout_base64);
    return {
      exitCode: v.exit_code,
      stdout,
      stderr: b64.decode(v.stderr_base64),
      timedOut: v.timed_out,
      truncated: v.truncated,
      killed: v.killed,
      denials: v.denials,
      admitted: v.admitted,
      limits: [...(v.limits ?? [])],
      text: new TextDecoder().decode(stdout),
    } as ExecOutcome;
  }

  /**
   * Run a fenced command, yielding its output as it is written, then its `Exit`.
   * Stopping early (break, or `signal`) disconnects: the command is killed and its
   * grant revoked.
   */
  async *execStream(key: string, argv: string[], o: ExecOptions = {}): AsyncGenerator<Output | Exit> {
    const ac = new AbortController();
    o.signal?.addEventListener("abort", () => ac.abort(o.signal?.reason));
    const r = await this.request(
      "POST",
      `/v1/sandboxes/${q(key)}/exec/stream`,
      JSON.stringify(Stockade.command(argv, o)),
      "application/json",
      this.token,
      ac.signal,
    );
    const reader = r.body!.getReader();
    const dec = new TextDecoder();
    const enc = new TextEncoder();
    let pending = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        pending += dec.decode(value, { stream: true });
        let nl: number;
        while ((nl = pending.indexOf("\n")) >= 0) {
          const ev = JSON.parse(pending.slice(0, nl));
          pending = pending.slice(nl + 1);
          if (ev.type === "stdout" || ev.type === "stderr") {
            const data = ev.data !== undefined ? enc.encode(ev.data) : b64.decode(ev.data_base64);
            yield { type: ev.type, data };
          } else if (ev.type === "exit") {
            yield {
              type: "exit",
              exitCode: ev.exit_code,
              timedOut: ev.timed_out,
              truncated: ev.truncated,
              killed: ev.killed,
              denials: ev.denials,
              admitted: ev.admitted,
              limits: ev.limits,
            };
            return;
          } else {
            throw new StockadeError(ev.status ?? 500, ev.error?.code ?? "failed", ev.error?.message ?? "");
          }
        }
      }
      throw new StockadeError(502, "unreachable", "the stream ended before the outcome");
    } finally {
      // An early stop disconnects (the server then ends the command).
      ac.abort();
    }
  }

  /** Start a detached process (no grant, ever); its id. */
  async start(key: string, argv: string[], o: Omit<ExecOptions, "grant" | "timeoutMs" | "approval"> = {}): Promise<string> {
    const v = await this.json<{ id: string }>("POST", `/v1/sandboxes/${q(key)}/detached`, Stockade.command(argv, o));
    return v.id;
  }

  /** A detached process's state: `running`, `exited` (code) or `gone` (reason). */
  async status(key: string, id: string): Promise<DetachedState> {
    return this.json<DetachedState>("GET", `/v1/sandboxes/${q(key)}/detached/${q(id)}`);
  }

  /** Kill a detached process's whole tree and forget its id. */
  async stop(key: string, id: string): Promise<void> {
    await this.json("DELETE", `/v1/sandboxes/${q(key)}/detached/${q(id)}`);
  }

  /** Start the key's container if it has none (restoring its checkpoint): no command
   * runs, no grant is applied; a refusal (over capacity) comes now. */
  async ensure(key: string): Promise<void> {
    await this.json("POST", `/v1/sandboxes/${q(key)}/ensure`);
  }

  /** Stop the key's container at once; its detached records are cleared. */
  async abort(key: string): Promise<void> {
    await this.json("POST", `/v1/sandboxes/${q(key)}/abort`);
  }

  /** The known keys starting with `prefix` that this token reaches, by key. */
  async sandboxes(prefix = ""): Promise<SandboxInfo[]> {
    const path = prefix === "" ? "/v1/sandboxes" : `/v1/sandboxes?prefix=${q(prefix)}`;
    return (await this.json<{ sandboxes: SandboxInfo[] }>("GET", path)).sandboxes;
  }

  /** The key as it is known; a key that is not known is a 404 not-found. */
  async describe(key: string): Promise<SandboxInfo> {
    return this.json<SandboxInfo>("GET", `/v1/sandboxes/${q(key)}`);
  }

  /** Abort the known key's container, then forget the key (its lifetime, metadata and
   * network; its named snapshots stay). A key that is not known is a 404. */
  async forget(key: string): Promise<void> {
    await this.json("DELETE", `/v1/sandboxes/${q(key)}`);
  }

  /** Give the key a lifetime: at its end the key is ended as `onEnd` says. */
  async setLifetime(key: string, o: LifetimeOptions): Promise<SandboxInfo> {
    const body: { ends_in_ms?: number; ends_at_ms?: number; on_end?: string } = {};
    if (o.endsInMs !== undefined) body.ends_in_ms = o.endsInMs;
    if (o.endsAtMs !== undefined) body.ends_at_ms = o.endsAtMs;
    if (o.onEnd !== undefined) body.on_end = o.onEnd;
    return this.json<SandboxInfo>("PUT", `/v1/sandboxes/${q(key)}/lifetime`, body);
  }

  /** The key's lifetime removed: it ends no more (it stays known). */
  async clearLifetime(key: string): Promise<SandboxInfo> {
    return this.json<SandboxInfo>("DELETE", `/v1/sandboxes/${q(key)}/lifetime`);
  }

  /** Replace the key's metadata whole (at most 64 entries). */
  async setMetadata(key: string, metadata: Record<string, string>): Promise<SandboxInfo> {
    return this.json<SandboxInfo>("PUT", `/v1/sandboxes/${q(key)}/metadata`, { metadata });
  }

  /** Give the key a network (replacing its own): the grant, `grant` as exec's takes it,
   * that each of its fenced commands (exec, execStream, a terminal) bringing no grant of
   * its own runs under, open only while that command runs; a detached process never
   * does. `ask`: what the rules refuse for want of a rule is held for the approver.
   * Checked now as an exec's grant (a secret not set: 409 secret-not-set; a rule
   * refused: 400 invalid-input). */
  async setNetwork(key: string, grant: Rule[], o: { ask?: boolean } = {}): Promise<SandboxInfo> {
    const body: Grant = { rules: grant };
    if (o.ask) body.ask = true;
    return this.json<SandboxInfo>("PUT", `/v1/sandboxes/${q(key)}/network`, body);
  }

  /** The key's network removed: its commands that bring no grant run with no rules (it
   * stays known). */
  async clearNetwork(key: string): Promise<SandboxInfo> {
    return this.json<SandboxInfo>("DELETE", `/v1/sandboxes/${q(key)}/network`);
  }

  /** Snapshot /workspace and stop; the next call restores it. */
  async checkpoint(key: string): Promise<void> {
    await this.json("POST", `/v1/sandboxes/${q(key)}/checkpoint`);
  }

  /** Archive the key's /workspace under `name` (replacing a snapshot of that name),
   * starting its container if it has none; the container keeps running. A key holds
   * at most 16; they outlive its container until deleted. */
  async saveSnapshot(key: string, name: string): Promise<Snapshot> {
    return this.json<Snapshot>("POST", `/v1/sandboxes/${q(key)}/snapshots`, { name });
  }

  /** The key's named snapshots, by name. */
  async snapshots(key: string): Promise<Snapshot[]> {
    return (await this.json<{ snapshots: Snapshot[] }>("GET", `/v1/sandboxes/${q(key)}/snapshots`)).snapshots;
  }

  /** Delete the key's snapshot `name` (one that does not exist: nothing changes). */
  async deleteSnapshot(key: string, name: string): Promise<void> {
    await this.json("DELETE", `/v1/sandboxes/${q(key)}/snapshots/${q(name)}`);
  }

  /** Make `source`'s snapshot `name` the key's restore cache: the key's next container
   * starts from it. The key must have no container (abort or checkpoint it first). */
  async fork(key: string, source: string, name: string): Promise<void> {
    await this.json("POST", `/v1/sandboxes/${q(key)}/fork`, { source, name });
  }

  /** What the key's fence refused, and why. */
  /** Open a preview door onto `port` (127.0.0.1 inside the key's running container). */
  async expose(key: string, port: number): Promise<Preview> {
    return this.json<Preview>("POST", `/v1/sandboxes/${q(key)}/previews`, { port });
  }

  /** Close the preview door onto `port` (one not open: nothing changes). */
  async unexpose(key: string, port: number): Promise<void> {
    await this.json("DELETE", `/v1/sandboxes/${q(key)}/previews/${Math.trunc(port)}`);
  }

  /** The key's open preview doors, by port. */
  async previews(key: string): Promise<Preview[]> {
    return (await this.json<{ previews: Preview[] }>("GET", `/v1/sandboxes/${q(key)}/previews`)).previews;
  }

  async denials(key: string): Promise<Denial[]> {
    return (await this.json<{ denials: Denial[] }>("GET", `/v1/sandboxes/${q(key)}/denials`)).denials;
  }

  /** Everything the key's fence decided, admitted and denied, oldest first. */
  async egress(key: string): Promise<EgressEvent[]> {
    return (await this.json<{ egress: EgressEvent[] }>("GET", `/v1/sandboxes/${q(key)}/egress`)).egress;
  }

  /** Files under the key's /artifacts. */
  async artifacts(key: string): Promise<Artifact[]> {
    return (await this.json<{ artifacts: Artifact[] }>("GET", `/v1/sandboxes/${q(key)}/artifacts`)).artifacts;
  }

  /** One whole artifact (read in 4 MiB parts). */
  async readArtifact(key: string, name: string): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    let offset = 0;
    for (;;) {
      const r = await this.request(
        "GET",
        `/v1/sandboxes/${q(key)}/artifacts/${q(name, true)}?offset=${offset}&length=4194304`,
      );
      const part = new Uint8Array(await r.arrayBuffer());
      parts.push(part);
      offset += part.length;
      if (part.length < 4194304) break;
    }
    const out = new Uint8Array(offset);
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }

  /** Write one file under /workspace (parents created), as the sandbox's user. */
  async putFile(key: string, path: string, data: string | Uint8Array): Promise<void> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.request("PUT", `/v1/sandboxes/${q(key)}/files/${q(path, true)}`, body as BodyInit, "application/octet-stream");
  }

  /** Unpack a tar archive under /workspace/dest; the number of entries. */
  async putArchive(key: string, tar: Uint8Array, dest = ""): Promise<number> {
    const r = await this.request("PUT", `/v1/sandboxes/${q(key)}/files?dest=${q(dest, true)}`, tar as BodyInit, "application/x-tar");
    return ((await r.json()) as { entries: number }).entries;
  }

  /** Record an approval for one floor command (the approver's token); the token that admits it once. */
  async approve(key: string, argv: string[], approverToken: string): Promise<string> {
    return (await this.json<{ token: string }>("POST", `/v1/sandboxes/${q(key)}/approvals`, { argv }, approverToken)).token;
  }

  /** Make a scoped consumer token reaching `keys` (one key, or a prefix ending in `*`),
   * holding at most `ceiling` live containers (the operator's token): the token, shown
   * once, and its info. */
  async createToken(keys: string, o: { ceiling?: number; name?: string } = {}): Promise<{ token: string; info: TokenInfo }> {
    const { token, ...info } = await this.json<TokenInfo & { token: string }>("POST", "/v1/tokens", { keys, ...o });
    return { token, info };
  }

  /** Every scoped token, live and revoked, oldest first (the operator's token). */
  async tokens(): Promise<TokenInfo[]> {
    return (await this.json<{ tokens: TokenInfo[] }>("GET", "/v1/tokens")).tokens;
  }

  /** Revoke a scoped token by its id: a wrong token (401) from now on. */
  async revokeToken(id: string): Promise<void> {
    await this.json("DELETE", `/v1/tokens/${q(id)}`);
  }
}
