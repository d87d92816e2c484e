//! A fence's grant on the key's container: `apply-grant` and `revoke-grant`, alone or
//! in a batch, each with its lease ([`crate::lease`]).

use std::time::Duration;

use axum::body::Bytes;

use crate::lease::LeaseEvent;
use crate::request::{Refusal, answer, own, parse};
use crate::state::Node;
use stockade_node_protocol as protocol;
use stockade_runtime::substrate::SubstrateError;

/// `apply-grant`.
pub(crate) async fn apply(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::ApplyGrant = parse(body)?;
    own(node, &req.container, key)?;
    Ok(answer(apply_grant(node, &req).await))
}

/// `revoke-grant`.
pub(crate) async fn revoke(node: &Node, key: &str, body: &[u8]) -> Result<Bytes, Refusal> {
    let req: protocol::OnContainer = parse(body)?;
    own(node, &req.container, key)?;
    Ok(answer(revoke_grant(node, &req.container).await))
}

/// `apply-grant` (alone or in a batch): the grant parsed again, opened, leased.
pub(crate) async fn apply_grant(
    node: &Node,
    req: &protocol::ApplyGrant,
) -> stockade_runtime::substrate::Result<()> {
    let g = req.grant()?;
    // A front serializes a key's fences, so a run still going here is an earlier
    // fence's that its front could not tear down (a cut link, a front that died): a
    // new grant would reach that command too. Refused until the run ends (its timeout,
    // then the lease closes its fence). A run its own front just killed may take a
    // moment to be seen ending (the supervisor's report): that is waited for, briefly.
    if !node.leases.runs_ended(&req.container, RUN_END_WAIT).await {
        return Err(SubstrateError::Failed(
            "a run of an earlier fence is still going on this container: no new grant until it ends"
                .into(),
        ));
    }
    node.substrate
        .apply_grant(&req.container, &req.fence, g)
        .await?;
    node.leases.on(&req.container, LeaseEvent::Applied);
    Ok(())
}

/// How long an apply waits for a run still going on its container to be seen ending.
const RUN_END_WAIT: Duration = Duration::from_secs(2);

/// `revoke-grant` (alone or in a batch): closed, its lease with it.
pub(crate) async fn revoke_grant(
    node: &Node,
    container: &str,
) -> stockade_runtime::substrate::Result<protocol::Counts> {
    let r = node.substrate.revoke_grant(container).await;
    node.leases.on(container, LeaseEvent::Revoked);
    r.map(|c| protocol::Counts {
        admitted: c.admitted,
        denied: c.denied,
    })
}
