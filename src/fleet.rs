//! Fleet runs (issue 5): one command on many hosts, as one batch in the journal.
//!
//! `cairn run --hosts a,b,c -- CMD` (or `--inventory FILE`) records a batch (`bt_…`) with an
//! execution ID chosen for every host *before* anything is dispatched, then runs the hosts on a
//! pool of `--parallel` workers. Each host gets its own [`Executor`] (its own journal handle and
//! one SSH connection, reused for every channel of that host's execution: the dispatch and any
//! `watch` after a reconnect). One execution per host means at most one channel at a time per
//! connection, far below any server's `MaxSessions`.
//!
//! `cairn batch resume B` applies the executor's own recovery to every member: a member whose
//! execution was never accepted is started under its recorded ID; one accepted but never
//! authorized, or failed before it was ever authorized, is put to the approver first
//! ([`Executor::authorize_accepted`], [`Executor::retry_never_started`]); every other one goes
//! through [`Executor::attach`], which re-dispatches only what provably never started,
//! reattaches to what runs, collects what finished, and concludes `interrupted`/`unknown` for
//! review.
//!
//! Exit status of a fleet run: 0 when every host completed with status 0; 255 when nothing was
//! dispatched anywhere; 254 when some host is `interrupted` or `unknown` (or still running);
//! 1 otherwise (some host failed, exited non-zero, or was skipped).

mod ledger;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::admission::{self, Recorded, Route};
use crate::evidence::SessionEvidence;
use crate::executor::{ExecError, Executor, Outcome, OutputSink, RunRequest};
use crate::executor::{EXIT_NOT_DISPATCHED, EXIT_UNKNOWN};
use crate::id::ExecutionId;
use crate::intent::{Intent, OpClass};
use crate::options::{ApproveOptions, HostOptions, IntentOptions};
use crate::outcome::Capture;
use crate::runner::ExecutorBuilder;
use crate::ssh::ConnectOptions;
use crate::state::State;

/// Options of `cairn run` for many hosts.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Run on these hosts ([user@]host or ssh_config aliases) instead of one destination.
    pub hosts: Vec<String>,
    /// Run on the hosts listed in this file, one destination per line.
    pub inventory: Option<PathBuf>,
    /// Hosts worked on at once.
    pub parallel: usize,
    /// Stop starting new hosts once more than K hosts failed.
    pub max_failures: Option<usize>,
    /// Stop starting new hosts after the first failure (= `max_failures: Some(0)`).
    pub fail_fast: bool,
    /// Rolling batches of N hosts.
    pub batch_size: Option<usize>,
    /// Write each host's output to DIR/HOST.out and DIR/HOST.err instead of the terminal.
    pub output_dir: Option<PathBuf>,
    /// Caller-chosen batch ID (default bt_ + UUIDv7).
    pub batch_id: Option<String>,
}

/// Hosts worked on at once when not told otherwise.
pub const DEFAULT_PARALLEL: usize = 32;

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            hosts: Vec::new(),
            inventory: None,
            parallel: DEFAULT_PARALLEL,
            max_failures: None,
            fail_fast: false,
            batch_size: None,
            output_dir: None,
            batch_id: None,
        }
    }
}

/// `cairn run` on many hosts: everything the command line gave.
#[derive(Debug, Clone)]
pub struct FleetRun {
    pub host: HostOptions,
    pub approve: ApproveOptions,
    pub intent: IntentOptions,
    /// One destination as well as the hosts: refused.
    pub destination: Option<String>,
    /// An execution ID as well as the hosts: refused (a batch ID names the run).
    pub id: Option<String>,
    /// Refused with many hosts.
    pub detach: bool,
    pub timeout: Option<Duration>,
    pub remote_dir: String,
    pub json: bool,
    pub fleet: FleetOptions,
}

/// `cairn batch …`
#[derive(Debug)]
pub enum BatchCommand {
    /// Every host of a batch with its execution's state (from the journal; no host contact).
    Status {
        batch: String,
        json: bool,
        host: HostOptions,
    },
    /// Continue a batch.
    Resume {
        batch: String,
        json: bool,
        /// Override the recorded parallelism.
        parallel: Option<usize>,
        output_dir: Option<PathBuf>,
        host: HostOptions,
        approve: ApproveOptions,
    },
    /// List batches.
    Ls { json: bool, host: HostOptions },
}

/// Exit status when some host failed, exited non-zero, or was skipped.
pub const EXIT_SOME_FAILED: i32 = 1;

/// Read an inventory: one destination per line; `#` starts a comment; blank lines skipped.
pub fn parse_inventory(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn host_list(f: &FleetOptions) -> Result<Vec<String>, ExecError> {
    let mut hosts: Vec<String> = f
        .hosts
        .iter()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .collect();
    if let Some(p) = &f.inventory {
        let text = std::fs::read_to_string(p)
            .map_err(|e| ExecError::Setup(format!("--inventory {}: {e}", p.display())))?;
        hosts.extend(parse_inventory(&text));
    }
    if hosts.is_empty() {
        return Err(ExecError::InvalidRequest(
            "no hosts given (--hosts / --inventory)".into(),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for h in &hosts {
        if h.starts_with('-') || h.contains(char::is_whitespace) {
            return Err(ExecError::InvalidRequest(format!(
                "{h:?} is not a destination"
            )));
        }
        if !seen.insert(h.clone()) {
            return Err(ExecError::InvalidRequest(format!(
                "host {h} is listed twice; each host runs the command once"
            )));
        }
    }
    Ok(hosts)
}

/// What a worker does for one host.
#[derive(Clone, Debug, PartialEq)]
enum Mode {
    /// Accept and dispatch under the recorded ID (never accepted before).
    Fresh,
    /// Already in the journal: apply the recovery table via attach.
    Attach,
    /// Accepted, never authorized (cairn stopped before it asked): ask the approver now, then
    /// dispatch under the recorded ID if allowed.
    Authorize,
    /// Authorized but the `dispatched` event was never written (cairn stopped in between): no
    /// byte of the command left, so dispatch it under its own ID (the start guard decides).
    Redispatch,
    /// Delivered: report the journal's outcome.
    Settled,
    /// Failed: provably never started (unreachable, refused before the start guard): dispatch
    /// it again under its own ID.
    Retry,
}

impl Mode {
    /// How `cairn batch resume` works on one member: the admission table's route for what the
    /// journal records of it ([`admission::Ask::Resume`] looks at the recorded state alone; the
    /// executor's call for the member checks its owner: `authorize_accepted` attaches to one a
    /// live owner holds, `redispatch` and `attach` drive only what this process may drive).
    fn resume(recorded: Recorded, intent: &Intent) -> Mode {
        let facts = admission::Facts {
            recorded,
            class: admission::Class::from_recorded(intent.class.as_str()),
            owner: admission::Owner::Nobody,
            redrives: 0,
            detached: false,
        };
        match admission::route(admission::Ask::Resume, &facts) {
            Route::New => Mode::Fresh,
            Route::Authorize => Mode::Authorize,
            Route::Redispatch => Mode::Redispatch,
            Route::RetryNeverStarted => Mode::Retry,
            Route::Settled => Mode::Settled,
            // (a resume routes nowhere else; attaching applies the recovery table whatever it is)
            Route::Attach
            | Route::RetryUnderSameId
            | Route::Recover
            | Route::Review
            | Route::Wait
            | Route::TakeOver
            | Route::Drive
            | Route::HeldByAnother
            | Route::LeaveAlone
            | Route::Conflict => Mode::Attach,
        }
    }
}

#[derive(Clone, Debug)]
struct Job {
    idx: usize,
    destination: String,
    id: ExecutionId,
    mode: Mode,
}

/// Everything the engine needs, for a new batch or a resumed one.
struct Plan {
    batch_id: String,
    command: Vec<u8>,
    remote_dir: String,
    timeout_secs: u64,
    intent: Intent,
    jobs: Vec<Job>,
    parallel: usize,
    batch_size: Option<usize>,
    max_failures: Option<usize>,
    output_dir: Option<PathBuf>,
    json: bool,
    host: HostOptions,
    approve: ApproveOptions,
    session: Option<String>,
}

/// The end of one host.
#[derive(Debug)]
struct HostResult {
    idx: usize,
    destination: String,
    execution_id: String,
    /// The execution's state, or `skipped` (never started by this run) / `error`.
    state: String,
    exit_code: Option<u8>,
    duration: Duration,
    reconnects: u32,
    reason: Option<String>,
    outcome: Option<Outcome>,
    /// With `--json`, the output kept for the host's JSON object.
    output: Capture,
}

impl HostResult {
    fn ok(&self) -> bool {
        matches!(self.state.as_str(), "completed" | "delivered") && self.exit_code == Some(0)
    }
    fn dispatched(&self) -> bool {
        !matches!(
            self.state.as_str(),
            "skipped" | "error" | "failed" | "rejected" | "accepted" | "authorized"
        )
    }
    fn needs_review(&self) -> bool {
        matches!(self.state.as_str(), "interrupted" | "unknown")
    }
}

enum Msg {
    Started,
    Line(usize, bool, Vec<u8>),
    Done(Box<HostResult>),
}

/// Output of one host: whole lines to the display, or files, or a bounded copy for `--json`.
struct HostSink {
    idx: usize,
    tx: mpsc::Sender<Msg>,
    files: Option<(File, File)>,
    json: bool,
    part_out: Vec<u8>,
    part_err: Vec<u8>,
    kept: Capture,
}

const JSON_CAP: usize = 1 << 20;

impl HostSink {
    fn take(&mut self, d: &[u8], stderr: bool) -> std::io::Result<()> {
        if let Some((o, e)) = &mut self.files {
            return if stderr {
                e.write_all(d)
            } else {
                o.write_all(d)
            };
        }
        if self.json {
            return if stderr {
                self.kept.stderr(d)
            } else {
                self.kept.stdout(d)
            };
        }
        let part = if stderr {
            &mut self.part_err
        } else {
            &mut self.part_out
        };
        part.extend_from_slice(d);
        while let Some(n) = part.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = part.drain(..=n).take(n).collect();
            let _ = self.tx.send(Msg::Line(self.idx, stderr, line));
        }
        Ok(())
    }
    fn flush_partial(&mut self) {
        for stderr in [false, true] {
            let part = std::mem::take(if stderr {
                &mut self.part_err
            } else {
                &mut self.part_out
            });
            if !part.is_empty() {
                let _ = self.tx.send(Msg::Line(self.idx, stderr, part));
            }
        }
        if let Some((o, e)) = &mut self.files {
            let _ = o.flush();
            let _ = e.flush();
        }
    }
}

impl OutputSink for HostSink {
    fn stdout(&mut self, d: &[u8]) -> std::io::Result<()> {
        self.take(d, false)
    }
    fn stderr(&mut self, d: &[u8]) -> std::io::Result<()> {
        self.take(d, true)
    }
}

fn file_name(dest: &str) -> String {
    dest.chars()
        .map(|c| if c == '/' || c == '\0' { '_' } else { c })
        .collect()
}

/// `cairn run --hosts …` / `--inventory …`.
pub async fn run(args: FleetRun, command: Vec<u8>) -> Result<i32, ExecError> {
    let f = &args.fleet;
    if args.destination.is_some() {
        return Err(ExecError::InvalidRequest(
            "give either DESTINATION or --hosts/--inventory, not both".into(),
        ));
    }
    if args.id.is_some() {
        return Err(ExecError::InvalidRequest(
            "--id names one execution; with --hosts use --batch ID".into(),
        ));
    }
    if args.detach {
        return Err(ExecError::InvalidRequest(
            "--detach is not supported with --hosts/--inventory".into(),
        ));
    }
    if f.parallel == 0 || f.batch_size == Some(0) {
        return Err(ExecError::InvalidRequest(
            "--parallel and --batch-size must be at least 1".into(),
        ));
    }
    let hosts = host_list(f)?;
    let batch_id = match &f.batch_id {
        Some(b) => ExecutionId::parse(b)
            .map_err(|e| ExecError::InvalidRequest(format!("--batch: {e}")))?
            .to_string(),
        None => format!("bt_{}", uuid::Uuid::now_v7().simple()),
    };
    crate::marker::validate_remote_dir(&args.remote_dir).map_err(ExecError::InvalidRequest)?;
    let intent = args.intent.intent(&args.host.connect.identity)?;
    intent.validate().map_err(ExecError::InvalidRequest)?;
    let timeout_secs = args.timeout.map(|d| d.as_secs().max(1)).unwrap_or(0);
    let max_failures = if f.fail_fast { Some(0) } else { f.max_failures };

    let mut ex = ExecutorBuilder::host(&args.host).build()?;
    if ex.batch_record(&batch_id)?.is_some() {
        return Err(ExecError::Refused(format!(
            "batch {batch_id} already exists; continue it with `cairn batch resume {batch_id}`"
        )));
    }
    let session = crate::runner::prepare(&mut ex, &args.approve, "cli", &intent.actor)?;
    let jobs: Vec<Job> = hosts
        .iter()
        .enumerate()
        .map(|(idx, h)| Job {
            idx,
            destination: h.clone(),
            id: ExecutionId::generate(),
            mode: Mode::Fresh,
        })
        .collect();
    let options = BatchOptions {
        remote_dir: Some(args.remote_dir.clone()),
        timeout_secs,
        parallel: Some(f.parallel),
        batch_size: f.batch_size,
        max_failures,
        actor: Some(intent.actor.clone()),
        cwd: intent.cwd.clone(),
        env: intent.env.clone(),
        secret_env: intent.secret_env.clone(),
        credential_ref: intent.credential_ref.clone(),
        class: intent.class,
        scope: intent.scope.clone(),
        retention_secs: intent.retention.map(|d| d.as_secs()),
        connect: ConnectRecord::of(&args.host.connect),
    }
    .to_value();
    let members: Vec<(String, ExecutionId)> = jobs
        .iter()
        .map(|j| (j.destination.clone(), j.id.clone()))
        .collect();
    ex.create_batch(&batch_id, &command, &options, &members)?;
    if !args.json {
        eprintln!("cairn: batch {batch_id}: {} host(s)", jobs.len());
    }
    let plan = Plan {
        batch_id,
        command,
        remote_dir: args.remote_dir.clone(),
        timeout_secs,
        intent,
        jobs,
        parallel: f.parallel,
        batch_size: f.batch_size,
        max_failures,
        output_dir: f.output_dir.clone(),
        json: args.json,
        host: args.host.clone(),
        approve: args.approve.clone(),
        session: Some(session.clone()),
    };
    let code = tokio::task::block_in_place(|| engine(plan));
    let _ = ex.end_session(&session, SessionEvidence::EndedWithExit { exit: code });
    Ok(code)
}

/// `cairn batch …`.
pub async fn batch(cmd: BatchCommand) -> Result<i32, ExecError> {
    match cmd {
        BatchCommand::Ls { json, host } => {
            let mut ex = ExecutorBuilder::host(&host).build()?;
            let mut rows = Vec::new();
            for id in ex.batch_ids()? {
                if let Some(b) = ex.batch_record(&id)? {
                    let states = member_states(&mut ex, &b)?;
                    rows.push((b, counts(states.iter().map(|s| s.0.as_str()))));
                }
            }
            for (b, c) in &rows {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"batch_id": b.id, "created_at": b.created_at,
                            "hosts": b.members.len(), "states": c, "command": b.command_display()})
                    );
                } else {
                    println!(
                        "{}  {}  {} host(s)  {}  {}",
                        b.id,
                        b.created_at,
                        b.members.len(),
                        counts_text(c),
                        b.command_display().replace('\n', "\\n")
                    );
                }
            }
            Ok(0)
        }
        BatchCommand::Status { batch, json, host } => {
            let mut ex = ExecutorBuilder::host(&host).build()?;
            let b = ex.known_batch(&batch)?;
            let states = member_states(&mut ex, &b)?;
            let c = counts(states.iter().map(|s| s.0.as_str()));
            if json {
                let hosts: Vec<_> = b
                    .members
                    .iter()
                    .zip(&states)
                    .map(|(m, (st, o))| {
                        serde_json::json!({"host": m.destination, "execution_id": m.execution_id,
                            "state": st, "exit_code": o.as_ref().and_then(|o| o.exit_code),
                            "reason": o.as_ref().and_then(|o| o.reason.clone())})
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({"batch_id": b.id, "created_at": b.created_at,
                        "command": b.command_display(), "states": c, "hosts": hosts})
                );
            } else {
                println!("batch       {}", b.id);
                println!("created     {}", b.created_at);
                println!("command     {}", b.command_display().replace('\n', "\\n"));
                println!("hosts       {} ({})", b.members.len(), counts_text(&c));
                let w = b
                    .members
                    .iter()
                    .map(|m| m.destination.len())
                    .max()
                    .unwrap_or(4)
                    .max(4);
                println!("{:w$}  {:12} {:>4}  EXECUTION", "HOST", "STATE", "EXIT");
                for (m, (st, o)) in b.members.iter().zip(&states) {
                    println!(
                        "{:w$}  {:12} {:>4}  {}",
                        m.destination,
                        st,
                        o.as_ref()
                            .and_then(|o| o.exit_code)
                            .map(|c| c.to_string())
                            .unwrap_or_else(|| "-".into()),
                        m.execution_id
                    );
                }
            }
            Ok(0)
        }
        BatchCommand::Resume {
            batch,
            json,
            parallel,
            output_dir,
            host,
            approve,
        } => resume(&batch, json, parallel, output_dir, host, approve).await,
    }
}

/// Each member's state in the journal (`not-started` when never accepted) and outcome.
fn member_states(
    ex: &mut Executor,
    b: &crate::journal::BatchRecord,
) -> Result<Vec<(String, Option<Outcome>)>, ExecError> {
    let mut v = Vec::new();
    for m in &b.members {
        let id = ExecutionId::parse(&m.execution_id)
            .map_err(|e| ExecError::Internal(format!("batch member: {e}")))?;
        if !ex.was_accepted(&id)? {
            v.push(("not-started".to_string(), None));
        } else {
            let o = ex.journal_outcome(&id)?;
            v.push((o.state.to_string(), Some(o)));
        }
    }
    Ok(v)
}

fn counts<'a>(states: impl Iterator<Item = &'a str>) -> BTreeMap<String, usize> {
    let mut c = BTreeMap::new();
    for s in states {
        *c.entry(s.to_owned()).or_insert(0) += 1;
    }
    c
}

fn counts_text(c: &BTreeMap<String, usize>) -> String {
    c.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a batch records of how it was started (`batches.options`), so that `batch resume`
/// continues it the same way. No secret: `secret_env` holds the variables' names only.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
struct BatchOptions {
    remote_dir: Option<String>,
    timeout_secs: u64,
    parallel: Option<usize>,
    batch_size: Option<usize>,
    max_failures: Option<usize>,
    actor: Option<String>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    secret_env: BTreeSet<String>,
    credential_ref: Option<String>,
    class: OpClass,
    scope: Option<String>,
    retention_secs: Option<u64>,
    connect: ConnectRecord,
}

impl BatchOptions {
    fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("batch options serialize to JSON")
    }

    /// The record of batch `id` as stored; a record that does not read is an error that names
    /// the batch, never a default that would resume it otherwise.
    fn read(id: &str, v: &serde_json::Value) -> Result<BatchOptions, ExecError> {
        <BatchOptions as serde::Deserialize>::deserialize(v).map_err(|e| {
            ExecError::Internal(format!(
                "batch {id}: its recorded options do not read ({e}); the journal row is damaged, \
                 nothing was resumed"
            ))
        })
    }
}

/// The connection flags of a batch, recorded with it (paths made absolute; no key material).
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
struct ConnectRecord {
    ssh_config: Option<PathBuf>,
    identity: Vec<PathBuf>,
    known_hosts: Option<PathBuf>,
    port: Option<u16>,
    jump: Option<String>,
}

impl ConnectRecord {
    fn of(c: &ConnectOptions) -> ConnectRecord {
        let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        ConnectRecord {
            ssh_config: c.ssh_config.as_ref().map(abs),
            identity: c.identity.iter().map(abs).collect(),
            known_hosts: c.known_hosts.as_ref().map(abs),
            port: c.port,
            jump: c.jump.clone(),
        }
    }

    /// Fill in the recorded flags the command line of `batch resume` does not give.
    fn apply(self, c: &mut ConnectOptions) {
        if c.ssh_config.is_none() {
            c.ssh_config = self.ssh_config;
        }
        if c.identity.is_empty() {
            c.identity = self.identity;
        }
        if c.known_hosts.is_none() {
            c.known_hosts = self.known_hosts;
        }
        if c.port.is_none() {
            c.port = self.port;
        }
        if c.jump.is_none() {
            c.jump = self.jump;
        }
    }
}

async fn resume(
    batch: &str,
    json: bool,
    parallel: Option<usize>,
    output_dir: Option<PathBuf>,
    host: HostOptions,
    approve: ApproveOptions,
) -> Result<i32, ExecError> {
    let mut ex = ExecutorBuilder::host(&host).build()?;
    let b = ex.known_batch(batch)?;
    let o = BatchOptions::read(&b.id, &b.options)?;
    // Hosts never reached are connected to as the batch was, unless flags say otherwise (those
    // already accepted follow their own recorded connection).
    let mut host = host;
    o.connect.apply(&mut host.connect);
    let intent = Intent {
        actor: o
            .actor
            .unwrap_or_else(|| crate::intent::local_actor("local")),
        cwd: o.cwd,
        env: o.env,
        secret_env: o.secret_env,
        credential_ref: o.credential_ref,
        class: o.class,
        scope: o.scope,
        retention: o.retention_secs.map(Duration::from_secs),
        ..Intent::default()
    };
    let mut jobs = Vec::new();
    for (idx, m) in b.members.iter().enumerate() {
        let id = ExecutionId::parse(&m.execution_id)
            .map_err(|e| ExecError::Internal(format!("batch member: {e}")))?;
        let recorded = match ex.recorded_state(&id)? {
            Some(s) => Recorded::At(s),
            None if !ex.was_accepted(&id)? => Recorded::Absent,
            None => Recorded::Stateless,
        };
        let mode = Mode::resume(recorded, &intent);
        jobs.push(Job {
            idx,
            destination: m.destination.clone(),
            id,
            mode,
        });
    }
    let session = crate::runner::prepare(&mut ex, &approve, "cli", &intent.actor)?;
    let _ = ex
        .journal
        .session_evidence(&session, SessionEvidence::BatchResume { batch_id: &b.id });
    if !json {
        let fresh = jobs.iter().filter(|j| j.mode == Mode::Fresh).count();
        eprintln!(
            "cairn: resuming batch {}: {} host(s), {} never started by cairn",
            b.id,
            jobs.len(),
            fresh
        );
    }
    let plan = Plan {
        batch_id: b.id.clone(),
        command: b.command.clone(),
        remote_dir: o
            .remote_dir
            .unwrap_or_else(|| crate::options::DEFAULT_REMOTE_DIR.to_owned()),
        timeout_secs: o.timeout_secs,
        intent,
        jobs,
        parallel: parallel.or(o.parallel).unwrap_or(DEFAULT_PARALLEL).max(1),
        batch_size: o.batch_size.map(|p| p.max(1)),
        max_failures: o.max_failures,
        output_dir,
        json,
        host: host.clone(),
        approve: approve.clone(),
        session: Some(session.clone()),
    };
    let code = tokio::task::block_in_place(|| engine(plan));
    let _ = ex.end_session(&session, SessionEvidence::EndedWithExit { exit: code });
    Ok(code)
}

/// Work one host to its end on this thread (it may block on a commit; see [`crate::rt`]).
fn run_host(plan: &Plan, job: &Job, tx: &mpsc::Sender<Msg>) -> HostResult {
    let t0 = Instant::now();
    let files = plan.output_dir.as_ref().map(|d| {
        let n = file_name(&job.destination);
        let open = |ext: &str| {
            File::create(d.join(format!("{n}.{ext}")))
                .unwrap_or_else(|_| File::create("/dev/null").expect("/dev/null"))
        };
        (open("out"), open("err"))
    });
    let mut sink = HostSink {
        idx: job.idx,
        tx: tx.clone(),
        files,
        json: plan.json,
        part_out: Vec::new(),
        part_err: Vec::new(),
        kept: Capture {
            cap: JSON_CAP,
            ..Capture::default()
        },
    };
    let r: Result<Outcome, ExecError> = crate::rt::block_on(async {
        let mut ex = ExecutorBuilder::host(&plan.host)
            .approve(&plan.approve, "local-cli")
            .session(plan.session.clone())
            .build()?;
        let o = match job.mode {
            Mode::Fresh => {
                let req = RunRequest {
                    destination: job.destination.clone(),
                    command: plan.command.clone(),
                    id: Some(job.id.clone()),
                    timeout_secs: plan.timeout_secs,
                    detach: false,
                    remote_dir: plan.remote_dir.clone(),
                };
                ex.execute(req, plan.intent.clone(), &mut sink).await?
            }
            Mode::Attach => ex.attach(&job.id, &mut sink).await?,
            Mode::Authorize => {
                ex.authorize_accepted(&job.id, &plan.command, &plan.intent, &mut sink)
                    .await?
            }
            Mode::Redispatch => ex.redispatch(&job.id, false, &mut sink).await?,
            Mode::Settled => ex.journal_outcome(&job.id)?,
            Mode::Retry => {
                ex.retry_never_started(
                    &job.id,
                    "batch resume: the execution provably never started",
                    &plan.command,
                    &plan.intent,
                    &mut sink,
                )
                .await?
            }
        };
        if o.state.has_result() && o.state != State::Delivered {
            ex.mark_delivered(&job.id, "cli")?;
        }
        Ok(o)
    });
    sink.flush_partial();
    let (state, exit_code, reconnects, reason) = match &r {
        // `delivered` is cairn's own bookkeeping; people see the host's answer.
        Ok(o) if o.state == State::Delivered => (
            State::Completed.to_string(),
            o.exit_code,
            o.reconnects,
            o.reason.clone(),
        ),
        Ok(o) => (
            o.state.to_string(),
            o.exit_code,
            o.reconnects,
            o.reason.clone(),
        ),
        Err(e) => ("error".to_string(), None, 0, Some(e.to_string())),
    };
    HostResult {
        idx: job.idx,
        destination: job.destination.clone(),
        execution_id: job.id.to_string(),
        state,
        exit_code,
        duration: t0.elapsed(),
        reconnects,
        reason,
        outcome: r.ok(),
        output: std::mem::take(&mut sink.kept),
    }
}

/// What the person at the terminal sees.
struct Display {
    names: Vec<String>,
    width: usize,
    json: bool,
    bar: Option<indicatif::ProgressBar>,
    running: usize,
    finished: BTreeMap<String, usize>,
}

impl Display {
    fn new(names: Vec<String>, json: bool) -> Display {
        let width = names.iter().map(|n| n.len()).max().unwrap_or(4).max(4);
        let bar = (!json && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(names.len() as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        Display {
            names,
            width,
            json,
            bar,
            running: 0,
            finished: BTreeMap::new(),
        }
    }

    fn refresh(&self) {
        if let Some(b) = &self.bar {
            let mut parts = vec![format!("running {}", self.running)];
            parts.extend(self.finished.iter().map(|(k, v)| format!("{k} {v}")));
            b.set_message(parts.join(" · "));
        }
    }

    fn out(&self, f: impl FnOnce()) {
        match &self.bar {
            Some(b) => b.suspend(f),
            None => f(),
        }
    }

    fn line(&self, idx: usize, stderr: bool, line: &[u8]) {
        let mut buf = format!("{:w$} | ", self.names[idx], w = self.width).into_bytes();
        buf.extend_from_slice(line);
        buf.push(b'\n');
        self.out(|| {
            if stderr {
                let _ = std::io::stderr().lock().write_all(&buf);
            } else {
                let _ = std::io::stdout().lock().write_all(&buf);
            }
        });
    }

    fn started(&mut self) {
        self.running += 1;
        self.refresh();
    }

    fn done(&mut self, r: &HostResult, batch_id: &str) {
        self.running = self.running.saturating_sub(1);
        *self.finished.entry(r.state.clone()).or_insert(0) += 1;
        if self.json {
            println!("{}", host_json(r, batch_id));
            let _ = std::io::stdout().flush();
            return;
        }
        let text = format!(
            "{:w$}   {}{}  {:.1}s{}",
            r.destination,
            r.state,
            r.exit_code
                .map(|c| format!(" (exit {c})"))
                .unwrap_or_default(),
            r.duration.as_secs_f64(),
            r.reason
                .as_deref()
                .filter(|_| !r.ok())
                .map(|x| format!(": {x}"))
                .unwrap_or_default(),
            w = self.width
        );
        match &self.bar {
            Some(b) => {
                b.println(format!("done {text}"));
                b.inc(1);
            }
            None => eprintln!("cairn: done {text}"),
        }
        self.refresh();
    }

    fn skipped(&mut self, r: &HostResult, batch_id: &str) {
        *self.finished.entry(r.state.clone()).or_insert(0) += 1;
        if self.json {
            println!("{}", host_json(r, batch_id));
        }
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn host_json(r: &HostResult, batch_id: &str) -> serde_json::Value {
    let mut v = match &r.outcome {
        Some(o) => serde_json::to_value(o).unwrap_or_default(),
        None => serde_json::json!({"execution_id": r.execution_id, "destination": r.destination,
            "state": r.state, "exit_code": null, "reconnects": 0, "reason": r.reason}),
    };
    if let Some(m) = v.as_object_mut() {
        m.insert("type".into(), "host".into());
        m.insert("batch_id".into(), batch_id.into());
        m.insert("host".into(), r.destination.clone().into());
        m.insert("state".into(), r.state.clone().into());
        m.insert("duration_ms".into(), (r.duration.as_millis() as u64).into());
    }
    crate::outcome::with_output(&mut v, &r.output);
    v
}

/// Run the plan's jobs on a worker pool, rolling batch by batch; print; return the exit code.
fn engine(plan: Plan) -> i32 {
    if let Some(d) = &plan.output_dir {
        if let Err(e) = std::fs::create_dir_all(d) {
            eprintln!("cairn: --output-dir {}: {e}", d.display());
            return EXIT_NOT_DISPATCHED;
        }
    }
    let plan = Arc::new(plan);
    let names: Vec<String> = plan.jobs.iter().map(|j| j.destination.clone()).collect();
    let mut display = Display::new(names, plan.json);
    let mut results: Vec<Option<HostResult>> = (0..plan.jobs.len()).map(|_| None).collect();
    let failures = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let chunk = plan.batch_size.unwrap_or(plan.jobs.len()).max(1);
    let mut next = 0;
    while next < plan.jobs.len() && !stop.load(Ordering::SeqCst) {
        let end = (next + chunk).min(plan.jobs.len());
        run_batch(
            &plan,
            next..end,
            &mut display,
            &mut results,
            &failures,
            &stop,
        );
        if plan.batch_size.is_some()
            && results[next..end]
                .iter()
                .any(|r| r.as_ref().is_none_or(|r| !r.ok()))
        {
            stop.store(true, Ordering::SeqCst);
        }
        next = end;
    }
    // Hosts never started by this run.
    let results: Vec<HostResult> = results
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|| skipped(&plan, i, &mut display)))
        .collect();
    display.finish();
    let code = exit_code(&results);
    summary(
        &plan.batch_id,
        &results,
        plan.json,
        code,
        plan.output_dir.as_deref(),
    );
    code
}

/// One rolling batch: the jobs in `range` on up to `--parallel` workers, each result shown and
/// kept as it arrives; a worker stops taking jobs once `--max-failures` is exceeded.
fn run_batch(
    plan: &Arc<Plan>,
    range: std::ops::Range<usize>,
    display: &mut Display,
    results: &mut [Option<HostResult>],
    failures: &Arc<AtomicUsize>,
    stop: &Arc<AtomicBool>,
) {
    let workers = plan.parallel.min(range.len());
    let queue: Arc<Mutex<VecDeque<Job>>> =
        Arc::new(Mutex::new(plan.jobs[range].iter().cloned().collect()));
    let (tx, rx) = mpsc::channel::<Msg>();
    let mut handles = Vec::new();
    for _ in 0..workers {
        let (plan, queue, tx, failures, stop) = (
            plan.clone(),
            queue.clone(),
            tx.clone(),
            failures.clone(),
            stop.clone(),
        );
        handles.push(std::thread::spawn(move || loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let Some(job) = queue.lock().ok().and_then(|mut q| q.pop_front()) else {
                return;
            };
            let _ = tx.send(Msg::Started);
            let r = run_host(&plan, &job, &tx);
            if !r.ok() {
                let n = failures.fetch_add(1, Ordering::SeqCst) + 1;
                if plan.max_failures.is_some_and(|k| n > k) {
                    stop.store(true, Ordering::SeqCst);
                }
            }
            let _ = tx.send(Msg::Done(Box::new(r)));
        }));
    }
    drop(tx);
    for m in rx {
        match m {
            Msg::Started => display.started(),
            Msg::Line(i, e, l) => display.line(i, e, &l),
            Msg::Done(r) => {
                display.done(&r, &plan.batch_id);
                let i = r.idx;
                results[i] = Some(*r);
            }
        }
    }
    for h in handles {
        let _ = h.join();
    }
}

/// The result of host `i`, which this run never started: an earlier failure stopped it.
fn skipped(plan: &Plan, i: usize, display: &mut Display) -> HostResult {
    let j = &plan.jobs[i];
    let r = HostResult {
        idx: i,
        destination: j.destination.clone(),
        execution_id: j.id.to_string(),
        state: "skipped".into(),
        exit_code: None,
        duration: Duration::ZERO,
        reconnects: 0,
        reason: Some(
            "not started: an earlier failure stopped the batch (`cairn batch resume`)".into(),
        ),
        outcome: None,
        output: Capture::default(),
    };
    display.skipped(&r, &plan.batch_id);
    r
}

fn exit_code(results: &[HostResult]) -> i32 {
    if results.iter().all(HostResult::ok) {
        0
    } else if !results.iter().any(HostResult::dispatched) {
        EXIT_NOT_DISPATCHED
    } else if results
        .iter()
        .any(|r| r.needs_review() || matches!(r.state.as_str(), "running" | "dispatched"))
    {
        EXIT_UNKNOWN
    } else {
        EXIT_SOME_FAILED
    }
}

fn summary(batch_id: &str, results: &[HostResult], json: bool, code: i32, dir: Option<&Path>) {
    let c = counts(results.iter().map(|r| r.state.as_str()));
    let ok = results.iter().filter(|r| r.ok()).count();
    if json {
        println!(
            "{}",
            serde_json::json!({"type": "summary", "batch_id": batch_id, "hosts": results.len(),
                "ok": ok, "states": c, "exit_code": code,
                "needs_review": results.iter().filter(|r| r.needs_review())
                    .map(|r| serde_json::json!({"host": r.destination, "execution_id": r.execution_id, "state": r.state}))
                    .collect::<Vec<_>>()})
        );
        return;
    }
    let w = results
        .iter()
        .map(|r| r.destination.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut s = String::new();
    s.push_str(&format!(
        "\n{:w$}  {:12} {:>4} {:>9} {:>10}  EXECUTION\n",
        "HOST", "STATE", "EXIT", "DURATION", "RECONNECTS"
    ));
    for r in results {
        s.push_str(&format!(
            "{:w$}  {:12} {:>4} {:>8.1}s {:>10}  {}\n",
            r.destination,
            r.state,
            r.exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into()),
            r.duration.as_secs_f64(),
            r.reconnects,
            r.execution_id
        ));
    }
    s.push_str(&format!(
        "batch {batch_id}: {} host(s), {ok} ok; {}\n",
        results.len(),
        counts_text(&c)
    ));
    if let Some(d) = dir {
        s.push_str(&format!("output in {}/HOST.out, HOST.err\n", d.display()));
    }
    for r in results.iter().filter(|r| r.needs_review()) {
        s.push_str(&format!(
            "needs review: {} {} ({}): {}; not run again, see `cairn status {}`\n",
            r.destination,
            r.execution_id,
            r.state,
            r.reason.as_deref().unwrap_or(""),
            r.execution_id
        ));
    }
    print!("{s}");
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The router before the admission table, kept as the oracle: the table must route every
    /// member exactly as it did, whatever the batch's class.
    #[test]
    fn resume_routes_every_member_as_the_hand_written_router_did() {
        let before = |recorded: Recorded| match recorded {
            Recorded::Absent => Mode::Fresh,
            Recorded::At(State::Delivered) => Mode::Settled,
            Recorded::At(State::Accepted) => Mode::Authorize,
            Recorded::At(State::Authorized) => Mode::Redispatch,
            Recorded::At(State::Failed) => Mode::Retry,
            _ => Mode::Attach,
        };
        let recorded = [Recorded::Absent, Recorded::Stateless]
            .into_iter()
            .chain(State::ALL.into_iter().map(Recorded::At));
        for r in recorded {
            for class in OpClass::ALL {
                let intent = Intent {
                    class,
                    ..Intent::default()
                };
                assert_eq!(Mode::resume(r, &intent), before(r), "{r:?} {class}");
            }
        }
    }

    /// Every class name the intent module writes is one the core's admission table knows: none
    /// falls to the strictest rule by a spelling difference.
    #[test]
    fn the_admission_table_recognizes_every_class_the_intent_module_writes() {
        for class in OpClass::ALL {
            let core = admission::Class::from_recorded(class.as_str());
            assert_ne!(core, admission::Class::Unrecognized, "{class}");
            assert_eq!(core, admission::Class::from(class), "{class}");
        }
    }

    #[test]
    fn batch_options_are_the_record_batches_always_wrote_and_a_damaged_one_is_refused() {
        let o = BatchOptions {
            remote_dir: Some("~/.cairn".into()),
            timeout_secs: 30,
            parallel: Some(4),
            batch_size: None,
            max_failures: Some(0),
            actor: Some("ops".into()),
            env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
            secret_env: BTreeSet::from(["TOKEN".to_owned()]),
            retention_secs: Some(60),
            connect: ConnectRecord {
                identity: vec!["/k/id".into()],
                port: Some(2222),
                ..ConnectRecord::default()
            },
            ..BatchOptions::default()
        };
        // the JSON the fleet wrote with `json!` before the record was typed
        let old = serde_json::json!({
            "remote_dir": "~/.cairn", "timeout_secs": 30, "parallel": 4, "batch_size": null,
            "max_failures": 0, "actor": "ops", "cwd": null, "env": {"A": "1"},
            "secret_env": ["TOKEN"], "credential_ref": null, "class": OpClass::default(),
            "scope": null, "retention_secs": 60,
            "connect": {"ssh_config": null, "identity": ["/k/id"], "known_hosts": null,
                        "port": 2222, "jump": null},
        });
        assert_eq!(o.to_value(), old);
        let back = BatchOptions::read("bt_1", &old).unwrap();
        assert_eq!(back.to_value(), old);
        // an older record without the later fields reads with their defaults
        let sparse = BatchOptions::read("bt_1", &serde_json::json!({"actor": "ops"})).unwrap();
        assert_eq!(sparse.actor.as_deref(), Some("ops"));
        assert!(sparse.connect.identity.is_empty() && sparse.parallel.is_none());
        // a damaged one is an error naming the batch, not a batch resumed with defaults
        let e = BatchOptions::read("bt_1", &serde_json::json!({"parallel": "four"})).unwrap_err();
        assert!(e.to_string().contains("batch bt_1") && e.to_string().contains("damaged"));
    }

    #[test]
    fn inventory_lines() {
        let t = "# prod\nweb-1\n\n  web-2  # the new one\nops@db-1\n   \n#end\n";
        assert_eq!(parse_inventory(t), vec!["web-1", "web-2", "ops@db-1"]);
    }

    fn r(state: &str, code: Option<u8>) -> HostResult {
        HostResult {
            idx: 0,
            destination: "h".into(),
            execution_id: "ex_1".into(),
            state: state.into(),
            exit_code: code,
            duration: Duration::ZERO,
            reconnects: 0,
            reason: None,
            outcome: None,
            output: Capture::default(),
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(&[r("completed", Some(0))]), 0);
        assert_eq!(
            exit_code(&[r("completed", Some(0)), r("completed", Some(3))]),
            1
        );
        assert_eq!(
            exit_code(&[r("completed", Some(0)), r("interrupted", None)]),
            254
        );
        assert_eq!(exit_code(&[r("error", None), r("skipped", None)]), 255);
        assert_eq!(exit_code(&[r("completed", Some(0)), r("skipped", None)]), 1);
    }
}
