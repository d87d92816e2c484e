//! The substrate's calls as the guest makes them: each one alone is a `batch` of one
//! call. The component then imports one substrate function instead of sixteen, and an
//! instance, made for every facade call, lowers one (each lowered import is work at
//! every instantiation; docs/BENCHMARKS.md). A batch of one has the named call's
//! effects and errors (the WIT `batch`); [`one`] reads its answer back, and an
//! answer of another call's kind is a `failed`, which the guest acts on as on any
//! failed call.

use crate::decide::batch::one;
pub use crate::stockade::sandbox::substrate::batch;
use crate::stockade::sandbox::substrate::{
    self as wit, Call, CallAnswer, Command, DropSnapshotCall, FenceCounts, ForkSnapshotCall,
    PreviewCall, ProcessCall, ProcessInfo, ReadArtifactCall, SaveSnapshotCall, StartProcessCall,
    SubstrateError, Target,
};
use crate::stockade::sandbox::types::{Artifact, Denial, Preview};

type R<T> = Result<T, SubstrateError>;

/// Make one call and take its answer's value, if the answer is the call's kind.
fn make<T>(call: Call, value: impl FnOnce(CallAnswer) -> Option<T>) -> R<T> {
    let answer = one(wit::batch(std::slice::from_ref(&call)))?;
    value(answer).ok_or_else(|| {
        SubstrateError::Failed("the substrate answered a call with another call's answer".into())
    })
}

/// The value of an answer of this kind (the closure [`make`] takes).
macro_rules! answer {
    ($kind:ident) => {
        |a| match a {
            CallAnswer::$kind(v) => Some(v),
            _ => None,
        }
    };
    ($kind:ident, unit) => {
        |a| match a {
            CallAnswer::$kind => Some(()),
            _ => None,
        }
    };
}

fn on(container: &str) -> Target {
    Target::Container(container.to_owned())
}

/// `ensure`.
pub fn ensure(key: &str) -> R<String> {
    make(Call::Ensure(key.to_owned()), answer!(Ensure))
}

/// `current`.
pub fn current(key: &str) -> R<Option<String>> {
    make(Call::Current(key.to_owned()), answer!(Current))
}

/// `revoke-grant`.
pub fn revoke_grant(container: &str) -> R<FenceCounts> {
    make(Call::RevokeGrant(on(container)), answer!(RevokeGrant))
}

/// `start-process`.
pub fn start_process(container: &str, cmd: Command) -> R<String> {
    let call = Call::StartProcess(StartProcessCall {
        container: on(container),
        cmd,
    });
    make(call, answer!(StartProcess))
}

/// `list-processes`.
pub fn list_processes(container: &str) -> R<Vec<ProcessInfo>> {
    make(Call::ListProcesses(on(container)), answer!(ListProcesses))
}

fn process(container: &str, id: &str) -> ProcessCall {
    ProcessCall {
        container: on(container),
        id: id.to_owned(),
    }
}

/// `process-status`.
pub fn process_status(container: &str, id: &str) -> R<Option<ProcessInfo>> {
    let call = Call::ProcessStatus(process(container, id));
    make(call, answer!(ProcessStatus))
}

/// `kill-process`.
pub fn kill_process(container: &str, id: &str) -> R<u32> {
    make(
        Call::KillProcess(process(container, id)),
        answer!(KillProcess),
    )
}

/// `snapshot`.
pub fn snapshot(container: &str) -> R<()> {
    make(Call::Snapshot(on(container)), answer!(Snapshot, unit))
}

/// `stop`.
pub fn stop(container: &str) -> R<()> {
    make(Call::Stop(on(container)), answer!(Stop, unit))
}

/// `denials`.
pub fn denials(key: &str) -> R<Vec<Denial>> {
    make(Call::Denials(key.to_owned()), answer!(Denials))
}

/// `list-artifacts`.
pub fn list_artifacts(key: &str) -> R<Vec<Artifact>> {
    make(Call::ListArtifacts(key.to_owned()), answer!(ListArtifacts))
}

/// `read-artifact`.
pub fn read_artifact(key: &str, name: &str, offset: u64, length: u32) -> R<Vec<u8>> {
    let call = Call::ReadArtifact(ReadArtifactCall {
        key: key.to_owned(),
        name: name.to_owned(),
        offset,
        length,
    });
    make(call, answer!(ReadArtifact))
}

fn door(container: &str, port: u16) -> PreviewCall {
    PreviewCall {
        container: on(container),
        port,
    }
}

/// `open-preview`.
pub fn open_preview(container: &str, port: u16) -> R<Preview> {
    make(
        Call::OpenPreview(door(container, port)),
        answer!(OpenPreview),
    )
}

/// `close-preview`.
pub fn close_preview(container: &str, port: u16) -> R<bool> {
    make(
        Call::ClosePreview(door(container, port)),
        answer!(ClosePreview),
    )
}

/// `list-previews`.
pub fn list_previews(container: &str) -> R<Vec<Preview>> {
    make(Call::ListPreviews(on(container)), answer!(ListPreviews))
}

/// `save-snapshot`.
pub fn save_snapshot(container: &str, name: &str) -> R<()> {
    let call = Call::SaveSnapshot(SaveSnapshotCall {
        container: on(container),
        name: name.to_owned(),
    });
    make(call, answer!(SaveSnapshot, unit))
}

/// `fork-snapshot`.
pub fn fork_snapshot(source: &str, name: &str, key: &str) -> R<()> {
    let call = Call::ForkSnapshot(ForkSnapshotCall {
        source: source.to_owned(),
        name: name.to_owned(),
        key: key.to_owned(),
    });
    make(call, answer!(ForkSnapshot, unit))
}

/// `drop-snapshot`.
pub fn drop_snapshot(key: &str, name: &str) -> R<bool> {
    let call = Call::DropSnapshot(DropSnapshotCall {
        key: key.to_owned(),
        name: name.to_owned(),
    });
    make(call, answer!(DropSnapshot))
}
