//! The driver of [`crate::machine::Machine`]: dispatch or probe, stream, and on a lost
//! connection reconnect and decide again; every event the drive records, held or not, and
//! how an execution is concluded.

use std::time::{Duration, Instant};

use crate::epoch::{self, HostPlace};
use crate::evidence::Evidence;
use crate::host_helper::{self, Side};
use crate::id::ExecutionId;
use crate::journal::{ExecutionRecord, NewEvent};
use crate::lifecycle::Illegal;
use crate::machine::{Answer, Event, Mode, Note, Step, Wait, Why};
use crate::marker::{self, FinishRecord, Hello, Line, Op, StartRecord};
use crate::recovery::{Backoff, Liveness, Prior, Probe};
use crate::ssh::{SshError, Target};
use crate::state::State;

use super::*;

/// The bookkeeping place of an execution's host (see [`crate::epoch`]).
pub(super) fn place_of(rec: &ExecutionRecord, host_key: &str) -> HostPlace {
    HostPlace::new(&rec.user, &rec.host, rec.port, host_key, &rec.remote_dir)
}

/// The host's announced epoch against the one `run` is bound to: its started record's (as the
/// journal knew it, else as this reply shows it), else its dispatch's.
fn epoch_check(run: &Run, hello: &Hello) -> epoch::Check {
    epoch::check(
        epoch::expected(run.start_epoch.as_deref(), run.dispatch_epoch.as_deref()),
        &hello.epoch,
    )
}

/// The evidence behind a recovery conclusion, in words: what the host's reply showed that the
/// decision rests on (epochs, boot identities, the supervisor), appended to the table's reason.
fn with_evidence(reason: &str, run: &Run, reply: &Reply, probe: &Probe) -> String {
    let Some(hello) = &reply.hello else {
        return reason.to_owned();
    };
    let check = epoch_check(run, hello);
    let detail = match probe {
        Probe::Absent { .. }
        | Probe::Started {
            same_epoch: false, ..
        } => check.evidence(),
        Probe::Started {
            liveness: Liveness::Rebooted,
            ..
        } => match &reply.start {
            Some(s) => format!(
                "the started record has boot identity {}, the host now {}; {}",
                s.boot,
                hello.boot,
                check.evidence()
            ),
            None => check.evidence(),
        },
        Probe::Started {
            liveness: Liveness::Dead,
            ..
        } => match &reply.start {
            Some(s) => format!(
                "supervisor PID {} with start time {} is not running under boot identity {}; {}",
                s.sup_pid,
                s.sup_start,
                hello.boot,
                check.evidence()
            ),
            None => check.evidence(),
        },
        _ => return reason.to_owned(),
    };
    format!("{reason} (evidence: {detail})")
}

/// The evidence of a settled outcome the machine decided, in words.
pub(super) fn reason_text(
    why: Why,
    target: &Target,
    run: &Run,
    last: Option<&(Reply, Probe)>,
) -> String {
    match why {
        Why::Said(r) => r,
        Why::Table(r) => match last {
            Some((reply, probe)) => with_evidence(&r, run, reply, probe),
            None => r,
        },
        Why::HostKeyChanged { pinned, presented } => SshError::HostKeyPinned {
            host: target.display(),
            pinned,
            presented,
        }
        .to_string(),
    }
}

/// A step that needs the connection came without one (the machine always connects first).
fn not_connected(run: &Run) -> ExecError {
    ExecError::Internal(format!(
        "internal: {} had no connection for its next exec",
        run.rec.id
    ))
}

fn start_text(s: &StartRecord) -> String {
    format!(
        "v=1 id={} len={} digest={} epoch={} boot={} sup_pid={} sup_start={} started_at={} timeout={}",
        s.id, s.len, s.digest, s.epoch, s.boot, s.sup_pid, s.sup_start, s.started_at, s.timeout
    )
}

pub(super) fn finish_text(f: &FinishRecord) -> String {
    format!(
        "v=1 id={} status={} finished_at={} out={} err={} timed_out={} cancelled={}",
        f.id,
        f.status,
        f.finished_at,
        f.out,
        f.err,
        u8::from(f.timed_out),
        u8::from(f.cancelled)
    )
}

/// What a drive starts with and what it is for (see [`Executor::drive`]). `detach`: stop as
/// soon as the command is known to be running.
#[derive(Clone, Copy, Debug)]
pub(super) enum DriveMode {
    /// A fresh run: dispatch first, and stream the output to the sink.
    Dispatch { detach: bool },
    /// Follow an execution already sent (attach): probe first, and stream its output from the
    /// run's offsets.
    Follow { detach: bool },
    /// Settle an execution without its output (recover, cancel): probe first, no bytes to a
    /// sink.
    Settle { detach: bool },
}

impl DriveMode {
    /// The machine's view of this mode.
    fn machine(self) -> Mode {
        let (dispatch_first, detach, live) = match self {
            DriveMode::Dispatch { detach } => (true, detach, true),
            DriveMode::Follow { detach } => (false, detach, true),
            DriveMode::Settle { detach } => (false, detach, false),
        };
        Mode {
            dispatch_first,
            detach,
            live,
        }
    }
}

impl Executor {
    /// The reply has ended (or broken): settle what it held.
    pub(super) fn reply_over(
        &mut self,
        run: &mut Run,
        mut reply: Reply,
    ) -> Result<Reply, ExecError> {
        if !reply.ended && reply.broken.is_none() {
            reply.broken = Some("the reply ended before its last line (connection lost?)".into());
        }
        // Held events wait for the outcome only when this reply carries it.
        if reply.done.is_none() || !reply.ended {
            self.flush_held(run)?;
        }
        self.save_cursor(run, true);
        Ok(reply)
    }

    pub(super) fn on_line(
        &mut self,
        line: Line,
        run: &mut Run,
        reply: &mut Reply,
    ) -> Result<(), ExecError> {
        match line {
            Line::Hello(h) => reply.hello = Some(h),
            Line::Error(e) => reply.errors.push(e),
            Line::Verdict(v) => reply.verdict = Some(v),
            Line::Absent => reply.absent = true,
            Line::Start(s) => {
                let ours = s.id == run.rec.id.as_str() && s.digest == run.rec.command_digest;
                if run.m.start_seen(ours) {
                    let running = Evidence::Running {
                        start_record: start_text(&s),
                        host_key: run.host_key.as_deref(),
                        host_side: run.host_side.map(Side::as_str),
                        helper_sha256: (run.host_side == Some(Side::Helper))
                            .then_some(host_helper::SHA256),
                    }
                    .into_event();
                    run.held.push(running);
                    run.held_since = Some(Instant::now());
                }
                if run.start_epoch.is_none()
                    && s.id == run.rec.id.as_str()
                    && s.digest == run.rec.command_digest
                {
                    run.start_epoch = Some(s.epoch.clone());
                }
                run.start = Some(s.clone());
                reply.start = Some(s);
            }
            Line::Live(l) => {
                if l == Liveness::Alive && run.announce {
                    tracing::info!(
                        "cairn: {} is still running on the host; reattached at stdout byte {}, stderr byte {}",
                        run.rec.id,
                        run.out_off,
                        run.err_off
                    );
                    run.announce = false;
                }
                reply.live = Some(l)
            }
            Line::Sizes { .. } => {}
            Line::Done(f) => reply.done = Some(f),
            Line::Cancel(c) => reply.cancel = Some(c),
            Line::OutputGone => reply.output_gone = true,
            Line::Gc(g) => reply.gc = Some(g),
            Line::Helper(_) | Line::Installed => {}
            Line::End => reply.ended = true,
        }
        Ok(())
    }

    pub(super) fn save_cursor(&mut self, run: &mut Run, force: bool) {
        if run.out_off >= NO_BYTES || run.err_off >= NO_BYTES {
            return;
        }
        if force || run.last_cursor_save.elapsed() >= Duration::from_millis(100) {
            if let Err(e) = self
                .journal
                .set_cursor(&run.rec.id, run.out_off, run.err_off)
            {
                tracing::warn!("saving output offsets: {e}");
            }
            run.last_cursor_save = Instant::now();
        }
    }

    /// Turn a complete reply into the recovery table's probe input.
    pub(super) fn probe_from(&self, run: &Run, reply: &Reply) -> Probe {
        if !reply.bad.is_empty() {
            let bad: Vec<String> = reply.bad.iter().map(ToString::to_string).collect();
            return Probe::Unreadable(bad.join("; "));
        }
        if let Some(e) = reply.errors.first() {
            return Probe::Unreadable(format!("the host reported: {e}"));
        }
        let Some(hello) = &reply.hello else {
            return Probe::Unreadable("no hello line".into());
        };
        let same_epoch = epoch_check(run, hello).same();
        if let Some(s) = &reply.start {
            if s.digest != run.rec.command_digest {
                return Probe::Unreadable(format!(
                    "the host's started record for this ID is for another command (digest {})",
                    s.digest
                ));
            }
        }
        if reply.done.is_some() {
            return Probe::Finished;
        }
        if reply.absent {
            return Probe::Absent { same_epoch };
        }
        match (&reply.start, reply.live) {
            (Some(_), Some(liveness)) => Probe::Started {
                liveness,
                same_epoch,
            },
            _ => Probe::Unreadable("reply had neither a started record nor 'absent'".into()),
        }
    }

    /// The loop: dispatch or probe, stream, and on a lost connection reconnect and decide again;
    /// `mode` says which it starts with and whether output streams (see [`DriveMode`]).
    pub(super) async fn drive(
        &mut self,
        target: &Target,
        run: &mut Run,
        mode: DriveMode,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let r = self.drive_inner(target, run, mode.machine(), sink).await;
        // Nothing a run holds may be left behind, whichever way it ended.
        let flushed = self.flush_held(run);
        let past_dispatch = matches!(run.m.prior(), Prior::Dispatched | Prior::Started);
        let unsettled = |e: ExecError| match e {
            e @ ExecError::Unsettled { .. } => e,
            e if past_dispatch => ExecError::Unsettled {
                id: run.rec.id.to_string(),
                source: Box::new(e),
            },
            e => e,
        };
        let o = r.map_err(unsettled)?;
        flushed.map_err(unsettled)?;
        Ok(o)
    }

    /// The driver of [`Machine`]: carries out its steps on SSH, the journal and the clock, and
    /// feeds it what happened. Every decision is the machine's.
    async fn drive_inner(
        &mut self,
        target: &Target,
        run: &mut Run,
        mode: Mode,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let patience = self.patience.clone();
        let mut step = run.m.start(mode, &patience, Instant::now());
        // The connection the last connect gave, the last reply with its probe, and the secrets
        // of the dispatch being sent.
        let mut ci: Option<usize> = None;
        let mut last: Option<(Reply, Probe)> = None;
        let mut secrets = Vec::new();
        loop {
            while let Some(note) = run.m.poll_note() {
                let barrier = note.is_barrier();
                self.carry_note(note, target, run, &mut ci, last.as_ref())?;
                debug_assert!(
                    !barrier || run.held.is_empty(),
                    "a barrier note is durable before the next step"
                );
            }
            step = match step {
                Step::WaitForOwner => {
                    let m = run.m.clone();
                    self.wait_for_owner(run).await?;
                    let prior = run.m.prior();
                    run.m = m;
                    run.m.owner_waited(prior)
                }
                Step::Held => return self.held_outcome(run),
                Step::Settled => return self.settled_outcome(target, run, sink).await,
                Step::Connect { within } => {
                    let event = self.connect_step(target, run, within, &mut ci).await;
                    run.m.handle(Instant::now(), event)
                }
                Step::Wait { until, why } => {
                    match &why {
                        Wait::Reconnect { pause, error } => tracing::info!(
                            "cairn: {} still unreachable ({error}); next try in {pause:?}",
                            target.display()
                        ),
                        Wait::Retry(reason) => tracing::info!("{reason}"),
                        Wait::Look => {}
                    }
                    tokio::time::sleep_until(until.into()).await;
                    run.m.handle(Instant::now(), Event::Timer)
                }
                Step::Dispatch { fresh } => {
                    let (event, s) = self.prepare_dispatch(run, fresh, mode.detach)?;
                    secrets = s;
                    run.m.handle(Instant::now(), event)
                }
                Step::Send => {
                    let i = ci.ok_or_else(|| not_connected(run))?;
                    crate::failpoint::pause("before-send");
                    let reply = self.send(i, run, mode.detach, &secrets, sink).await?;
                    self.heard(run, &reply, true)?;
                    let (answer, probe) = self.answer_of(run, &reply);
                    last = Some((reply, probe));
                    run.m.handle(Instant::now(), Event::Replied(answer))
                }
                Step::Watch { wait } => {
                    let i = ci.ok_or_else(|| not_connected(run))?;
                    let reply = self.watch(i, run, wait, sink).await?;
                    self.heard(run, &reply, false)?;
                    let (answer, probe) = self.answer_of(run, &reply);
                    last = Some((reply, probe));
                    run.m.handle(Instant::now(), Event::Replied(answer))
                }
                Step::Running { recovered } => {
                    let mut o = self.outcome_from_journal(run)?;
                    o.state = State::Running;
                    o.recovered = recovered;
                    return Ok(o);
                }
                Step::Complete { recovered } => {
                    let done = last.as_ref().and_then(|(r, _)| r.done.clone());
                    return match done {
                        Some(done) => self.complete(run, done, recovered),
                        None => self.conclude(
                            run,
                            State::Unknown,
                            "probe said finished without a record",
                        ),
                    };
                }
                Step::Settle { state, why } => {
                    let reason = reason_text(why, target, run, last.as_ref());
                    return self.conclude(run, state, &reason);
                }
                Step::Withhold => return self.withhold(run),
                Step::Report => return self.outcome_from_journal(run),
            };
        }
    }

    /// The machine's `Connect` step: a connection to `target`, within `within` when the
    /// reconnect window bounds it, as the event the machine is fed; `ci` becomes the
    /// connection made.
    async fn connect_step(
        &mut self,
        target: &Target,
        run: &Run,
        within: Option<Duration>,
        ci: &mut Option<usize>,
    ) -> Event {
        let attempt = match within {
            Some(left) => match tokio::time::timeout(left, self.link.connection(target)).await {
                Ok(r) => r,
                Err(_) => Err(SshError::Timeout {
                    what: "reconnecting within --reconnect-for",
                    after: left,
                }),
            },
            None => self.link.connection(target).await,
        };
        match attempt {
            Ok(i) => {
                *ci = Some(i);
                Event::Connected {
                    presented: self.link.host_key(i).to_owned(),
                    pinned: run.host_key.clone(),
                }
            }
            Err(e) => Event::ConnectFailed {
                transient: e.is_transient(),
                error: e.to_string(),
            },
        }
    }

    /// The machine's `Watch` step on connection `i`: the probe, which is also the reattach
    /// stream while the command runs (`wait`: until it ends).
    async fn watch(
        &mut self,
        i: usize,
        run: &mut Run,
        wait: bool,
        sink: &mut dyn OutputSink,
    ) -> Result<Reply, ExecError> {
        let nonce = marker::new_nonce();
        let idc = run.rec.id.clone();
        let op = Op::Watch {
            id: &idc,
            out_off: run.out_off,
            err_off: run.err_off,
            wait,
        };
        self.exec_op(i, &op, &nonce, None, run, sink).await
    }

    /// Carry out one of the machine's notes (before its next step).
    fn carry_note(
        &mut self,
        note: Note,
        target: &Target,
        run: &mut Run,
        ci: &mut Option<usize>,
        last: Option<&(Reply, Probe)>,
    ) -> Result<(), ExecError> {
        match note {
            Note::Reconnected { after } => {
                run.reconnects += 1;
                tracing::info!(
                    "cairn: reconnected to {} after {:.1}s",
                    target.display(),
                    after.as_secs_f64()
                );
                run.held.push(
                    Evidence::Reconnected {
                        reconnects: run.reconnects,
                    }
                    .into_event(),
                );
                run.held_since.get_or_insert_with(Instant::now);
            }
            Note::Pin(fp) => run.host_key = Some(fp),
            Note::Lost(why) => {
                // Whatever was streamed is kept (offsets advanced).
                tracing::info!(
                    "cairn: connection to {} lost ({why}); reconnecting to ask the host what happened",
                    target.display()
                );
                run.announce = true;
                let lost = Evidence::ConnectionLost {
                    error: &why,
                    out_off: run.out_off,
                    err_off: run.err_off,
                };
                self.record(run, lost.into_event())?;
                if let Some(i) = ci.take() {
                    self.link.drop_connection(i);
                }
            }
            Note::GuardExists => {
                let start = last.and_then(|(r, _)| r.start.as_ref()).map(start_text);
                let exists = Evidence::GuardExists {
                    start_record: start,
                };
                self.record(run, exists.into_event())?;
            }
            Note::Redispatch => {
                tracing::info!(
                    "cairn: {} never started on the host (start guard not crossed); \
                     dispatching it again under the same ID",
                    run.rec.id
                );
                let probe = Evidence::ProbeAbsent {
                    result: (),
                    decision: (),
                };
                self.record(run, probe.into_event())?;
            }
            Note::Collecting => {
                if run.announce {
                    tracing::info!(
                        "cairn: {} finished while disconnected; returning its stored result",
                        run.rec.id
                    );
                    run.announce = false;
                }
            }
        }
        Ok(())
    }

    /// A settled execution is never touched again: report what the journal holds, plus the
    /// stored output when asked to replay it.
    async fn settled_outcome(
        &mut self,
        target: &Target,
        run: &mut Run,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        if run.out_off < NO_BYTES && run.done.is_some() {
            // The bytes are on the host alone. A connection that fails or breaks part-way is
            // tried again within the reconnect window, from the offsets received so far, with
            // the pauses a drive's reconnect takes; past the window, say so rather than answer
            // `completed` with output that is not all there.
            let began = Instant::now();
            let p = &self.patience;
            let mut backoff = Backoff::new(p.backoff_min, p.backoff_max, p.fast_for);
            let unread = |id: &ExecutionId, e: &dyn std::fmt::Display| {
                ExecError::Ssh(SshError::Disconnected(format!(
                    "{id} is settled, but its output could not be read from the host ({e}); \
                     nothing was run again; ask for it again (attach or output)"
                )))
            };
            loop {
                let why = match self.link.connection(target).await {
                    Err(e) if !e.is_transient() => return Err(unread(&run.rec.id, &e)),
                    Err(e) => e.to_string(),
                    Ok(ci) => {
                        let nonce = marker::new_nonce();
                        let idc = run.rec.id.clone();
                        let op = Op::Watch {
                            id: &idc,
                            out_off: run.out_off,
                            err_off: run.err_off,
                            wait: false,
                        };
                        let reply = self.exec_op(ci, &op, &nonce, None, run, sink).await?;
                        let Some(why) = reply.broken else { break };
                        self.link.drop_connection(ci);
                        why
                    }
                };
                let pause = backoff.pause();
                if began.elapsed() + pause >= self.patience.reconnect_for {
                    return Err(unread(&run.rec.id, &why));
                }
                tracing::debug!(
                    "cairn: reading the output of {}: {why}; again in {pause:?}",
                    run.rec.id
                );
                tokio::time::sleep(pause).await;
                backoff.after_pause(began.elapsed());
            }
        }
        let mut o = self.outcome_from_journal(run)?;
        o.recovered = true;
        Ok(o)
    }

    /// Before the bytes of a dispatch leave: for a fresh one, the request's gate crossed; then
    /// the `dispatched` event made durable, or refused by the journal. Returns what happened
    /// for the machine, and the secrets to send.
    fn prepare_dispatch(
        &mut self,
        run: &mut Run,
        fresh: bool,
        detach: bool,
    ) -> Result<(Event, Vec<u8>), ExecError> {
        // A new execution whose request's caller is gone sends nothing (src/exec/claims/gate.rs).
        let gate = fresh.then(crate::gate::current).flatten();
        let crossing = match gate.as_deref().map(|g| g.cross(&run.rec.id)) {
            Some(Err(why)) => return Ok((Event::DispatchRefused(why.to_string()), Vec::new())),
            Some(Ok(c)) => Some(c),
            None => None,
        };
        let secrets = self.secrets_for(&run.rec.id)?;
        let epoch = run.dispatch_epoch.clone();
        let dispatched = Evidence::Dispatched {
            epoch: epoch.as_deref(),
            host_key: run.host_key.as_deref(),
            attempt: run.reconnects,
            detach,
            timeout_secs: run.rec.timeout_secs,
        }
        .into_event();
        // The journal decides in the append itself: settled by another process while this one
        // prepared it (a `cancel` of an execution waiting for its approval, even one that came
        // after every check here), the `dispatched` event is refused and nothing is sent.
        let mut held = std::mem::take(&mut run.held);
        held.push(dispatched);
        crate::failpoint::pause("before-dispatched");
        let appended = match run.dispatch_from.take() {
            Some(from) => self
                .journal
                .append_all_if(&run.rec.id, from, held.clone())
                .map(Some),
            None => self.journal.append_all(&run.rec.id, held.clone()),
        };
        if let Err(e) = appended {
            let refused = e.refused().ok_or(e)?;
            // What this process held stays on record as the withheld note's evidence.
            held.pop();
            run.held = held;
            run.withheld_at = refused.from;
            return Ok((Event::SettledElsewhere, Vec::new()));
        }
        run.held_since = None;
        drop(crossing);
        Ok((Event::Dispatched, secrets))
    }

    /// Another process settled the execution before this one sent it: its approval stays on
    /// record as a note (a transition now would move the settled state back).
    fn withhold(&mut self, run: &mut Run) -> Result<Outcome, ExecError> {
        let s = run.withheld_at;
        let held = std::mem::take(&mut run.held);
        let kinds: Vec<&str> = held.iter().map(|h| h.0.as_str()).collect();
        self.journal.append_evidence(
            &run.rec.id,
            Evidence::DispatchWithheld {
                by: crate::journal::client_identity(),
                state: s,
                withheld: kinds,
                reason: (),
            },
        )?;
        self.outcome_from_journal(run)
    }

    /// Send the dispatch (the `dispatched` event is durable) and stream its reply: through the
    /// connection's host session when it can carry this dispatch, else one exec.
    pub(super) async fn send(
        &mut self,
        ci: usize,
        run: &mut Run,
        detach: bool,
        secrets: &[u8],
        sink: &mut dyn OutputSink,
    ) -> Result<Reply, ExecError> {
        let nonce = marker::new_nonce();
        let idc = run.rec.id.clone();
        let digest_c = run.rec.command_digest.clone();
        let op = if secrets.is_empty() {
            Op::Dispatch {
                id: &idc,
                len: run.rec.command.len(),
                digest: &digest_c,
                timeout_secs: run.rec.timeout_secs,
                attach: !detach,
            }
        } else {
            Op::DispatchWithSecrets {
                id: &idc,
                len: run.rec.command.len(),
                digest: &digest_c,
                timeout_secs: run.rec.timeout_secs,
                attach: !detach,
                secrets_len: secrets.len(),
            }
        };
        let side = if self.link.host_session {
            self.link.side_for(ci, &run.rec.remote_dir).await?
        } else {
            Side::Script
        };
        let session = match &self.link.conns[ci].2 {
            Some(lease)
                if self.link.host_session
                    && secrets.is_empty()
                    && !detach
                    && run.rec.command.len() <= crate::session::MAX_COMMAND
                    && marker::session_can_carry(&run.rec.command) =>
            {
                Some(lease.session(
                    &self.link.conns[ci].1,
                    &run.rec.remote_dir,
                    side == Side::Helper,
                ))
            }
            _ => None,
        };
        let via_session = match session {
            Some(s) => self.session_op(&s, run, sink).await?,
            None => None,
        };
        match via_session {
            Some(reply) => Ok(reply),
            None => {
                let mut command = run.rec.command.clone();
                command.extend_from_slice(secrets);
                self.exec_op(ci, &op, &nonce, Some(&command), run, sink)
                    .await
            }
        }
    }

    /// What a reply's hello says about epochs, recorded: the epoch a dispatch ran under, and
    /// the bookkeeping of the host's place.
    fn heard(&mut self, run: &mut Run, reply: &Reply, was_dispatch: bool) -> Result<(), ExecError> {
        let Some(h) = &reply.hello else {
            return Ok(());
        };
        if was_dispatch && run.dispatch_epoch.as_deref() != Some(h.epoch.as_str()) {
            // The host said, before its start guard, which epoch this dispatch ran under: that
            // is the one the execution is bound to.
            let announced = Evidence::DispatchEpoch {
                epoch: &h.epoch,
                recorded_before: run.dispatch_epoch.as_deref(),
                evidence: (),
            }
            .into_event();
            self.record(run, announced)?;
            run.dispatch_epoch = Some(h.epoch.clone());
        }
        self.note_epoch(run, &h.epoch)
    }

    /// A reply as the machine takes it, and its probe (kept for the evidence of a conclusion).
    pub(super) fn answer_of(&self, run: &Run, reply: &Reply) -> (Answer, Probe) {
        let probe = self.probe_from(run, reply);
        tracing::debug!("probe: {probe:?}");
        let answer = Answer {
            broken: reply.broken.clone(),
            verdict: reply.verdict.clone(),
            errors: reply.errors.clone(),
            start_matches: reply
                .start
                .as_ref()
                .map(|s| s.digest == run.rec.command_digest),
            finish: reply.done.as_ref().map(|d| (d.out, d.err)),
            output_gone: reply.output_gone,
            received: (run.out_off, run.err_off),
            probe: probe.clone(),
        };
        (answer, probe)
    }

    /// Append an event of `run`, in one transaction with the events it holds (see `Run::held`).
    /// `Some`: the journal refused a transition among them (see [`Executor::flush_held`]).
    pub(super) fn record(
        &mut self,
        run: &mut Run,
        event: NewEvent,
    ) -> Result<Option<Illegal>, ExecError> {
        run.held.push(event);
        self.flush_held(run)
    }

    /// Commit the events `run` holds, if any, in one transaction. The journal checks each
    /// transition against the state recorded at that moment: when another process moved the
    /// execution on meanwhile (an `attach` recorded its result, a `cancel` came first) it
    /// refuses them all, and that state stands; the held notes are then committed alone and
    /// the refusal returned, for the caller that acts on it.
    pub(super) fn flush_held(&mut self, run: &mut Run) -> Result<Option<Illegal>, ExecError> {
        let mut refused = None;
        if !run.held.is_empty() {
            let held = std::mem::take(&mut run.held);
            let notes: Vec<NewEvent> = held.iter().filter(|e| e.1.is_none()).cloned().collect();
            match self.journal.append_all(&run.rec.id, held) {
                Ok(_) => {}
                Err(e) => {
                    let r = e.refused().ok_or(e)?;
                    tracing::debug!("cairn: {}: {r}", run.rec.id);
                    refused = Some(r);
                    if !notes.is_empty() {
                        self.journal.append_all(&run.rec.id, notes)?;
                    }
                }
            }
        }
        run.held_since = None;
        Ok(refused)
    }

    pub(super) fn complete(
        &mut self,
        run: &mut Run,
        done: FinishRecord,
        recovered: bool,
    ) -> Result<Outcome, ExecError> {
        let state = if done.cancelled {
            State::Cancelled
        } else {
            State::Completed
        };
        let finished = Evidence::Finished {
            state,
            finish_record: finish_text(&done),
            recovered,
            reconnects: run.reconnects,
        }
        .into_event();
        // Another process attached to the same execution may have recorded it already: the
        // journal then refuses this one, and the outcome is the one it holds.
        self.record(run, finished)?;
        run.done = Some(done);
        run.m.set_prior(Prior::Settled);
        let mut o = self.outcome_from_journal(run)?;
        o.recovered = recovered;
        Ok(o)
    }

    pub(super) fn conclude(
        &mut self,
        run: &mut Run,
        state: State,
        reason: &str,
    ) -> Result<Outcome, ExecError> {
        let concluded = Evidence::Concluded {
            state,
            reason,
            reconnects: run.reconnects,
            start_record: run.start.as_ref().map(start_text),
        }
        .into_event();
        if let Some(refused) = self.record(run, concluded)? {
            return self.overtaken(run, state, reason, refused);
        }
        if state.is_settled() {
            run.m.set_prior(Prior::Settled);
        }
        let mut o = self.outcome_from_journal(run)?;
        o.reason = Some(reason.to_owned());
        Ok(o)
    }

    /// The answer of a conclusion the journal refused: another process (a `recover`, an
    /// `attach`, a `cancel`) settled the execution while this one could not reach the host.
    /// Its verdict stands: an `unknown` appended after it would contradict the host, and this
    /// process has none of the result to hand on.
    fn overtaken(
        &mut self,
        run: &mut Run,
        state: State,
        reason: &str,
        refused: Illegal,
    ) -> Result<Outcome, ExecError> {
        let mut o = self.outcome_from_journal(run)?;
        let recorded = refused.from.unwrap_or(o.state);
        if recorded.is_settled() {
            run.m.set_prior(Prior::Settled);
        }
        if recorded == state {
            // (recorded already: a retry of a `failed` one that failed again)
            o.reason = Some(reason.to_owned());
            return Ok(o);
        }
        if !state.is_settled() {
            o.state = state;
            o.needs_review = true;
        }
        o.reason = Some(format!(
            "{reason}; meanwhile another process recorded it as {recorded}: `cairn attach {}` \
             returns its result (do not send it again)",
            run.rec.id
        ));
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventKind;
    use serde_json::json;

    /// Events a run held while another process recorded the execution's result: the journal
    /// refuses the held `running` (the result stands), and the held note is still recorded.
    #[test]
    fn held_transitions_overtaken_by_a_result_are_refused_and_the_notes_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(&dir.path().join("j.db")).unwrap();
        let rec = crate::journal::tests::rec("ex_held");
        j.accept(&rec, crate::journal::accepted_evidence(&rec))
            .unwrap();
        crate::journal::tests::walk(
            &mut j,
            &rec.id,
            &[State::Authorized, State::Dispatched, State::Completed],
        );
        let mut ex = Executor::new(j, ConnectOptions::default(), Patience::default());
        let mut run = ex.load(&rec.id).unwrap();
        run.held = vec![
            Evidence::Reconnected { reconnects: 1 }.into_event(),
            (EventKind::Running, Some(State::Running), json!({})),
        ];
        let refused = ex.flush_held(&mut run).unwrap();
        assert_eq!(
            refused,
            Some(Illegal {
                from: Some(State::Completed),
                to: State::Running
            })
        );
        assert!(run.held.is_empty());
        let kinds: Vec<String> = ex
            .journal
            .events(&rec.id)
            .unwrap()
            .iter()
            .map(|e| e.kind.to_string())
            .collect();
        assert_eq!(
            kinds,
            [
                "accepted",
                "authorized",
                "dispatched",
                "completed",
                "reconnected"
            ]
        );
        assert_eq!(
            ex.journal.status(&rec.id).unwrap().unwrap().state,
            State::Completed
        );
        // and a delivery is recorded once: the second is refused by the journal, quietly
        ex.mark_delivered(&rec.id, "test").unwrap();
        ex.mark_delivered(&rec.id, "test").unwrap();
        let delivered = ex
            .journal
            .events(&rec.id)
            .unwrap()
            .iter()
            .filter(|e| e.kind == EventKind::Delivered)
            .count();
        assert_eq!(delivered, 1);
    }
}
