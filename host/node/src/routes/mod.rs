//! The node's routes, one file per group of calls (docs/NODE.md "Calls"). [`crate::server`]
//! checks every request first (body bound, signature, key, idempotency); then a plain
//! call is the function this table names, which parses its body, checks the container
//! is the key's and answers JSON. The streamed calls answer NDJSON from their own
//! files: [`run`], [`batch`] and [`run_stream`] (the lines and heads they share:
//! [`streamed`]).

pub mod artifacts;
pub mod batch;
pub mod containers;
pub mod grants;
pub mod node_wide;
pub mod previews;
pub mod run;
pub mod run_stream;
pub mod streamed;

use axum::body::Bytes;

use crate::request::Refusal;
use crate::state::Node;
use stockade_node_protocol::call;

/// Steps 5 and on for every plain call (every call but `run`, `batch` and
/// `run-stream`): the answer's JSON (a substrate failure is an answer), or a refusal.
pub(crate) async fn dispatch(
    node: &Node,
    call: &str,
    key: &str,
    body: &[u8],
) -> Result<Bytes, Refusal> {
    match call {
        call::ENSURE => containers::ensure(node, key, body).await,
        call::CURRENT => containers::current(node, key, body).await,
        call::APPLY_GRANT => grants::apply(node, key, body).await,
        call::REVOKE_GRANT => grants::revoke(node, key, body).await,
        call::START_PROCESS => containers::start_process(node, key, body).await,
        call::LIST_PROCESSES => containers::list_processes(node, key, body).await,
        call::PROCESS_STATUS => containers::process_status(node, key, body).await,
        call::KILL_PROCESS => containers::kill_process(node, key, body).await,
        call::KILL_ALL => containers::kill_all(node, key, body).await,
        call::SNAPSHOT => containers::snapshot(node, key, body).await,
        call::STOP => containers::stop(node, key, body).await,
        call::SAVE_SNAPSHOT => containers::save_snapshot(node, key, body).await,
        call::FORK_SNAPSHOT => containers::fork_snapshot(node, key, body).await,
        call::DROP_SNAPSHOT => containers::drop_snapshot(node, key, body).await,
        call::DENIALS => artifacts::denials(node, key, body).await,
        call::ADMITTED => artifacts::admitted(node, key, body).await,
        call::LIST_ARTIFACTS => artifacts::list_artifacts(node, key, body).await,
        call::READ_ARTIFACT => artifacts::read_artifact(node, key, body).await,
        call::HEALTH => node_wide::health(node, key, body).await,
        call::IDLE => node_wide::idle(node, key, body).await,
        call::PUT_SECRET => node_wide::put_secret(node, key, body).await,
        call::REMOVE_SECRET => node_wide::remove_secret(node, key, body).await,
        call::PENDING => node_wide::pending(node, key, body).await,
        call::ANSWER_PENDING => node_wide::answer_pending(node, key, body).await,
        call::OPEN_GRANTS => node_wide::open_grants(node, key, body).await,
        call::OPEN_PREVIEW => previews::open(node, key, body).await,
        call::CLOSE_PREVIEW => previews::close(node, key, body).await,
        call::LIST_PREVIEWS => previews::list(node, key, body).await,
        other => Err(Refusal::invalid(format!("no call {other:?}"))),
    }
}
