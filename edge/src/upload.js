// Uploads on the edge, as `stockade serve` serves them (host/src/api/upload.rs,
// host/src/upload): `PUT /v1/sandboxes/{key}/files?dest=DIR` (a tar archive unpacked
// into /workspace/DIR) and `PUT …/files/PATH` (one file of its Content-Length).
//
// Decision: one checker. The archive is checked on the key's node, by the same code
// that checks it in `stockade serve` (the node's `run-stream` with `upload`,
// docs/NODE.md "Streamed stdin"), not by a JavaScript port of it: the edge streams the
// request's body to the node unread (bounded: the body is read as the node takes it,
// a frame at a time), and the node answers its verdict (`{"upload": {entries}}` or
// `{"upload": {refused}}`) before the run's last line. What the edge checks itself is
// what `stockade serve` checks before the body: the destination or path (ported
// below, same messages), the declared length, the size bound. The unpack is the same
// fenced exec of the container's own `tar` (UNPACK: the host's script file itself,
// host/node-protocol/src/upload/unpack.sh, imported as `#gen/unpack.js`), through the
// guest, serialized with the key's other mutating calls by the object's queue. Pure
// but for crypto.randomUUID.

import { BadRequest } from './api.js';
import { UNPACK } from '#gen/unpack.js';

/** The largest upload one request takes (host/node-protocol/src/upload/archive.rs MAX_ARCHIVE_BYTES). */
export const MAX_ARCHIVE_BYTES = 2 ** 30;

/** The unpack script: host/node-protocol/src/upload/unpack.sh, the host's own file
 * (edge/build.sh makes gen/unpack.js of it; `#gen/unpack.js` is that module's name in
 * workerd and, through package.json's `imports`, in Node: workerd refuses a `../`
 * above its modules' root). */
export { UNPACK };

/** The completion entry's name for `marker` (archive.rs `completion_name`). */
export const completionName = (marker) => `.stockade-complete-${marker}`;

/** A fresh marker: 32 hex digits. */
export const newMarker = () => crypto.randomUUID().replaceAll('-', '');

/** The exec that unpacks the streamed archive into /workspace/<dest> (upload::command),
 * in the guest's exec-input form (jco). */
export function command(dest, marker) {
  return {
    argv: [
      'sh',
      '-c',
      UNPACK,
      'stockade-put',
      `/workspace/${dest}`,
      `/workspace/.stockade-put-${marker}`,
      completionName(marker),
    ],
    cwd: undefined,
    env: [],
    timeoutMs: 600_000n,
    grant: undefined,
    approval: undefined,
    stdin: undefined,
  };
}

const invalid = (m) => new BadRequest(400, 'invalid-input', m);
const debug = (s) => JSON.stringify(s);

/** `?dest=` checked (archive.rs `check_dest`): relative, no `..`, no NUL; `.` and
 * empty segments dropped. The destination as the unpack takes it. */
export function checkDest(dest) {
  if (dest.includes('\0')) throw invalid('the destination contains a NUL byte');
  if (dest.startsWith('/')) {
    throw invalid(`the destination ${debug(dest)} is absolute (it is relative to /workspace)`);
  }
  const parts = [];
  for (const seg of dest.split('/')) {
    if (seg === '' || seg === '.') continue;
    if (seg === '..') throw invalid(`the destination ${debug(dest)} has ..`);
    parts.push(seg);
  }
  return parts.join('/');
}

/** A file's path (`PUT …/files/PATH`) checked (archive.rs `check_file_name`):
 * canonical, relative to /workspace. */
export function checkFileName(name) {
  if (name.includes('\0')) throw invalid('the name contains a NUL byte');
  const bad = name.split('/').find((seg) => seg === '' || seg === '.' || seg === '..');
  if (bad !== undefined) {
    throw invalid(
      `the path ${debug(name)} has an empty, '.' or '..' segment (${debug(bad)}); write it canonical, relative to /workspace`,
    );
  }
}

/** What is uploaded, from the route and the request, checked before its body is read:
 * `{dest, upload}` where `upload` is the node's `run-stream` check. */
export function what(rest, url, headers) {
  const declared = headers.get('content-length');
  const tooLarge = () => {
    if (declared !== null && Number(declared) > MAX_ARCHIVE_BYTES) {
      throw new BadRequest(413, 'payload-too-large', `an upload takes at most ${MAX_ARCHIVE_BYTES} bytes`);
    }
  };
  if (rest.length === 1) {
    for (const k of url.searchParams.keys()) {
      if (k !== 'dest') throw invalid(`Failed to deserialize query string: unknown field \`${k}\`, expected \`dest\``);
    }
    const dest = checkDest(url.searchParams.get('dest') ?? '');
    tooLarge();
    return { dest, upload: (marker) => ({ archive: { marker } }) };
  }
  let path;
  try {
    path = decodeURIComponent(rest.slice(1).join('/'));
  } catch {
    throw invalid('the path does not decode');
  }
  checkFileName(path);
  if (declared === null || !/^[0-9]+$/.test(declared)) {
    throw new BadRequest(
      411,
      'length-required',
      'a file upload declares its length (Content-Length); an archive (PUT …/files) need not',
    );
  }
  tooLarge();
  const len = Number(declared);
  return { dest: '', upload: (marker) => ({ file: { path, len, marker } }) };
}

/**
 * The request's body as the node's stdin, bounded: past MAX_ARCHIVE_BYTES, or broken
 * off, or silent for `idleMs`, a read throws (the node then refuses the stream: no end
 * frame) and `state.failure` says why, as `[status, code, message]`.
 *
 * `stream` is a byte source, `{read(view), cancel(reason)}`, not a ReadableStream: a
 * read fills the caller's buffer (a BYOB read of the body, where the body is a byte
 * stream, as workerd's is), so the relay (nodes.js `runStream`) reuses one buffer for
 * the whole upload. A default reader hands out a fresh ArrayBuffer per chunk (4 KiB in
 * workerd): 96 MiB of those outran the collector and workerd's peak grew 2.18 bytes per
 * byte uploaded (measured); with one reused buffer it grows by ~13 MiB. A body that is
 * not a byte stream is read chunk by chunk (each chunk its own buffer).
 */
export function bounded(body, idleMs = 60_000) {
  const state = { failure: undefined, bytes: 0 };
  let reader;
  let byob = false;
  if (body) {
    try {
      reader = body.getReader({ mode: 'byob' });
      byob = true;
    } catch {
      reader = body.getReader();
    }
  }
  const fail = (failure, e) => {
    state.failure ??= failure;
    reader.cancel(e).catch(() => {});
    throw e;
  };
  const stream = {
    /** The next bytes, in `view` when the body is a byte stream: `{value, done}`. */
    async read(view) {
      if (!reader) return { value: undefined, done: true };
      let timer;
      const idle = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`the upload's body sent nothing for ${idleMs / 1000}s`)), idleMs);
      });
      let r;
      try {
        r = await Promise.race([byob ? reader.read(view) : reader.read(), idle]);
      } catch (e) {
        fail([400, 'malformed-body', String(e?.message ?? e)], e);
      } finally {
        clearTimeout(timer);
      }
      if (r.done) return { value: undefined, done: true };
      state.bytes += r.value.length;
      if (state.bytes > MAX_ARCHIVE_BYTES) {
        fail([413, 'payload-too-large', `an upload takes at most ${MAX_ARCHIVE_BYTES} bytes`], new Error('too large'));
      }
      return r;
    },
    cancel(reason) {
      reader?.cancel(reason).catch(() => {});
    },
  };
  return { stream, state };
}

/** What an upload whose node could not be reached answers (upload/mod.rs `Failure::Unreachable`). */
export const UPLOAD_UNREACHABLE =
  "the upload did not complete: the sandbox's node could not be reached (nothing was written)";

/**
 * The answer of an upload (api/upload.rs `upload`), the first cause first: the body,
 * then the node's verdict on the archive, then the unpack's run. `call` is the guest
 * exec's outcome or its error (`{error}`), `verdict` the node's `upload` line.
 * Returns [status, body].
 */
export function answer({ failure, verdict, call, dest, callErrorStatus }) {
  const err = (status, code, message) => [status, { error: { code, message } }];
  if (failure) return err(...failure);
  if (verdict && 'refused' in verdict) return err(400, 'invalid-input', String(verdict.refused));
  if (call.error) {
    const [status, code, message] = callErrorStatus(call.error);
    // A node lost mid-upload is said in the user's terms, as api/upload.rs does: the
    // call's own text names the node protocol's calls (`node-1: run: Network connection lost`).
    return code === 'unreachable' ? err(status, code, UPLOAD_UNREACHABLE) : err(status, code, message);
  }
  const o = call.outcome;
  if (verdict && 'entries' in verdict && o.exitCode === 0) {
    return [201, { dest: `/workspace/${dest}`, entries: verdict.entries }];
  }
  const stderr = new TextDecoder().decode(o.stderr).trim();
  return err(422, 'put-failed', `tar in the container exited ${o.exitCode}: ${stderr}`);
}
