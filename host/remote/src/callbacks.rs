//! A node's call backs (`POST /v1/nodes/events`, docs/NODE.md): verified as signed by
//! a configured node, once, then turned into the guest's events.

use std::sync::{Arc, Mutex};

use super::{Shared, front_id};
use stockade_node_protocol::{self as protocol, auth};
use stockade_runtime::substrate::Event;

/// Why a node's call back was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallbackRefused {
    /// Not signed by a configured node (unknown node, bad signature, time, replay): 401.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// Signed, but the body is not a [`protocol::NodeEvent`] of that node: 400.
    #[error("invalid: {0}")]
    Invalid(String),
}

/// The signing headers of a call back, as received.
#[derive(Debug, Clone, Copy)]
pub struct CallbackHeaders<'a> {
    /// `x-stockade-node`.
    pub node: &'a str,
    /// `x-stockade-time`.
    pub time: &'a str,
    /// `x-stockade-nonce`.
    pub nonce: &'a str,
    /// `x-stockade-key`.
    pub key: &'a str,
    /// `x-stockade-idempotency` ("" when absent).
    pub idempotency: &'a str,
    /// `x-stockade-signature`.
    pub signature: &'a str,
}

/// Verifies a node's call backs (`POST /v1/nodes/events`) and turns them into events.
pub struct Callbacks {
    pub(super) shared: Arc<Shared>,
    pub(super) nonces: Mutex<auth::Nonces>,
}

impl Callbacks {
    /// Verify a call back and, if it is a node's, send the guest's event; the event.
    /// Nothing changes on a refusal.
    pub fn accept(
        &self,
        h: &CallbackHeaders<'_>,
        body: &[u8],
        now_ms: u64,
    ) -> std::result::Result<Event, CallbackRefused> {
        let unauth = |why: String| CallbackRefused::Unauthenticated(why);
        let Some(node) = self.shared.nodes.iter().position(|n| n.name() == h.node) else {
            return Err(unauth(format!("unknown node {:?}", h.node)));
        };
        let time_ms: u64 = h
            .time
            .parse()
            .map_err(|_| unauth(auth::Refused::Malformed.to_string()))?;
        let signed = auth::Signed {
            time_ms,
            nonce: h.nonce,
            method: "POST",
            path: protocol::EVENTS_PATH,
            key: h.key,
            idempotency: h.idempotency,
            body,
        };
        auth::verify(
            &signed,
            h.signature,
            self.shared.nodes[node].secret(),
            now_ms,
        )
        .map_err(|e| unauth(e.to_string()))?;
        self.nonces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .accept(h.nonce, now_ms)
            .map_err(|e| unauth(e.to_string()))?;
        let ev: protocol::NodeEvent = serde_json::from_slice(body)
            .map_err(|e| CallbackRefused::Invalid(format!("the body: {e}")))?;
        if ev.node != h.node {
            return Err(CallbackRefused::Invalid(format!(
                "an event of node {:?} signed by node {:?}",
                ev.node, h.node
            )));
        }
        let fid = front_id(h.node, &ev.stopped);
        if let Some(k) = self.shared.containers_lock().get(&fid)
            && k.key != h.key
        {
            return Err(CallbackRefused::Invalid(format!(
                "container {fid} is not of the key that signed"
            )));
        }
        self.shared.forget(&fid);
        let event = Event::Stopped(fid);
        let _ = self.shared.events.send(event.clone());
        Ok(event)
    }
}
