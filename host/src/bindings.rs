//! The single `bindgen!` for the Stockade world.
