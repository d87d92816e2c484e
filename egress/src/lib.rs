//! The egress fence: allow rules ([`rules`]) and the proxy that enforces them. The
//! proxy knows nothing of containers beyond "which grant is open for this listener".
//!
//! The linux substrate opens one listener per container inside the container's network
//! namespace (`127.0.0.1:3128`) and calls [`serve`] from the host namespace, so the
//! proxy resolves and connects from the host. Every request on every connection is
//! decided by [`rules::decide`] against the grant open *at that moment* ([`Fence`]); an
//! admitted request or tunnel is raced against the revocation of the grant that
//! admitted it, so revoking a fence cuts off what it let through. Each decision
//! produces exactly one `CANONICAL-EGRESS-DECISION` log line (target `stockade::egress`).
//!
//! What it needs from above comes in through traits, so the arrows point down (this
//! crate depends on the grammar and libraries, never on the host): who holds a
//! connection ([`Attribution`], the linux substrate's `/proc` reading), where denials
//! and the audit go ([`DenialSink`], the records store), and where secrets set through
//! the API are kept ([`secrets::SecretStore`], the records store).
//!
//! A request's way through the modules: `accept` takes the connection, `h1` (or `h2`
//! inside an intercepted tunnel) reads requests, `conn` decides each, `forward` sends
//! an admitted one through `upstream` in the proxy's own `framing`, streaming `body`s
//! counted by the `audit`; a CONNECT goes to `tunnel` (blind, or intercepted with
//! [`tls`]). `answer` holds the proxy's own answers, [`budget`] what one container may
//! spend of the server.

#![deny(missing_docs)]

pub mod ask;
pub mod audit;
pub mod bounded;
pub mod budget;
pub mod config;
pub mod rules;
pub mod secrets;
pub mod threads;
pub mod tls;

mod accept;
mod answer;
mod body;
mod conn;
mod fence;
mod forward;
mod framing;
mod h1;
mod h2;
mod record;
mod shared;
mod tunnel;
mod upstream;

#[cfg(test)]
mod tests;

pub use accept::{serve, serve_with};
pub use answer::{DENIAL_HEADER, LIMIT_HEADER, UPSTREAM_ERROR_HEADER};
pub use audit::{Admitted, Denial, DenialSink};
pub use fence::{Fence, FenceCounts, TornDown};
pub use shared::{Attribution, Interception, MAX_CONNECTIONS, ProxyOptions};
pub use upstream::UpstreamError;
