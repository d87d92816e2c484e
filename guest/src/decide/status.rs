//! What a detached-status answer is, and what stop does after its kill
//! (docs/DESIGN.md §3, invariant 5: a key cannot name a process it did not start).

use crate::stockade::sandbox::substrate::{ProcessInfo, SubstrateError};
use crate::stockade::sandbox::types::{DetachedState, GoneReason};

/// What happens to records after an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Records {
    /// Keep them.
    Keep,
    /// Forget this one declaration.
    Forget,
    /// The container is gone: forget every declaration of it.
    ClearContainer,
}

/// The answer to `detached-status`, or an error for a substrate that failed outright.
///
/// `declared` is whether this key declared the id; `tombstone` the reason this key
/// kept when it cleared the id's declaration (a gone reason holds on every poll);
/// `lookup` is the substrate's answer about it (never asked when the key did not
/// declare it, so another key's id is `gone(unknown)`, not that process's status).
pub fn answer(
    declared: bool,
    tombstone: Option<GoneReason>,
    lookup: Option<Result<Option<ProcessInfo>, SubstrateError>>,
) -> Result<(DetachedState, Records), String> {
    if !declared {
        let reason = tombstone.unwrap_or(GoneReason::Unknown);
        return Ok((DetachedState::Gone(reason), Records::Keep));
    }
    match lookup {
        None => Ok((DetachedState::Gone(GoneReason::Unknown), Records::Keep)),
        Some(Ok(Some(p))) if p.running => Ok((DetachedState::Running, Records::Keep)),
        Some(Ok(Some(p))) => Ok((
            DetachedState::Exited(p.exit_code.unwrap_or(-1)),
            Records::Keep,
        )),
        Some(Ok(None)) => Ok((DetachedState::Gone(GoneReason::NotTracked), Records::Forget)),
        Some(Err(SubstrateError::Unreachable(_))) => Ok((
            DetachedState::Gone(GoneReason::ContainerUnreachable),
            Records::ClearContainer,
        )),
        Some(Err(e)) => Err(format!("status lookup failed: {e:?}")),
    }
}

/// After stop's kill: forget the declaration when the process is dead or its
/// container unreachable; keep it (and report the failure) when the kill failed and
/// the process may still be alive.
pub fn after_stop_kill(kill: &Result<u32, SubstrateError>) -> Result<Records, String> {
    match kill {
        Ok(_) => Ok(Records::Forget),
        Err(SubstrateError::Unreachable(_)) => Ok(Records::ClearContainer),
        Err(e) => Err(format!("kill failed, the process may still run: {e:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(running: bool, code: Option<i32>) -> ProcessInfo {
        ProcessInfo {
            id: "id".into(),
            running,
            exit_code: code,
        }
    }

    #[test]
    fn status_rows() {
        type Row = (
            &'static str,
            bool,
            Option<GoneReason>,
            Option<Result<Option<ProcessInfo>, SubstrateError>>,
            Result<(DetachedState, Records), ()>,
        );
        let rows: Vec<Row> = vec![
            (
                "an id this key never started (or stopped itself) is gone(unknown), no lookup",
                false,
                None,
                None,
                Ok((DetachedState::Gone(GoneReason::Unknown), Records::Keep)),
            ),
            (
                "a cleared id reads its tombstone's reason on every later poll",
                false,
                Some(GoneReason::ContainerUnreachable),
                None,
                Ok((
                    DetachedState::Gone(GoneReason::ContainerUnreachable),
                    Records::Keep,
                )),
            ),
            (
                "a process the container lost stays not-tracked after the first poll",
                false,
                Some(GoneReason::NotTracked),
                None,
                Ok((DetachedState::Gone(GoneReason::NotTracked), Records::Keep)),
            ),
            (
                "a live tree is running",
                true,
                None,
                Some(Ok(Some(info(true, None)))),
                Ok((DetachedState::Running, Records::Keep)),
            ),
            (
                "an exited leader reports its code, the record is kept",
                true,
                None,
                Some(Ok(Some(info(false, Some(3))))),
                Ok((DetachedState::Exited(3), Records::Keep)),
            ),
            (
                "a process the container no longer tracks is gone(not-tracked)",
                true,
                None,
                Some(Ok(None)),
                Ok((DetachedState::Gone(GoneReason::NotTracked), Records::Forget)),
            ),
            (
                "an unreachable container is gone(container-unreachable) and cleared",
                true,
                None,
                Some(Err(SubstrateError::Unreachable("stopped".into()))),
                Ok((
                    DetachedState::Gone(GoneReason::ContainerUnreachable),
                    Records::ClearContainer,
                )),
            ),
            (
                "a failing substrate is an error, not a guess",
                true,
                None,
                Some(Err(SubstrateError::Failed("io".into()))),
                Err(()),
            ),
        ];
        for (what, declared, tombstone, lookup, want) in rows {
            let got = answer(declared, tombstone, lookup).map_err(|_| ());
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn stop_rows() {
        assert_eq!(
            after_stop_kill(&Ok(2)),
            Ok(Records::Forget),
            "killed: forget"
        );
        assert_eq!(
            after_stop_kill(&Err(SubstrateError::Unreachable("x".into()))),
            Ok(Records::ClearContainer),
            "container gone: the process is gone with it"
        );
        assert!(
            after_stop_kill(&Err(SubstrateError::Failed("x".into()))).is_err(),
            "a failed kill keeps the record"
        );
    }
}
