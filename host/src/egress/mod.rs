//! The egress fence: allow rules ([`rules`]) and the proxy that enforces them
//! ([`proxy`]). The proxy knows nothing of containers beyond "which grant is open for
//! this listener".

pub mod audit;
pub mod bounded;
pub mod budget;
pub mod proxy;
pub mod rules;
pub mod secrets;
pub mod threads;
pub mod tls;

#[cfg(test)]
mod intercept_tests;
