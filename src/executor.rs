//! The one place that sequences an execution:
//! accept → connect → dispatch → stream → (reconnect → probe → decide) → conclude → deliver.
//!
//! Everything that happens is appended to the journal before it is acted on. The decision after
//! a lost connection is [`crate::recovery::decide`]; this module only gathers its inputs (one
//! `watch` exec, which is both the probe and, when the command is still running, the reattach
//! stream) and carries out its answer.

use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::id::ExecutionId;
use crate::journal::{now_rfc3339, rfc3339_from_unix, ExecutionRecord, Journal, JournalError};
use crate::marker::{self, FinishRecord, Hello, Line, Op, Piece, StartRecord, StderrDemux};
use crate::recovery::{decide, Action, Liveness, Prior, Probe};
use crate::ssh::{ConnectOptions, Connection, ExecEvent, SshError, Target};
use crate::state::State;

/// Offsets larger than any output: a probe that wants the records but no bytes.
const NO_BYTES: u64 = 999_999_999_999_999; // 15 digits: the host script accepts at most 15

/// Errors that end an operation before an outcome could be recorded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    #[error(transparent)]
    Ssh(#[from] SshError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Input(String),
    #[error("no execution {0} in journal {1}")]
    NoSuchExecution(String, String),
    #[error(
        "execution ID {id} already exists in the journal for another operation:\n  \
         recorded: {recorded}\n  requested: {requested}\n\
         Use a new ID, or rerun with exactly the recorded destination and command"
    )]
    IdConflict {
        id: String,
        recorded: String,
        requested: String,
    },
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// Where the command's output goes as it arrives.
pub trait OutputSink {
    fn stdout(&mut self, data: &[u8]) -> std::io::Result<()>;
    fn stderr(&mut self, data: &[u8]) -> std::io::Result<()>;
}

/// Discards output (for `recover`, `status`).
pub struct Discard;
impl OutputSink for Discard {
    fn stdout(&mut self, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
    fn stderr(&mut self, _: &[u8]) -> std::io::Result<()> {
        Ok(())
    }
}

/// How persistently to work towards an outcome.
#[derive(Clone, Debug)]
pub struct Patience {
    /// After the connection is lost, how long to keep trying to reach the host again.
    pub reconnect_for: Duration,
    /// First backoff between reconnect attempts (doubles up to `backoff_max`).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for Patience {
    fn default() -> Self {
        Patience {
            reconnect_for: Duration::from_secs(300),
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// A request to run a command.
#[derive(Clone, Debug)]
pub struct RunRequest {
    pub destination: String,
    pub command: Vec<u8>,
    pub id: Option<ExecutionId>,
    pub timeout_secs: u64,
    pub detach: bool,
    pub remote_dir: String,
}

/// What cairn knows about an execution at the end of an operation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Outcome {
    pub execution_id: String,
    pub destination: String,
    pub host: String,
    pub host_key_fingerprint: Option<String>,
    pub state: State,
    pub exit_code: Option<u8>,
    pub signal: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub reconnects: u32,
    pub timed_out: bool,
    /// Whether this result was recovered from the host's records rather than watched live.
    pub recovered: bool,
    /// The evidence behind the state, in words.
    pub reason: Option<String>,
}

impl Outcome {
    /// The process exit code the CLI uses for this outcome (documented in the README).
    pub fn exit_code_for_cli(&self) -> i32 {
        match self.state {
            State::Completed | State::Delivered => {
                self.exit_code.map(i32::from).unwrap_or(EXIT_UNKNOWN)
            }
            State::Cancelled => self.exit_code.map(i32::from).unwrap_or(EXIT_UNKNOWN),
            State::Running | State::Dispatched if self.exit_code.is_none() => 0,
            State::Failed | State::Rejected | State::Accepted | State::Authorized => {
                EXIT_NOT_DISPATCHED
            }
            _ => EXIT_UNKNOWN,
        }
    }
}

/// Exit code when nothing was dispatched (as `ssh` uses 255 for its own errors).
pub const EXIT_NOT_DISPATCHED: i32 = 255;
/// Exit code when the outcome is `interrupted` or `unknown`.
pub const EXIT_UNKNOWN: i32 = 254;

/// Everything one reply (one exec) said.
#[derive(Debug, Default)]
struct Reply {
    hello: Option<Hello>,
    verdict: Option<String>,
    absent: bool,
    start: Option<StartRecord>,
    live: Option<Liveness>,
    done: Option<FinishRecord>,
    cancel: Option<String>,
    errors: Vec<String>,
    bad: Vec<String>,
    ended: bool,
    /// The stream broke (connection lost) before `end`.
    broken: Option<String>,
}

/// The state of one execution while an operation drives it.
struct Run {
    rec: ExecutionRecord,
    prior: Prior,
    expected_epoch: Option<String>,
    out_off: u64,
    err_off: u64,
    reconnects: u32,
    host_key: Option<String>,
    start: Option<StartRecord>,
    done: Option<FinishRecord>,
    last_cursor_save: Instant,
    /// Tell the user what the next probe finds (set after a lost connection).
    announce: bool,
}

pub struct Executor {
    pub journal: Journal,
    pub connect: ConnectOptions,
    pub patience: Patience,
    conns: Vec<(String, Connection)>,
}

fn digest(cmd: &[u8]) -> String {
    hex::encode(Sha256::digest(cmd))
}

impl Executor {
    pub fn new(journal: Journal, connect: ConnectOptions, patience: Patience) -> Self {
        Executor {
            journal,
            connect,
            patience,
            conns: Vec::new(),
        }
    }

    /// `cairn run`: accept, dispatch, stream, survive connection loss, conclude, deliver.
    pub async fn run(
        &mut self,
        req: RunRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        marker::validate_remote_dir(&req.remote_dir).map_err(ExecError::Input)?;
        let target = crate::ssh::resolve(&req.destination, &self.connect)?;
        let cmd_digest = digest(&req.command);

        if let Some(id) = &req.id {
            if let Some(rec) = self.journal.execution(id)? {
                let same = rec.command_digest == cmd_digest
                    && rec.host == target.hostname
                    && rec.port == target.port
                    && rec.user == target.user;
                if !same {
                    return Err(ExecError::IdConflict {
                        id: id.to_string(),
                        recorded: format!(
                            "{}@{}:{} -- {}",
                            rec.user,
                            rec.host,
                            rec.port,
                            rec.command_display()
                        ),
                        requested: format!(
                            "{}@{}:{} -- {}",
                            target.user,
                            target.hostname,
                            target.port,
                            String::from_utf8_lossy(&req.command)
                        ),
                    });
                }
                // The same operation again: never a second run. Replay from the start.
                self.journal.append(
                    id,
                    "request-reused",
                    None,
                    json!({"by": crate::journal::client_identity(),
                           "decision": "same ID, same operation: attach to the existing execution"}),
                )?;
                return self.attach_from(id, sink, (0, 0), true).await;
            }
        }

        let id = req.id.clone().unwrap_or_else(ExecutionId::generate);
        let rec = ExecutionRecord {
            id: id.clone(),
            created_at: now_rfc3339(),
            destination: req.destination.clone(),
            host: target.hostname.clone(),
            port: target.port,
            user: target.user.clone(),
            command: req.command.clone(),
            command_digest: cmd_digest,
            remote_dir: req.remote_dir.clone(),
            timeout_secs: req.timeout_secs,
            client: crate::journal::client_identity().to_owned(),
        };
        self.journal
            .accept(&rec, crate::journal::accepted_evidence(&rec))?;

        let mut run = Run {
            rec,
            prior: Prior::NotDispatched,
            expected_epoch: None,
            out_off: 0,
            err_off: 0,
            reconnects: 0,
            host_key: None,
            start: None,
            done: None,
            last_cursor_save: Instant::now(),
            announce: false,
        };

        // First contact: connect, authorize, learn the host's epoch. A failure here is a
        // proven "never started": nothing was sent.
        let conn_idx = match self.connection(&target).await {
            Ok(i) => i,
            Err(e) => {
                self.conclude(&mut run, State::Failed, &format!("never dispatched: {e}"))?;
                return Err(e.into());
            }
        };
        let fp = self.conns[conn_idx].1.host_key_fingerprint().to_owned();
        run.host_key = Some(fp.clone());
        self.journal.append(
            &id,
            "authorized",
            Some(State::Authorized),
            json!({"by": "local-cli", "host_key": fp}),
        )?;
        let epoch = match self.journal.host_epoch(&fp, &run.rec.remote_dir)? {
            Some(e) => e,
            None => match self.hello(conn_idx, &run.rec.remote_dir).await {
                Ok(h) => {
                    self.journal
                        .set_host_epoch(&fp, &run.rec.remote_dir, &h.epoch)?;
                    h.epoch
                }
                Err(why) => {
                    let o = self.conclude(
                        &mut run,
                        State::Failed,
                        &format!("never dispatched: preparing the host failed: {why}"),
                    )?;
                    return Ok(o);
                }
            },
        };
        run.expected_epoch = Some(epoch);
        self.drive(&target, &mut run, true, req.detach, true, sink)
            .await
    }

    /// `cairn attach`: stream from the stored offsets, wait, and conclude.
    pub async fn attach(
        &mut self,
        id: &ExecutionId,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let offsets = self.journal.cursor(id)?;
        self.attach_from(id, sink, offsets, true).await
    }

    async fn attach_from(
        &mut self,
        id: &ExecutionId,
        sink: &mut dyn OutputSink,
        offsets: (u64, u64),
        wait: bool,
    ) -> Result<Outcome, ExecError> {
        let mut run = self.load(id)?;
        run.out_off = offsets.0;
        run.err_off = offsets.1;
        let target = self.target_for(&run.rec)?;
        self.drive(&target, &mut run, false, !wait, true, sink)
            .await
    }

    /// `cairn recover`: apply the recovery table to one execution that is not settled.
    /// Re-dispatches (detached) what provably never started; never streams output.
    pub async fn recover_one(
        &mut self,
        id: &ExecutionId,
        wait: bool,
    ) -> Result<Outcome, ExecError> {
        let mut run = self.load(id)?;
        run.out_off = NO_BYTES;
        run.err_off = NO_BYTES;
        let target = self.target_for(&run.rec)?;
        self.drive(&target, &mut run, false, !wait, false, &mut Discard)
            .await
    }

    /// `cairn status`: the journal's view plus one fresh probe, without changing anything.
    pub async fn probe(
        &mut self,
        id: &ExecutionId,
    ) -> Result<(Outcome, Result<Probe, String>), ExecError> {
        let mut run = self.load(id)?;
        let target = self.target_for(&run.rec)?;
        let journal_outcome = self.outcome_from_journal(&run)?;
        let probe = match self.connection(&target).await {
            Err(e) => Err(e.to_string()),
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
                    .exec_op(ci, &op, &nonce, None, &mut run, &mut Discard)
                    .await?;
                if let Some(b) = &reply.broken {
                    Err(format!("probe did not complete: {b}"))
                } else {
                    Ok(self.probe_from(&run, &reply))
                }
            }
        };
        Ok((journal_outcome, probe))
    }

    /// `cairn output`: the whole stdout (or stderr) of an execution, read from the host.
    pub async fn output(
        &mut self,
        id: &ExecutionId,
        stderr: bool,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<FinishRecord>, ExecError> {
        let mut run = self.load(id)?;
        let target = self.target_for(&run.rec)?;
        let ci = self.connection(&target).await?;
        let nonce = marker::new_nonce();
        let (o, e) = if stderr { (NO_BYTES, 0) } else { (0, NO_BYTES) };
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
            return Err(ExecError::Input(format!(
                "the host has no record of {id}: it never started there"
            )));
        }
        if let Some(e) = reply.errors.first() {
            return Err(ExecError::Input(format!("the host reported: {e}")));
        }
        Ok(reply.done)
    }

    /// `cairn cancel`: stop the remote process group and record `cancelled`.
    pub async fn cancel(
        &mut self,
        id: &ExecutionId,
        grace_secs: u64,
    ) -> Result<Outcome, ExecError> {
        let mut run = self.load(id)?;
        let target = self.target_for(&run.rec)?;
        if run.prior == Prior::Settled {
            return self.outcome_from_journal(&run);
        }
        if run.prior == Prior::NotDispatched {
            return self.conclude(
                &mut run,
                State::Cancelled,
                "cancelled before dispatch: nothing was sent",
            );
        }
        let ci = self.connection(&target).await?;
        let nonce = marker::new_nonce();
        self.journal.append(
            id,
            "cancel-requested",
            None,
            json!({"grace_secs": grace_secs}),
        )?;
        let idc = run.rec.id.clone();
        let op = Op::Cancel {
            id: &idc,
            grace_secs,
        };
        let reply = self
            .exec_op(ci, &op, &nonce, None, &mut run, &mut Discard)
            .await?;
        if let Some(b) = reply.broken {
            return Err(SshError::Disconnected(b).into());
        }
        if let Some(e) = reply.errors.first() {
            return Err(ExecError::Input(format!("the host reported: {e}")));
        }
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
                self.drive(&target, &mut run, false, false, false, &mut Discard)
                    .await
            }
        }
    }

    // ----- internals -------------------------------------------------------------------

    fn load(&mut self, id: &ExecutionId) -> Result<Run, ExecError> {
        let rec = self.journal.execution(id)?.ok_or_else(|| {
            ExecError::NoSuchExecution(id.to_string(), self.journal.path().display().to_string())
        })?;
        let events = self.journal.events(id)?;
        let status = crate::journal::status_from_events(&events);
        let prior = match &status {
            Some(s) => Prior::from_journal(s.state, s.before_unknown),
            None => Prior::NotDispatched,
        };
        let mut run = Run {
            rec,
            prior,
            expected_epoch: None,
            out_off: 0,
            err_off: 0,
            reconnects: 0,
            host_key: None,
            start: None,
            done: None,
            last_cursor_save: Instant::now(),
            announce: false,
        };
        for ev in &events {
            if let Some(e) = ev.evidence.get("epoch").and_then(|v| v.as_str()) {
                if ev.kind == "dispatched" {
                    run.expected_epoch = Some(e.to_owned());
                }
            }
            if let Some(k) = ev.evidence.get("host_key").and_then(|v| v.as_str()) {
                run.host_key = Some(k.to_owned());
            }
            if let Some(r) = ev.evidence.get("reconnects").and_then(|v| v.as_u64()) {
                run.reconnects = r as u32;
            }
            if let Some(s) = ev.evidence.get("start_record").and_then(|v| v.as_str()) {
                run.start = StartRecord::parse(s).ok();
            }
            if let Some(s) = ev.evidence.get("finish_record").and_then(|v| v.as_str()) {
                run.done = FinishRecord::parse(s).ok();
            }
        }
        Ok(run)
    }

    fn target_for(&self, rec: &ExecutionRecord) -> Result<Target, ExecError> {
        let mut t = crate::ssh::resolve(&rec.destination, &self.connect)?;
        // Reach the host the execution was dispatched to, whatever the config says today.
        t.hostname = rec.host.clone();
        t.port = rec.port;
        t.user = rec.user.clone();
        Ok(t)
    }

    /// A live connection to `target`, reusing one if it is still open.
    async fn connection(&mut self, target: &Target) -> Result<usize, SshError> {
        let key = format!("{}@{}:{}", target.user, target.hostname, target.port);
        if let Some(i) = self
            .conns
            .iter()
            .position(|(k, c)| *k == key && !c.is_closed())
        {
            return Ok(i);
        }
        self.conns.retain(|(k, _)| *k != key);
        let c = Connection::connect(target, &self.connect).await?;
        self.conns.push((key, c));
        Ok(self.conns.len() - 1)
    }

    fn drop_connection(&mut self, idx: usize) {
        if idx < self.conns.len() {
            self.conns.remove(idx);
        }
    }

    async fn hello(&mut self, ci: usize, dir: &str) -> Result<Hello, String> {
        let nonce = marker::new_nonce();
        let cmd = marker::invocation(&Op::Hello, dir, &nonce);
        let mut exec = self.conns[ci]
            .1
            .exec(cmd.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let _ = exec.close_stdin().await;
        let mut demux = StderrDemux::new(&nonce);
        let mut hello = None;
        let mut errors = Vec::new();
        loop {
            match exec.next().await {
                Ok(Some(ExecEvent::Stderr(d))) => {
                    let mut pieces = Vec::new();
                    demux.feed(&d, &mut pieces);
                    for p in pieces {
                        match p {
                            Piece::Line(Ok(Line::Hello(h))) => hello = Some(h),
                            Piece::Line(Ok(Line::Error(e))) => errors.push(e),
                            Piece::Line(Err(e)) => errors.push(e),
                            _ => {}
                        }
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => return Err(e.to_string()),
            }
        }
        match hello {
            Some(h) if errors.is_empty() => Ok(h),
            _ if !errors.is_empty() => Err(errors.join("; ")),
            _ => Err("the host did not answer the marker protocol (is /bin/sh POSIX?)".into()),
        }
    }

    /// Run one protocol exec and consume its reply, streaming command output to `sink` and
    /// recording `running` the moment the started record is seen.
    async fn exec_op(
        &mut self,
        ci: usize,
        op: &Op<'_>,
        nonce: &str,
        stdin: Option<&[u8]>,
        run: &mut Run,
        sink: &mut dyn OutputSink,
    ) -> Result<Reply, ExecError> {
        let cmd = marker::invocation(op, &run.rec.remote_dir, nonce);
        let mut reply = Reply::default();
        let mut exec = match self.conns[ci].1.exec(cmd.as_bytes()).await {
            Ok(e) => e,
            Err(e) => {
                reply.broken = Some(e.to_string());
                return Ok(reply);
            }
        };
        let sent = match stdin {
            Some(data) => exec.write_stdin(data).await.and(exec.close_stdin().await),
            None => exec.close_stdin().await,
        };
        if let Err(e) = sent {
            reply.broken = Some(e.to_string());
            return Ok(reply);
        }
        let mut demux = StderrDemux::new(nonce);
        let mut pieces = Vec::new();
        loop {
            let ev = match exec.next().await {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    reply.broken = Some(e.to_string());
                    break;
                }
            };
            match ev {
                ExecEvent::Stdout(d) => {
                    if run.out_off < NO_BYTES {
                        sink.stdout(&d)?;
                        run.out_off += d.len() as u64;
                        self.save_cursor(run, false);
                    }
                }
                ExecEvent::Stderr(d) => {
                    demux.feed(&d, &mut pieces);
                    for p in pieces.drain(..) {
                        match p {
                            Piece::Stderr(s) => {
                                if run.err_off < NO_BYTES {
                                    sink.stderr(&s)?;
                                    run.err_off += s.len() as u64;
                                    self.save_cursor(run, false);
                                }
                            }
                            Piece::Line(Ok(line)) => self.on_line(line, run, &mut reply)?,
                            Piece::Line(Err(e)) => reply.bad.push(e),
                        }
                    }
                }
                ExecEvent::ExitStatus(_) | ExecEvent::ExitSignal(_) => {}
            }
        }
        if !reply.ended && reply.broken.is_none() {
            reply.broken = Some("the reply ended before its last line (connection lost?)".into());
        }
        self.save_cursor(run, true);
        Ok(reply)
    }

    fn on_line(&mut self, line: Line, run: &mut Run, reply: &mut Reply) -> Result<(), ExecError> {
        match line {
            Line::Hello(h) => reply.hello = Some(h),
            Line::Error(e) => reply.errors.push(e),
            Line::Verdict(v) => reply.verdict = Some(v),
            Line::Absent => reply.absent = true,
            Line::Start(s) => {
                if matches!(run.prior, Prior::Dispatched | Prior::NotDispatched)
                    && s.id == run.rec.id.as_str()
                    && s.digest == run.rec.command_digest
                {
                    self.journal.append(
                        &run.rec.id,
                        "running",
                        Some(State::Running),
                        json!({"start_record": start_text(&s), "host_key": run.host_key}),
                    )?;
                    run.prior = Prior::Started;
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
            Line::End => reply.ended = true,
        }
        Ok(())
    }

    fn save_cursor(&mut self, run: &mut Run, force: bool) {
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
    fn probe_from(&self, run: &Run, reply: &Reply) -> Probe {
        if !reply.bad.is_empty() {
            return Probe::Unreadable(reply.bad.join("; "));
        }
        if let Some(e) = reply.errors.first() {
            return Probe::Unreadable(format!("the host reported: {e}"));
        }
        let Some(hello) = &reply.hello else {
            return Probe::Unreadable("no hello line".into());
        };
        let same_epoch = run
            .expected_epoch
            .as_deref()
            .is_none_or(|e| e == hello.epoch);
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

    /// The loop: dispatch or probe, stream, and on a lost connection reconnect and decide again.
    ///
    /// `dispatch_first`: start with a dispatch (a fresh run) instead of a probe.
    /// `detach`: stop as soon as the command is known to be running.
    /// `live`: stream output bytes to the sink (off for recover/cancel/status).
    async fn drive(
        &mut self,
        target: &Target,
        run: &mut Run,
        dispatch_first: bool,
        detach: bool,
        live: bool,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        if run.prior == Prior::Settled {
            // A settled execution is never touched again: report what the journal holds,
            // plus the stored output when asked to replay it.
            if run.out_off < NO_BYTES && run.done.is_some() {
                if let Ok(ci) = self.connection(target).await {
                    let nonce = marker::new_nonce();
                    let idc = run.rec.id.clone();
                    let op = Op::Watch {
                        id: &idc,
                        out_off: run.out_off,
                        err_off: run.err_off,
                        wait: false,
                    };
                    let _ = self.exec_op(ci, &op, &nonce, None, run, sink).await?;
                }
            }
            let mut o = self.outcome_from_journal(run)?;
            o.recovered = true;
            return Ok(o);
        }
        if run.prior == Prior::NotDispatched && !dispatch_first {
            let action = decide(run.prior, &Probe::Unreachable);
            if let Action::Conclude { state, reason } = action {
                return self.conclude(run, state, &reason);
            }
        }

        let mut short_reads = 0;
        let mut next_dispatch = dispatch_first;
        let mut backoff = self.patience.backoff_min;
        let mut lost_since: Option<Instant> = None;
        let mut recovered = !dispatch_first;
        loop {
            // 1. A connection (reconnecting with backoff within the patience window).
            let ci = match self.connection(target).await {
                Ok(ci) => {
                    if let Some(since) = lost_since.take() {
                        run.reconnects += 1;
                        tracing::info!(
                            "cairn: reconnected to {} after {:.1}s",
                            target.display(),
                            since.elapsed().as_secs_f64()
                        );
                        self.journal.append(
                            &run.rec.id,
                            "reconnected",
                            None,
                            json!({"reconnects": run.reconnects}),
                        )?;
                    }
                    ci
                }
                Err(e) => {
                    if !e.is_transient() {
                        let reason = format!("cannot reach the host to learn the outcome: {e}");
                        return self.give_up(run, &reason, e.into());
                    }
                    let since = *lost_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.patience.reconnect_for {
                        let reason = format!(
                            "host unreachable for {:?} (last error: {e}); the outcome is unknown",
                            since.elapsed()
                        );
                        return self.conclude(run, State::Unknown, &reason);
                    }
                    tracing::info!(
                        "cairn: {} still unreachable ({e}); next try in {backoff:?}",
                        target.display()
                    );
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.patience.backoff_max);
                    continue;
                }
            };
            // The host must be the one this execution was dispatched to.
            let fp = self.conns[ci].1.host_key_fingerprint().to_owned();
            match &run.host_key {
                Some(k) if *k != fp => {
                    let reason = format!(
                        "the host now presents key {fp}, but the execution was dispatched to {k}; \
                         refusing to treat it as the same host"
                    );
                    return self.conclude(run, State::Unknown, &reason);
                }
                None => run.host_key = Some(fp),
                _ => {}
            }

            // 2. One exec: the dispatch, or the probe that is also the reattach stream.
            let nonce = marker::new_nonce();
            let reply = if next_dispatch {
                let epoch = run.expected_epoch.clone();
                self.journal.append(
                    &run.rec.id,
                    "dispatched",
                    Some(State::Dispatched),
                    json!({"epoch": epoch, "host_key": run.host_key, "attempt": run.reconnects,
                           "detach": detach, "timeout_secs": run.rec.timeout_secs}),
                )?;
                if run.prior == Prior::NotDispatched {
                    run.prior = Prior::Dispatched;
                }
                let idc = run.rec.id.clone();
                let digest_c = run.rec.command_digest.clone();
                let op = Op::Dispatch {
                    id: &idc,
                    len: run.rec.command.len(),
                    digest: &digest_c,
                    timeout_secs: run.rec.timeout_secs,
                    attach: !detach,
                };
                let command = run.rec.command.clone();
                self.exec_op(ci, &op, &nonce, Some(&command), run, sink)
                    .await?
            } else {
                let idc = run.rec.id.clone();
                let op = Op::Watch {
                    id: &idc,
                    out_off: run.out_off,
                    err_off: run.err_off,
                    wait: !detach,
                };
                self.exec_op(ci, &op, &nonce, None, run, sink).await?
            };
            next_dispatch = false;

            if let Some(why) = &reply.broken {
                // Lost mid-reply. Whatever was streamed is kept (offsets advanced); ask the
                // host again what happened.
                tracing::info!(
                    "cairn: connection to {} lost ({why}); reconnecting to ask the host what happened",
                    target.display()
                );
                run.announce = true;
                self.journal.append(
                    &run.rec.id,
                    "connection-lost",
                    None,
                    json!({"error": why, "out_off": run.out_off, "err_off": run.err_off}),
                )?;
                self.drop_connection(ci);
                lost_since.get_or_insert_with(Instant::now);
                recovered = true;
                continue;
            }
            backoff = self.patience.backoff_min;

            // 3. What did the host say?
            if let Some(v) = reply.verdict.as_deref() {
                match v {
                    "started" if detach => {
                        let mut o = self.outcome_from_journal(run)?;
                        o.state = State::Running;
                        return Ok(o);
                    }
                    "started" => {}
                    "exists" => {
                        // An earlier attempt crossed the guard: watch it, never start another.
                        self.journal.append(
                            &run.rec.id,
                            "guard-exists",
                            None,
                            json!({"start_record": reply.start.as_ref().map(start_text)}),
                        )?;
                        if reply.start.as_ref().map(|s| &s.digest) != Some(&run.rec.command_digest)
                        {
                            return self.conclude(
                                run,
                                State::Unknown,
                                "the start guard for this ID was crossed by a different command on the host",
                            );
                        }
                        continue;
                    }
                    _ => {
                        let why = if reply.errors.is_empty() {
                            format!("the host refused the dispatch ({v})")
                        } else {
                            format!("the host refused the dispatch: {}", reply.errors.join("; "))
                        };
                        return self.conclude(run, State::Failed, &format!("never started: {why}"));
                    }
                }
            }
            let probe = self.probe_from(run, &reply);
            tracing::debug!("probe: {probe:?}");
            match decide(run.prior, &probe) {
                Action::Dispatch => {
                    tracing::info!(
                        "cairn: {} never started on the host (start guard not crossed); \
                         dispatching it again under the same ID",
                        run.rec.id
                    );
                    self.journal.append(
                        &run.rec.id,
                        "probe",
                        None,
                        json!({"result": "absent", "decision": "dispatch again under the same ID"}),
                    )?;
                    next_dispatch = true;
                }
                Action::Reattach => {
                    if detach {
                        let mut o = self.outcome_from_journal(run)?;
                        o.state = State::Running;
                        o.recovered = recovered;
                        return Ok(o);
                    }
                    // A watch ended while the supervisor is alive (it should not): look again,
                    // without spinning.
                    tokio::time::sleep(self.patience.backoff_min).await;
                }
                Action::Collect => {
                    let Some(done) = reply.done.clone() else {
                        return self.conclude(
                            run,
                            State::Unknown,
                            "probe said finished without a record",
                        );
                    };
                    if run.announce {
                        tracing::info!(
                            "cairn: {} finished while disconnected; returning its stored result",
                            run.rec.id
                        );
                        run.announce = false;
                    }
                    if live && short_reads < 3 && (run.out_off < done.out || run.err_off < done.err)
                    {
                        // The finish record says there is more than we were sent: fetch it.
                        short_reads += 1;
                        continue;
                    }
                    return self.complete(run, done, recovered);
                }
                Action::Conclude { state, reason } => return self.conclude(run, state, &reason),
                Action::Retry { reason } => {
                    tracing::info!("{reason}");
                    tokio::time::sleep(backoff).await;
                }
                Action::Nothing => {
                    let o = self.outcome_from_journal(run)?;
                    return Ok(o);
                }
            }
        }
    }

    fn give_up(
        &mut self,
        run: &mut Run,
        reason: &str,
        err: ExecError,
    ) -> Result<Outcome, ExecError> {
        if run.prior == Prior::NotDispatched {
            self.conclude(run, State::Failed, reason)?;
        } else {
            self.conclude(run, State::Unknown, reason)?;
        }
        Err(err)
    }

    fn complete(
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
        self.journal.append(
            &run.rec.id,
            state.as_str(),
            Some(state),
            json!({"finish_record": finish_text(&done), "recovered": recovered,
                   "reconnects": run.reconnects}),
        )?;
        run.done = Some(done);
        run.prior = Prior::Settled;
        let mut o = self.outcome_from_journal(run)?;
        o.recovered = recovered;
        Ok(o)
    }

    fn conclude(
        &mut self,
        run: &mut Run,
        state: State,
        reason: &str,
    ) -> Result<Outcome, ExecError> {
        self.journal.append(
            &run.rec.id,
            state.as_str(),
            Some(state),
            json!({"reason": reason, "reconnects": run.reconnects, "start_record": run.start.as_ref().map(start_text)}),
        )?;
        if state.is_settled() {
            run.prior = Prior::Settled;
        }
        let mut o = self.outcome_from_journal(run)?;
        o.reason = Some(reason.to_owned());
        Ok(o)
    }

    /// Record `delivered` for an execution whose result the caller now holds.
    pub fn mark_delivered(&mut self, id: &ExecutionId, how: &str) -> Result<(), ExecError> {
        if let Some(st) = self.journal.status(id)? {
            if st.state.has_result() && st.state != State::Delivered {
                self.journal
                    .append(id, "delivered", Some(State::Delivered), json!({"to": how}))?;
            }
        }
        Ok(())
    }

    fn outcome_from_journal(&self, run: &Run) -> Result<Outcome, ExecError> {
        let status = self.journal.status(&run.rec.id)?;
        let events = self.journal.events(&run.rec.id)?;
        let reason = events.iter().rev().find_map(|e| {
            e.evidence
                .get("reason")
                .and_then(|r| r.as_str())
                .map(str::to_owned)
        });
        let mut state = status.map(|s| s.state).unwrap_or(State::Accepted);
        let delivered = state == State::Delivered;
        if delivered {
            // Report the outcome the delivery was of.
            state = events
                .iter()
                .rev()
                .filter_map(|e| e.state)
                .find(|s| *s != State::Delivered)
                .unwrap_or(State::Completed);
        }
        let done = run.done.as_ref();
        Ok(Outcome {
            execution_id: run.rec.id.to_string(),
            destination: run.rec.destination.clone(),
            host: format!("{}@{}:{}", run.rec.user, run.rec.host, run.rec.port),
            host_key_fingerprint: run.host_key.clone(),
            state,
            exit_code: done.map(|d| d.status),
            signal: done.and_then(|d| d.signal()),
            started_at: run
                .start
                .as_ref()
                .map(|s| rfc3339_from_unix(s.started_at as i64, 0)),
            finished_at: done.map(|d| rfc3339_from_unix(d.finished_at as i64, 0)),
            stdout_bytes: done.map(|d| d.out).unwrap_or(if run.out_off < NO_BYTES {
                run.out_off
            } else {
                0
            }),
            stderr_bytes: done.map(|d| d.err).unwrap_or(if run.err_off < NO_BYTES {
                run.err_off
            } else {
                0
            }),
            reconnects: run.reconnects,
            timed_out: done.map(|d| d.timed_out).unwrap_or(false),
            recovered: false,
            reason,
        })
    }
}

fn start_text(s: &StartRecord) -> String {
    format!(
        "v=1 id={} len={} digest={} epoch={} boot={} sup_pid={} sup_start={} started_at={} timeout={}",
        s.id, s.len, s.digest, s.epoch, s.boot, s.sup_pid, s.sup_start, s.started_at, s.timeout
    )
}

fn finish_text(f: &FinishRecord) -> String {
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
