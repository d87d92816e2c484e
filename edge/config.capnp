# workerd configuration: the Stockade guest (transpiled by jco into gen/ by build.sh)
# in a Worker over the in-memory mock substrate. Serve with:
#   npx workerd serve edge/config.capnp --socket-addr http=127.0.0.1:PORT
# (the socket's default address below is loopback only).
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [ (name = "stockade", worker = .stockadeWorker) ],
  sockets = [ (name = "http", address = "127.0.0.1:8799", http = (), service = "stockade") ],
);

const stockadeWorker :Workerd.Worker = (
  modules = [
    (name = "worker.js", esModule = embed "src/worker.js"),
    (name = "scenarios.js", esModule = embed "src/scenarios.js"),
    (name = "host.js", esModule = embed "src/host.js"),
    (name = "mock.js", esModule = embed "src/mock.js"),
    (name = "batch.js", esModule = embed "src/batch.js"),
    (name = "settle.js", esModule = embed "src/settle.js"),
    (name = "store.js", esModule = embed "src/store.js"),
    (name = "defaults.js", esModule = embed "src/defaults.js"),
    (name = "call.js", esModule = embed "src/call.js"),
    (name = "stockade.js", esModule = embed "gen/stockade.js"),
    (name = "stockade.core.wasm", wasm = embed "gen/stockade.core.wasm"),
    (name = "stockade.core2.wasm", wasm = embed "gen/stockade.core2.wasm"),
    (name = "stockade.core3.wasm", wasm = embed "gen/stockade.core3.wasm"),
  ],
  compatibilityDate = "2024-09-23",
);
