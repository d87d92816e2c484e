//! Thin glue: the facade's calls as sequences of imports around the pure decisions.

use crate::Component;
use crate::decide::batch::{self, Began, Closed, Opened};
use crate::decide::declarations::{self, Declaration};
use crate::decide::lifecycle::{self, Next, Step};
use crate::decide::lifetime::{self, OnEnd};
use crate::decide::network::{self, Source};
use crate::decide::preview::{self, Expose};
use crate::decide::snapshots;
use crate::decide::status::{self, Records};
use crate::decide::teardown::{self, AfterKillAll, Plan, Start};
use crate::decide::tombstone::{self, Cleared};
use crate::decide::{credentials, declare, floor, validate};
use crate::exports::stockade::sandbox::events::Guest as EventsGuest;
use crate::exports::stockade::sandbox::facade::{
    EndAction, Error, ExecOutcome, Guest, Lifetime, SandboxInfo,
};
use crate::stockade::sandbox::log::{self, Level};
use crate::stockade::sandbox::substrate::{Command, FenceCounts, SubstrateError, Target};
use crate::stockade::sandbox::types::{
    Artifact, Denial, DetachedInput, DetachedState, ExecInput, GoneReason, Grant, Preview,
    SnapshotInfo,
};
use crate::stockade::sandbox::{clock, policy, records};
use crate::substrate as sub;
use stockade_grammar::rules::Grant as ParsedGrant;

/// Default run timeout when the input names none: ten minutes.
const DEFAULT_TIMEOUT_MS: u64 = 10 * 60 * 1000;
/// Working directory when the input names none.
const DEFAULT_CWD: &str = "/workspace";

impl Guest for Component {
    fn exec(key: String, mut input: ExecInput) -> Result<ExecOutcome, Error> {
        let started = clock::now_ms();
        let mut container = String::new();
        let mut fence_id = String::new();
        let mut source = Source::None;
        let outcome = validate::key(&key)
            .map_err(Error::InvalidInput)
            .and_then(|()| {
                // A command that brings no grant runs under the key's network, which is
                // then validated and checked below as a grant it brought would be.
                let recorded = match input.grant {
                    Some(_) => None,
                    None => records::get(network::NETWORKS, &key).map_err(store_error)?,
                };
                let (grant, from) = network::choose(input.grant.take(), recorded.as_deref())
                    .map_err(Error::Failed)?;
                input.grant = grant;
                source = from;
                Ok(())
            })
            .and_then(|()| validate::input(&input).map_err(Error::InvalidInput))
            .and_then(|parsed| check_credentials(input.grant.as_ref().zip(parsed.as_ref())))
            .and_then(|()| {
                admit_floor(&key, &input.argv, input.approval.as_deref())
                    .map(|spend| spend.map(str::to_owned))
            })
            .and_then(|spend| {
                // Up to 16 MiB: handed on, not copied in the guest's memory.
                let stdin = input.stdin.take().unwrap_or_default();
                fence(
                    &key,
                    &input,
                    stdin,
                    spend.as_deref(),
                    &mut container,
                    &mut fence_id,
                )
            });
        canonical_fence(
            &key, &container, &fence_id, &input, source, started, &outcome,
        );
        outcome
    }

    fn start_detached(key: String, mut input: DetachedInput) -> Result<String, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        validate::detached(&input).map_err(Error::InvalidInput)?;
        let spend = admit_floor(&key, &input.argv, input.approval.as_deref())?;
        let container = sub::ensure(&key).map_err(from_substrate)?;
        spend_approval(&key, spend)?;
        // Invariant 3 (docs/DESIGN.md §3): no grant is applied. Ever (the input cannot
        // even carry one).
        let stdin = input.stdin.take().unwrap_or_default();
        let cmd = Command {
            argv: input.argv.clone(),
            cwd: input.cwd.clone().unwrap_or_else(|| DEFAULT_CWD.to_string()),
            env: input.env.clone(),
            stdin,
        };
        let id = sub::start_process(&container, cmd).map_err(from_substrate)?;
        if let declare::Next::Kill(why) = declare::after_start(&id) {
            let _ = sub::kill_process(&container, &id);
            return Err(Error::Failed(why));
        }
        let put = records::put(&key, &declarations::record_name(&id), &container);
        if let declare::Next::Kill(why) = declare::after_record(&put) {
            let _ = sub::kill_process(&container, &id);
            return Err(Error::Failed(why));
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
        let tombstone = match &declared {
            Some(_) => None,
            None => find_tombstone(&key, &id)?,
        };
        let lookup = declared
            .as_ref()
            .map(|d| sub::process_status(&d.container, &id));
        let (answer, records) =
            status::answer(declared.is_some(), tombstone, lookup).map_err(Error::Failed)?;
        if let Some(d) = &declared {
            match records {
                Records::Keep => {}
                Records::Forget => clear(&key, std::slice::from_ref(&d.id), Cleared::NotTracked)?,
                Records::ClearContainer => {
                    clear_container(&d.container, Cleared::ContainerGone).map(drop)?;
                }
            }
        }
        Ok(answer)
    }

    fn stop_detached(key: String, id: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        validate::process_id(&id).map_err(Error::InvalidInput)?;
        // Another key's id has no declaration here: nothing is killed. An id this key
        // saw go (a tombstone) reads `unknown` from now on: the consumer stopped it.
        let Some(d) = find_declaration(&key, &id)? else {
            records::remove(&key, &tombstone::record_name(&id)).map_err(store_error)?;
            return Ok(());
        };
        let kill = sub::kill_process(&d.container, &id);
        match status::after_stop_kill(&kill).map_err(Error::Failed)? {
            Records::Keep => Ok(()),
            Records::Forget => clear(&key, std::slice::from_ref(&d.id), Cleared::ByConsumer),
            Records::ClearContainer => {
                // The container is gone: the others' reason is that, this one the
                // consumer stopped.
                clear_container(&d.container, Cleared::ContainerGone)?;
                records::remove(&key, &tombstone::record_name(&id)).map_err(store_error)?;
                Ok(())
            }
        }
    }

    fn ensure(key: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        // No command, no grant: only the substrate's ensure (invariant 3 is not in
        // play; nothing runs that could hold a fence).
        let container = sub::ensure(&key).map_err(from_substrate)?;
        log::emit(
            Level::Info,
            "ensured",
            &[("key".into(), key), ("container".into(), container)],
        );
        Ok(())
    }

    fn abort(key: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        stop_container(&key, false)
    }

    fn checkpoint(key: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        stop_container(&key, true)
    }

    fn save_snapshot(key: String, name: String) -> Result<SnapshotInfo, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        validate::snapshot_name(&name).map_err(Error::InvalidInput)?;
        let held: Vec<String> = held_snapshots(&key)?.into_iter().map(|s| s.name).collect();
        snapshots::admit(&held, &name).map_err(Error::InvalidInput)?;
        // No command, no grant: the container is started (restoring its checkpoint) as
        // `ensure` starts it, and only read.
        let container = sub::ensure(&key).map_err(from_substrate)?;
        let saved = sub::save_snapshot(&container, &name).map_err(from_substrate);
        let at_ms = clock::now_ms();
        let recorded = saved.and_then(|()| {
            records::put(&key, &snapshots::record_name(&name), &at_ms.to_string())
                .map_err(store_error)
        });
        log::emit(
            if recorded.is_ok() {
                Level::Info
            } else {
                Level::Warn
            },
            "snapshot-saved",
            &[
                ("key".into(), key),
                ("container".into(), container),
                ("name".into(), name.clone()),
                ("ok".into(), recorded.is_ok().to_string()),
            ],
        );
        recorded.map(|()| SnapshotInfo { name, at_ms })
    }

    fn fork(key: String, source: String, name: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        validate::key(&source).map_err(Error::InvalidInput)?;
        validate::snapshot_name(&name).map_err(Error::InvalidInput)?;
        let exists = records::get(&source, &snapshots::record_name(&name))
            .map_err(store_error)?
            .is_some();
        let running = exists && sub::current(&key).map_err(from_substrate)?.is_some();
        snapshots::fork(&source, &name, exists, running).map_err(Error::InvalidInput)?;
        let forked = sub::fork_snapshot(&source, &name, &key).map_err(from_substrate);
        log::emit(
            if forked.is_ok() {
                Level::Info
            } else {
                Level::Warn
            },
            "forked",
            &[
                ("key".into(), key),
                ("source".into(), source),
                ("name".into(), name),
                ("ok".into(), forked.is_ok().to_string()),
            ],
        );
        forked
    }

    fn snapshots(key: String) -> Result<Vec<SnapshotInfo>, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        held_snapshots(&key)
    }

    fn delete_snapshot(key: String, name: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        validate::snapshot_name(&name).map_err(Error::InvalidInput)?;
        // The archive first: a failure leaves the record, so the delete can be retried
        // (never a record gone with its archive left behind).
        sub::drop_snapshot(&key, &name).map_err(from_substrate)?;
        records::remove(&key, &snapshots::record_name(&name)).map_err(store_error)?;
        log::emit(
            Level::Info,
            "snapshot-deleted",
            &[("key".into(), key), ("name".into(), name)],
        );
        Ok(())
    }

    fn set_lifetime(key: String, lifetime: Option<Lifetime>) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        let value = lifetime
            .as_ref()
            .map(|l| lifetime::format(l.ends_at_ms, on_end(l.on_end)));
        record_known(lifetime::LIFETIMES, &key, value.as_deref())?;
        log::emit(
            Level::Info,
            "lifetime-set",
            &[
                ("key".into(), key),
                (
                    "ends_at_ms".into(),
                    lifetime
                        .map(|l| l.ends_at_ms.to_string())
                        .unwrap_or_else(|| "none".into()),
                ),
            ],
        );
        Ok(())
    }

    fn set_metadata(key: String, metadata: Vec<(String, String)>) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        lifetime::metadata(&metadata).map_err(Error::InvalidInput)?;
        for old in records::list(&key, lifetime::META_PREFIX).map_err(store_error)? {
            records::remove(&key, &old.name).map_err(store_error)?;
        }
        for (name, value) in &metadata {
            records::put(&key, &format!("{}{name}", lifetime::META_PREFIX), value)
                .map_err(store_error)?;
        }
        records::put(lifetime::KNOWN, &key, "").map_err(store_error)
    }

    fn set_network(key: String, grant: Option<Grant>) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        if let Some(g) = &grant {
            // Refused now as an exec bringing it would be; decided again at every
            // command that runs under it.
            let parsed = validate::grant(g).map_err(Error::InvalidInput)?;
            check_credentials(Some((g, &parsed)))?;
        }
        let value = grant.as_ref().map(network::encode);
        record_known(network::NETWORKS, &key, value.as_deref())?;
        log::emit(
            Level::Info,
            "network-set",
            &[
                ("key".into(), key),
                (
                    "rules".into(),
                    grant
                        .map(|g| g.rules.len().to_string())
                        .unwrap_or_else(|| "none".into()),
                ),
            ],
        );
        Ok(())
    }

    fn describe(key: String) -> Result<Option<SandboxInfo>, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        if records::get(lifetime::KNOWN, &key)
            .map_err(store_error)?
            .is_none()
        {
            return Ok(None);
        }
        known(key).map(Some)
    }

    fn sandboxes(prefix: String) -> Result<Vec<SandboxInfo>, Error> {
        if !prefix.is_empty() {
            // A prefix is a key's start: the same characters.
            validate::key(&prefix).map_err(Error::InvalidInput)?;
        }
        let keys = records::list(lifetime::KNOWN, &prefix).map_err(store_error)?;
        keys.into_iter()
            .filter(|e| lifetime::listed(&e.name, &prefix))
            .take(lifetime::MAX_LISTED)
            .map(|e| known(e.name))
            .collect()
    }

    fn forget(key: String) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        forget_key(&key)?;
        log::emit(Level::Info, "forgotten", &[("key".into(), key)]);
        Ok(())
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

    fn expose(key: String, port: u32) -> Result<Preview, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        let port = preview::exposable(port).map_err(Error::InvalidInput)?;
        let container = sub::current(&key).map_err(from_substrate)?;
        let open = match &container {
            Some(c) => sub::list_previews(c).map_err(from_substrate)?,
            None => Vec::new(),
        };
        let decision = preview::expose(container.is_some(), &open, port);
        let answer = match (&decision, container.as_deref()) {
            (Expose::Existing(p), _) => Ok(p.clone()),
            (Expose::Open, Some(c)) => sub::open_preview(c, port).map_err(from_substrate),
            (d, _) => Err(Error::InvalidInput(
                preview::refusal(d).unwrap_or_else(|| "refused".into()),
            )),
        };
        log::emit(
            if answer.is_ok() {
                Level::Info
            } else {
                Level::Warn
            },
            "preview-expose",
            &[
                ("key".into(), key),
                ("container".into(), container.unwrap_or_default()),
                ("port".into(), port.to_string()),
                // Never the token: a log line is no door key.
                ("decision".into(), decision.label().into()),
                ("ok".into(), answer.is_ok().to_string()),
            ],
        );
        answer
    }

    fn unexpose(key: String, port: u32) -> Result<(), Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        let port = preview::port(port).map_err(Error::InvalidInput)?;
        let Some(container) = sub::current(&key).map_err(from_substrate)? else {
            return Ok(());
        };
        let closed = sub::close_preview(&container, port).map_err(from_substrate)?;
        log::emit(
            Level::Info,
            "preview-unexpose",
            &[
                ("key".into(), key),
                ("container".into(), container),
                ("port".into(), port.to_string()),
                ("closed".into(), closed.to_string()),
            ],
        );
        Ok(())
    }

    fn previews(key: String) -> Result<Vec<Preview>, Error> {
        validate::key(&key).map_err(Error::InvalidInput)?;
        match sub::current(&key).map_err(from_substrate)? {
            Some(c) => sub::list_previews(&c)
                .map(preview::sorted)
                .map_err(from_substrate),
            None => Ok(Vec::new()),
        }
    }
}

impl EventsGuest for Component {
    fn expiring() -> Vec<String> {
        match lifetimes() {
            Ok(rows) => lifetime::ended(clock::now_ms(), &rows)
                .into_iter()
                .map(|(key, _)| key)
                .collect(),
            Err(e) => {
                log::emit(
                    Level::Warn,
                    "expiring",
                    &[("error".into(), format!("{e:?}"))],
                );
                Vec::new()
            }
        }
    }

    fn end_lifetime(key: String) -> bool {
        let row = match records::get(lifetime::LIFETIMES, &key) {
            Ok(Some(value)) => vec![(key.clone(), value)],
            _ => return false,
        };
        let Some((_, on)) = lifetime::ended(clock::now_ms(), &row).pop() else {
            return false;
        };
        // The container first: a stop that fails keeps the lifetime, so the next ask
        // finds it again.
        let result = stop_container(&key, on == OnEnd::Checkpoint).and_then(|()| match on {
            OnEnd::Abort => forget_key(&key),
            OnEnd::Checkpoint => records::remove(lifetime::LIFETIMES, &key)
                .map(drop)
                .map_err(store_error),
        });
        log::emit(
            if result.is_ok() {
                Level::Info
            } else {
                Level::Warn
            },
            "lifetime-ended",
            &[
                ("key".into(), key),
                (
                    "on_end".into(),
                    match on {
                        OnEnd::Abort => "abort",
                        OnEnd::Checkpoint => "checkpoint",
                    }
                    .into(),
                ),
                ("ok".into(), result.is_ok().to_string()),
            ],
        );
        result.is_ok()
    }

    fn on_stop(container: String) -> u32 {
        let cleared = clear_container(&container, Cleared::ContainerGone).unwrap_or(0);
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

/// The floor, the same for both doors (invariant 4). Returns the approval token to
/// spend once the command is admitted (after `ensure`): looking one up spends nothing.
fn admit_floor<'a>(
    key: &str,
    argv: &[String],
    token: Option<&'a str>,
) -> Result<Option<&'a str>, Error> {
    let rules = policy::floor_rules();
    let lookup = floor::lookup(argv, &rules, token);
    let approved = match lookup {
        floor::Lookup::Token(t) => policy::approval(key, t),
        floor::Lookup::NotFloor | floor::Lookup::NoToken => None,
    };
    let verdict = floor::check(argv, &rules, approved.as_deref());
    let spend = floor::to_spend(&lookup, &verdict);
    match verdict {
        floor::Verdict::Admit => Ok(spend),
        floor::Verdict::NeedsApproval(why) => Err(Error::NeedsApproval(why)),
    }
}

/// Spend the approval that admitted the command (single use), now that it is admitted.
fn spend_approval(key: &str, token: Option<&str>) -> Result<(), Error> {
    match token {
        Some(t) if !policy::spend_approval(key, t) => Err(Error::NeedsApproval(
            "the approval was spent by another call, or expired, before this command was admitted"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// Every credential rule sits inside its secret's binding, checked before any
/// substrate call (invariants 3 and 10): a refused grant changes nothing.
fn check_credentials(grant: Option<(&Grant, &ParsedGrant)>) -> Result<(), Error> {
    let Some((grant, parsed)) = grant else {
        return Ok(());
    };
    let names = credentials::secret_names(grant);
    if names.is_empty() {
        return Ok(());
    }
    let bindings: Vec<_> = names
        .into_iter()
        .map(|n| {
            let b = policy::secret_binding(&n);
            (n, b)
        })
        .collect();
    credentials::check(parsed, &bindings).map_err(Error::InvalidInput)
}

/// The fence: ensure, spend the approval, apply the grant, run, tear down, revoke.
/// `container` and `fence_id` are set as soon as they are known (for the canonical
/// line of a fence that failed later).
fn fence(
    key: &str,
    input: &ExecInput,
    stdin: Vec<u8>,
    spend: Option<&str>,
    container: &mut String,
    fence_id: &mut String,
) -> Result<ExecOutcome, Error> {
    // Invariant 1: the grant window opens after approval and ensure. An apply that
    // failed opened nothing: nothing ran, so nothing is torn down (a declared
    // process must survive bad input).
    let calls = batch::FenceCalls {
        grant: input.grant.clone().unwrap_or(Grant {
            rules: vec![],
            ask: false,
        }),
        cmd: command(input, stdin),
        timeout_ms: input.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
    };
    let mut closed = None;
    let opened = match spend {
        // One round trip for the calls decided here (batch::whole_fence): the
        // substrate makes the apply only if the ensure answered, the run only if the
        // apply did, and a teardown decided before the run in the same batch.
        None => {
            let decided = matches!(declared(key), Ok(d) if d.is_empty());
            let (began, teardown) =
                batch::whole(sub::batch(&batch::whole_fence(key, calls, decided)));
            closed = teardown;
            match began {
                Began::NotEnsured(e) => return Err(from_substrate(e)),
                Began::Ensured {
                    container: c,
                    opened,
                } => {
                    *container = c;
                    opened
                }
                // Not even the container is known: the key's current one is the one
                // the batch may have fenced. None: no container, so no grant open.
                // Not answered: the node's grant lease closes what may be open.
                Began::Unknown(e) => match sub::current(key) {
                    Ok(Some(c)) => {
                        *container = c;
                        Opened::Unknown(e)
                    }
                    Ok(None) | Err(_) => return Err(from_substrate(e)),
                },
            }
        }
        // An approval is spent after the ensure answered and before the grant opens.
        Some(_) => {
            *container = sub::ensure(key).map_err(from_substrate)?;
            spend_approval(key, spend)?;
            let target = Target::Container(container.clone());
            batch::opened(sub::batch(&batch::apply_run(target, calls)))
        }
    };
    let container = container.as_str();
    let run = match opened {
        Opened::NotApplied(e) => return Err(from_substrate(e)),
        Opened::Ran { fence, run } => {
            *fence_id = fence;
            run
        }
        // It may have opened and run: torn down and revoked as any fence, and failed.
        Opened::Unknown(e) => Err(e),
    };
    let (killed, revoked) = match closed {
        // Made in the batch: no declaration to clear.
        Some(closed) => after_kill_all(key, container, closed, 0, &[], &[]),
        None => teardown_fence(key, container),
    };
    // ...and closes after teardown, on every path (in the teardown's batch, or here
    // when that did not make it).
    let counts = revoked.unwrap_or_else(|| sub::revoke_grant(container));
    let run = run.map_err(from_substrate)?;
    let killed = killed?;
    let counts = counts.map_err(from_substrate)?;
    Ok(ExecOutcome {
        exit_code: run.exit_code,
        stdout: run.stdout,
        stderr: run.stderr,
        timed_out: run.timed_out,
        truncated: run.truncated,
        killed,
        denials: counts.denied,
        admitted: counts.admitted,
        limits: run.limits,
    })
}

/// One `CANONICAL-FENCE` line per fence, whatever its outcome: the failed fences are
/// the ones a reader most needs to find.
fn canonical_fence(
    key: &str,
    container: &str,
    fence_id: &str,
    input: &ExecInput,
    source: Source,
    started: u64,
    outcome: &Result<ExecOutcome, Error>,
) {
    let rules = input.grant.as_ref().map_or(0, |g| g.rules.len());
    let mut fields = vec![
        ("key".into(), key.to_string()),
        ("container".into(), container.to_string()),
        ("fence".into(), fence_id.to_string()),
        ("grant".into(), source.label().to_string()),
        ("rules".into(), rules.to_string()),
    ];
    match outcome {
        Ok(o) => fields.extend([
            ("outcome".into(), "ran".to_string()),
            ("exit".into(), o.exit_code.to_string()),
            ("timed_out".into(), o.timed_out.to_string()),
            ("killed".into(), o.killed.to_string()),
            ("denials".into(), o.denials.to_string()),
            ("admitted".into(), o.admitted.to_string()),
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

/// The selective teardown (docs/DESIGN.md §3, invariants 2 and 7). Every kill happens
/// before any record is touched: a records store that fails (reading the declarations or
/// forgetting them) never skips a kill. Unreadable declarations mean kill-all.
///
/// A `kill-all` goes with the fence's `revoke-grant` in one batch (docs/NODE.md): the
/// revoke's answer is returned when it was made, `None` when the caller must revoke.
fn teardown_fence(
    key: &str,
    container: &str,
) -> (
    Result<u32, Error>,
    Option<Result<FenceCounts, SubstrateError>>,
) {
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
            // Stale declarations name processes of an earlier container, which is gone;
            // reaped ones, processes this container no longer tracks.
            clear_after_kills(key, &stale, Cleared::ContainerGone);
            clear_after_kills(key, reap, Cleared::NotTracked);
            return (Ok(killed), None);
        }
        plan = teardown::after_failed_kill();
    }
    debug_assert_eq!(plan, Plan::KillAll);
    let on = Target::Container(container.to_string());
    let closed = batch::closed(sub::batch(&batch::closing(on)));
    after_kill_all(
        key,
        container,
        closed,
        killed,
        &stale,
        &ids.unwrap_or_default(),
    )
}

/// The teardown's kill-all answered (with the revoke after it, when made): the
/// container stopped if the kill failed, else every declaration cleared (everything
/// died, declared processes too: a poll of one reads `not-tracked` from now on).
fn after_kill_all(
    key: &str,
    container: &str,
    closed: Closed,
    killed_before: u32,
    stale: &[String],
    ids: &[String],
) -> (
    Result<u32, Error>,
    Option<Result<FenceCounts, SubstrateError>>,
) {
    let Closed {
        kill_all: result,
        revoke,
    } = closed;
    let killed = killed_before
        + match (teardown::after_kill_all(&result), result) {
            (AfterKillAll::Gone, Err(e)) => return (Err(from_substrate(e)), revoke),
            (AfterKillAll::StopContainer, Err(e)) => {
                return (Err(stop_after_failed_teardown(key, container, e)), revoke);
            }
            (_, Ok(n)) | (AfterKillAll::Killed(n), _) => n,
        };
    clear_after_kills(key, stale, Cleared::ContainerGone);
    clear_after_kills(key, ids, Cleared::NotTracked);
    (Ok(killed), revoke)
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
        Next::Continue | Next::ClearAndSucceed => {
            clear_container(container, Cleared::ContainerGone).ok()
        }
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

/// Clear declarations once the kills are done. A store that fails here leaves
/// records of dead processes, which the next status or teardown finds gone and
/// reaps: the failure is logged, the fence's outcome stands.
fn clear_after_kills(key: &str, ids: &[String], cleared: Cleared) {
    if ids.is_empty() {
        return;
    }
    if let Err(e) = clear(key, ids, cleared) {
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

/// Abort (`snapshot` false) or checkpoint (`snapshot` true) the key's container. The
/// consumer stopped what ran there: its ids read `unknown` afterwards.
fn stop_container(key: &str, snapshot: bool) -> Result<(), Error> {
    let current = sub::current(key).map_err(from_substrate)?;
    let steps = match (lifecycle::plan(current.is_some(), snapshot), current) {
        (lifecycle::Plan::Steps(steps), Some(container)) => Some((steps, container)),
        _ => None,
    };
    if let Some((steps, container)) = steps {
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
        clear_container(&container, Cleared::ByConsumer)?;
    }
    // Declarations of earlier containers of this key are stale too.
    let all = declared(key)?;
    let ids: Vec<String> = all.into_iter().map(|d| d.id).collect();
    clear(key, &ids, Cleared::ByConsumer)
}

/// Forget every declaration of `container`, whichever key made it; returns how many.
fn clear_container(container: &str, cleared: Cleared) -> Result<u32, Error> {
    let found = records::find(declarations::PREFIX, container).map_err(store_error)?;
    let mut by_key: Vec<(String, Vec<String>)> = Vec::new();
    for (scope, name) in found {
        let Some(d) = declarations::parse(&name, container) else {
            continue;
        };
        match by_key.iter_mut().find(|(k, _)| *k == scope) {
            Some((_, ids)) => ids.push(d.id),
            None => by_key.push((scope, vec![d.id])),
        }
    }
    let mut n = 0;
    for (key, ids) in by_key {
        bury(&key, &ids, cleared);
        for id in &ids {
            if records::remove(&key, &declarations::record_name(id)).map_err(store_error)? {
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Forget these declarations of `key`, leaving the tombstones their cause calls for.
fn clear(key: &str, ids: &[String], cleared: Cleared) -> Result<(), Error> {
    bury(key, ids, cleared);
    forget(key, ids.iter().map(String::as_str))
}

/// Write the tombstones `cleared` calls for (before the declarations go: a store that
/// fails in between leaves the declaration, which answers the same on the next poll),
/// evicting the key's oldest past the bound. Best effort: a tombstone that cannot be
/// written leaves that id reading `unknown` later, logged.
fn bury(key: &str, ids: &[String], cleared: Cleared) {
    let Some(reason) = tombstone::reason(cleared) else {
        return;
    };
    if ids.is_empty() {
        return;
    }
    let written = (|| -> Result<(), String> {
        let existing: Vec<(String, u64)> = records::list(key, tombstone::PREFIX)?
            .into_iter()
            .filter_map(|e| tombstone::parse(&e.value).map(|(_, at)| (e.name, at)))
            .collect();
        for name in tombstone::evict(&existing, ids.len(), tombstone::MAX_PER_KEY) {
            records::remove(key, &name)?;
        }
        let value = tombstone::value(reason, clock::now_ms());
        for id in ids {
            records::put(key, &tombstone::record_name(id), &value)?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        log::emit(
            Level::Warn,
            "tombstone-not-written",
            &[("key".into(), key.to_string()), ("error".into(), e)],
        );
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

/// The reason this key kept when it cleared `id`'s declaration, if any.
fn find_tombstone(key: &str, id: &str) -> Result<Option<GoneReason>, Error> {
    let value = records::get(key, &tombstone::record_name(id)).map_err(store_error)?;
    Ok(value.and_then(|v| tombstone::parse(&v)).map(|(r, _)| r))
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

/// Every recorded lifetime, as (key, record).
fn lifetimes() -> Result<Vec<(String, String)>, Error> {
    Ok(records::list(lifetime::LIFETIMES, "")
        .map_err(store_error)?
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect())
}

fn on_end(a: EndAction) -> OnEnd {
    match a {
        EndAction::Abort => OnEnd::Abort,
        EndAction::Checkpoint => OnEnd::Checkpoint,
    }
}

/// The key's record in `scope` (one per key: its lifetime, its network) set to `value`,
/// or removed for none; the key is known from now on.
fn record_known(scope: &str, key: &str, value: Option<&str>) -> Result<(), Error> {
    match value {
        Some(v) => records::put(scope, key, v).map_err(store_error)?,
        None => {
            records::remove(scope, key).map_err(store_error)?;
        }
    }
    records::put(lifetime::KNOWN, key, "").map_err(store_error)
}

/// A known key as `describe` and `sandboxes` answer it.
fn known(key: String) -> Result<SandboxInfo, Error> {
    let running = sub::current(&key).map_err(from_substrate)?.is_some();
    let lifetime = records::get(lifetime::LIFETIMES, &key)
        .map_err(store_error)?
        .and_then(|v| lifetime::parse(&v))
        .map(|(ends_at_ms, on)| Lifetime {
            ends_at_ms,
            on_end: match on {
                OnEnd::Abort => EndAction::Abort,
                OnEnd::Checkpoint => EndAction::Checkpoint,
            },
        });
    let metadata = records::list(&key, lifetime::META_PREFIX)
        .map_err(store_error)?
        .into_iter()
        .filter_map(|e| {
            e.name
                .strip_prefix(lifetime::META_PREFIX)
                .map(|n| (n.to_owned(), e.value))
        })
        .collect();
    let network = records::get(network::NETWORKS, &key)
        .map_err(store_error)?
        .and_then(|v| network::decode(&v));
    Ok(SandboxInfo {
        key,
        running,
        lifetime,
        metadata,
        network,
    })
}

/// The key's lifetime, metadata, network and place among the known removed.
fn forget_key(key: &str) -> Result<(), Error> {
    records::remove(lifetime::LIFETIMES, key).map_err(store_error)?;
    records::remove(network::NETWORKS, key).map_err(store_error)?;
    for old in records::list(key, lifetime::META_PREFIX).map_err(store_error)? {
        records::remove(key, &old.name).map_err(store_error)?;
    }
    records::remove(lifetime::KNOWN, key).map_err(store_error)?;
    Ok(())
}

/// The key's named snapshots, by name (the records store lists in name order).
fn held_snapshots(key: &str) -> Result<Vec<SnapshotInfo>, Error> {
    let entries = records::list(key, snapshots::PREFIX).map_err(store_error)?;
    Ok(entries
        .iter()
        .filter_map(|e| snapshots::parse(&e.name, &e.value))
        .map(|(name, at_ms)| SnapshotInfo { name, at_ms })
        .collect())
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
