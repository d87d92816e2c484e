//! The Worker-style runtime: one `Engine` and one `InstancePre` built at start-up, a
//! fresh instance per facade call, state in the durable store.
//!
//! Calls that change a sandbox (exec, start-detached, stop-detached, abort,
//! checkpoint) are serialized per key and run to completion in their own task (a
//! caller that goes away cannot cut them mid-fence); read-only calls run concurrently. A guest trap
//! or deadline never takes the host down, and the host revokes any grant the call
//! left open (invariant 1).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, HasSelf, Instance, InstancePre, Lift,
    Linker, Lower,
};
use wasmtime::{
    Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store as WasmStore,
    StoreLimitsBuilder, UpdateDeadline,
};

use crate::bindings::{
    Artifact, Denial as GuestDenial, DetachedInput, DetachedState, EMBEDDED_GUEST, ExecInput,
    ExecOutcome, FacadeError, Preview, Stockade, StockadePre,
};
use crate::config::{Config, EngineConfig};
use crate::imports::{Ctx, FenceState};
use crate::substrate::{Denial, Event, Substrate};
use stockade_egress::secrets::Secrets;
use stockade_store::Store;

/// What a caller attaches to an `exec`.
#[derive(Debug, Default)]
pub struct ExecIo {
    /// Live output: [`Output::Started`](crate::substrate::Output::Started) when the run
    /// begins, then its chunks as they are produced. The outcome's `stdout` and
    /// `stderr` are then empty: the output went here (a large output crosses the guest
    /// once, not twice).
    pub output: Option<crate::substrate::OutputSink>,
    /// The caller's presence: the receiver of a channel whose sender the caller holds
    /// while it waits. If the sender is dropped before the run ends, the run is
    /// abandoned: the guest's teardown kills its tree, then revokes its grant, and the
    /// call ends (a client that disconnects does not leave its command running).
    pub caller: Option<tokio::sync::watch::Receiver<()>>,
    /// The run's stdin given by the host itself, past the guest (whose stdin is
    /// bounded at 16 MiB): an upload's archive, streamed as it is checked. Never from
    /// a consumer's command (that stdin is the guest's to check).
    pub stdin: Option<crate::substrate::StdinStream>,
    /// An interactive terminal for the run (`stockade shell`): its stdin, stdout and
    /// stderr are the terminal, whose ends the caller holds. The run is the guest's
    /// as any other (floor, approval, grant, teardown); only its I/O differs.
    pub pty: Option<crate::substrate::pty::Attach>,
}

/// What a guest call answers: a trap (or a deadline), or the facade's own result.
type GuestResult<T> = wasmtime::Result<Result<T, FacadeError>>;

/// A guest call's future, boxed for the calls that change a sandbox: they run in a
/// task of their own, which needs the future to be `Send`, and a generic async
/// closure cannot promise that on stable Rust (no bound can name its future).
type SendCall<'a, T> = std::pin::Pin<Box<dyn Future<Output = GuestResult<T>> + Send + 'a>>;

/// The guest's exported functions, by index, found once per runtime.
///
/// A call looks up and type-checks only the function it calls. bindgen's
/// `StockadePre::instantiate` would type-check all thirteen exports' signatures on
/// every instance (`StockadeIndices::load`: 12 % of an instance); the
/// check per call is the same check, of one function.
#[derive(Clone, Copy)]
struct Exports {
    exec: ComponentExportIndex,
    start_detached: ComponentExportIndex,
    detached_status: ComponentExportIndex,
    stop_detached: ComponentExportIndex,
    abort: ComponentExportIndex,
    checkpoint: ComponentExportIndex,
    denials: ComponentExportIndex,
    artifacts: ComponentExportIndex,
    read_artifact: ComponentExportIndex,
    expose: ComponentExportIndex,
    unexpose: ComponentExportIndex,
    previews: ComponentExportIndex,
    on_stop: ComponentExportIndex,
}

impl Exports {
    /// The indices of `component`'s `facade` and `events` functions (whatever the
    /// package's version: the WIT names it once).
    fn new(component: &Component) -> wasmtime::Result<Self> {
        let interface = |name: &str| {
            let full = component
                .component_type()
                .exports(component.engine())
                .map(|(n, _)| n)
                .find(|n| n.split('@').next() == Some(name))
                .map(str::to_owned)
                .ok_or_else(|| wasmtime::format_err!("the guest exports no `{name}`"))?;
            component
                .get_export_index(None, &full)
                .ok_or_else(|| wasmtime::format_err!("the guest exports no `{full}`"))
        };
        let (facade, events) = (
            interface("stockade:sandbox/facade")?,
            interface("stockade:sandbox/events")?,
        );
        let func = |i: &ComponentExportIndex, name: &str| {
            component
                .get_export_index(Some(i), name)
                .ok_or_else(|| wasmtime::format_err!("the guest exports no function `{name}`"))
        };
        Ok(Self {
            exec: func(&facade, "exec")?,
            start_detached: func(&facade, "start-detached")?,
            detached_status: func(&facade, "detached-status")?,
            stop_detached: func(&facade, "stop-detached")?,
            abort: func(&facade, "abort")?,
            checkpoint: func(&facade, "checkpoint")?,
            denials: func(&facade, "denials")?,
            artifacts: func(&facade, "artifacts")?,
            read_artifact: func(&facade, "read-artifact")?,
            expose: func(&facade, "expose")?,
            unexpose: func(&facade, "unexpose")?,
            previews: func(&facade, "previews")?,
            on_stop: func(&events, "on-stop")?,
        })
    }
}

/// Call the export at `index` of `inst` with `params`: its lookup by index, the
/// type check of this one function, the call.
async fn invoke<P, R>(
    inst: &Instance,
    store: &mut WasmStore<Ctx>,
    index: &ComponentExportIndex,
    params: P,
) -> wasmtime::Result<R>
where
    P: ComponentNamedList + Lower + Send + Sync,
    R: Lift + Send + Sync + 'static,
    (R,): ComponentNamedList + Lift,
{
    let f = inst.get_typed_func::<P, (R,)>(&mut *store, index)?;
    Ok(f.call_async(store, params).await?.0)
}

/// Why a facade call did not produce the guest's answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    /// The guest answered with a typed error.
    #[error("{0:?}")]
    Facade(FacadeError),
    /// The guest trapped or ran past its deadline; the host revoked any open grant.
    #[error("guest trapped: {0}")]
    Trap(String),
}

/// The runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The engine or the component could not be built.
    #[error("wasmtime: {0}")]
    Wasm(String),
    /// The guest component could not be read.
    #[error("guest component {path}: {source}")]
    Guest {
        /// Its path.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// How the engine allocates instances (reported by `doctor` and the benches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// The pooling allocator.
    Pooling,
    /// On-demand (configured, or the pool could not be reserved).
    OnDemand,
}

/// Per-key locks for the mutating calls.
#[derive(Default)]
struct KeyLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl KeyLocks {
    async fn lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let m = {
            let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() > 4096 {
                map.retain(|_, m| Arc::strong_count(m) > 1);
            }
            map.entry(key.to_string()).or_default().clone()
        };
        m.lock_owned().await
    }
}

/// The epoch ticker thread; stops when the runtime is dropped.
struct Ticker(Arc<AtomicBool>);

impl Drop for Ticker {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The engine and the compiled guest, built once per process and shared by every
/// runtime (compiling the component is the expensive part of start-up).
#[derive(Clone)]
pub struct Compiled {
    engine: Engine,
    component: Component,
    allocation: Allocation,
    _ticker: Arc<Ticker>,
}

impl Compiled {
    /// Build the engine and compile the guest (embedded unless `[guest] component`
    /// names a file).
    pub fn new(cfg: &Config) -> Result<Self, StartError> {
        let wasm = |e: wasmtime::Error| StartError::Wasm(format!("{e:#}"));
        let (engine, allocation) = build_engine(&cfg.engine).map_err(wasm)?;
        let bytes: std::borrow::Cow<'static, [u8]> = match &cfg.guest.component {
            None => EMBEDDED_GUEST.into(),
            Some(p) => std::fs::read(p)
                .map_err(|source| StartError::Guest {
                    path: p.clone(),
                    source,
                })?
                .into(),
        };
        let component = Component::new(&engine, &bytes).map_err(wasm)?;
        let stop = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.clone();
            let stop = stop.clone();
            let tick = Duration::from_millis(cfg.engine.epoch_tick_ms);
            std::thread::Builder::new()
                .name("stockade-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(tick);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| StartError::Wasm(format!("epoch thread: {e}")))?;
        }
        Ok(Self {
            engine,
            component,
            allocation,
            _ticker: Arc::new(Ticker(stop)),
        })
    }

    /// How instances are allocated.
    pub fn allocation(&self) -> Allocation {
        self.allocation
    }
}

/// The runtime.
pub struct Runtime {
    engine: Engine,
    pre: InstancePre<Ctx>,
    exports: Exports,
    substrate: Arc<dyn Substrate>,
    store: Arc<Store>,
    floor: Arc<Vec<Vec<String>>>,
    secrets: Secrets,
    locks: KeyLocks,
    engine_cfg: EngineConfig,
    allocation: Allocation,
    _compiled: Compiled,
}

impl Runtime {
    /// Compile the guest and build a runtime over `substrate` and `store`.
    pub fn new(
        cfg: &Config,
        substrate: Arc<dyn Substrate>,
        store: Arc<Store>,
    ) -> Result<Self, StartError> {
        Self::from_compiled(&Compiled::new(cfg)?, cfg, substrate, store)
    }

    /// A runtime over an already compiled guest.
    pub fn from_compiled(
        compiled: &Compiled,
        cfg: &Config,
        substrate: Arc<dyn Substrate>,
        store: Arc<Store>,
    ) -> Result<Self, StartError> {
        let wasm = |e: wasmtime::Error| StartError::Wasm(format!("{e:#}"));
        let mut linker: Linker<Ctx> = Linker::new(&compiled.engine);
        Stockade::add_to_linker::<Ctx, HasSelf<Ctx>>(&mut linker, |c| c).map_err(wasm)?;
        let pre = linker.instantiate_pre(&compiled.component).map_err(wasm)?;
        // bindgen's check that every export of the world is there, once.
        StockadePre::new(pre.clone()).map_err(wasm)?;
        let exports = Exports::new(&compiled.component).map_err(wasm)?;
        Ok(Self {
            secrets: Secrets::from_config(store.clone(), &cfg.egress),
            engine: compiled.engine.clone(),
            pre,
            exports,
            substrate,
            store,
            floor: Arc::new(cfg.floor.rules.clone()),
            locks: KeyLocks::default(),
            engine_cfg: cfg.engine.clone(),
            allocation: compiled.allocation,
            _compiled: compiled.clone(),
        })
    }

    /// How instances are allocated.
    pub fn allocation(&self) -> Allocation {
        self.allocation
    }

    /// The substrate this runtime drives.
    pub fn substrate(&self) -> &Arc<dyn Substrate> {
        &self.substrate
    }

    /// The durable store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The engine every instance of this runtime lives in (the benches compile a
    /// comparison guest in it).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A fresh instance for one call.
    pub async fn instance(&self) -> Result<(WasmStore<Ctx>, Instance), CallError> {
        let mut store = self.call_store();
        let instance = self
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| CallError::Trap(format!("instantiate: {e:#}")))?;
        Ok((store, instance))
    }

    /// The store of one call: its [`Ctx`], its memory limit and its deadline on guest
    /// compute.
    pub fn call_store(&self) -> WasmStore<Ctx> {
        let limits = StoreLimitsBuilder::new()
            .memory_size((self.engine_cfg.memory_mib as usize) << 20)
            .instances(64)
            .build();
        let ctx = Ctx::new(
            self.substrate.clone(),
            self.store.clone(),
            self.floor.clone(),
            self.secrets.clone(),
            limits,
        );
        let mut store = WasmStore::new(&self.engine, ctx);
        store.limiter(|c| &mut c.limits);
        let deadline = Duration::from_millis(self.engine_cfg.call_deadline_ms);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |ctx| {
            if ctx.data().guest_compute() > deadline {
                Err(wasmtime::Error::msg(format!(
                    "guest compute passed the per-call deadline of {deadline:?}"
                )))
            } else {
                Ok(UpdateDeadline::Continue(1))
            }
        });
        store
    }

    /// End a call: tear down and revoke whatever fence it left open, then map the
    /// result.
    ///
    /// A call leaves an applied grant open only when it stopped mid-fence (a trap, a
    /// deadline) or its revoke failed: its run may have backgrounded something that is
    /// alive and would share the next fence's grant. Invariant 1 is teardown, then
    /// revoke, on every path: the host kills every tracked tree (`kill-all`; the guest's
    /// selective teardown is not available here, and killing a declared process is the
    /// lesser wrong, as when the list is unreadable), then revokes.
    ///
    /// An apply that failed opened nothing and ran nothing: the host only revokes (in
    /// case a substrate failed half-way) and kills nothing, so bad input never costs a
    /// declared process its life (DESIGN §2.3: a secret file that could not be read once
    /// killed every detached server).
    async fn settle<T>(
        &self,
        mut store: WasmStore<Ctx>,
        result: GuestResult<T>,
    ) -> Result<T, CallError> {
        let started = store.data_mut().take_started_processes();
        if result.is_err() {
            // A trapped call returned no id: what it started is nobody's. Killed before
            // any open fence is revoked below.
            for (container, id) in started {
                let killed = self.substrate.kill_process(&container, &id).await;
                tracing::warn!(
                    target: "stockade::runtime",
                    container = %container,
                    id = %id,
                    killed = ?killed,
                    "host killed a process started by a trapped call"
                );
            }
        }
        let mut open = store.data_mut().take_open_fences();
        // A batch that opened with its key's ensure and did not answer: the fence, if
        // it opened, is on the key's current container (none: no grant is open).
        for key in store.data_mut().take_unresolved_fences() {
            match self.substrate.current(&key).await {
                Ok(Some(container)) => open.push((container, FenceState::Applied)),
                Ok(None) => {}
                Err(e) => tracing::warn!(
                    target: "stockade::runtime",
                    key = %key,
                    error = %e,
                    "a fence's container could not be asked for: the node's grant lease closes it"
                ),
            }
        }
        for (container, state) in open {
            if state == FenceState::ApplyFailed {
                let r = self.substrate.revoke_grant(&container).await;
                tracing::info!(
                    target: "stockade::runtime",
                    container = %container,
                    revoked = r.is_ok(),
                    "a failed apply opened nothing: revoked, nothing killed"
                );
                continue;
            }
            let killed = self.substrate.kill_all(&container).await;
            let r = self.substrate.revoke_grant(&container).await;
            tracing::warn!(
                target: "stockade::runtime",
                container = %container,
                killed = ?killed,
                revoked = r.is_ok(),
                "host tore down and revoked a fence the call left open"
            );
        }
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(CallError::Facade(e)),
            Err(trap) => {
                tracing::error!(target: "stockade::runtime", error = %format!("{trap:#}"), "guest trapped");
                Err(CallError::Trap(format!("{trap:#}")))
            }
        }
    }

    /// One guest call, the same for every facade method: a fresh instance, the call
    /// (which may first attach host-side state to the instance's [`Ctx`]), then
    /// [`settle`](Self::settle). Read-only calls run this directly, concurrently.
    async fn call<T>(
        &self,
        call: impl AsyncFnOnce(&Instance, &mut WasmStore<Ctx>) -> GuestResult<T>,
    ) -> Result<T, CallError> {
        let (mut store, inst) = self.instance().await?;
        let r = call(&inst, &mut store).await;
        self.settle(store, r).await
    }

    /// A [`call`](Self::call) that changes the sandbox of `key`: serialized by the
    /// key's lock and run to completion ([`Finish`](crate::finish::Finish): polled in
    /// the caller's task, finished on the runtime if the caller drops it), so a caller
    /// that stops waiting (an HTTP client that disconnected, a dropped future) cannot
    /// cut it between apply and revoke, or between start and declare. What it started is
    /// settled as on every other path (invariant 1).
    async fn mutate<T: Send + 'static>(
        self: &Arc<Self>,
        key: &str,
        call: impl for<'a> FnOnce(&'a Instance, &'a mut WasmStore<Ctx>, &'a str) -> SendCall<'a, T>
        + Send
        + 'static,
    ) -> Result<T, CallError> {
        let (rt, key) = (self.clone(), key.to_owned());
        let call = crate::finish::Finish::new(async move {
            let _g = rt.locks.lock(&key).await;
            rt.call(async |inst, store| call(inst, store, &key).await)
                .await
        });
        match call.await {
            Ok(r) => r,
            Err(e) => Err(CallError::Trap(format!("the call panicked: {}", e.0))),
        }
    }

    /// `exec`: the fenced command.
    pub async fn exec(
        self: &Arc<Self>,
        key: &str,
        input: &ExecInput,
    ) -> Result<ExecOutcome, CallError> {
        self.exec_with(key, input, ExecIo::default()).await
    }

    /// `exec`, with the caller's live output sink and presence (see [`ExecIo`]).
    pub async fn exec_with(
        self: &Arc<Self>,
        key: &str,
        input: &ExecInput,
        io: ExecIo,
    ) -> Result<ExecOutcome, CallError> {
        let input = input.clone();
        let f = self.exports.exec;
        self.mutate(key, move |inst, store, key| {
            store.data_mut().output = io.output;
            store.data_mut().caller = io.caller;
            store.data_mut().stdin = io.stdin;
            store.data_mut().pty = io.pty;
            Box::pin(async move { invoke(inst, store, &f, (key, &input)).await })
        })
        .await
    }

    /// `start-detached`: a process that outlives the call, with no grant. The
    /// contract's `detached-input` cannot carry one; an `ExecInput` that does is
    /// refused here, before any call (a timeout is not a detached process's: ignored).
    pub async fn start_detached(
        self: &Arc<Self>,
        key: &str,
        input: &ExecInput,
    ) -> Result<String, CallError> {
        let input = DetachedInput::try_from(input).map_err(CallError::Facade)?;
        let f = self.exports.start_detached;
        self.mutate(key, move |inst, store, key| {
            Box::pin(async move { invoke(inst, store, &f, (key, &input)).await })
        })
        .await
    }

    /// `detached-status` (read-only: not serialized).
    pub async fn detached_status(&self, key: &str, id: &str) -> Result<DetachedState, CallError> {
        let f = &self.exports.detached_status;
        self.call(async |inst, store| invoke(inst, store, f, (key, id)).await)
            .await
    }

    /// `stop-detached`.
    pub async fn stop_detached(self: &Arc<Self>, key: &str, id: &str) -> Result<(), CallError> {
        let id = id.to_owned();
        let f = self.exports.stop_detached;
        self.mutate(key, move |inst, store, key| {
            Box::pin(async move { invoke(inst, store, &f, (key, id.as_str())).await })
        })
        .await
    }

    /// `abort`.
    pub async fn abort(self: &Arc<Self>, key: &str) -> Result<(), CallError> {
        let f = self.exports.abort;
        self.mutate(key, move |inst, store, key| {
            Box::pin(async move { invoke(inst, store, &f, (key,)).await })
        })
        .await
    }

    /// `checkpoint`.
    pub async fn checkpoint(self: &Arc<Self>, key: &str) -> Result<(), CallError> {
        let f = self.exports.checkpoint;
        self.mutate(key, move |inst, store, key| {
            Box::pin(async move { invoke(inst, store, &f, (key,)).await })
        })
        .await
    }

    /// `checkpoint` for a caller that holds the key's lock.
    async fn checkpoint_locked(&self, key: &str) -> Result<(), CallError> {
        let f = &self.exports.checkpoint;
        self.call(async |inst, store| invoke(inst, store, f, (key,)).await)
            .await
    }

    /// `denials` (read-only), as the host's records: the reason by its kebab-case name
    /// and the fence id as `rule_set` (the API's field).
    pub async fn denials(&self, key: &str) -> Result<Vec<Denial>, CallError> {
        let f = &self.exports.denials;
        let denials: Vec<GuestDenial> = self
            .call(async |inst, store| invoke(inst, store, f, (key,)).await)
            .await?;
        Ok(denials.into_iter().map(Denial::from).collect())
    }

    /// `artifacts` (read-only).
    pub async fn artifacts(&self, key: &str) -> Result<Vec<Artifact>, CallError> {
        let f = &self.exports.artifacts;
        self.call(async |inst, store| invoke(inst, store, f, (key,)).await)
            .await
    }

    /// `read-artifact` (read-only).
    pub async fn read_artifact(
        &self,
        key: &str,
        name: &str,
        offset: u64,
        length: u32,
    ) -> Result<Vec<u8>, CallError> {
        let f = &self.exports.read_artifact;
        self.call(async |inst, store| invoke(inst, store, f, (key, name, offset, length)).await)
            .await
    }

    /// `expose` (DESIGN §8): a preview door onto `port` of the key's running container.
    /// Serialized with the key's other mutations (an abort cannot interleave).
    pub async fn expose(self: &Arc<Self>, key: &str, port: u32) -> Result<Preview, CallError> {
        let f = self.exports.expose;
        self.mutate(key, move |inst, store, key| {
            Box::pin(async move { invoke(inst, store, &f, (key, port)).await })
        })
        .await
    }

    /// `unexpose`: close the door onto `port`.
    pub async fn unexpose(self: &Arc<Self>, key: &str, port: u32) -> Result<(), CallError> {
        let f = self.exports.unexpose;
        self.mutate(key, move |inst, store, key| {
            Box::pin(async move { invoke(inst, store, &f, (key, port)).await })
        })
        .await
    }

    /// `previews` (read-only): the key's open doors.
    pub async fn previews(&self, key: &str) -> Result<Vec<Preview>, CallError> {
        let f = &self.exports.previews;
        self.call(async |inst, store| invoke(inst, store, f, (key,)).await)
            .await
    }

    /// `on-stop`: the substrate saw `container` stop; returns declarations cleared.
    pub async fn on_stop(&self, container: &str) -> Result<u32, CallError> {
        let f = &self.exports.on_stop;
        self.call(async |inst, store| invoke(inst, store, f, (container,)).await.map(Ok))
            .await
    }

    /// Forward the substrate's events to the guest (`on-stop`) until the substrate
    /// closes its channel.
    pub fn spawn_event_loop(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let rt = self.clone();
        let mut events = self.substrate.subscribe();
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(Event::Stopped(container)) => {
                        let r = rt.on_stop(&container).await;
                        tracing::info!(target: "stockade::runtime", %container, cleared = ?r, "container stopped on its own");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::error!(target: "stockade::runtime", missed = n, "missed container-stop events");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        })
    }

    /// Checkpoint (through the guest) every container idle for `idle_for`, checking
    /// every `every`. Each key is re-checked under its lock, so a call that arrived in
    /// between keeps its container.
    pub fn spawn_idle_loop(
        self: &Arc<Self>,
        idle_for: Duration,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let rt = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                for key in rt.substrate.idle(idle_for).await {
                    rt.evict_if_idle(&key, idle_for).await;
                }
            }
        })
    }

    /// Check and act under one hold of the key's lock: a call queued behind the
    /// check runs after the eviction (on a restored container), never in between (it
    /// used to run between the check and the checkpoint, whose stop then ended its
    /// container and cleared a fresh declaration).
    pub async fn evict_if_idle(&self, key: &str, idle_for: Duration) {
        let _g = self.locks.lock(key).await;
        if !self.substrate.idle(idle_for).await.iter().any(|k| k == key) {
            return;
        }
        let r = self.checkpoint_locked(key).await;
        tracing::info!(target: "stockade::runtime", %key, result = ?r, "idle container checkpointed and stopped");
    }

    /// Graceful shutdown: take every key lock in turn is not needed here — the API has
    /// stopped accepting calls; revoke every open grant and stop every container.
    pub async fn shutdown(&self) {
        for container in self.substrate.open_grants() {
            let _ = self.substrate.revoke_grant(&container).await;
        }
        self.substrate.shutdown().await;
    }
}

/// How a released pooled slot's linear memory and tables are brought back to the
/// image's bytes (`[engine]`'s slot reset, `config.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotReset {
    /// Bytes per slot reset in place (`memset` or a copy from the image) of the pages
    /// the instance dirtied; past them, `madvise`. 0: `madvise` only.
    keep_resident: usize,
    /// Find the dirtied pages with `PAGEMAP_SCAN` (Linux 6.7).
    pagemap_scan: bool,
}

/// Reset in place only where the kernel can say which pages were dirtied: without
/// `PAGEMAP_SCAN` wasmtime would `memset` the whole kept prefix on every release
/// (2 MiB per call), slower than the `madvise` it replaces. Either way the next
/// instance sees the image's bytes, never the last call's.
fn slot_reset(keep_resident_kib: u64, pagemap_scan_available: bool) -> SlotReset {
    if keep_resident_kib == 0 || !pagemap_scan_available {
        return SlotReset {
            keep_resident: 0,
            pagemap_scan: false,
        };
    }
    SlotReset {
        keep_resident: usize::try_from(keep_resident_kib.saturating_mul(1024))
            .unwrap_or(usize::MAX),
        pagemap_scan: true,
    }
}

/// The engine: epoch interruption, component model, pooling where the address space
/// allows it (else on-demand, logged).
fn build_engine(cfg: &EngineConfig) -> wasmtime::Result<(Engine, Allocation)> {
    let mut base = wasmtime::Config::new();
    base.wasm_component_model(true).epoch_interruption(true);
    if cfg.pooling {
        let n = cfg.max_instances;
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(n)
            .total_core_instances(n * 8)
            .total_memories(n * 2)
            .total_tables(n * 8)
            .max_memory_size((cfg.memory_mib as usize) << 20)
            .max_memories_per_module(2);
        let reset = slot_reset(
            cfg.keep_resident_kib,
            PoolingAllocationConfig::is_pagemap_scan_available(),
        );
        pool.linear_memory_keep_resident(reset.keep_resident)
            .table_keep_resident(reset.keep_resident)
            .pagemap_scan(if reset.pagemap_scan {
                Enabled::Yes
            } else {
                Enabled::No
            });
        tracing::info!(
            target: "stockade::runtime",
            keep_resident = reset.keep_resident,
            pagemap_scan = reset.pagemap_scan,
            configured_kib = cfg.keep_resident_kib,
            "pooled slots: reset in place up to keep_resident bytes, madvise past it"
        );
        let mut pooled = base.clone();
        pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        match Engine::new(&pooled) {
            Ok(e) => return Ok((e, Allocation::Pooling)),
            Err(e) => tracing::warn!(
                target: "stockade::degradation",
                mechanism = "pooling-allocator",
                fallback = "on-demand",
                error = %e,
                "DEGRADED: the pooling allocator could not be set up"
            ),
        }
    }
    Ok((Engine::new(&base)?, Allocation::OnDemand))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send<T: Send>(_: &T) {}

    /// In-place reset only with `PAGEMAP_SCAN`, and only when asked for.
    #[test]
    fn slot_reset_table() {
        let madvise = SlotReset {
            keep_resident: 0,
            pagemap_scan: false,
        };
        for (kib, available, want) in [
            (0, true, madvise),
            (0, false, madvise),
            (2048, false, madvise),
            (
                2048,
                true,
                SlotReset {
                    keep_resident: 2 << 20,
                    pagemap_scan: true,
                },
            ),
            (
                1,
                true,
                SlotReset {
                    keep_resident: 1024,
                    pagemap_scan: true,
                },
            ),
        ] {
            assert_eq!(slot_reset(kib, available), want, "{kib} KiB, {available}");
        }
    }

    /// The embedded guest imports the Stockade interfaces and nothing else: no WASI
    /// (host/runtime/build.rs made std's into traps), so the runtime links none and each
    /// instance lowers only the guest's own imports.
    #[test]
    fn the_guest_imports_the_stockade_interfaces_alone() {
        let engine = Engine::default();
        let component = Component::new(&engine, EMBEDDED_GUEST).expect("the embedded guest");
        let imports: Vec<String> = component
            .component_type()
            .imports(&engine)
            .map(|(name, _)| name.to_owned())
            .collect();
        assert!(
            imports
                .iter()
                .any(|n| n.starts_with("stockade:sandbox/substrate@")),
            "{imports:?}"
        );
        for name in &imports {
            assert!(
                name.starts_with("stockade:sandbox/"),
                "the guest imports {name}"
            );
        }
    }

    /// No export of the embedded guest has a post-return function (host/runtime/build.rs
    /// drops the `cabi_post_*` exports): an instance answers one call and is then dropped
    /// whole, so freeing its answer inside it first was work thrown away, and each
    /// post-return cost every instance a function reference.
    #[test]
    fn the_guests_exports_have_no_post_return() {
        let mut lifts = 0;
        for f in canonical_functions() {
            if let wasmparser::CanonicalFunction::Lift { options, .. } = f {
                lifts += 1;
                assert!(
                    !options
                        .iter()
                        .any(|o| matches!(o, wasmparser::CanonicalOption::PostReturn(_))),
                    "a lift with a post-return: {options:?}"
                );
            }
        }
        assert!(
            lifts >= 13,
            "the facade and events exports are lifted ({lifts})"
        );
    }

    /// The guest lowers each function it imports once per instance, and an instance
    /// answers one call: it makes its substrate calls through `batch` alone (one lowered
    /// function, not sixteen; `guest/src/substrate.rs`). Its lowered imports: `batch`,
    /// the five `records` calls, the four `policy` calls, `now-ms` and `emit`.
    #[test]
    fn the_guest_lowers_one_substrate_function() {
        let lowers = canonical_functions()
            .iter()
            .filter(|f| matches!(f, wasmparser::CanonicalFunction::Lower { .. }))
            .count();
        assert_eq!(lowers, 1 + 5 + 4 + 1 + 1, "the guest's lowered imports");
    }

    /// The embedded guest's canonical functions (its lifted exports, lowered imports).
    fn canonical_functions() -> Vec<wasmparser::CanonicalFunction> {
        let mut out = Vec::new();
        for payload in wasmparser::Parser::new(0).parse_all(EMBEDDED_GUEST) {
            if let wasmparser::Payload::ComponentCanonicalSection(s) = payload.expect("parses") {
                out.extend(s.into_iter().map(|f| f.expect("reads")));
            }
        }
        out
    }

    /// Every facade and events function is found by index at start-up.
    #[test]
    fn every_export_is_found_once() {
        let engine = Engine::default();
        let component = Component::new(&engine, EMBEDDED_GUEST).expect("the embedded guest");
        let e = Exports::new(&component).expect("exports");
        let all = [
            e.exec,
            e.start_detached,
            e.detached_status,
            e.stop_detached,
            e.abort,
            e.checkpoint,
            e.denials,
            e.artifacts,
            e.read_artifact,
            e.expose,
            e.unexpose,
            e.previews,
            e.on_stop,
        ];
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len(), "two functions share an index");
    }

    /// The API runs each call on a multi-threaded runtime, so every facade method's
    /// future must be `Send`: a generic call over async closures can lose that, and
    /// this stops compiling when it does. Type-checked, never run.
    #[allow(dead_code)]
    fn every_facade_future_is_send(rt: Arc<Runtime>, input: ExecInput) {
        send(&rt.exec("k", &input));
        send(&rt.exec_with("k", &input, ExecIo::default()));
        send(&rt.start_detached("k", &input));
        send(&rt.detached_status("k", "id"));
        send(&rt.stop_detached("k", "id"));
        send(&rt.abort("k"));
        send(&rt.checkpoint("k"));
        send(&rt.denials("k"));
        send(&rt.artifacts("k"));
        send(&rt.read_artifact("k", "a", 0, 1));
        send(&rt.on_stop("c"));
        send(&rt.evict_if_idle("k", Duration::ZERO));
    }
}
