// The Worker: the Stockade guest in workerd, over the in-memory mock substrate.
//
//   GET  /health    -> 200 "ok" (readiness)
//   POST /scenario  -> body: one scenario of tests/scenarios/conformance.json;
//                      runs it whole inside the worker (fresh mock, store, floor);
//                      200 {"ok": bool, "error": string|null}
//   POST /cells     -> body: {call, cells}: one call of tests/scenarios/faults.json and
//                      its fault-matrix cells, each expanded (cellScenario) and run;
//                      200 {"ok": bool, "ran": n, "failures": [string]}
//
// Every facade call instantiates the guest afresh (Worker-style, as the Rust host
// does); state lives in the mock and the store, which live for one scenario.

import { cellScenario, runScenario } from './scenarios.js';

const json = (v, status = 200) =>
  new Response(JSON.stringify(v), { status, headers: { 'content-type': 'application/json' } });

export default {
  async fetch(request) {
    const url = new URL(request.url);
    if (url.pathname === '/health' && request.method === 'GET') {
      return new Response('ok\n');
    }
    if (url.pathname === '/scenario') {
      if (request.method !== 'POST') return json({ ok: false, error: 'POST a scenario' }, 405);
      let scenario;
      try {
        scenario = await request.json();
      } catch (e) {
        return json({ ok: false, error: `malformed JSON: ${e.message}` }, 400);
      }
      if (!scenario || typeof scenario !== 'object' || !Array.isArray(scenario.steps)) {
        return json({ ok: false, error: 'a scenario is an object with a steps array' }, 400);
      }
      const logs = [];
      const log = (level, event, fields) => {
        if (level !== 'debug') logs.push(`${level} ${event} ${JSON.stringify(fields)}`);
      };
      const r = await runScenario(scenario, { log });
      return json(r.ok ? r : { ...r, log: logs.slice(-50) });
    }
    if (url.pathname === '/cells') {
      if (request.method !== 'POST') return json({ ok: false, error: 'POST a call and its cells' }, 405);
      let body;
      try {
        body = await request.json();
      } catch (e) {
        return json({ ok: false, error: `malformed JSON: ${e.message}` }, 400);
      }
      if (!body || typeof body.call !== 'object' || !Array.isArray(body.cells)) {
        return json({ ok: false, error: 'a body is {call, cells}' }, 400);
      }
      const failures = [];
      for (const cell of body.cells) {
        const s = cellScenario(body.call, cell);
        const r = await runScenario(s);
        if (!r.ok) failures.push(`${s.name}: ${r.error}`);
      }
      return json({ ok: failures.length === 0, ran: body.cells.length, failures });
    }
    return json({ ok: false, error: 'not found' }, 404);
  },
};
