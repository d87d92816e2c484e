//! Preview doors (DESIGN §8): the substrate's own inbound route into a port of a
//! container, as DESIGN §2.1 decided ("Inbound is not egress": the route is the
//! substrate's, the hostname is configuration, the token is random).
//!
//! * [`token`]: a door's token, 24 characters of `[a-z0-9]` from the OS CSPRNG (ring's
//!   `SystemRandom`), never the consumer's.
//! * [`doors`]: the table of open doors (token → container and port), its URLs, and
//!   its per-token rate bound; closing a container's doors is one call, made by the
//!   substrate when the container stops for any reason.
//! * [`route`]: the pure parse of an inbound request into a token and the path to
//!   forward (`/p/{token}/…`, or a strict `Host: {port}-{token}.{domain}`).
//! * [`rate`]: a token bucket per door.
//! * [`conns`]: the pool of connections no door has claimed yet (small, oldest evicted
//!   first), so a connection without a valid token holds little, briefly.
//! * [`server`]: the listener (`[preview]` in `wasmtime.toml`): HTTP/1.1 in, each
//!   request forwarded over a connection made from inside the container's network
//!   namespace to `127.0.0.1:{port}` (never via an address the host can see), upgrades
//!   (WebSocket, CDP) spliced. Every request is recorded (the audit ring and one
//!   `stockade::preview` line: time, token prefix, port, method, path, status).
//!
//! Inbound traffic never touches the egress fence: the door has no handle on the
//! container's proxy or its grant state. A closed, guessed or unknown token answers the
//! same 404 ([`server::not_found`]), byte for byte.

pub mod audit;
pub mod config;
pub mod conns;
pub mod doors;
pub mod rate;
pub mod route;
pub mod server;
pub mod token;

pub use audit::{Audit, AuditEntry};
pub use config::PreviewConfig;
pub use doors::{Door, Doors, Urls};
pub use server::{Connect, serve};

/// A door as the contract answers it (`preview`: port, token, url).
pub use crate::bindings::stockade::sandbox::types::Preview;
