"""The E2B benchmark (docs/BENCHMARKS.md, "E2B: create and the first command"), run by
`bash scripts/bench e2b` against a `stockade serve` it started (release build):

  (a) e2b:      `Sandbox.create()` then `commands.run("true")` through the unmodified
                E2B SDK (configured by `stockade e2b env`);
  (b) stockade: Stockade's own Python client's first exec on a new key, `exec(new key,
                ["/bin/bash", "-l", "-c", "true"])`, the command as the E2B layer runs
                it (the first call on a key starts its container);
  (c) stockade: `ensure(new key)` (the container started, no command) then that exec;
  (d) stockade: what an E2B create is since a sandbox's end became native, through the
                own client: `ensure(new key)`, `set_lifetime(key, ends_in_ms=300000)`
                (E2B's default timeout), then that exec: the goal's baseline, "the own
                client doing the same";

interleaved a, b, c, d, a, b, c, d … (each sandbox killed / key aborted after, untimed);
median and p95 of each, (a)/(d) against the goal 1.3x ((a)/(c) and (a)/(b) beside it). Then 50 creates at once through the SDK
(threads), each timed from the common start: p50, p95, max.

argv: the server's URL. Env: E2B_* from `stockade e2b env`, STOCKADE_TOKEN.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))

from e2b import Sandbox  # noqa: E402

import stockade  # noqa: E402

N = int(os.environ.get("BENCH_N", "100"))
CONCURRENT = int(os.environ.get("BENCH_CONCURRENT", "50"))
GOAL = 1.3

server = sys.argv[1]
client = stockade.Stockade(server, os.environ["STOCKADE_TOKEN"])


def stats(xs):
    s = sorted(xs)

    def at(q):
        return s[min(len(s) - 1, max(0, int(-(-q * len(s) // 1)) - 1))]

    return at(0.5), at(0.95), s[-1]


parts = {"create": [], "run": []}
own_parts = {"ensure": [], "lifetime": [], "exec": []}


def e2b_once():
    t = time.perf_counter()
    sbx = Sandbox.create()
    m = time.perf_counter()
    r = sbx.commands.run("true")
    took = time.perf_counter() - t
    parts["create"].append(m - t)
    parts["run"].append(took - (m - t))
    assert r.exit_code == 0
    sbx.kill()
    return took


def own_once(i, ensure=False, lifetime=False):
    key = f"bench-own-{'d' if lifetime else 'c' if ensure else 'b'}-{i}"
    t = time.perf_counter()
    if ensure:
        client.ensure(key)
    m1 = time.perf_counter()
    if lifetime:
        client.set_lifetime(key, ends_in_ms=300_000)
    m2 = time.perf_counter()
    out = client.exec(key, ["/bin/bash", "-l", "-c", "true"])
    took = time.perf_counter() - t
    if lifetime:
        own_parts["ensure"].append(m1 - t)
        own_parts["lifetime"].append(m2 - m1)
        own_parts["exec"].append(took - (m2 - t))
    assert out.exit_code == 0, out
    if lifetime:
        client.forget(key)
    else:
        client.abort(key)
    return took


# Warm both paths (the SDK's imports and connection pools, the server's first instance).
e2b_once()
own_once("warm")
own_once("warm", ensure=True)
own_once("warm", ensure=True, lifetime=True)

a, b, c, d = [], [], [], []
for i in range(N):
    a.append(e2b_once())
    b.append(own_once(i))
    c.append(own_once(i, ensure=True))
    d.append(own_once(i, ensure=True, lifetime=True))

(a50, a95, _), (b50, b95, _), (c50, c95, _) = stats(a), stats(b), stats(c)
(d50, d95, _) = stats(d)
print(f"e2b bench: n={N} interleaved")
print(f"  (a) e2b create + first run   p50 {a50 * 1000:7.1f} ms   p95 {a95 * 1000:7.1f} ms")
print(f"  (b) own client first exec    p50 {b50 * 1000:7.1f} ms   p95 {b95 * 1000:7.1f} ms")
print(f"  (c) own ensure + first exec  p50 {c50 * 1000:7.1f} ms   p95 {c95 * 1000:7.1f} ms")
print(f"  (d) own ensure + lifetime + first exec  p50 {d50 * 1000:7.1f} ms   p95 {d95 * 1000:7.1f} ms")
print(f"  (a)/(d) p50 {a50 / d50:.2f}x  p95 {a95 / d95:.2f}x  (goal <= {GOAL}x)")
print(f"  (a)/(c) p50 {a50 / c50:.2f}x  p95 {a95 / c95:.2f}x")
print(f"  (a)/(b) p50 {a50 / b50:.2f}x  p95 {a95 / b95:.2f}x")
for name, xs in parts.items():
    p50, p95, _ = stats(xs)
    print(f"  (a) of which {name:8} p50 {p50 * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms")
for name, xs in own_parts.items():
    p50, p95, _ = stats(xs)
    print(f"  (d) of which {name:8} p50 {p50 * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms")

# 50 creates at once.
times = [None] * CONCURRENT
boxes = [None] * CONCURRENT
go = threading.Event()


def create(i):
    go.wait()
    t = time.perf_counter()
    boxes[i] = Sandbox.create()
    times[i] = time.perf_counter() - start[0]
    del t


start = [0.0]
threads = [threading.Thread(target=create, args=(i,)) for i in range(CONCURRENT)]
for t in threads:
    t.start()
start[0] = time.perf_counter()
go.set()
for t in threads:
    t.join()
c50, c95, cmax = stats(times)
print(f"  {CONCURRENT} creates at once: p50 {c50 * 1000:.1f} ms  p95 {c95 * 1000:.1f} ms  max {cmax * 1000:.1f} ms")
for sbx in boxes:
    sbx.kill()
print("e2b bench: done")
