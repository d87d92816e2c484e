//! The mock substrate.
