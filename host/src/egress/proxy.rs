//! The egress proxy.
