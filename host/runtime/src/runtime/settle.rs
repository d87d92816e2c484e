//! The end of every guest call: what it left running or open is torn down and revoked
//! (invariant 1), and its result mapped.

use wasmtime::Store as WasmStore;

use super::{CallError, GuestResult, Runtime};
use crate::imports::{Ctx, FenceState};

impl Runtime {
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
    pub(super) async fn settle<T>(
        &self,
        mut store: WasmStore<Ctx>,
        result: GuestResult<T>,
    ) -> Result<T, CallError> {
        let started = store.data_mut().take_started_processes();
        if result.is_err() {
            self.kill_started(started).await;
        }
        for (container, state) in self.open_fences(store.data_mut()).await {
            self.close_fence(&container, state).await;
        }
        answer(result)
    }

    /// A trapped call returned no id: what it started is nobody's. Killed before any
    /// open fence is revoked ([`Runtime::close_fence`]).
    async fn kill_started(&self, started: Vec<(String, String)>) {
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

    /// The fences the call left open, and how far each got.
    async fn open_fences(&self, ctx: &mut Ctx) -> Vec<(String, FenceState)> {
        let mut open = ctx.take_open_fences();
        // A batch that opened with its key's ensure and did not answer: the fence, if
        // it opened, is on the key's current container (none: no grant is open).
        for key in ctx.take_unresolved_fences() {
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
        open
    }

    /// Teardown, then revoke; after an apply that failed, only the revoke.
    async fn close_fence(&self, container: &str, state: FenceState) {
        if state == FenceState::ApplyFailed {
            let r = self.substrate.revoke_grant(container).await;
            tracing::info!(
                target: "stockade::runtime",
                container = %container,
                revoked = r.is_ok(),
                "a failed apply opened nothing: revoked, nothing killed"
            );
            return;
        }
        let killed = self.substrate.kill_all(container).await;
        let r = self.substrate.revoke_grant(container).await;
        tracing::warn!(
            target: "stockade::runtime",
            container = %container,
            killed = ?killed,
            revoked = r.is_ok(),
            "host tore down and revoked a fence the call left open"
        );
    }
}

/// The guest's answer as the caller's: its typed error, or the trap.
fn answer<T>(result: GuestResult<T>) -> Result<T, CallError> {
    match result {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(CallError::Facade(e)),
        Err(trap) => {
            tracing::error!(target: "stockade::runtime", error = %format!("{trap:#}"), "guest trapped");
            Err(CallError::Trap(format!("{trap:#}")))
        }
    }
}
