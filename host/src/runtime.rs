//! The Worker-style runtime.
