//! The linux substrate: real containers on one machine (DESIGN §4).
