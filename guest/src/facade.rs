//! Thin glue: the facade's calls as sequences of imports around the pure decisions.

use crate::Component;
use crate::decide::declarations::{self, Declaration};
use crate::decide::lifecycle::{self, Next, Step};
use crate::decide::status::{self, Records};
use crate::decide::teardown::{self, AfterKillAll, Plan, Start};
use crate::decide::{floor, validate};
use crate::exports::stockade::sandbox::facade::{Error, ExecOutcome, Guest};
use crate::stockade::sandbox::log::{self, Level};
use crate::stockade::sandbox::substrate::{self as sub, Command, SubstrateError};
use crate::stockade::sandbox::types::{Artifact, Denial, DetachedState, ExecInput, Grant};
use crate::stockade::sandbox::{clock, policy, records};

/// Default run timeout when the input names none: ten minutes.
const DEFAULT_TIMEOUT_MS: u64 = 10 * 60 * 1000;
/// Working directory when the input names none.
const DEFAULT_CWD: &str = "/workspace";

impl Guest for Component {
    fn exec(key: String, mut input: ExecInput) -> Result<ExecOutcome, Error> {
        let started = clock::now_ms();
        let mut container = String::new();
        let outcome = validate::key(&key)
            .and_then(|()| validate::input(&input, validate::Door::Exec))
            .map_err(Error::InvalidInput)
            .and_then(|()| admit_floor(&key, &input))
            .and_then(|()| {
                // Up to 16 MiB: handed on, not copied in the guest's memory.
                let stdin = input.stdin.take().unwrap_or_default();
                fence(&key, &input, stdin, started, &mut container)
            });
        canonical_fence(&key, &container, &input, started, &outcome);
        outcome
    }

    fn start_detached(key: String, mut input: ExecInput) -> Result<String, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        validate::input(&input, validate::Door::Detached).map_err(Error::InvalidInput)?;
        admit_floor(&key, &input)?;
        let container = sub::ensure(&key).map_err(from_substrate)?;
        // ADR-0012: no grant is applied. Ever.
        let stdin = input.stdin.take().unwrap_or_default();
        let id = sub::start_process(&container, &command(&input, stdin)).map_err(from_substrate)?;
        if validate::process_id(&id).is_err() {
            // Invariant 5: ids are substrate UUIDs. A substrate that answers otherwise
            // gets its process killed rather than a record we could not honour.
            let _ = sub::kill_process(&container, &id);
            return Err(Error::Failed(format!(
                "substrate returned a non-UUID id {id:?}"
            )));
        }
        if let Err(e) = records::put(&key, &declarations::record_name(&id), &container) {
            // An undeclared process would be killed by the next fence anyway; kill it now
            // so the consumer never holds an id that names nothing.
            let _ = sub::kill_process(&container, &id);
            return Err(Error::Failed(format!(
                "could not record the declaration: {e}"
            )));
        }
        log::emit(
            Level::Info,
            "detached-started",
            &[
                ("key".into(), key),
                ("container".into(), container),
                ("id".into(), id.clone()),
            ],
        );
        Ok(id)
    }

    fn detached_status(key: String, id: String) -> Result<DetachedState, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        validate::process_id(&id).map_err(Error::InvalidInput)?;
        let declared = find_declaration(&key, &id)?;
        let lookup = declared
            .as_ref()
            .map(|d| sub::process_status(&d.container, &id));
        let (answer, records) =
            status::answer(declared.is_some(), lookup).map_err(Error::Failed)?;
        if let Some(d) = &declared {
            apply_records(&key, d, records)?;
        }
        Ok(answer)
    }

    fn stop_detached(key: String, id: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        validate::process_id(&id).map_err(Error::InvalidInput)?;
        // Another key's id has no declaration here: nothing is killed.
        let Some(d) = find_declaration(&key, &id)? else {
            return Ok(());
        };
        let kill = sub::kill_process(&d.container, &id);
        let records = status::after_stop_kill(&kill).map_err(Error::Failed)?;
        apply_records(&key, &d, records)
    }

    fn abort(key: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        stop_container(&key, false)
    }

    fn checkpoint(key: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        stop_container(&key, true)
    }

    fn denials(key: String) -> Result<Vec<Denial>, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        sub::denials(&key).map_err(from_substrate)
    }

    fn artifacts(key: String) -> Result<Vec<Artifact>, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        sub::list_artifacts(&key).map_err(from_substrate)
    }

    fn read_artifact(
        key: String,
        name: String,
        offset: u64,
        length: u32,
    ) -> Result<Vec<u8>, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        validate::artifact_name(&name).map_err(Error::InvalidInput)?;
        validate::artifact_chunk(length).map_err(Error::InvalidInput)?;
        sub::read_artifact(&key, &name, offset, length).map_err(from_substrate)
    }

    fn on_stop(container: String) -> u32 {
        let cleared = clear_container(&container).unwrap_or(0);
        log::emit(
            Level::Info,
            "on-stop",
            &[
                ("container".into(), container),
                ("cleared".into(), cleared.to_string()),
            ],
        );
        cleared
    }
}

/// The floor, the same for both doors (invariant 4).
fn admit_floor(key: &str, input: &ExecInput) -> Result<(), Error> {
    let rules = policy::floor_rules();
    // A command that is not a floor command needs nothing: its token (if any) is not
    // looked up, so it is not spent (approvals are single-use).
    if floor::check(&input.argv, &rules, None) == floor::Verdict::Admit {
        return Ok(());
    }
    let approved = match &input.approval {
        Some(token) => policy::approval(key, token),
        None => None,
    };
    match floor::check(&input.argv, &rules, approved.as_deref()) {
        floor::Verdict::Admit => Ok(()),
        floor::Verdict::NeedsApproval(why) => Err(Error::NeedsApproval(why)),
    }
}

/// The fence's teardown; returns how many processes it killed.
/// The fence: ensure, apply the grant, run, tear down, revoke. `container` is set as
/// soon as it is known (for the canonical line of a fence that failed later).
fn fence(
    key: &str,
    input: &ExecInput,
    stdin: Vec<u8>,
    started: u64,
    container: &mut String,
) -> Result<ExecOutcome, Error> {
    *container = sub::ensure(key).map_err(from_substrate)?;
    let container = container.as_str();
    // Invariant 1: the grant window opens after approval and ensure...
    let grant = input.grant.clone().unwrap_or(Grant { rules: vec![] });
    let fence = format!("{container}/{started}");
    sub::apply_grant(container, &fence, &grant).map_err(from_substrate)?;
    let run = sub::run(
        container,
        &command(input, stdin),
        input.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
    );
    let killed = teardown_fence(key, container);
    // ...and closes after teardown, on every path.
    let denials = sub::revoke_grant(container);
    let run = run.map_err(from_substrate)?;
    let killed = killed?;
    let denials = denials.map_err(from_substrate)?;
    Ok(ExecOutcome {
        exit_code: run.exit_code,
        stdout: run.stdout,
        stderr: run.stderr,
        timed_out: run.timed_out,
        truncated: run.truncated,
        killed,
        denials,
        limits: run.limits,
    })
}

/// One `CANONICAL-FENCE` line per fence, whatever its outcome: the failed fences are
/// the ones a reader most needs to find.
fn canonical_fence(
    key: &str,
    container: &str,
    input: &ExecInput,
    started: u64,
    outcome: &Result<ExecOutcome, Error>,
) {
    let rules = input.grant.as_ref().map_or(0, |g| g.rules.len());
    let mut fields = vec![
        ("key".into(), key.to_string()),
        ("container".into(), container.to_string()),
        ("rules".into(), rules.to_string()),
    ];
    match outcome {
        Ok(o) => fields.extend([
            ("outcome".into(), "ran".to_string()),
            ("exit".into(), o.exit_code.to_string()),
            ("timed_out".into(), o.timed_out.to_string()),
            ("killed".into(), o.killed.to_string()),
            ("denials".into(), o.denials.to_string()),
            ("limits".into(), format!("{:?}", o.limits)),
        ]),
        Err(e) => fields.extend([
            ("outcome".into(), "error".to_string()),
            ("error".into(), format!("{e:?}")),
        ]),
    }
    fields.push((
        "duration_ms".into(),
        clock::now_ms().saturating_sub(started).to_string(),
    ));
    let level = if outcome.is_ok() {
        Level::Info
    } else {
        Level::Warn
    };
    log::emit(level, "CANONICAL-FENCE", &fields);
}

/// The selective teardown (ADR-0012, invariants 2 and 7). Every kill happens before any
/// record is touched: a records store that fails (reading the declarations or
/// forgetting them) never skips a kill. Unreadable declarations mean kill-all.
fn teardown_fence(key: &str, container: &str) -> Result<u32, Error> {
    let declared_all = declared(key);
    let (ids, stale): (Option<Vec<String>>, Vec<String>) = match &declared_all {
        Ok(all) => {
            let (current, stale) = declarations::for_container(all.clone(), container);
            (
                Some(current.into_iter().map(|d| d.id).collect()),
                stale.into_iter().map(|d| d.id).collect(),
            )
        }
        Err(_) => (None, Vec::new()),
    };
    let mut plan = match teardown::start(ids.as_deref()) {
        Start::KillAll => Plan::KillAll,
        Start::List => {
            let listed = sub::list_processes(container).ok();
            teardown::after_listing(ids.as_deref().unwrap_or_default(), listed.as_deref())
        }
    };
    let mut killed = 0u32;
    let mut forget_later: Vec<String> = stale;
    if let Plan::Selective { kill, reap } = &plan {
        let mut all_killed = true;
        for id in kill {
            match sub::kill_process(container, id) {
                Ok(n) => killed += n,
                Err(_) => {
                    all_killed = false;
                    break;
                }
            }
        }
        if all_killed {
            forget_later.extend(reap.iter().cloned());
            forget_after_kills(key, &forget_later);
            return Ok(killed);
        }
        plan = teardown::after_failed_kill();
    }
    debug_assert_eq!(plan, Plan::KillAll);
    let result = sub::kill_all(container);
    killed += match (teardown::after_kill_all(&result), result) {
        (AfterKillAll::Gone, Err(e)) => return Err(from_substrate(e)),
        (AfterKillAll::StopContainer, Err(e)) => {
            return Err(stop_after_failed_teardown(key, container, e));
        }
        (_, Ok(n)) | (AfterKillAll::Killed(n), _) => n,
    };
    // Everything died, declared processes too: their declarations go with them.
    forget_later.extend(ids.unwrap_or_default());
    forget_after_kills(key, &forget_later);
    Ok(killed)
}

/// The fence's kill could not be done: what the command backgrounded may be alive,
/// and a fence must not leave it behind (invariant 7). The container is stopped (its
/// whole tree dies with it) and its declarations are cleared; the consumer gets the
/// kill's error either way. A stop that fails too is named in the error.
fn stop_after_failed_teardown(key: &str, container: &str, kill: SubstrateError) -> Error {
    let stopped = sub::stop(container);
    let next = lifecycle::after(Step::Stop, &stopped);
    let cleared = match next {
        Next::Fail(_) => None,
        Next::Continue | Next::ClearAndSucceed => clear_container(container).ok(),
    };
    log::emit(
        Level::Warn,
        "teardown-failed",
        &[
            ("key".into(), key.to_string()),
            ("container".into(), container.to_string()),
            ("kill".into(), format!("{kill:?}")),
            (
                "stopped".into(),
                (!matches!(next, Next::Fail(_))).to_string(),
            ),
            ("cleared".into(), format!("{cleared:?}")),
        ],
    );
    match (from_substrate(kill), next) {
        (e, Next::Continue | Next::ClearAndSucceed) => e,
        (e, Next::Fail(why)) => Error::Failed(format!(
            "the fence's kill failed ({e:?}) and the container could not be stopped: {why}"
        )),
    }
}

/// Forget declarations once the kills are done. A store that fails here leaves
/// records of dead processes, which the next status or teardown finds gone and
/// reaps: the failure is logged, the fence's outcome stands.
fn forget_after_kills(key: &str, ids: &[String]) {
    if let Err(e) = forget(key, ids.iter().map(String::as_str)) {
        log::emit(
            Level::Warn,
            "declarations-not-forgotten",
            &[
                ("key".into(), key.to_string()),
                ("error".into(), format!("{e:?}")),
            ],
        );
    }
}

/// Abort (`snapshot` false) or checkpoint (`snapshot` true) the key's container.
fn stop_container(key: &str, snapshot: bool) -> Result<(), Error> {
    // With no live container there is nothing to stop or snapshot, only stale
    // declarations to clear.
    let Some(container) = sub::current(key).map_err(from_substrate)? else {
        let all = declared(key)?;
        forget(key, all.iter().map(|d| d.id.as_str()))?;
        return Ok(());
    };
    let steps: &[Step] = if snapshot {
        &[Step::Snapshot, Step::Stop]
    } else {
        &[Step::Stop]
    };
    for step in steps {
        let result = match step {
            Step::Snapshot => sub::snapshot(&container),
            Step::Stop => sub::stop(&container),
        };
        match lifecycle::after(*step, &result) {
            Next::Continue => {}
            Next::ClearAndSucceed => break,
            Next::Fail(why) => return Err(Error::Failed(why)),
        }
    }
    clear_container(&container)?;
    // Declarations of earlier containers of this key are stale too.
    let all = declared(key)?;
    forget(key, all.iter().map(|d| d.id.as_str()))?;
    Ok(())
}

/// Forget every declaration of `container`, whichever key made it.
fn clear_container(container: &str) -> Result<u32, Error> {
    let found = records::find(declarations::PREFIX, container).map_err(store_error)?;
    let mut n = 0;
    for (scope, name) in found {
        if records::remove(&scope, &name).map_err(store_error)? {
            n += 1;
        }
    }
    Ok(n)
}

fn apply_records(key: &str, d: &Declaration, records: Records) -> Result<(), Error> {
    match records {
        Records::Keep => Ok(()),
        Records::Forget => forget(key, [d.id.as_str()]),
        Records::ClearContainer => clear_container(&d.container).map(|_| ()),
    }
}

fn declared(key: &str) -> Result<Vec<Declaration>, Error> {
    let entries = records::list(key, declarations::PREFIX).map_err(store_error)?;
    Ok(entries
        .iter()
        .filter_map(|e| declarations::parse(&e.name, &e.value))
        .collect())
}

fn find_declaration(key: &str, id: &str) -> Result<Option<Declaration>, Error> {
    let name = declarations::record_name(id);
    let value = records::get(key, &name).map_err(store_error)?;
    Ok(value.and_then(|v| declarations::parse(&name, &v)))
}

fn forget<'a>(key: &str, ids: impl IntoIterator<Item = &'a str>) -> Result<(), Error> {
    for id in ids {
        records::remove(key, &declarations::record_name(id)).map_err(store_error)?;
    }
    Ok(())
}

/// The substrate's command: the input's, with the stdin taken out of it beforehand.
fn command(input: &ExecInput, stdin: Vec<u8>) -> Command {
    Command {
        argv: input.argv.clone(),
        cwd: input.cwd.clone().unwrap_or_else(|| DEFAULT_CWD.to_string()),
        env: input.env.clone(),
        stdin,
    }
}

fn from_substrate(e: SubstrateError) -> Error {
    match e {
        SubstrateError::Unreachable(s) => Error::Unreachable(s),
        SubstrateError::OverCapacity => Error::OverCapacity,
        SubstrateError::Invalid(s) => Error::InvalidInput(s),
        SubstrateError::Failed(s) => Error::Failed(s),
    }
}

fn store_error(e: String) -> Error {
    Error::Failed(format!("records store: {e}"))
}
