// A substrate batch's semantics as one plan (docs/EMBEDDING.md `batch`, docs/NODE.md
// "Batches"), the edge's copy of host/runtime/src/substrate/batch.rs: both are tested
// against the rows of tests/scenarios/batch.json (edge/test/batch.test.mjs). A driver
// only makes the calls it is told to and hands back their answers: mock.js
// batchInOrder (the edge's imports, call by call) and nodes.js RemoteSubstrate.batch
// (the answers a node's `batch` sent back).

/** What a call is, as far as a batch's semantics go. */
function kindOf(c) {
  if (c.tag === 'ensure') return 'ensure';
  if (c.tag === 'apply-grant') return 'apply-grant';
  if (c.tag === 'kill-all' || c.tag === 'revoke-grant') return 'teardown';
  return 'other';
}

/**
 * A batch of WIT calls being made: which call next, with the ensured placeholder
 * resolved; the answers so far ({tag: 'ok', val: {tag, val}} or {tag: 'err', val});
 * when it is over. The shape is checked whole first (checkBatch throws the typed
 * `invalid`: nothing is made).
 */
export class BatchPlan {
  constructor(calls) {
    checkBatch(calls);
    this.calls = calls;
    this.answers = [];
    this.ensured = undefined;
    this.opened = undefined; // [container, grant] of the batch's own apply
    this.stopped = false;
  }

  /** What call `i` acts on: a container id, the placeholder resolved once the ensure
   * answered (until then `{tag: 'ensured'}`), or undefined (a call on a key). */
  resolved(i) {
    const t = targetOf(this.calls[i]);
    if (!t) return undefined;
    if (t.tag !== 'ensured') return t.val;
    return this.ensured === undefined ? t : this.ensured;
  }

  /** The call to make next, {index, container, whileOpen}, or undefined when the batch
   * is over (every call answered, or one failed). `whileOpen`: a teardown of the fence
   * this batch opened on that container, made only while that grant is still open
   * there (else answered `closedMeanwhile`). */
  next() {
    if (this.stopped || this.answers.length >= this.calls.length) return undefined;
    const index = this.answers.length;
    const container = this.resolved(index);
    const c = typeof container === 'object' ? undefined : container;
    const whileOpen =
      this.opened && kindOf(this.calls[index]) === 'teardown' && this.opened[0] === c ? { grant: this.opened[1] } : undefined;
    return { index, container: c, whileOpen };
  }

  /** The next call's answer. An error ends the batch; an answer past the end is not
   * one of its calls' and is dropped. */
  answer(a) {
    if (this.stopped || this.answers.length >= this.calls.length) return;
    const call = this.calls[this.answers.length];
    if (a.tag === 'err') this.stopped = true;
    else if (call.tag === 'ensure') this.ensured = a.val?.val;
    this.answers.push(a);
  }

  /** `answer` for an apply-grant, with the grant now open on its container (a driver
   * that guards its trailing teardown: the node). */
  answerOpened(a, grant) {
    const i = this.answers.length;
    if (a.tag === 'ok' && !this.stopped && this.calls[i]?.tag === 'apply-grant') {
      const c = this.resolved(i);
      if (typeof c === 'string') this.opened = [c, grant];
    }
    this.answer(a);
  }

  get done() {
    return this.next() === undefined;
  }
}

/** The answer of a trailing teardown whose fence another call closed meanwhile. */
export function closedMeanwhile(container) {
  return {
    tag: 'unreachable',
    val: `the fence this batch opened on ${JSON.stringify(container)} was closed by another call meanwhile: its teardown was not made`,
  };
}

/** The most calls one `batch` carries (the WIT's bound). */
export const MAX_BATCH = 16;

/**
 * The WIT `target` a batch call acts on (the `container` of a call with arguments, the
 * value of one on a container alone), or undefined (a call on a key, or a call a batch
 * does not carry).
 */
export function targetOf(c) {
  switch (c?.tag) {
    case 'apply-grant':
    case 'run':
    case 'start-process':
    case 'process-status':
    case 'kill-process':
    case 'open-preview':
    case 'close-preview':
    case 'save-snapshot':
      return c.val.container;
    case 'kill-all':
    case 'revoke-grant':
    case 'list-processes':
    case 'snapshot':
    case 'stop':
    case 'list-previews':
      return c.val;
    default:
      return undefined;
  }
}

/** The calls a node's own batch carries (the fence's); the others go one at a time. */
export const FENCE_CALLS = new Set(['ensure', 'apply-grant', 'run', 'kill-all', 'revoke-grant']);

/**
 * A batch's whole check, before any of its calls is made (the WIT `batch`): 1 to
 * MAX_BATCH calls, an `ensure` only as the first call, and a `target.ensured` only in
 * a batch that opens with one. A batch that fails it is refused whole: throws the
 * typed `invalid`, nothing is made.
 */
export function checkBatch(calls) {
  if (calls.length === 0 || calls.length > MAX_BATCH) {
    throw { tag: 'invalid', val: `a batch carries 1 to ${MAX_BATCH} calls, not ${calls.length}` };
  }
  const opens = calls[0]?.tag === 'ensure';
  for (const [i, c] of calls.entries()) {
    if (c.tag === 'ensure' && i > 0) throw { tag: 'invalid', val: `an ensure is only a batch's first call (call ${i})` };
    if (targetOf(c)?.tag === 'ensured' && !opens) {
      throw { tag: 'invalid', val: `call ${i} names the ensured container in a batch that does not open with ensure` };
    }
  }
}

/**
 * The WIT `batch` over an import object's own calls, as its BatchPlan says: checked
 * whole, then made in order, stopping at the first error (a typed error is that call's
 * `err` answer; an Error, a trap, is thrown on). `imports` holds the substrate's calls
 * by their jco names, sync or async; the answer is a promise when any call's is.
 */
export function batchInOrder(imports, calls) {
  const plan = new BatchPlan(calls);
  const make = (c, on) => {
    switch (c.tag) {
      case 'ensure':
        return imports.ensure(c.val);
      case 'apply-grant':
        return imports.applyGrant(on, c.val.grant);
      case 'run':
        return imports.run(on, c.val.cmd, c.val.timeoutMs);
      case 'kill-all':
        return imports.killAll(on);
      case 'revoke-grant':
        return imports.revokeGrant(on);
      case 'current':
        return imports.current(c.val);
      case 'start-process':
        return imports.startProcess(on, c.val.cmd);
      case 'list-processes':
        return imports.listProcesses(on);
      case 'process-status':
        return imports.processStatus(on, c.val.id);
      case 'kill-process':
        return imports.killProcess(on, c.val.id);
      case 'snapshot':
        return imports.snapshot(on);
      case 'stop':
        return imports.stop(on);
      case 'denials':
        return imports.denials(c.val);
      case 'list-artifacts':
        return imports.listArtifacts(c.val);
      case 'read-artifact':
        return imports.readArtifact(c.val.key, c.val.name, c.val.offset, c.val.length);
      case 'open-preview':
        return imports.openPreview(on, c.val.port);
      case 'close-preview':
        return imports.closePreview(on, c.val.port);
      case 'list-previews':
        return imports.listPreviews(on);
      case 'save-snapshot':
        return imports.saveSnapshot(on, c.val.name);
      case 'fork-snapshot':
        return imports.forkSnapshot(c.val.source, c.val.name, c.val.key);
      case 'drop-snapshot':
        return imports.dropSnapshot(c.val.key, c.val.name);
      default:
        throw { tag: 'invalid', val: `no call ${c.tag} in a batch` };
    }
  };
  const failed = (e) => {
    if (e instanceof Error) throw e;
    plan.answer({ tag: 'err', val: e });
  };
  const step = () => {
    for (let next = plan.next(); next; next = plan.next()) {
      const tag = calls[next.index].tag;
      let v;
      try {
        v = make(calls[next.index], next.container);
      } catch (e) {
        failed(e);
        continue;
      }
      if (v && typeof v.then === 'function') {
        return v.then(
          (val) => {
            plan.answer({ tag: 'ok', val: { tag, val } });
            return step();
          },
          (e) => {
            failed(e);
            return plan.answers;
          },
        );
      }
      plan.answer({ tag: 'ok', val: { tag, val: v } });
    }
    return plan.answers;
  };
  return step();
}
