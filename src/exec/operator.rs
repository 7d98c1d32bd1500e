//! Operator commands on existing executions: attach, recover, redispatch, resolve, probe,
//! predict (`cairn status`), output, cancel, gc; and loading an execution for a drive.

use std::time::{Duration, Instant};

use crate::event::EventKind;
use crate::evidence::{Evidence, ResolvedDetail};
use crate::host_helper::{self};
use crate::id::ExecutionId;
use crate::intent::Intent;
use crate::journal::ExecutionRecord;
use crate::machine::{Event, Mode, Step, Why};
use crate::marker::{self, FinishRecord, Op, StartRecord};
use crate::recovery::{Prior, Probe};
use crate::ssh::{SshError, Target};
use crate::state::State;

use super::claims::Drive;
use super::drive::{finish_text, place_of, reason_text, DriveMode};
use super::*;

impl Executor {
    /// Dispatch an execution again under its own ID (the start guard decides on the host).
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn redispatch(
        &mut self,
        id: &ExecutionId,
        detach: bool,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let _driving = match self.own_or_wait(id).await? {
            Drive::Go(g) => g,
            other => return self.not_driven(id, other),
        };
        let mut run = self.load(id)?;
        let target = self.target_for(&run)?;
        if run.m.prior() == Prior::Settled {
            return self.outcome_from_journal(&run);
        }
        // Whatever the marker home's epoch is now, this dispatch is meant to run there (the
        // reply to it records which one that was).
        run.dispatch_epoch = None;
        run.m.set_prior(Prior::Dispatched);
        self.drive(&target, &mut run, DriveMode::Dispatch { detach }, sink)
            .await
    }

    /// Dispatch again an execution recorded `failed`: it provably never started (nothing was
    /// sent, or the host refused before the start guard), so sending it under the same ID is
    /// safe; the host's start guard still decides. Anything else is attached to instead.
    ///
    /// One that failed before it was ever authorized (the host could not be reached at first
    /// contact, or its client stopped first) is put to the approver now, with `command` (as
    /// requested, before `cwd`/`env` were wrapped around it) and `intent`: a retry never runs
    /// on a decision nobody made.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn retry_never_started(
        &mut self,
        id: &ExecutionId,
        why: &str,
        command: &[u8],
        intent: &Intent,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        if self.journal.status(id)?.map(|s| s.state) != Some(State::Failed) {
            return self.attach(id, sink).await;
        }
        let mut run = self.load(id)?;
        let target = self.target_for(&run)?;
        self.journal.append_evidence(
            id,
            Evidence::Retry {
                why,
                by: crate::journal::client_identity(),
            },
        )?;
        let authorized = self
            .journal
            .events(id)?
            .iter()
            .any(|e| e.kind == EventKind::Authorized);
        if !authorized {
            run.m.set_prior(Prior::Dispatched);
            return self
                .ask_then_dispatch(&mut run, command, intent, sink)
                .await;
        }
        // The epoch this journal last saw at the host, when it knows the host's key.
        run.dispatch_epoch = match &run.host_key {
            Some(k) => self.journal.host_epoch_at(&place_of(&run.rec, k))?,
            None => None,
        };
        run.last_seen_epoch.clone_from(&run.dispatch_epoch);
        run.m.set_prior(Prior::Dispatched);
        // Two retries racing: the journal lets only the first `dispatched` follow `failed`.
        run.dispatch_from = Some(&[State::Failed]);
        self.drive(
            &target,
            &mut run,
            DriveMode::Dispatch { detach: false },
            sink,
        )
        .await
    }

    /// `cairn resolve`: record a human decision about an execution under review, as evidence.
    /// `completed`/`failed` settle it; `retry` dispatches again under the same ID only if a
    /// fresh probe proves it never started (no started record, same host epoch, and the
    /// journal never saw one), and refuses otherwise.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn resolve(
        &mut self,
        id: &ExecutionId,
        how: crate::review::Resolution,
        reason: &str,
        by: &str,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        use crate::review::Resolution;
        let r = crate::review::record(&self.journal, id)?;
        if !matches!(r.state, State::Unknown | State::Interrupted) {
            return Err(ExecError::Refused(format!(
                "{id} is {}, not under review (only unknown or interrupted executions are resolved)",
                r.state
            )));
        }
        if reason.trim().is_empty() {
            return Err(ExecError::InvalidRequest(
                "--reason is required: say what you checked".into(),
            ));
        }
        let resolved = |state: Option<State>, decision, detail| Evidence::Resolved {
            state,
            decision,
            by,
            reason,
            client: crate::journal::client_identity(),
            state_before: r.state,
            detail,
        };
        match how {
            Resolution::Completed | Resolution::Failed => {
                let state = if how == Resolution::Completed {
                    State::Completed
                } else {
                    State::Failed
                };
                self.journal
                    .append_evidence(id, resolved(Some(state), state.as_str(), None))?;
                let run = self.load(id)?;
                let mut o = self.outcome_from_journal(&run)?;
                o.reason = Some(format!("resolved by {by}: {reason}"));
                Ok(o)
            }
            Resolution::Retry => {
                if r.state == State::Interrupted {
                    return Err(ExecError::Refused(format!(
                        "refusing to retry {id}: it started on the host (interrupted); resolve it as completed or failed"
                    )));
                }
                let (_, probe) = self.probe(id).await?;
                let run = self.load(id)?;
                let seen_start = run.start.is_some()
                    || self
                        .journal
                        .events(id)?
                        .iter()
                        .any(|e| e.kind == EventKind::Running);
                match probe {
                    Ok(Probe::Absent { same_epoch: true }) if !seen_start => {
                        let detail = Some(ResolvedDetail::ABSENT_SAME_EPOCH);
                        self.journal
                            .append_evidence(id, resolved(None, "retry", detail))?;
                        self.redispatch_checked(id, sink).await
                    }
                    other => {
                        let found = match other {
                            Ok(p) => format!("{p:?}"),
                            Err(e) => e.to_string(),
                        };
                        Err(ExecError::Refused(format!(
                            "refusing to retry {id}: the marker does not prove it never started (the host says: {found}{})",
                            if seen_start { "; and the journal saw it start" } else { "" }
                        )))
                    }
                }
            }
        }
    }

    /// Re-dispatch after `resolve --as retry`, keeping the recorded epoch (the probe just
    /// proved it unchanged).
    async fn redispatch_checked(
        &mut self,
        id: &ExecutionId,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let mut run = self.load(id)?;
        let target = self.target_for(&run)?;
        run.m.set_prior(Prior::Dispatched);
        self.drive(
            &target,
            &mut run,
            DriveMode::Dispatch { detach: false },
            sink,
        )
        .await
    }

    /// Attach from byte 0 of both streams (a gateway's caller holds no offsets), wait.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn attach_replay(
        &mut self,
        id: &ExecutionId,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        self.attach_from(id, sink, (0, 0), true).await
    }

    /// `cairn attach`: stream from the stored offsets, wait, and conclude.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn attach(
        &mut self,
        id: &ExecutionId,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let offsets = self.journal.cursor(id)?;
        self.attach_from(id, sink, offsets, true).await
    }

    pub(super) async fn attach_from(
        &mut self,
        id: &ExecutionId,
        sink: &mut dyn OutputSink,
        offsets: (u64, u64),
        wait: bool,
    ) -> Result<Outcome, ExecError> {
        let _driving = match self.own_or_wait(id).await? {
            Drive::Go(g) => g,
            other => return self.not_driven(id, other),
        };
        let mut run = self.load(id)?;
        run.out_off = offsets.0;
        run.err_off = offsets.1;
        let target = self.target_for(&run)?;
        self.drive(&target, &mut run, DriveMode::Follow { detach: !wait }, sink)
            .await
    }

    /// `cairn recover`: apply the recovery table to one execution that is not settled.
    /// Re-dispatches (detached) what provably never started; never streams output.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn recover_one(
        &mut self,
        id: &ExecutionId,
        wait: bool,
    ) -> Result<Outcome, ExecError> {
        let _driving = match self.own_or_wait(id).await? {
            Drive::Go(g) => g,
            other => return self.not_driven(id, other),
        };
        self.recover_owned(id, wait).await
    }

    /// [`Executor::recover_one`] by the caller that drives `id` (a takeover's recovery).
    pub(crate) async fn recover_owned(
        &mut self,
        id: &ExecutionId,
        wait: bool,
    ) -> Result<Outcome, ExecError> {
        let mut run = self.load(id)?;
        run.out_off = NO_BYTES;
        run.err_off = NO_BYTES;
        let target = self.target_for(&run)?;
        self.drive(
            &target,
            &mut run,
            DriveMode::Settle { detach: !wait },
            &mut Discard,
        )
        .await
    }

    /// The owner's sweep picks up `id`, an execution this replica owns that no call of this
    /// process has driven for `undriven_for` (its call failed with a journal error, say, or its
    /// caller went away): a `redrive` event, then the recovery table exactly as after a
    /// takeover ([`Executor::recover_owned`], waiting for the result). `None` when
    /// [`may_redrive`] says to leave it alone. The caller holds [`drive_undriven`]'s guard.
    pub(crate) async fn redrive_owned(
        &mut self,
        id: &ExecutionId,
        undriven_for: Duration,
    ) -> Result<Option<Outcome>, ExecError> {
        let Some((state, before)) = may_redrive(&self.journal, id)? else {
            return Ok(None);
        };
        tracing::info!(
            "cairn: {id} ({state}) is owned by this replica and no call of it has driven it for \
             {:.1}s; picking it up (redrive {} of at most {MAX_REDRIVES}) and recovering it",
            undriven_for.as_secs_f64(),
            before + 1
        );
        // Fenced like every append of the owner: refused if another replica took it over.
        self.journal.append_evidence(
            id,
            Evidence::Redrive {
                by: crate::journal::client_identity(),
                replica: crate::journal::replica_id(),
                state,
                redrive: before + 1,
                max_redrives: MAX_REDRIVES,
                undriven_ms: undriven_for.as_millis() as u64,
                reason: (),
            },
        )?;
        self.recover_owned(id, true).await.map(Some)
    }

    /// The journal's view plus one fresh probe, without changing anything.
    pub async fn probe(
        &mut self,
        id: &ExecutionId,
    ) -> Result<(Outcome, Result<Probe, NotProbed>), ExecError> {
        let p = self.predict(id).await?;
        Ok((p.outcome, p.probe))
    }

    /// `cairn status`: the journal's view, one fresh probe, and what `cairn recover` would do
    /// next, as the same [`Machine`] that drives `recover` decides it from the same connect and
    /// the same probe. Nothing is concluded.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn predict(&mut self, id: &ExecutionId) -> Result<Prediction, ExecError> {
        let mut run = self.load(id)?;
        run.out_off = NO_BYTES;
        run.err_off = NO_BYTES;
        let target = self.target_for(&run)?;
        let outcome = if run.m.prior() == Prior::Held {
            self.held_outcome(&run)?
        } else {
            self.outcome_from_journal(&run)?
        };
        let patience = self.patience.clone();
        let first = run.m.start(Mode::RECOVER, &patience, Instant::now());
        // The host is probed whatever the journal concludes: `host_says` shows it.
        let connected = self.link.connection(&target).await;
        let mut last = None;
        let probe = match &connected {
            Err(e) => Err(NotProbed::Connect(e.to_string())),
            Ok(ci) => {
                let nonce = marker::new_nonce();
                let idc = run.rec.id.clone();
                let op = Op::Watch {
                    id: &idc,
                    out_off: NO_BYTES,
                    err_off: NO_BYTES,
                    wait: false,
                };
                let reply = self
                    .exec_op(*ci, &op, &nonce, None, &mut run, &mut Discard)
                    .await?;
                let p = match &reply.broken {
                    Some(b) => Err(NotProbed::Incomplete(b.clone())),
                    None => Ok(self.probe_from(&run, &reply)),
                };
                last = Some(reply);
                p
            }
        };
        let mut notes = Vec::new();
        let mut seen = None;
        let next = if first.is_final() {
            first
        } else {
            let event = match &connected {
                Ok(ci) => Event::Connected {
                    presented: self.link.host_key(*ci).to_owned(),
                    pinned: run.host_key.clone(),
                },
                Err(e) => Event::ConnectFailed {
                    transient: e.is_transient(),
                    error: e.to_string(),
                },
            };
            let mut step = run.m.handle(Instant::now(), event);
            if let (Step::Watch { .. }, Some(reply)) = (&step, last.take()) {
                let (answer, probe) = self.answer_of(&run, &reply);
                seen = Some((reply, probe));
                step = run.m.handle(Instant::now(), Event::Replied(answer));
            }
            while let Some(n) = run.m.poll_note() {
                notes.push(n);
            }
            step
        };
        let next = match next {
            Step::Settle { state, why } => Step::Settle {
                state,
                why: Why::Said(reason_text(why, &target, &run, seen.as_ref())),
            },
            s => s,
        };
        Ok(Prediction {
            outcome,
            probe,
            notes,
            next,
        })
    }

    /// `cairn output`: the whole stdout (or stderr) of an execution, read from the host.
    pub async fn output(
        &mut self,
        id: &ExecutionId,
        stderr: bool,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<FinishRecord>, ExecError> {
        self.output_from(id, stderr, 0, sink).await
    }

    /// One stream of an execution's output from byte `offset` to what the host holds now
    /// (the finish record, when it has finished, says the total).
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn output_from(
        &mut self,
        id: &ExecutionId,
        stderr: bool,
        offset: u64,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<FinishRecord>, ExecError> {
        let offset = offset.min(NO_BYTES - 1);
        let mut run = self.load(id)?;
        let target = self.target_for(&run)?;
        let ci = self.link.connection(&target).await?;
        let nonce = marker::new_nonce();
        let (o, e) = if stderr {
            (NO_BYTES, offset)
        } else {
            (offset, NO_BYTES)
        };
        run.out_off = o;
        run.err_off = e;
        let idc = run.rec.id.clone();
        let op = Op::Watch {
            id: &idc,
            out_off: o,
            err_off: e,
            wait: false,
        };
        let reply = self.exec_op(ci, &op, &nonce, None, &mut run, sink).await?;
        if let Some(b) = reply.broken {
            return Err(SshError::Disconnected(b).into());
        }
        if reply.absent {
            return Err(ExecError::HostReported(format!(
                "the host has no record of {id}: it never started there"
            )));
        }
        if reply.output_gone {
            return Err(ExecError::HostReported(format!(
                "the output of {id} was removed by `cairn gc` (output retention); its finish \
                 record is kept: {}",
                reply.done.as_ref().map(finish_text).unwrap_or_default()
            )));
        }
        if let Some(e) = reply.errors.first() {
            return Err(ExecError::HostReported(format!("the host reported: {e}")));
        }
        Ok(reply.done)
    }

    /// `cairn cancel`: stop the remote process group and record `cancelled`.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn cancel(
        &mut self,
        id: &ExecutionId,
        grace_secs: u64,
    ) -> Result<Outcome, ExecError> {
        let mut run = self.load(id)?;
        let target = self.target_for(&run)?;
        if run.m.prior() == Prior::Settled {
            return self.outcome_from_journal(&run);
        }
        if matches!(run.m.prior(), Prior::NotDispatched | Prior::Held) {
            // Recorded only while the execution is still accepted or authorized, in the append
            // itself: then a live owner's `dispatched` event after it is refused by the journal,
            // and nothing is sent. An owner that dispatched first makes this refused, and the
            // cancel goes to the host.
            let reason = "cancelled before dispatch: nothing was sent";
            let concluded = Evidence::Concluded {
                state: State::Cancelled,
                reason,
                reconnects: run.reconnects,
                start_record: None,
            }
            .into_event();
            let before = [State::Accepted, State::Authorized];
            match self.journal.append_all_if(id, &before, vec![concluded]) {
                Ok(_) => {
                    run.m.set_prior(Prior::Settled);
                    let mut o = self.outcome_from_journal(&run)?;
                    o.reason = Some(reason.to_owned());
                    return Ok(o);
                }
                Err(e) => match e.refused() {
                    Some(r) if r.from.is_some_and(State::is_settled) => {
                        return self.outcome_from_journal(&run);
                    }
                    Some(_) => run = self.load(id)?,
                    None => return Err(e.into()),
                },
            }
        }
        let ci = self.link.connection(&target).await?;
        let nonce = marker::new_nonce();
        self.journal
            .append_evidence(id, Evidence::CancelRequested { grace_secs })?;
        let idc = run.rec.id.clone();
        let op = Op::Cancel {
            id: &idc,
            grace_secs,
        };
        let reply = self
            .exec_op(ci, &op, &nonce, None, &mut run, &mut Discard)
            .await?
            .checked()?;
        match reply.cancel.as_deref() {
            Some("absent") => {
                // The host now holds a cancel flag for this ID: a dispatch still in flight
                // records `cancelled` instead of starting, so the command can never run.
                self.conclude(
                    &mut run,
                    State::Cancelled,
                    "cancelled before it started: the host had no started record and now holds a \
                     cancel flag that stops any late dispatch of this ID",
                )
            }
            _ => {
                // Signalled, prevented or already finished: collect the finish record.
                run.out_off = NO_BYTES;
                run.err_off = NO_BYTES;
                self.drive(
                    &target,
                    &mut run,
                    DriveMode::Settle { detach: false },
                    &mut Discard,
                )
                .await
            }
        }
    }

    /// `cairn gc` on one host: remove the output of finished executions older than
    /// `output_age` and their records (the tombstone that keeps the start guard) older than
    /// `tombstone_age`. Running executions are never touched.
    pub async fn gc_host(
        &mut self,
        rec: &ExecutionRecord,
        output_age: Duration,
        tombstone_age: Duration,
    ) -> Result<String, ExecError> {
        // (connected as `rec` was: its recorded connection, its pinned key)
        let mut run = Run {
            out_off: NO_BYTES,
            err_off: NO_BYTES,
            ..self.load(&rec.id)?
        };
        run.m.set_prior(Prior::Settled);
        let target = self.target_for(&run)?;
        let ci = self.link.connection(&target).await?;
        let nonce = marker::new_nonce();
        let op = Op::Gc {
            output_age_secs: output_age.as_secs(),
            tombstone_age_secs: tombstone_age.as_secs(),
            keep_helper: host_helper::available().then_some(host_helper::SHA256),
        };
        let reply = self
            .exec_op(ci, &op, &nonce, None, &mut run, &mut Discard)
            .await?
            .checked()?;
        Ok(reply.gc.unwrap_or_default())
    }

    // ----- internals -------------------------------------------------------------------

    pub(super) fn load(&mut self, id: &ExecutionId) -> Result<Run, ExecError> {
        let rec = self
            .journal
            .execution(id)?
            .ok_or_else(|| ExecError::NoSuchExecution(id.to_string(), self.journal.location()))?;
        let events = self.journal.events(id)?;
        let status = crate::journal::status_from_events(&events);
        let prior = match &status {
            Some(s) => Prior::from_journal(s.state, s.before_unknown),
            None => Prior::NotDispatched,
        };
        let prior = if prior == Prior::NotDispatched
            && self.live_owner(id, &rec.client, &events)?.is_some()
        {
            Prior::Held
        } else {
            prior
        };
        let mut run = Run::new(rec);
        run.m.set_prior(prior);
        for ev in &events {
            if ev.kind == EventKind::Accepted {
                run.reach = crate::reach::Reach::from_accepted(&ev.evidence);
            }
            if ev.kind == EventKind::Dispatched || ev.kind == EventKind::DispatchEpoch {
                // (a dispatch without a recorded epoch resets it: it runs wherever it lands)
                run.dispatch_epoch = ev
                    .evidence
                    .get("epoch")
                    .and_then(|v| v.as_str())
                    .map(str::to_owned);
            }
            if let Some(k) = ev.evidence.get("host_key").and_then(|v| v.as_str()) {
                run.host_key = Some(k.to_owned());
            }
            if let Some(r) = ev.evidence.get("reconnects").and_then(|v| v.as_u64()) {
                run.reconnects = r as u32;
            }
            if let Some(s) = ev.evidence.get("start_record").and_then(|v| v.as_str()) {
                run.start = StartRecord::parse(s).ok();
                if run.start_epoch.is_none() {
                    run.start_epoch = run.start.as_ref().map(|s| s.epoch.clone());
                }
            }
            if let Some(s) = ev.evidence.get("finish_record").and_then(|v| v.as_str()) {
                run.done = FinishRecord::parse(s).ok();
            }
        }
        Ok(run)
    }

    /// What the journal says of `id` before any probe, as the recovery table takes it
    /// (including whether a live owner holds it undispatched).
    pub fn prior(&mut self, id: &ExecutionId) -> Result<Prior, ExecError> {
        Ok(self.load(id)?.m.prior())
    }

    /// The host of `run` announced `announced`: keep the bookkeeping of its place (per
    /// destination, key and remote dir), recording a change or a shared key once.
    pub(super) fn note_epoch(&mut self, run: &mut Run, announced: &str) -> Result<(), ExecError> {
        if run.last_seen_epoch.as_deref() == Some(announced) {
            return Ok(());
        }
        let Some(key) = run.host_key.clone() else {
            return Ok(());
        };
        // Events of this run still held go first: they happened before this reply.
        self.flush_held(run)?;
        let place = place_of(&run.rec, &key);
        let a = self
            .journal
            .observe_host_epoch(&run.rec.id, &place, announced)?;
        if let Some(old) = &a.changed_from {
            tracing::warn!(
                "cairn: the marker home {} on {} has a new epoch ({old} -> {announced}): it was \
                 wiped or replaced; executions dispatched there before keep the old epoch's rule",
                place.remote_dir,
                place.destination
            );
        }
        for (other, other_epoch) in &a.shared_with {
            tracing::warn!(
                "cairn: {} and {other} present the same host key {key} with different epochs \
                 ({announced}, {other_epoch}): probably hosts cloned from one image; cairn keeps \
                 them apart, but consider giving each its own host key",
                place.destination
            );
        }
        run.last_seen_epoch = Some(announced.to_owned());
        Ok(())
    }

    /// How to reach the host of `run` again: as its execution recorded (see [`crate::reach`]),
    /// with what the command line sets overriding the matching part, and pinned to the host key
    /// verified at dispatch.
    pub(super) fn target_for(&self, run: &Run) -> Result<Target, ExecError> {
        let rec = &run.rec;
        let mut t = match &run.reach {
            Some(r) => {
                let mut t =
                    crate::ssh::resolve(&rec.destination, &r.resolve_options(&self.link.connect))?;
                r.apply(&mut t, &self.link.connect)?;
                t
            }
            None => crate::ssh::resolve(&rec.destination, &self.link.connect)?,
        };
        // Reach the host the execution was dispatched to, whatever the config says today.
        t.hostname = rec.host.clone();
        t.port = rec.port;
        t.user = rec.user.clone();
        t.pinned_host_key.clone_from(&run.host_key);
        Ok(t)
    }
}
