//! SIGTERM and SIGINT, caught from the moment they are installed (`stockade serve` and
//! `stockade node` both wait on them): a signal that arrives before anyone waits is
//! kept, not lost.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGTERM and SIGINT, their default actions replaced.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Replace the default actions of SIGTERM and SIGINT.
    pub fn install() -> std::io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next SIGTERM or SIGINT (at once if one came since `install`).
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {},
            _ = self.int.recv() => {},
        }
    }
}
