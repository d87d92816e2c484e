//! The guest's exports as the runtime calls them: found by index once, each call's
//! function looked up and type-checked alone.

use wasmtime::Store as WasmStore;
use wasmtime::component::{
    Component, ComponentExportIndex, ComponentNamedList, Instance, Lift, Lower,
};

use crate::imports::Ctx;

/// The guest's exported functions, by index, found once per runtime.
///
/// A call looks up and type-checks only the function it calls. bindgen's
/// `StockadePre::instantiate` would type-check all thirteen exports' signatures on
/// every instance (`StockadeIndices::load`: 12 % of an instance); the
/// check per call is the same check, of one function.
#[derive(Clone, Copy)]
pub(super) struct Exports {
    pub(super) exec: ComponentExportIndex,
    pub(super) start_detached: ComponentExportIndex,
    pub(super) detached_status: ComponentExportIndex,
    pub(super) stop_detached: ComponentExportIndex,
    pub(super) ensure: ComponentExportIndex,
    pub(super) abort: ComponentExportIndex,
    pub(super) checkpoint: ComponentExportIndex,
    pub(super) save_snapshot: ComponentExportIndex,
    pub(super) fork: ComponentExportIndex,
    pub(super) snapshots: ComponentExportIndex,
    pub(super) delete_snapshot: ComponentExportIndex,
    pub(super) set_lifetime: ComponentExportIndex,
    pub(super) set_metadata: ComponentExportIndex,
    pub(super) set_network: ComponentExportIndex,
    pub(super) describe: ComponentExportIndex,
    pub(super) sandboxes: ComponentExportIndex,
    pub(super) forget: ComponentExportIndex,
    pub(super) expiring: ComponentExportIndex,
    pub(super) end_lifetime: ComponentExportIndex,
    pub(super) denials: ComponentExportIndex,
    pub(super) artifacts: ComponentExportIndex,
    pub(super) read_artifact: ComponentExportIndex,
    pub(super) expose: ComponentExportIndex,
    pub(super) unexpose: ComponentExportIndex,
    pub(super) previews: ComponentExportIndex,
    pub(super) on_stop: ComponentExportIndex,
}

impl Exports {
    /// The indices of `component`'s `facade` and `events` functions (whatever the
    /// package's version: the WIT names it once).
    pub(super) fn new(component: &Component) -> wasmtime::Result<Self> {
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
            ensure: func(&facade, "ensure")?,
            abort: func(&facade, "abort")?,
            checkpoint: func(&facade, "checkpoint")?,
            save_snapshot: func(&facade, "save-snapshot")?,
            fork: func(&facade, "fork")?,
            snapshots: func(&facade, "snapshots")?,
            delete_snapshot: func(&facade, "delete-snapshot")?,
            set_lifetime: func(&facade, "set-lifetime")?,
            set_metadata: func(&facade, "set-metadata")?,
            set_network: func(&facade, "set-network")?,
            describe: func(&facade, "describe")?,
            sandboxes: func(&facade, "sandboxes")?,
            forget: func(&facade, "forget")?,
            expiring: func(&events, "expiring")?,
            end_lifetime: func(&events, "end-lifetime")?,
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
pub(super) async fn invoke<P, R>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bindings::EMBEDDED_GUEST;
    use wasmtime::Engine;

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
            e.ensure,
            e.abort,
            e.checkpoint,
            e.save_snapshot,
            e.fork,
            e.snapshots,
            e.delete_snapshot,
            e.set_lifetime,
            e.set_metadata,
            e.set_network,
            e.describe,
            e.sandboxes,
            e.forget,
            e.expiring,
            e.end_lifetime,
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
}
