//! A container's egress wiring: its fence, and the proxy that serves the listener in
//! its network namespace (DESIGN §5). Built when a container is given to a key (the
//! fence names the key), stopped when the container is torn down.
//!
//! Who holds a connection comes from the container's TCP table and its trees'
//! cgroups ([`super::attribution`]). With it, an open grant is the fenced run's alone
//! (a detached process is denied `detached`) and credentials go only to its
//! connections; without it (no cgroup-mode trees, or no Landlock to keep trees out of
//! each other: a degradation `doctor` lists and `require = ["attribution"]` refuses)
//! the grant is shared as DESIGN §2.1 allows and credentials are never added.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use stockade_egress::tls::Authority;
use stockade_egress::{self as egress, DenialSink, Fence, Interception, ProxyOptions};

use super::cgroup::CgroupDir;

/// What a container's proxy is built from (beyond its listener).
pub(super) struct Plan<'a> {
    /// The key and the container.
    pub key: &'a str,
    pub container: &'a str,
    /// The supervisor's pid (the attribution reads its TCP table).
    pub supervisor_pid: i32,
    /// The containers' cgroup root, in cgroup mode.
    pub cgroup_root: Option<&'a CgroupDir>,
    /// The container's CA and the upstream verification, when interception is on.
    pub authority: Option<Arc<Authority>>,
    pub upstream_tls: Option<&'a Arc<rustls::ClientConfig>>,
    /// `egress.allow_private_targets`.
    pub allow_private_targets: bool,
    /// Where denials are recorded.
    pub sink: Arc<dyn DenialSink>,
    /// Where an `ask` grant holds requests for the approver (DESIGN §5).
    pub asks: Arc<egress::ask::Asks>,
    /// The container's CPU limit (`substrate.limits.cpus`, 0: none): its proxy's
    /// handshakes and CONNECTs are budgeted in proportion (`egress::budget`).
    pub cpus: f64,
}

/// A container's fence and its proxy.
pub(super) struct Wiring {
    /// The fence the guest opens and closes.
    pub fence: Fence,
    proxy: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Wiring {
    /// Serve `listener` behind a fresh, closed fence for the plan's key.
    pub fn start(listener: TcpListener, plan: Plan<'_>) -> Self {
        let fence = Fence::new(plan.key, plan.container);
        fence.set_asks(plan.asks.clone());
        let attribution = match plan.cgroup_root {
            Some(root) if super::exec::landlock_abi() >= 1 => {
                let tracer = root.open_child(plan.container).and_then(|cgroup| {
                    super::attribution::Tracer::new(plan.supervisor_pid, Some(cgroup))
                });
                match tracer {
                    Ok(t) => Some(Arc::new(t) as Arc<dyn egress::Attribution>),
                    Err(e) => {
                        tracing::warn!(target: "stockade::substrate", container = plan.container, error = %e, "connections cannot be attributed: the fence's grant is shared with detached processes, credentials will not be added");
                        None
                    }
                }
            }
            _ => None,
        };
        let tls = match (plan.authority, plan.upstream_tls) {
            (Some(authority), Some(upstream)) => Some(Interception {
                authority,
                upstream: upstream.clone(),
                attribution: None,
            }),
            _ => None,
        };
        let opts = ProxyOptions {
            allow_private_targets: plan.allow_private_targets,
            max_connections: egress::MAX_CONNECTIONS,
        };
        // On the egress threads, below the API's priority (`egress::threads`).
        let threads = egress::threads::handle();
        let proxy = {
            let _on_egress_threads = threads.enter();
            // The TLS work the server does for the container, outside its CPU limit,
            // is in proportion to that limit.
            let machine = std::thread::available_parallelism().map_or(1, |n| n.get());
            let limits = egress::budget::Limits::for_cpus(plan.cpus, machine);
            let budget = egress::budget::Budget::new(limits);
            egress::serve_with(
                listener,
                fence.clone(),
                opts,
                plan.sink,
                tls,
                attribution,
                budget,
            )
        };
        Self {
            fence,
            proxy: Mutex::new(Some(proxy)),
        }
    }

    /// Stop serving and close the fence (the container is going).
    pub fn stop(&self) {
        if let Some(p) = self.proxy.lock().unwrap_or_else(|p| p.into_inner()).take() {
            p.abort();
        }
        self.fence.revoke();
    }
}
