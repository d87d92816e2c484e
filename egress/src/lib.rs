//! The egress fence: allow rules ([`rules`]) and the proxy that enforces them
//! ([`proxy`]). The proxy knows nothing of containers beyond "which grant is open for
//! this listener".
//!
//! What it needs from above comes in through traits, so the arrows point down (this
//! crate depends on the grammar and libraries, never on the host): who holds a
//! connection ([`proxy::Attribution`], the linux substrate's `/proc` reading), where
//! denials and the audit go ([`proxy::DenialSink`], the records store), and where
//! secrets set through the API are kept ([`secrets::SecretStore`], the records store).

#![deny(missing_docs)]

pub mod audit;
pub mod bounded;
pub mod budget;
pub mod config;
pub mod proxy;
pub mod rules;
pub mod secrets;
pub mod threads;
pub mod tls;

#[cfg(test)]
mod intercept_tests;
