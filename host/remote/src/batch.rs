//! The remote substrate's [`Substrate::batch`](stockade_runtime::substrate::Substrate::batch):
//! a batch in as few signed requests as its calls allow, as its [`Plan`] says (the
//! semantics: `stockade_runtime::substrate::batch`; the wire: docs/NODE.md "Batches").

use stockade_node_protocol as protocol;
use stockade_runtime::substrate::batch::{On, Plan};
use stockade_runtime::substrate::{
    Answer, Call, ContainerId, FenceCounts, Output, OutputSink, Result, RunResult, Substrate,
    SubstrateError, Target, batch_one_by_one,
};

use super::{Remote, value};

/// A batch as one request to one node: its node, its key and its calls on the wire.
struct OneNode {
    node: usize,
    key: String,
    wire: Vec<protocol::BatchCall>,
}

impl Remote {
    /// [`Substrate::batch`](stockade_runtime::substrate::Substrate::batch) in requests,
    /// as its [`Plan`] says: an opening `ensure` of a key not placed yet (or, the
    /// baseline [`Remote::ensure_alone`], any) alone first; then
    /// [`Self::batch_on_one_node`] of the rest, the placeholder named once the `ensure`
    /// answered; or (the baseline [`Remote::teardown_alone`]) the calls up to the run,
    /// then the rest once every call before answered `ok`.
    pub(super) async fn batch_in_requests(
        &self,
        calls: Vec<Call>,
        sink: Option<OutputSink>,
    ) -> Result<Vec<Result<Answer>>> {
        let mut plan: Plan<Answer, SubstrateError> =
            match Plan::new(calls.iter().map(Call::step).collect()) {
                Ok(p) => p,
                Err(e) => return Ok(vec![Err(e)]),
            };
        let mut calls: Vec<Option<Call>> = calls.into_iter().map(Some).collect();
        if let Some(Some(Call::Ensure { key })) = calls.first()
            && !(self.ensure_in_batch && matches!(self.placed(key), Ok(Some(_))))
        {
            let key = key.clone();
            calls[0] = None;
            plan.answer(self.ensure(&key).await.map(Answer::Ensure));
        }
        let mut sink = sink;
        for end in self.requests(&calls, plan.answered()) {
            if plan.done() {
                break;
            }
            let from = plan.answered();
            let mut sent = Vec::with_capacity(end - from);
            for (i, c) in calls.iter_mut().enumerate().take(end).skip(from) {
                let Some(mut c) = c.take() else {
                    break;
                };
                if let (Some(t), On::Container(c)) = (c.target_mut(), plan.resolved(i)) {
                    *t = Target::Container(c);
                }
                sent.push(c);
            }
            let n = sent.len();
            let answers = self.batch_on_one_node(sent, sink.take()).await?;
            let got = answers.len();
            for a in answers {
                plan.answer(a);
            }
            // Short with no error: what the node said, and nothing more is sent.
            if got < n {
                break;
            }
        }
        Ok(plan.into_answers())
    }

    /// Where the requests of the calls from `from` on end: the rest whole, or (the
    /// baseline [`Remote::teardown_alone`]) split after its run.
    fn requests(&self, calls: &[Option<Call>], from: usize) -> Vec<usize> {
        let run = calls[from..]
            .iter()
            .position(|c| matches!(c, Some(Call::Run { .. })))
            .map(|i| from + i);
        match run.filter(|i| !self.teardown_in_batch && i + 1 < calls.len()) {
            Some(i) => vec![i + 1, calls.len()],
            None => vec![calls.len()],
        }
    }

    /// [`Substrate::batch`](stockade_runtime::substrate::Substrate::batch) for calls
    /// that name containers the front knows, or (after an opening `ensure`) the
    /// container the node ensures for a placed key: one signed request when they are
    /// all of one node and key, else one by one.
    async fn batch_on_one_node(
        &self,
        calls: Vec<Call>,
        sink: Option<OutputSink>,
    ) -> Result<Vec<Result<Answer>>> {
        let Some(OneNode { node, key, wire }) = (match self.one_node(&calls) {
            Ok(one) => one,
            Err(()) => return Ok(batch_one_by_one(self, calls, sink).await),
        }) else {
            return Ok(Vec::new());
        };
        self.open_before_sent(&calls);
        let mut ensured: Option<ContainerId> = None;
        let (own_tx, mut own_rx) = tokio::sync::mpsc::unbounded_channel();
        let out = sink.clone().unwrap_or(own_tx);
        let answers = {
            let mut answered = |a: &protocol::Answer<serde_json::Value>| {
                self.on_answer(&calls, &key, node, &mut ensured, a);
            };
            self.shared.nodes[node]
                .batch(
                    &key,
                    &protocol::Batch { calls: wire },
                    self.heartbeat_timeout,
                    &out,
                    &mut answered,
                )
                .await?
        };
        // Without a sink, a run's output is its result's (as `run`).
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        if sink.is_none() {
            while let Ok(o) = own_rx.try_recv() {
                match o {
                    Output::Stdout(b) => stdout.extend(b),
                    Output::Stderr(b) => stderr.extend(b),
                    Output::Started => {}
                }
            }
        }
        Ok(self.read_answers(&calls, answers, ensured, (stdout, stderr)))
    }

    /// The calls as one request: `Ok(None)` for no calls, `Err` when they cannot go as
    /// one (containers of different nodes or keys, one the front does not know, an
    /// `ensure` of a key not placed, a streamed stdin): then they go one by one.
    fn one_node(&self, calls: &[Call]) -> std::result::Result<Option<OneNode>, ()> {
        let mut target: Option<(usize, String)> = None;
        let mut wire = Vec::with_capacity(calls.len());
        for c in calls {
            // (node, key, the node's id) of the call's container.
            let (node, key, id) = match (c, c.target()) {
                (Call::Ensure { key }, _) => match self.placed(key) {
                    Ok(Some(i)) => (i, key.clone(), protocol::ENSURED.to_owned()),
                    _ => return Err(()),
                },
                (_, Some(Target::Ensured)) => match &target {
                    Some((i, key)) => (*i, key.clone(), protocol::ENSURED.to_owned()),
                    None => return Err(()),
                },
                (_, Some(Target::Container(container))) => {
                    let known = self
                        .shared
                        .containers_lock()
                        .get(container.as_str())
                        .cloned();
                    match known {
                        Some(k) => (k.node, k.key, k.id),
                        None => return Err(()),
                    }
                }
                (_, None) => return Err(()),
            };
            if let Call::Run { cmd, .. } = c
                && cmd.stdin_stream.is_some()
            {
                return Err(());
            }
            match &target {
                Some((n, k)) if (*n, k.as_str()) != (node, key.as_str()) => return Err(()),
                Some(_) => {}
                None => target = Some((node, key.clone())),
            }
            wire.push(match c {
                Call::Ensure { .. } => protocol::BatchCall::Ensure(protocol::Empty {}),
                Call::ApplyGrant { fence, grant, .. } => {
                    protocol::BatchCall::ApplyGrant(protocol::ApplyGrant::new(&id, fence, grant))
                }
                Call::Run { cmd, timeout, .. } => protocol::BatchCall::Run(protocol::Run {
                    container: id,
                    cmd: cmd.clone(),
                    timeout_ms: timeout.as_millis() as u64,
                }),
                Call::KillAll { .. } => {
                    protocol::BatchCall::KillAll(protocol::OnContainer { container: id })
                }
                Call::RevokeGrant { .. } => {
                    protocol::BatchCall::RevokeGrant(protocol::OnContainer { container: id })
                }
            });
        }
        Ok(target.map(|(node, key)| OneNode { node, key, wire }))
    }

    /// A grant is open from before it is sent (as `apply_grant`); on the ensured
    /// container, from when the ensure's answer names it ([`Self::on_answer`]; before
    /// that, only the node's lease closes it, as for a front killed mid-fence).
    fn open_before_sent(&self, calls: &[Call]) {
        for c in calls {
            if let Call::ApplyGrant {
                container: Target::Container(container),
                ..
            } = c
            {
                self.shared.grants_lock().insert(container.clone());
            }
        }
    }

    /// Each answer line as it arrives: an opening `ensure`'s names the container, which
    /// the front records (and its grant as open, if the batch applies one there) before
    /// the run after it ends.
    fn on_answer(
        &self,
        calls: &[Call],
        key: &str,
        node: usize,
        ensured: &mut Option<ContainerId>,
        a: &protocol::Answer<serde_json::Value>,
    ) {
        let opens = matches!(calls.first(), Some(Call::Ensure { .. }));
        if opens
            && ensured.is_none()
            && let protocol::Answer::Ok(v) = a
            && let Ok(id) = value::<String>(v.clone())
        {
            let fid = self.remember(key, node, &id);
            let on_ensured = calls.iter().any(|c| {
                matches!(
                    c,
                    Call::ApplyGrant {
                        container: Target::Ensured,
                        ..
                    }
                )
            });
            if on_ensured {
                self.shared.grants_lock().insert(fid.clone());
            }
            *ensured = Some(fid);
        }
    }

    /// The node's answers as the calls' own, the front's record of open grants kept as
    /// each call alone keeps it; a run's output that came in lines is its result's when
    /// there was no sink.
    fn read_answers(
        &self,
        calls: &[Call],
        answers: Vec<protocol::Answer<serde_json::Value>>,
        ensured: Option<ContainerId>,
        (mut stdout, mut stderr): (Vec<u8>, Vec<u8>),
    ) -> Vec<Result<Answer>> {
        let on = |t: &Target| match t {
            Target::Ensured => ensured.clone().unwrap_or_default(),
            Target::Container(c) => c.clone(),
        };
        let mut made = Vec::with_capacity(answers.len());
        for (c, a) in calls.iter().zip(answers) {
            let a = a.into_result();
            made.push(match c {
                Call::Ensure { .. } => match (&ensured, a) {
                    (Some(fid), Ok(_)) => Ok(Answer::Ensure(fid.clone())),
                    (None, Ok(_)) => Err(SubstrateError::Failed(
                        "batch: the ensure's answer is not a container id".into(),
                    )),
                    (_, Err(e)) => Err(e),
                },
                Call::ApplyGrant { container, .. } => {
                    if let Err(e) = &a
                        && !matches!(e, SubstrateError::Unreachable(_))
                    {
                        self.shared.grants_lock().remove(&on(container));
                    }
                    a.map(|_| Answer::ApplyGrant)
                }
                Call::Run { .. } => a.and_then(|v| {
                    let mut r: RunResult = value(v)?;
                    r.stdout.extend(std::mem::take(&mut stdout));
                    r.stderr.extend(std::mem::take(&mut stderr));
                    Ok(Answer::Run(r))
                }),
                Call::KillAll { .. } => a.and_then(value).map(Answer::KillAll),
                Call::RevokeGrant { container } => {
                    if !matches!(a, Err(SubstrateError::Unreachable(_))) {
                        self.shared.grants_lock().remove(&on(container));
                    }
                    a.and_then(value).map(|c: protocol::Counts| {
                        Answer::RevokeGrant(FenceCounts {
                            admitted: c.admitted,
                            denied: c.denied,
                        })
                    })
                }
            });
        }
        made
    }
}
