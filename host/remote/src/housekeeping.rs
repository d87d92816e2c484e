//! The remote substrate's [`Housekeeping`]: the nodes asked for what the front's
//! runtime needs of its substrate (idle keys, open grants, pending egress decisions,
//! the egress audit), secrets handed to every node, and the shutdown (the crate's
//! docs say what it keeps).

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::broadcast;

use super::client::NodeClient;
use super::{Remote, answered};
use stockade_egress::ask::{Answer, AnswerError, Pending};
use stockade_node_protocol::{self as protocol, call};
use stockade_runtime::substrate::{
    ContainerId, Denial, Event, Housekeeping, Result, SubstrateError,
};

#[async_trait]
impl Housekeeping for Remote {
    fn kind(&self) -> &'static str {
        "remote"
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    async fn idle(&self, idle_for: Duration) -> Vec<String> {
        let body = protocol::Idle {
            idle_for_ms: idle_for.as_millis() as u64,
        };
        let asks = self.shared.nodes.iter().map(|n| {
            let body = body.clone();
            async move {
                (
                    n.name(),
                    n.call::<_, Vec<String>>(call::IDLE, "", &body).await,
                )
            }
        });
        let mut out = BTreeSet::new();
        for (node, r) in futures_util::future::join_all(asks).await {
            match r {
                Ok(keys) => out.extend(keys),
                Err(e) => {
                    tracing::warn!(target: "stockade::remote", node, error = %e, "idle not asked")
                }
            }
        }
        out.into_iter().collect()
    }

    fn open_grants(&self) -> Vec<ContainerId> {
        self.shared.grants_lock().iter().cloned().collect()
    }

    /// A key's: its node's, keyed (a key not placed has none). Every key's: every
    /// node's, node-wide, oldest first; a node that cannot be asked fails the list
    /// (a list without its decisions would look complete).
    async fn pending(&self, key: Option<&str>) -> Result<Vec<Pending>> {
        if let Some(key) = key {
            let Some(i) = self.placed(key)? else {
                return Ok(Vec::new());
            };
            return self.shared.nodes[i]
                .call(call::PENDING, key, &protocol::Empty {})
                .await;
        }
        let lists = self
            .shared
            .nodes
            .iter()
            .map(|n| n.call::<_, Vec<Pending>>(call::PENDING, "", &protocol::Empty {}));
        let mut all = Vec::new();
        for list in futures_util::future::join_all(lists).await {
            all.extend(list?);
        }
        all.sort_by(|a, b| a.at_ms.cmp(&b.at_ms).then_with(|| a.id.cmp(&b.id)));
        Ok(all)
    }

    /// Asked of every node (keyed: of the key's node only); [`answered`] reads their
    /// answers as one.
    async fn answer_pending(
        &self,
        id: &str,
        of: Option<&str>,
        answer: Answer,
    ) -> Result<std::result::Result<Pending, AnswerError>> {
        let body = protocol::AnswerPending {
            id: id.to_owned(),
            decision: match answer {
                Answer::Approve => stockade_wire::Verdict::Approve,
                Answer::Refuse => stockade_wire::Verdict::Refuse,
            },
        };
        let nodes: Vec<&NodeClient> = match of {
            Some(key) => match self.placed(key)? {
                Some(i) => vec![&self.shared.nodes[i]],
                None => Vec::new(),
            },
            None => self.shared.nodes.iter().collect(),
        };
        let key = of.unwrap_or("");
        let asks = nodes
            .iter()
            .map(|n| n.call::<_, protocol::PendingAnswer>(call::ANSWER_PENDING, key, &body));
        let answers = futures_util::future::join_all(asks).await;
        for (n, a) in nodes.iter().zip(&answers) {
            if let Err(e) = a {
                tracing::warn!(target: "stockade::remote", node = n.name(), id, error = %e, "a node was not asked to answer an egress decision");
            }
        }
        answered(id, answers)
    }

    async fn shutdown(&self) {
        // The containers of this front's keys the nodes hold: the ones it knows, and
        // the keys placed here that a node reports live.
        let mut stop: Vec<(usize, String)> = self
            .shared
            .containers_lock()
            .values()
            .map(|k| (k.node, k.key.clone()))
            .collect();
        for key in self.idle(Duration::ZERO).await {
            if let Ok(Some(i)) = self.placed(&key) {
                stop.push((i, key));
            }
        }
        stop.sort();
        stop.dedup();
        let stops = stop.into_iter().map(|(i, key)| async move {
            let node = &self.shared.nodes[i];
            let r = async {
                if let Some(id) = node.call::<_, Option<String>>(call::CURRENT, &key, &protocol::Empty {}).await? {
                    node.call::<_, ()>(call::STOP, &key, &protocol::OnContainer { container: id })
                        .await?;
                }
                Ok::<_, SubstrateError>(())
            }
            .await;
            if let Err(e) = r {
                tracing::warn!(target: "stockade::remote", node = node.name(), %key, error = %e, "container not stopped at shutdown");
            }
        });
        futures_util::future::join_all(stops).await;
        self.shared.containers_lock().clear();
    }

    async fn secret_set(
        &self,
        name: &str,
        value: &str,
        binding: &stockade_grammar::binding::Binding,
    ) {
        let body = protocol::PutSecret {
            name: name.to_owned(),
            value: value.to_owned(),
            host: binding.host.clone(),
            port: binding.port,
            methods: binding.methods.clone(),
            path_prefix: binding.path_prefix.clone(),
        };
        let puts = self
            .shared
            .nodes
            .iter()
            .map(|n| async { (n.name(), n.call::<_, ()>(call::PUT_SECRET, "", &body).await) });
        for (node, r) in futures_util::future::join_all(puts).await {
            match r {
                Ok(()) => {
                    tracing::info!(target: "stockade::remote", node, secret = name, "secret handed to the node")
                }
                Err(e) => {
                    tracing::warn!(target: "stockade::remote", node, secret = name, error = %e, "a node missed a secret")
                }
            }
        }
    }

    async fn egress_audit(
        &self,
        key: &str,
    ) -> Option<Result<(Vec<stockade_egress::audit::Admitted>, Vec<Denial>)>> {
        let audit = async {
            let Some(i) = self.placed(key)? else {
                return Ok((Vec::new(), Vec::new()));
            };
            let node = &self.shared.nodes[i];
            let (admitted, denied) = tokio::join!(
                node.call(call::ADMITTED, key, &protocol::Empty {}),
                node.call(call::DENIALS, key, &protocol::Empty {})
            );
            Ok((admitted?, denied?))
        };
        Some(audit.await)
    }

    async fn secret_removed(&self, name: &str) {
        let body = protocol::RemoveSecret {
            name: name.to_owned(),
        };
        let removes = self.shared.nodes.iter().map(|n| async {
            (
                n.name(),
                n.call::<_, bool>(call::REMOVE_SECRET, "", &body).await,
            )
        });
        for (node, r) in futures_util::future::join_all(removes).await {
            match r {
                Ok(_) => {
                    tracing::info!(target: "stockade::remote", node, secret = name, "secret removed from the node")
                }
                Err(e) => {
                    tracing::warn!(target: "stockade::remote", node, secret = name, error = %e, "a node missed a secret's removal")
                }
            }
        }
    }
}
