//! What abort, checkpoint and on-stop clear (invariant 8): every declaration of the
//! container. A record that outlived its process spares nothing and would pin every
//! later teardown to the selective path.

use crate::stockade::sandbox::substrate::SubstrateError;

/// Which step of abort/checkpoint is being judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Checkpoint's snapshot of `/workspace`.
    Snapshot,
    /// Stopping the container.
    Stop,
}

/// What to do after a lifecycle step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Go on (to the stop, or to clearing the records).
    Continue,
    /// The container is already gone: clear its records and report success.
    ClearAndSucceed,
    /// Stop here with this error; the container (and its records) stay as they are.
    Fail(String),
}

/// What abort or checkpoint does, given whether the key has a live container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No live container: nothing to stop or snapshot; only the key's stale
    /// declarations are forgotten.
    ForgetStale,
    /// Run these steps on the live container, then clear its declarations (and the
    /// key's stale ones).
    Steps(&'static [Step]),
}

/// Abort (`snapshot` false) or checkpoint (`snapshot` true): snapshot first, so a
/// failed snapshot stops nothing; a key with no live container has nothing to lose.
pub fn plan(has_container: bool, snapshot: bool) -> Plan {
    match (has_container, snapshot) {
        (false, _) => Plan::ForgetStale,
        (true, false) => Plan::Steps(&[Step::Stop]),
        (true, true) => Plan::Steps(&[Step::Snapshot, Step::Stop]),
    }
}

/// Judge one step's result.
///
/// A failed snapshot stops the checkpoint before the container is stopped, so no
/// work is lost. A stop that fails leaves the container (and its processes) alive,
/// so the records stay true and are kept. An unreachable container is already gone:
/// its records are cleared.
pub fn after(step: Step, result: &Result<(), SubstrateError>) -> Next {
    match (step, result) {
        (_, Ok(())) => Next::Continue,
        (_, Err(SubstrateError::Unreachable(_))) => Next::ClearAndSucceed,
        (Step::Snapshot, Err(e)) => Next::Fail(format!("snapshot failed, nothing stopped: {e:?}")),
        (Step::Stop, Err(e)) => Next::Fail(format!("stop failed, the container still runs: {e:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abort_and_checkpoint_plans() {
        let rows = [
            (
                "abort without a live container only forgets stale declarations",
                false,
                false,
                Plan::ForgetStale,
            ),
            (
                "checkpoint without a live container has nothing to snapshot",
                false,
                true,
                Plan::ForgetStale,
            ),
            (
                "abort stops the container",
                true,
                false,
                Plan::Steps(&[Step::Stop]),
            ),
            (
                "checkpoint snapshots before it stops",
                true,
                true,
                Plan::Steps(&[Step::Snapshot, Step::Stop]),
            ),
        ];
        for (what, has, snapshot, want) in rows {
            assert_eq!(plan(has, snapshot), want, "{what}");
        }
    }

    #[test]
    fn lifecycle_rows() {
        let unreachable = Err(SubstrateError::Unreachable("gone".into()));
        let failed = Err(SubstrateError::Failed("io".into()));
        let rows = [
            (
                "a snapshot that worked goes on to the stop",
                Step::Snapshot,
                Ok(()),
                Next::Continue,
            ),
            (
                "a stop that worked goes on to clear",
                Step::Stop,
                Ok(()),
                Next::Continue,
            ),
            (
                "an unreachable container is cleared",
                Step::Stop,
                unreachable.clone(),
                Next::ClearAndSucceed,
            ),
            (
                "an unreachable container has nothing to snapshot",
                Step::Snapshot,
                unreachable,
                Next::ClearAndSucceed,
            ),
        ];
        for (what, step, result, next) in rows {
            assert_eq!(after(step, &result), next, "{what}");
        }
        assert!(
            matches!(after(Step::Snapshot, &failed), Next::Fail(_)),
            "a failed snapshot stops nothing"
        );
        assert!(
            matches!(after(Step::Stop, &failed), Next::Fail(_)),
            "a failed stop keeps the records"
        );
    }
}
