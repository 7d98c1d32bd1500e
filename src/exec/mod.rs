//! The one place that sequences an execution:
//! accept → connect → dispatch → stream → (reconnect → probe → decide) → conclude → deliver.
//!
//! Everything that happens is appended to the journal before it is acted on. Once an execution
//! is driven (dispatch or probe, stream, reconnect), every decision is [`crate::machine`]'s;
//! this module is its driver: it connects, runs the execs (a `watch` is both the probe and,
//! when the command is still running, the reattach stream), writes the journal, sleeps, and
//! feeds the machine what happened.

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::approve::{Allow, ApprovalRequest, Approver};
use crate::epoch::{self, HostPlace};
use crate::event::EventKind;
use crate::evidence::{AcceptedIntent, Evidence, ResolvedDetail};
use crate::host_helper::{self, HostHelper, Side};
use crate::id::ExecutionId;
use crate::intent::{AfterUnknown, Intent, IntentKey, OpClass};
use crate::journal::{
    now_rfc3339, rfc3339_from_unix, AcceptOrMatch, Candidate, ExecutionJournal, ExecutionRecord,
    IntentColumns, Journal, NewEvent,
};
use crate::lifecycle::Illegal;
use crate::machine::{Answer, Event, Machine, Mode, Note, Step, Wait, Why};
use crate::marker::{self, FinishRecord, Hello, Line, Op, Piece, StartRecord, StderrDemux};
use crate::recovery::{Backoff, Liveness, Prior, Probe};
use crate::ssh::{ConnectOptions, Connection, ExecEvent, SshError, Target};
use crate::state::State;

/// Offsets larger than any output: a probe that wants the records but no bytes.
const NO_BYTES: u64 = 999_999_999_999_999; // 15 digits: the host script accepts at most 15

pub use crate::error::{ExecError, EXIT_NOT_DISPATCHED, EXIT_UNKNOWN};

/// Where the command's output goes as it arrives. `Send`, so that the executor's futures, which
/// hold the sink across their awaits, are `Send` and run on any thread of a multi-thread runtime.
pub trait OutputSink: Send {
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

pub use crate::machine::Patience;

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
    /// This request matched an earlier execution's intent and attached to it: the result is
    /// that execution's, nothing new was started.
    pub attached: bool,
    /// The outcome is `unknown` or `interrupted` and waits for a human (`cairn review`).
    pub needs_review: bool,
    /// The intent fingerprint (absent for an execution whose host was never identified).
    pub fingerprint: Option<String>,
    /// The operation class.
    pub class: Option<String>,
    /// Accepted, not dispatched, and owned by this process (`pid@host`), which is still alive
    /// and may still send it: nothing is concluded (see [`crate::owner`]). On a shared
    /// journal also the live owning replica's process of an execution that stayed unsettled
    /// for the caller's whole reconnect window (its state is the journal's, nothing concluded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
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
            // Its owner may still send it: not "nothing was dispatched", which invites a resend.
            State::Accepted | State::Authorized if self.held_by.is_some() => EXIT_UNKNOWN,
            State::Failed | State::Rejected | State::Accepted | State::Authorized => {
                EXIT_NOT_DISPATCHED
            }
            _ => EXIT_UNKNOWN,
        }
    }
}

/// What `cairn status` shows of an execution (see [`Executor::predict`]).
#[derive(Debug)]
pub struct Prediction {
    /// The journal's view.
    pub outcome: Outcome,
    /// What the host said, or why it was not probed.
    pub probe: Result<Probe, String>,
    /// What the machine would note before its next step (a re-dispatch, a lost connection).
    pub notes: Vec<Note>,
    /// What `cairn recover` does next; a conclusion's evidence is in words.
    pub next: Step,
}

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
    /// gc removed the output; only the records remain.
    output_gone: bool,
    gc: Option<String>,
    errors: Vec<String>,
    bad: Vec<String>,
    ended: bool,
    /// The stream broke (connection lost) before `end`.
    broken: Option<String>,
}

impl Reply {
    /// The reply, unless the connection broke or the host reported an error.
    fn checked(self) -> Result<Reply, ExecError> {
        if let Some(b) = self.broken {
            return Err(SshError::Disconnected(b).into());
        }
        if let Some(e) = self.errors.first() {
            return Err(ExecError::HostReported(format!("the host reported: {e}")));
        }
        Ok(self)
    }
}

/// The state of one execution while an operation drives it.
struct Run {
    rec: ExecutionRecord,
    /// The drive's decisions, and what the journal says (its prior) as the drive moves it on.
    m: Machine,
    /// The epoch the dispatch was sent into: the one last seen at the host when the
    /// `dispatched` event was written, corrected by the host's own announcement in its reply
    /// to the dispatch (`dispatch-epoch`). See [`crate::epoch`].
    dispatch_epoch: Option<String>,
    /// The epoch of the execution's started record, once seen.
    start_epoch: Option<String>,
    /// The epoch last seen at this execution's host (bookkeeping), as far as this run knows.
    last_seen_epoch: Option<String>,
    /// How the execution reached its host (from its `accepted` event; `None` for executions
    /// accepted before it was recorded).
    reach: Option<crate::reach::Reach>,
    out_off: u64,
    err_off: u64,
    reconnects: u32,
    host_key: Option<String>,
    start: Option<StartRecord>,
    done: Option<FinishRecord>,
    last_cursor_save: Instant,
    /// Tell the user what the next probe finds (set after a lost connection).
    announce: bool,
    /// Which host implementation ran the last operation (recorded with `running`).
    host_side: Option<Side>,
    /// Events recorded but not yet committed: they go into the journal in the same transaction
    /// as this run's next event (see [`Executor::record`]), so they cost no fsync of their own.
    /// Only events nothing is acted on before that: `authorized` (committed with `dispatched`,
    /// before anything is sent), `running` (with the outcome when the same reply carries it,
    /// else within [`HOLD_RUNNING`]) and the `reconnected` note.
    held: Vec<NewEvent>,
    /// When a `running` or `reconnected` event was put among the held ones: from then, they
    /// wait at most [`HOLD_RUNNING`] while a reply streams.
    held_since: Option<Instant>,
    /// The state another process had recorded when the journal refused this run's
    /// `dispatched` event (the evidence of the `dispatch-withheld` note).
    withheld_at: Option<State>,
    /// The states the next `dispatched` event may be appended from, when the lifecycle's own
    /// rule is not enough for this run's decision (a retry of a `failed` one: not after another
    /// retry's `dispatched`); checked in the append's transaction.
    dispatch_from: Option<&'static [State]>,
}

/// How long a held `running` (or `reconnected`) event may wait, while a reply streams, for the
/// outcome to share its transaction.
const HOLD_RUNNING: Duration = Duration::from_millis(20);

/// Sequences executions on one journal; made by [`crate::ExecutorBuilder`] (or [`Executor::new`]
/// with the defaults).
pub struct Executor<J: ExecutionJournal = Journal> {
    pub journal: J,
    pub(crate) connect: ConnectOptions,
    pub(crate) patience: Patience,
    /// Connections this executor uses, with its claim when the connection is pooled.
    conns: Vec<(String, Connection, Option<crate::pool::Lease>)>,
    /// Connections shared with other executors of this process (`cairn serve`, `cairn mcp`);
    /// `None`: this executor connects for itself.
    pub(crate) pool: Option<std::sync::Arc<crate::pool::Pool>>,
    /// Dispatch through the pooled connection's host session (`--host-session`; see
    /// [`crate::session`]) when the dispatch allows it. Needs `pool`.
    pub(crate) host_session: bool,
    /// Which host implementation runs the marker protocol (`--host-helper`).
    pub(crate) host_helper: HostHelper,
    /// The intent fingerprint key file (default: `intent.key` next to the journal).
    pub(crate) intent_key_path: Option<std::path::PathBuf>,
    intent_key: Option<IntentKey>,
    /// Decides whether a new execution may start (default: allow, by the local caller).
    pub(crate) approver: Box<dyn Approver>,
    /// The session new executions are recorded under.
    pub(crate) session_id: Option<String>,
    /// Secret values for executions this process dispatches, by execution ID; memory only.
    secrets: std::collections::HashMap<String, Vec<u8>>,
}

/// A held `running` waits at most HOLD_RUNNING (from when it was seen, however much output
/// streams meanwhile) for the outcome to share its transaction: how long it may still wait.
fn hold_left(run: &Run) -> Option<Duration> {
    run.held_since
        .filter(|_| !run.held.is_empty())
        .map(|t| HOLD_RUNNING.saturating_sub(t.elapsed()))
}

/// The bookkeeping place of an execution's host (see [`crate::epoch`]).
fn place_of(rec: &ExecutionRecord, host_key: &str) -> HostPlace {
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
fn reason_text(why: Why, target: &Target, run: &Run, last: Option<&(Reply, Probe)>) -> String {
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

/// Which side runs the marker protocol, by connection and marker home, for every executor of
/// this process (a gateway makes one per request): `Err` (the script, and why) is asked again
/// after [`SCRIPT_DECISION_FOR`].
type SideCache = std::collections::HashMap<String, (Instant, Result<(), String>)>;
fn host_helper_cache() -> &'static std::sync::Mutex<SideCache> {
    static C: std::sync::OnceLock<std::sync::Mutex<SideCache>> = std::sync::OnceLock::new();
    C.get_or_init(Default::default)
}
const SCRIPT_DECISION_FOR: Duration = Duration::from_secs(600);

/// The gate each key of [`host_helper_cache`] is decided behind: executions that reach a host
/// together (a gateway given a thousand calls at once) wait for the first one's probe and upload
/// instead of each probing and each sending the 1.2 MB helper: those copies, and the SSH write
/// buffers they grew (which keep their size), were most of what an execution in flight cost.
fn host_helper_gate(key: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    type Gates = std::collections::HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>;
    static G: std::sync::OnceLock<std::sync::Mutex<Gates>> = std::sync::OnceLock::new();
    G.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key.to_owned())
        .or_default()
        .clone()
}

/// Where the host script cannot be installed, by connection and marker home: `Err` (it is
/// streamed with each operation, and why), asked again after [`SCRIPT_DECISION_FOR`].
fn script_cache() -> &'static std::sync::Mutex<SideCache> {
    static C: std::sync::OnceLock<std::sync::Mutex<SideCache>> = std::sync::OnceLock::new();
    C.get_or_init(Default::default)
}
fn host_helper_cache_get(key: &str) -> Option<Result<(), String>> {
    cache_get(host_helper_cache(), key)
}
fn host_helper_cache_put(key: &str, d: Result<(), String>) {
    cache_put(host_helper_cache(), key, d)
}
fn cache_get(c: &std::sync::Mutex<SideCache>, key: &str) -> Option<Result<(), String>> {
    let c = c.lock().unwrap_or_else(|e| e.into_inner());
    match c.get(key) {
        Some((at, Err(_))) if at.elapsed() > SCRIPT_DECISION_FOR => None,
        Some((_, d)) => Some(d.clone()),
        None => None,
    }
}
fn cache_put(c: &std::sync::Mutex<SideCache>, key: &str, d: Result<(), String>) {
    let mut c = c.lock().unwrap_or_else(|e| e.into_inner());
    c.insert(key.to_owned(), (Instant::now(), d));
}

/// Calls waiting to learn which execution their correlation gets recorded against
/// ([`await_correlation`]). A front that answers once a call's execution is accepted (an MCP
/// task) is told by the executor that recorded it, right after the commit, instead of asking
/// the journal over and over: with a thousand calls waiting, those queries took every thread of
/// the blocking pool and starved the very commits they waited for.
type CorrelationWaiters =
    std::collections::HashMap<String, Vec<tokio::sync::oneshot::Sender<ExecutionId>>>;
fn correlation_waiters() -> std::sync::MutexGuard<'static, CorrelationWaiters> {
    static W: std::sync::OnceLock<std::sync::Mutex<CorrelationWaiters>> =
        std::sync::OnceLock::new();
    W.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Be told the execution `correlation` is next recorded against (committed) by an executor of
/// this process. Register before the call can record it; what was recorded before is in the
/// journal. A receiver dropped unanswered is pruned by [`forget_correlation`].
pub fn await_correlation(correlation: &str) -> tokio::sync::oneshot::Receiver<ExecutionId> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    correlation_waiters()
        .entry(correlation.to_owned())
        .or_default()
        .push(tx);
    rx
}

/// Drop the waiters of `correlation` that stopped waiting.
pub fn forget_correlation(correlation: &str) {
    let mut w = correlation_waiters();
    if let Some(list) = w.get_mut(correlation) {
        list.retain(|tx| !tx.is_closed());
        if list.is_empty() {
            w.remove(correlation);
        }
    }
}

/// `correlation` was just committed against `id`: wake whoever waits for it.
fn correlation_recorded(correlation: Option<&str>, id: &ExecutionId) {
    let Some(c) = correlation else { return };
    let waiting = correlation_waiters().remove(c);
    for tx in waiting.into_iter().flatten() {
        let _ = tx.send(id.clone());
    }
}

fn digest(cmd: &[u8]) -> String {
    hex::encode(Sha256::digest(cmd))
}

impl Run {
    fn new(rec: ExecutionRecord) -> Run {
        Run {
            rec,
            m: Machine::new(Prior::NotDispatched),
            dispatch_epoch: None,
            start_epoch: None,
            last_seen_epoch: None,
            reach: None,
            out_off: 0,
            err_off: 0,
            reconnects: 0,
            host_key: None,
            start: None,
            done: None,
            last_cursor_save: Instant::now(),
            announce: false,
            host_side: None,
            held: Vec::new(),
            held_since: None,
            withheld_at: None,
            dispatch_from: None,
        }
    }
}

/// Which earlier execution (newest first) a request with the same intent attaches to:
/// one that is accepted, authorized, dispatched, running, or has a result not yet delivered;
/// or one whose outcome is `unknown`/`interrupted` (the review record), unless its class lets
/// a retry run again (read-only, within limits). Failed, rejected and delivered ones do not
/// hold a match: a request after them is a new execution.
pub fn choose_match(cands: &[Candidate]) -> Option<usize> {
    let unsettled = cands
        .iter()
        .filter(|c| matches!(c.status.state, State::Unknown | State::Interrupted))
        .count();
    cands.iter().position(|c| match c.status.state {
        State::Accepted
        | State::Authorized
        | State::Dispatched
        | State::Running
        | State::Completed
        | State::Cancelled => true,
        State::Unknown | State::Interrupted => {
            crate::intent::after_unknown_recorded(&c.class, unsettled) != AfterUnknown::RunAgain
        }
        State::Failed | State::Rejected | State::Delivered => false,
    })
}

/// What the approver is asked about, besides the target and the host key.
struct Asked<'a> {
    actor: &'a str,
    scope: &'a str,
    class: OpClass,
    destination: &'a str,
    command: &'a [u8],
}

/// An accept that lost the race for its execution ID (another process sending the same ID
/// accepted it between our look-up and our insert) says so plainly, instead of a database
/// error: the other process runs it, once. (Attaching here could meet it accepted but not yet
/// dispatched, which reads as "never dispatched".)
fn lost_id_race(e: crate::journal::JournalError, id: &ExecutionId) -> ExecError {
    if e.is_duplicate_id() {
        ExecError::Refused(format!(
            "execution {id} was accepted by another process at the same moment; it runs there, \
             once. Follow it with `cairn attach {id}` or `cairn status {id}`"
        ))
    } else {
        e.into()
    }
}

/// Secret variables (`--secret-env NAME`): values from cairn's own environment, encoded for
/// the host as `export NAME='value'` lines that travel after the command on the dispatch's
/// stdin. They are never journaled, written to the marker, or put in argv; see
/// `docs/GATEWAYS.md` for the host side.
fn secret_blob(intent: &Intent) -> Result<Option<Vec<u8>>, ExecError> {
    if intent.secret_env.is_empty() {
        return Ok(None);
    }
    let mut blob = Vec::new();
    for name in &intent.secret_env {
        let v = std::env::var_os(name).ok_or_else(|| {
            ExecError::Setup(format!(
                "secret variable {name} is not set in cairn's environment"
            ))
        })?;
        #[cfg(unix)]
        let bytes = {
            use std::os::unix::ffi::OsStrExt;
            v.as_bytes().to_vec()
        };
        #[cfg(not(unix))]
        let bytes = v.to_string_lossy().into_owned().into_bytes();
        if bytes.contains(&0) {
            return Err(ExecError::Setup(format!(
                "secret {name} contains a NUL byte"
            )));
        }
        blob.extend_from_slice(format!("export {name}=").as_bytes());
        blob.extend_from_slice(&crate::intent::quote_word(&bytes));
        blob.push(b'\n');
    }
    Ok(Some(blob))
}

/// How many times the owner's sweep picks up one execution that none of its calls drives
/// ([`Executor::redrive_owned`]): one whose recovery keeps failing is then left as it is.
pub const MAX_REDRIVES: usize = 3;

/// Whether the owner's sweep may pick up `id` when no call drives it: its state and how many
/// times it was picked up before, or `None` to leave it alone: settled or `unknown` (a call
/// concluded it), detached (its callers attach to it or poll it), or picked up
/// [`MAX_REDRIVES`] times already (said once here; `cairn recover` finishes it).
pub(crate) fn may_redrive(
    j: &impl ExecutionJournal,
    id: &ExecutionId,
) -> Result<Option<(State, usize)>, crate::journal::JournalError> {
    let Some(status) = j.status(id)? else {
        return Ok(None);
    };
    if !matches!(
        status.state,
        State::Accepted | State::Authorized | State::Dispatched | State::Running
    ) {
        return Ok(None);
    }
    let events = j.events(id)?;
    let detached = events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::Dispatched)
        .is_some_and(|e| e.evidence["detach"] == true);
    if detached {
        return Ok(None);
    }
    let before = events
        .iter()
        .filter(|e| e.kind == EventKind::Redrive)
        .count();
    if before >= MAX_REDRIVES {
        tracing::warn!(
            "cairn: {id} ({}): no call of its owner drives it, and its owner picked it up \
             {MAX_REDRIVES} times already; left as it is (cairn recover finishes it)",
            status.state
        );
        return Ok(None);
    }
    Ok(Some((status.state, before)))
}

/// Whether a caller may drive an execution of a shared journal (see `own_or_wait`).
enum Drive {
    /// Go ahead; with the guard when this replica owns it (this call drives it then).
    Go(Option<Driving>),
    /// Taken over too often: leave it for review.
    Review,
    /// A live replica (`replica`, process `client`, lease epoch `epoch`) owns it and it stayed
    /// unsettled for the caller's whole reconnect window: report it as held by that owner,
    /// what the journal holds, concluding nothing ([`Step::Held`]).
    Held {
        replica: String,
        client: String,
        epoch: i64,
    },
}

/// The calls of this process driving one execution of a shared journal: how many drive it
/// beside each other (the owner's own calls), and whether one drives it alone (the recovery
/// after a takeover, or the owner picking up an execution none of its calls drove any more).
#[derive(Default)]
struct Drivers {
    shared: usize,
    sole: bool,
}

/// Executions this process drives (see [`Drivers`]): one call recovers an execution after a
/// takeover and the others wait for its result instead of recording it twice, and the owner's
/// sweep never drives an execution beside a live call of this process.
fn drivers() -> std::sync::MutexGuard<'static, std::collections::HashMap<String, Drivers>> {
    static S: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, Drivers>>> =
        std::sync::OnceLock::new();
    S.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// This call drives `id` (alone, or beside other calls of the owner) until dropped.
#[must_use = "the drive ends when it is dropped"]
pub(crate) struct Driving {
    id: String,
    sole: bool,
}

impl Drop for Driving {
    fn drop(&mut self) {
        let mut d = drivers();
        if let Some(e) = d.get_mut(&self.id) {
            if self.sole {
                e.sole = false;
            } else {
                e.shared = e.shared.saturating_sub(1);
            }
            if !e.sole && e.shared == 0 {
                d.remove(&self.id);
            }
        }
    }
}

/// Become the one call of this process that drives `id` after its takeover; `None` when
/// another call does.
pub(crate) fn drive_taken(id: &ExecutionId) -> Option<Driving> {
    let mut d = drivers();
    let e = d.entry(id.as_str().to_owned()).or_default();
    if e.sole {
        return None;
    }
    e.sole = true;
    Some(Driving {
        id: id.as_str().to_owned(),
        sole: true,
    })
}

/// Drive `id`, which this replica owns from its own acceptance, beside any other call of its
/// own that does; `None` while one call drives it alone (the owner's sweep picked it up).
fn drive_own(id: &ExecutionId) -> Option<Driving> {
    let mut d = drivers();
    let e = d.entry(id.as_str().to_owned()).or_default();
    if e.sole {
        return None;
    }
    e.shared += 1;
    Some(Driving {
        id: id.as_str().to_owned(),
        sole: false,
    })
}

/// Whether a call of this process drives `id`, or is taking it towards its dispatch
/// ([`crate::owner::claim`], from before its acceptance).
pub(crate) fn driven_here(id: &ExecutionId) -> bool {
    driven_in(&drivers(), id)
}

/// [`driven_here`], under the lock already taken.
fn driven_in(d: &std::collections::HashMap<String, Drivers>, id: &ExecutionId) -> bool {
    d.contains_key(id.as_str()) || crate::owner::claimed_here(id.as_str())
}

/// Become the one call of this process that drives `id`, an execution this replica owns, when
/// no call of this process drives it or is taking it towards its dispatch (checked under the
/// same lock every driving call registers under); `None` otherwise.
pub(crate) fn drive_undriven(id: &ExecutionId) -> Option<Driving> {
    let mut d = drivers();
    if driven_in(&d, id) {
        return None;
    }
    d.insert(
        id.as_str().to_owned(),
        Drivers {
            shared: 0,
            sole: true,
        },
    );
    Some(Driving {
        id: id.as_str().to_owned(),
        sole: true,
    })
}

impl<J: ExecutionJournal> Executor<J> {
    pub fn new(journal: J, connect: ConnectOptions, patience: Patience) -> Self {
        Executor {
            journal,
            connect,
            patience,
            conns: Vec::new(),
            pool: None,
            host_session: false,
            host_helper: HostHelper::Auto,
            intent_key_path: None,
            intent_key: None,
            approver: Box::new(Allow {
                by: "local-cli".into(),
            }),
            session_id: None,
            secrets: std::collections::HashMap::new(),
        }
    }

    /// `cairn run`: accept, dispatch, stream, survive connection loss, conclude, deliver.
    /// The intent is the local user's, class `remote-command`, default scope.
    pub async fn run(
        &mut self,
        req: RunRequest,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let intent = Intent {
            actor: crate::intent::local_actor("local"),
            ..Intent::default()
        };
        self.execute(req, intent, sink).await
    }

    /// Accept (or match), authorize, dispatch, stream, survive connection loss, conclude.
    ///
    /// A request whose intent fingerprint, actor and scope match an earlier execution that
    /// is still in its retention window and not yet delivered attaches to that execution
    /// (live output, the stored result, or its review record) instead of starting another;
    /// see [`crate::intent`] and docs/DESIGN.md, intent matching.
    // Long: admission in its order (reuse by ID, first contact, the intent and its evidence,
    // accept-or-match with its bounded retry, attach): each step hands the next the record, the
    // connection and the fingerprint it made, and the order is the guarantee.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = tracing::field::Empty))]
    pub async fn execute(
        &mut self,
        req: RunRequest,
        intent: Intent,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        marker::validate_remote_dir(&req.remote_dir).map_err(ExecError::InvalidRequest)?;
        intent.validate().map_err(ExecError::InvalidRequest)?;
        let secret_blob = secret_blob(&intent)?;
        let target = crate::ssh::resolve(&req.destination, &self.connect)?;
        let command = intent.wrap_command(&req.command);
        let cmd_digest = digest(&command);

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
                            String::from_utf8_lossy(&command)
                        ),
                    });
                }
                // The same operation again: never a second run. Replay from the start.
                tracing::Span::current().record("execution_id", tracing::field::display(id));
                self.journal.append_evidence(
                    id,
                    Evidence::RequestReused {
                        by: crate::journal::client_identity(),
                        correlation_id: intent.correlation_id.as_deref(),
                        session_id: self.session_id.as_deref(),
                        decision: (),
                    },
                )?;
                correlation_recorded(intent.correlation_id.as_deref(), id);
                if let Some(blob) = &secret_blob {
                    self.secrets.insert(id.to_string(), blob.clone());
                }
                let mut o = self.attach_from(id, sink, (0, 0), !req.detach).await?;
                o.attached = true;
                return Ok(o);
            }
        }

        let id = req.id.clone().unwrap_or_else(ExecutionId::generate);
        // Claimed before it is accepted, so that no moment exists in which the journal holds
        // it accepted and this process does not count as its live owner.
        let _claim = crate::owner::claim(&id);
        let rec = ExecutionRecord {
            id: id.clone(),
            created_at: now_rfc3339(),
            destination: req.destination.clone(),
            host: target.hostname.clone(),
            port: target.port,
            user: target.user.clone(),
            command: command.clone(),
            command_digest: cmd_digest,
            remote_dir: req.remote_dir.clone(),
            timeout_secs: req.timeout_secs,
            client: crate::journal::client_identity().to_owned(),
        };
        let mut run = Run::new(rec.clone());
        // How it reaches the host, for every later connection made for it.
        let reach = crate::reach::Reach::of(&target, &self.connect, &req.remote_dir);

        // First contact: connect and learn the host's key (the host identity in the intent).
        // A failure here is a proven "never started": nothing was sent. The execution is
        // recorded without a fingerprint (the host was never identified), so it matches nothing.
        let conn_idx = match self.connection(&target).await {
            Ok(i) => i,
            Err(e) => {
                tracing::Span::current().record("execution_id", tracing::field::display(&id));
                let actor = intent.actor.trim();
                let evidence = Evidence::Accepted {
                    record: crate::journal::accepted_evidence(&rec),
                    connection: Some(&reach),
                    intent: None,
                    asked_by: Some(actor),
                };
                self.journal
                    .accept(&rec, evidence.to_value())
                    .map_err(|e| lost_id_race(e, &id))?;
                self.correlate(&id, &intent, true)?;
                // An outcome, not an error: `--json` callers get the object, and the reason
                // carries the error (host key, auth, unreachable) for people.
                return self.conclude(&mut run, State::Failed, &format!("never dispatched: {e}"));
            }
        };
        let fp = self.conns[conn_idx].1.host_key_fingerprint().to_owned();
        run.host_key = Some(fp.clone());

        // Intent: the keyed fingerprint of the canonical operation record.
        let key = self.intent_key()?;
        let host = crate::intent::canonical_host(&target.hostname, target.port);
        let op = intent.record(&fp, &host, &target.user, &req.command);
        let fingerprint = op.fingerprint(&key);
        let legacy_fp = op.fingerprint_v1(&key);
        let legacy = crate::journal::LegacyIntent {
            fingerprint: &legacy_fp,
            host: &target.hostname,
            port: target.port,
        };
        let cols = IntentColumns {
            fingerprint: fingerprint.clone(),
            actor: op.actor_canonical(),
            scope: op.scope_canonical(),
            class: intent.class.as_str().to_owned(),
            retention_secs: intent.retention_secs(),
            accepted_ms: crate::journal::now_ms(),
            session_id: self.session_id.clone(),
            intent: op.display_json(),
        };
        let evidence = Evidence::Accepted {
            record: crate::journal::accepted_evidence(&rec),
            connection: Some(&reach),
            intent: Some(AcceptedIntent {
                fingerprint: &fingerprint,
                actor: &cols.actor,
                scope: &cols.scope,
                class: &cols.class,
                retention_secs: cols.retention_secs,
                session_id: cols.session_id.as_deref(),
                intent: &cols.intent,
            }),
            asked_by: None,
        }
        .to_value();
        let match_evidence = Evidence::IntentMatched {
            by: crate::journal::client_identity(),
            session_id: self.session_id.as_deref(),
            correlation_id: intent.correlation_id.as_deref(),
            fingerprint: &fingerprint,
            decision: (),
        }
        .to_value();
        let mut accepted = false;
        for _ in 0..5 {
            let mut cols = cols.clone();
            cols.accepted_ms = crate::journal::now_ms();
            match self
                .journal
                .accept_or_match_with(
                    &rec,
                    &cols,
                    Some(legacy),
                    evidence.clone(),
                    match_evidence.clone(),
                    choose_match,
                )
                .map_err(|e| lost_id_race(e, &id))?
            {
                AcceptOrMatch::Accepted(_) => {
                    tracing::Span::current().record("execution_id", tracing::field::display(&id));
                    accepted = true;
                    break;
                }
                AcceptOrMatch::Matched(c) => {
                    // (the match evidence, with the correlation, was committed with the match)
                    correlation_recorded(intent.correlation_id.as_deref(), &c.id);
                    tracing::Span::current().record("execution_id", tracing::field::display(&c.id));
                    tracing::info!(
                        "cairn: same intent as {} ({}): attaching to it instead of running again",
                        c.id,
                        c.status.state
                    );
                    if let Some(blob) = &secret_blob {
                        self.secrets.insert(c.id.to_string(), blob.clone());
                    }
                    if let Some(o) = self.attach_matched(&c, req.detach, sink).await? {
                        return Ok(o);
                    }
                    // The earlier one was proven never dispatched: accept this one.
                }
            }
        }
        if !accepted {
            return Err(ExecError::Internal(
                "intent matching did not settle after 5 attempts".into(),
            ));
        }
        if let Some(blob) = secret_blob {
            self.secrets.insert(id.to_string(), blob);
        }
        self.correlate(&id, &intent, true)?;

        let asked = Asked {
            actor: &cols.actor,
            scope: &cols.scope,
            class: intent.class,
            destination: &req.destination,
            command: &req.command,
        };
        self.authorize_and_dispatch(&target, &mut run, conn_idx, &asked, req.detach, sink)
            .await
    }

    /// An execution accepted in the journal whose client stopped before it asked for
    /// authorization or sent a byte (`cairn batch resume` of a member left `accepted`): ask the
    /// approver now, as `execute` would have, and dispatch it under its own ID if allowed.
    /// `command` is the command as requested (before `cwd`/`env` were wrapped around it) and
    /// `intent` the request's. Anything past `accepted`, or still owned by a live client, is
    /// attached to instead.
    #[tracing::instrument(name = "execution", skip_all, fields(execution_id = %id))]
    pub async fn authorize_accepted(
        &mut self,
        id: &ExecutionId,
        command: &[u8],
        intent: &Intent,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let state = self.journal.status(id)?.map(|s| s.state);
        if state != Some(State::Accepted) || self.owner_may_dispatch(id)?.is_some() {
            return self.attach(id, sink).await;
        }
        if self.journal.intent_of(id)?.is_none() {
            // accepted without an intent: the host was never identified
            return self.attach(id, sink).await;
        }
        // This process owns it from here (the `resumed` event names it for other processes).
        let _claim = crate::owner::claim(id);
        let mut run = self.load(id)?;
        self.journal.append_evidence(
            id,
            Evidence::Resumed {
                by: crate::journal::client_identity(),
                why: (),
            },
        )?;
        self.ask_then_dispatch(&mut run, command, intent, sink)
            .await
    }

    /// An execution never authorized: connect (learning the host key), ask the approver about
    /// `command` with `intent`, and dispatch it under its own ID if allowed.
    async fn ask_then_dispatch(
        &mut self,
        run: &mut Run,
        command: &[u8],
        intent: &Intent,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let target = self.target_for(run)?;
        let conn_idx = match self.connection(&target).await {
            Ok(i) => i,
            Err(e) => return self.conclude(run, State::Failed, &format!("never dispatched: {e}")),
        };
        let fp = self.conns[conn_idx].1.host_key_fingerprint().to_owned();
        run.host_key = Some(fp.clone());
        let host = crate::intent::canonical_host(&target.hostname, target.port);
        let op = intent.record(&fp, &host, &target.user, command);
        let (actor, scope) = (op.actor_canonical(), op.scope_canonical());
        let destination = run.rec.destination.clone();
        let asked = Asked {
            actor: &actor,
            scope: &scope,
            class: intent.class,
            destination: &destination,
            command,
        };
        self.authorize_and_dispatch(&target, run, conn_idx, &asked, false, sink)
            .await
    }

    /// Authorization (asked once, the decision is evidence), the host's epoch, then the
    /// dispatch: the part of `execute` after the execution was accepted.
    async fn authorize_and_dispatch(
        &mut self,
        target: &Target,
        run: &mut Run,
        conn_idx: usize,
        asked: &Asked<'_>,
        detach: bool,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome, ExecError> {
        let id = run.rec.id.clone();
        let fp = self.conns[conn_idx].1.host_key_fingerprint().to_owned();
        let target_text = format!("{}@{}:{}", target.user, target.hostname, target.port);
        let decision = self.approver.decide(&ApprovalRequest {
            execution_id: id.as_str(),
            actor: asked.actor,
            destination: asked.destination,
            target: &target_text,
            account: &target.user,
            host_key: &fp,
            class: asked.class,
            scope: asked.scope,
            command: asked.command,
        });
        let at = now_rfc3339();
        let decided = Evidence::Decided {
            allow: decision.allow,
            by: &decision.by,
            rule: decision.rule.as_deref(),
            reason: &decision.reason,
            at: &at,
            host_key: &fp,
            actor: asked.actor,
        }
        .into_event();
        if !decision.allow {
            let (kind, state, value) = decided;
            self.journal.append(&id, kind, state, value)?;
            run.m.set_prior(Prior::Settled);
            let mut o = self.outcome_from_journal(run)?;
            o.reason = Some(format!(
                "not authorized ({}): {}; nothing was sent",
                decision.by, decision.reason
            ));
            return Ok(o);
        }
        run.held.push(decided);
        // The epoch last seen at this host; on first contact, the one it announces now. The
        // reply to the dispatch says which epoch it really ran under (see `drive`).
        let place = place_of(&run.rec, &fp);
        let epoch = match self.journal.host_epoch_at(&place)? {
            Some(e) => e,
            None => match self.hello(conn_idx, &run.rec.remote_dir).await {
                Ok(h) => {
                    self.note_epoch(run, &h.epoch)?;
                    h.epoch
                }
                Err(why) => {
                    let o = self.conclude(
                        run,
                        State::Failed,
                        &format!("never dispatched: preparing the host failed: {why}"),
                    )?;
                    return Ok(o);
                }
            },
        };
        run.last_seen_epoch = Some(epoch.clone());
        run.dispatch_epoch = Some(epoch);
        self.drive(target, run, true, detach, true, sink).await
    }

    /// The secret `export` lines to send after the command for a dispatch of `id`: those of
    /// the request this process holds, else read again by name from this process's
    /// environment (a `recover` in another process). Refuses rather than run without them.
    fn secrets_for(&mut self, id: &ExecutionId) -> Result<Vec<u8>, ExecError> {
        if let Some(b) = self.secrets.get(id.as_str()) {
            return Ok(b.clone());
        }
        let names: std::collections::BTreeSet<String> = self
            .journal
            .intent_of(id)?
            .and_then(|i| {
                serde_json::from_value(i.intent.get("secret_env").cloned().unwrap_or_default()).ok()
            })
            .unwrap_or_default();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let intent = Intent {
            secret_env: names,
            ..Intent::default()
        };
        let blob = secret_blob(&intent)
            .map_err(|e| ExecError::Setup(format!("cannot dispatch {id}: {e}; nothing was sent")))?
            .unwrap_or_default();
        self.secrets.insert(id.to_string(), blob.clone());
        Ok(blob)
    }

    /// The fingerprint key, loaded (or created) once.
    fn intent_key(&mut self) -> Result<IntentKey, ExecError> {
        if let Some(k) = &self.intent_key {
            return Ok(k.clone());
        }
        let path = match self.intent_key_path.clone() {
            Some(p) => p,
            None => IntentKey::default_path(self.journal.path()).ok_or_else(|| {
                ExecError::Setup(
                    "a PostgreSQL journal is shared by replicas, and they match one intent only \
                     under one intent key: give every replica the same key file with \
                     --intent-key FILE or CAIRN_INTENT_KEY"
                        .into(),
                )
            })?,
        };
        let k = IntentKey::load_or_create(&path).map_err(ExecError::Setup)?;
        self.intent_key = Some(k.clone());
        Ok(k)
    }

    /// Record the caller's correlation ID (a JSON-RPC id) against an execution.
    fn correlate(&mut self, id: &ExecutionId, intent: &Intent, new: bool) -> Result<(), ExecError> {
        if let Some(c) = &intent.correlation_id {
            self.journal.append_evidence(
                id,
                Evidence::Correlation {
                    correlation_id: c,
                    session_id: self.session_id.as_deref(),
                    new_execution: new,
                },
            )?;
            correlation_recorded(Some(c), id);
        }
        Ok(())
    }

    /// A request matched `c`: attach to it according to its state and class. `None` when it
    /// turned out never to have been dispatched (its owner died first): accept anew.
    async fn attach_matched(
        &mut self,
        c: &Candidate,
        detach: bool,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<Outcome>, ExecError> {
        // An execution another process is still starting: give it time to reach the host,
        // so that we watch its dispatch rather than race it with our own (the start guard
        // would make that harmless, but not quiet).
        let deadline = Instant::now() + self.connect.connect_timeout + Duration::from_secs(30);
        let mut state = c.status.state;
        while matches!(
            state,
            State::Accepted | State::Authorized | State::Dispatched
        ) && Instant::now() < deadline
        {
            if self.owner_may_dispatch(&c.id)?.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            state = self
                .journal
                .status(&c.id)?
                .map(|s| s.state)
                .unwrap_or(state);
        }
        let status = self.journal.status(&c.id)?;
        let state = status.as_ref().map(|s| s.state).unwrap_or(state);
        if matches!(state, State::Accepted | State::Authorized) {
            // Never dispatched, and its owner is gone (or silent past the deadline): the
            // `dispatched` event is durable before a byte leaves, so nothing was sent.
            let o = self.recover_one(&c.id, false).await?;
            if o.state == State::Failed {
                return Ok(None);
            }
            return Ok(Some(self.mark_attached(o)));
        }
        if state == State::Failed {
            return Ok(None);
        }
        let o = match state {
            State::Interrupted => self.review_outcome(&c.id)?,
            State::Unknown => match crate::intent::after_unknown_recorded(&c.class, 0) {
                AfterUnknown::Review | AfterUnknown::RunAgain => self.review_outcome(&c.id)?,
                AfterUnknown::ProbeMarker => {
                    let o = self.attach_from(&c.id, sink, (0, 0), !detach).await?;
                    // (held by its live owner on another replica: nothing concluded here)
                    if o.state == State::Unknown && o.held_by.is_none() {
                        self.review_outcome(&c.id)?
                    } else {
                        o
                    }
                }
                AfterUnknown::RetrySameId => {
                    let o = self.attach_from(&c.id, sink, (0, 0), !detach).await?;
                    // Held by its live owner on another replica: that owner decides, not this
                    // call (nothing is appended or sent from here).
                    if o.state == State::Unknown && o.held_by.is_none() {
                        // Idempotent: running it again is harmless; do it under the same
                        // execution ID (the start guard still holds where the marker exists).
                        self.journal.append_evidence(
                            &c.id,
                            Evidence::RetrySameId {
                                class: OpClass::Idempotent,
                                reason: (),
                            },
                        )?;
                        self.redispatch(&c.id, detach, sink).await?
                    } else {
                        o
                    }
                }
            },
            _ => self.attach_from(&c.id, sink, (0, 0), !detach).await?,
        };
        Ok(Some(self.mark_attached(o)))
    }

    fn mark_attached(&self, mut o: Outcome) -> Outcome {
        o.attached = true;
        o
    }

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
        self.drive(&target, &mut run, true, detach, true, sink)
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
        self.drive(&target, &mut run, true, false, true, sink).await
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
                            Err(e) => e,
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
        self.drive(&target, &mut run, true, false, true, sink).await
    }

    /// The journal's record of an execution that needs review, without touching the host.
    pub fn review_outcome(&mut self, id: &ExecutionId) -> Result<Outcome, ExecError> {
        let run = self.load(id)?;
        let mut o = self.outcome_from_journal(&run)?;
        let r = crate::review::record(&self.journal, id)?;
        o.needs_review = true;
        o.reason = Some(format!(
            "needs review: {}; first dispatched {}; {}",
            r.known_outcome,
            r.first_dispatched_at.as_deref().unwrap_or("never"),
            r.why_not_resent
        ));
        Ok(o)
    }

    /// The journal's view of an execution, without contacting the host.
    pub fn journal_outcome(&mut self, id: &ExecutionId) -> Result<Outcome, ExecError> {
        let run = self.load(id)?;
        if run.m.prior() == Prior::Held {
            return self.held_outcome(&run);
        }
        self.outcome_from_journal(&run)
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

    async fn attach_from(
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
        self.drive(&target, &mut run, false, !wait, true, sink)
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
        self.drive(&target, &mut run, false, !wait, false, &mut Discard)
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
    ) -> Result<(Outcome, Result<Probe, String>), ExecError> {
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
        let connected = self.connection(&target).await;
        let mut last = None;
        let probe = match &connected {
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
                    .exec_op(*ci, &op, &nonce, None, &mut run, &mut Discard)
                    .await?;
                let p = match &reply.broken {
                    Some(b) => Err(format!("probe did not complete: {b}")),
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
                    presented: self.conns[*ci].1.host_key_fingerprint().to_owned(),
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
        let ci = self.connection(&target).await?;
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
        let ci = self.connection(&target).await?;
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
                self.drive(&target, &mut run, false, false, false, &mut Discard)
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
        let ci = self.connection(&target).await?;
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

    fn load(&mut self, id: &ExecutionId) -> Result<Run, ExecError> {
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

    /// The owner of `id` (`pid@host`) when it is accepted, not dispatched, and that owner may
    /// still send it (see [`crate::owner`]).
    fn owner_may_dispatch(&self, id: &ExecutionId) -> Result<Option<String>, ExecError> {
        let Some(rec) = self.journal.execution(id)? else {
            return Ok(None);
        };
        let events = self.journal.events(id)?;
        self.live_owner(id, &rec.client, &events)
    }

    /// The process that may still dispatch `id` if it is accepted and not dispatched. On a
    /// shared journal that is its owning replica while its lease is current, and nobody once
    /// this replica took it over (the old owner's appends, its `dispatched` among them, are
    /// refused by the fence). Elsewhere, see [`crate::owner`].
    fn live_owner(
        &self,
        id: &ExecutionId,
        accepted_by: &str,
        events: &[crate::journal::Event],
    ) -> Result<Option<String>, ExecError> {
        if let Some(o) = self.journal.ownership(id)? {
            if !o.mine {
                return Ok(o.live.then_some(o.client));
            }
            if self.journal.taken_over_here(id) {
                return Ok(None);
            }
        }
        let owner = crate::owner::owner_of(accepted_by, events);
        Ok(crate::owner::may_still_dispatch(id.as_str(), owner).then(|| owner.to_owned()))
    }

    /// On a shared journal an execution is driven by its owner. Before driving `id` (attach,
    /// recover, dispatch again): go ahead when nobody owns it, this replica owns it from its
    /// own acceptance (unless its sweep picked it up, see [`Executor::redrive_owned`]: then
    /// wait for that), or it is settled; when its owner's lease expired, take it over (a
    /// `takeover` event, the epoch bumped: the old owner is fenced) and drive it as its new
    /// owner; while a live replica owns it, or another call of this process drives it after
    /// a takeover, wait until it settles (or that lease expires): woken by the notification of
    /// its settling append, reading the journal again without one every poll interval and when
    /// the lease would expire (docs/REPLICAS.md: notifications are hints).
    /// [`Drive::Review`] when it was taken over [`crate::journal::MAX_TAKEOVERS`] times
    /// already: left for review, not driven again.
    async fn own_or_wait(&mut self, id: &ExecutionId) -> Result<Drive, ExecError> {
        // Made before the first read, so that a settling notified after it wakes the wait.
        let Some(mut watch) = self.journal.watch(id) else {
            return Ok(Drive::Go(None));
        };
        let mut said = false;
        // Waiting on a live replica's lease is bounded by this call's reconnect window: past
        // it the caller gets what the journal holds, as held by that owner.
        let mut until: Option<Instant> = None;
        loop {
            let Some(o) = self.journal.ownership(id)? else {
                return Ok(Drive::Go(None));
            };
            if o.settled
                || self
                    .journal
                    .status(id)?
                    .is_some_and(|s| s.state.is_settled())
            {
                return Ok(Drive::Go(None));
            }
            if o.mine {
                let g = if self.journal.taken_over_here(id) {
                    drive_taken(id)
                } else {
                    drive_own(id)
                };
                if let Some(g) = g {
                    return Ok(Drive::Go(Some(g)));
                }
                // another call of this replica recovers it (after a takeover, or the owner's
                // sweep picked it up): wait for its result
            } else if !o.live {
                for (_, t) in self.journal.take_over(Some(id), 1)? {
                    match t {
                        crate::journal::TakeOver::Taken { from, epoch } => {
                            tracing::info!(
                                "cairn: {id}: the lease of its owner {from} expired; this replica \
                                 took it over (epoch {epoch}) and recovers it"
                            );
                        }
                        crate::journal::TakeOver::Exhausted => {
                            tracing::warn!(
                                "cairn: {id} was taken over {} times already; left for review",
                                crate::journal::MAX_TAKEOVERS
                            );
                            return Ok(Drive::Review);
                        }
                        // Settled, or taken over a moment ago by this process's own sweep
                        // (which drives it then): read again rather than drive it beside that.
                        crate::journal::TakeOver::NotNeeded => {}
                        // Another replica is taking it over right now: let it commit.
                        crate::journal::TakeOver::Held => {
                            tokio::time::sleep(Duration::from_millis(20)).await
                        }
                    }
                }
                continue;
            }
            if !said {
                tracing::info!(
                    "cairn: {id} is driven by replica {} (lease epoch {}); waiting until it \
                     settles or its lease expires",
                    o.replica,
                    o.epoch
                );
                said = true;
            }
            // Another replica's lease: read again when it would expire, if nothing comes first,
            // and give up waiting at the end of the reconnect window.
            let within = match o.mine {
                true => crate::journal::poll_every(),
                false => {
                    let now = Instant::now();
                    let mut end = *until.get_or_insert(now + self.patience.reconnect_for);
                    // A run its owner drives, or would pick up once undriven (`may_redrive`),
                    // ends with a result worth waiting for, as on one gateway: wait another
                    // window. Only one the owner leaves alone (detached, `unknown`, picked up
                    // too often) is answered as held at the end of the window.
                    if now >= end && may_redrive(&self.journal, id)?.is_some() {
                        end = now + self.patience.reconnect_for;
                        until = Some(end);
                    }
                    if now >= end {
                        tracing::info!(
                            "cairn: {id} is still owned by live replica {} (lease epoch {}) and \
                             not settled after this call's reconnect window ({:?}); answering \
                             what the journal holds, nothing concluded",
                            o.replica,
                            o.epoch,
                            self.patience.reconnect_for
                        );
                        return Ok(Drive::Held {
                            replica: o.replica,
                            client: o.client,
                            epoch: o.epoch,
                        });
                    }
                    Duration::from_millis(o.lease_left_ms.max(0) as u64 + 50).min(end - now)
                }
            };
            match watch.wait(within).await {
                crate::journal::Woken::Notified => {
                    tracing::debug!("cairn: {id}: woken by the notification of its settling")
                }
                crate::journal::Woken::Listening => tracing::debug!(
                    "cairn: {id}: woken by the listener listening again; reading the journal"
                ),
                crate::journal::Woken::Timeout => {}
            }
        }
    }

    /// The answer of a call that may not drive `id` ([`Executor::own_or_wait`] said so):
    /// left for review, or held by its live owner. Nothing is written.
    fn not_driven(&mut self, id: &ExecutionId, d: Drive) -> Result<Outcome, ExecError> {
        let (replica, client, epoch) = match d {
            Drive::Held {
                replica,
                client,
                epoch,
            } => (replica, client, epoch),
            _ => return self.review_outcome(id),
        };
        let run = self.load(id)?;
        let mut o = self.outcome_from_journal(&run)?;
        o.reason = Some(format!(
            "{}; held by its owner, replica {replica} (lease epoch {epoch}), which is alive: it \
             did not settle within this call's reconnect window ({:?}); nothing is concluded: \
             attach to it again, or send the call to that replica (its owner drives it)",
            o.state, self.patience.reconnect_for
        ));
        o.held_by = Some(client);
        Ok(o)
    }

    /// `run` is held by a live owner: wait (within the reconnect window) until the owner
    /// dispatches it, settles it, or is gone; then `run` is what the journal says by then.
    async fn wait_for_owner(&mut self, run: &mut Run) -> Result<(), ExecError> {
        let id = run.rec.id.clone();
        let deadline = Instant::now() + self.patience.reconnect_for;
        let mut said = false;
        while Instant::now() < deadline {
            let state = self.journal.status(&id)?.map(|s| s.state);
            let pending = matches!(state, Some(State::Accepted | State::Authorized));
            if !pending || self.owner_may_dispatch(&id)?.is_none() {
                break;
            }
            if !said {
                tracing::info!(
                    "cairn: {id} is accepted by a live process that has not dispatched it yet; \
                     waiting for it (up to {:?})",
                    self.patience.reconnect_for
                );
                said = true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (out_off, err_off) = (run.out_off, run.err_off);
        *run = self.load(&id)?;
        run.out_off = out_off;
        run.err_off = err_off;
        Ok(())
    }

    /// The outcome of an execution a live owner may still dispatch: the journal's state, the
    /// owner, and why nothing is concluded. Nothing is written.
    fn held_outcome(&self, run: &Run) -> Result<Outcome, ExecError> {
        let owner = self.owner_may_dispatch(&run.rec.id)?;
        let mut o = self.outcome_from_journal(run)?;
        let reason = Machine::held_reason();
        o.reason = Some(format!(
            "{reason} (owner: {})",
            owner.as_deref().unwrap_or("gone since")
        ));
        o.held_by = owner.or_else(|| Some(run.rec.client.clone()));
        Ok(o)
    }

    /// The host of `run` announced `announced`: keep the bookkeeping of its place (per
    /// destination, key and remote dir), recording a change or a shared key once.
    fn note_epoch(&mut self, run: &mut Run, announced: &str) -> Result<(), ExecError> {
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
    fn target_for(&self, run: &Run) -> Result<Target, ExecError> {
        let rec = &run.rec;
        let mut t = match &run.reach {
            Some(r) => {
                let mut t =
                    crate::ssh::resolve(&rec.destination, &r.resolve_options(&self.connect))?;
                r.apply(&mut t, &self.connect)?;
                t
            }
            None => crate::ssh::resolve(&rec.destination, &self.connect)?,
        };
        // Reach the host the execution was dispatched to, whatever the config says today.
        t.hostname = rec.host.clone();
        t.port = rec.port;
        t.user = rec.user.clone();
        t.pinned_host_key.clone_from(&run.host_key);
        Ok(t)
    }

    /// A live connection to `target`, reusing one if it is still open (and presents the key
    /// the target is pinned to, if any).
    async fn connection(&mut self, target: &Target) -> Result<usize, SshError> {
        let key = format!("{}@{}:{}", target.user, target.hostname, target.port);
        if let Some(i) = self
            .conns
            .iter()
            .position(|(k, c, _)| *k == key && !c.is_closed())
        {
            let presented = self.conns[i].1.host_key_fingerprint();
            return match &target.pinned_host_key {
                Some(p) if p != presented => Err(SshError::HostKeyPinned {
                    host: target.display(),
                    pinned: p.clone(),
                    presented: presented.to_owned(),
                }),
                _ => Ok(i),
            };
        }
        self.conns.retain(|(k, _, _)| *k != key);
        let (c, lease) = match &self.pool {
            Some(pool) => {
                let (c, lease) = pool.get(target, &self.connect).await?;
                (c, Some(lease))
            }
            None => (crate::pool::connect(target, &self.connect).await?, None),
        };
        self.conns.push((key, c, lease));
        Ok(self.conns.len() - 1)
    }

    /// Stop using a connection that failed; a pooled one is given to nobody new.
    fn drop_connection(&mut self, idx: usize) {
        if idx < self.conns.len() {
            let (_, _, lease) = self.conns.remove(idx);
            if let Some(mut l) = lease {
                l.retire();
            }
        }
    }

    async fn hello(&mut self, ci: usize, dir: &str) -> Result<Hello, String> {
        let (lines, errors) = self.small_exec(ci, &Op::Hello, dir, None).await?;
        let hello = lines.into_iter().rev().find_map(|l| match l {
            Line::Hello(h) => Some(h),
            _ => None,
        });
        match hello {
            Some(h) if errors.is_empty() => Ok(h),
            _ if !errors.is_empty() => Err(errors.join("; ")),
            _ => Err("the host did not answer the marker protocol (is /bin/sh POSIX?)".into()),
        }
    }

    /// Run one protocol exec and consume its reply, streaming command output to `sink` and
    /// recording `running` the moment the started record is seen. With the native helper
    /// where it runs (`--host-helper`), else the sh script; a helper that did not run at all
    /// (nothing happened on the host) gives way to the script for this and later operations.
    async fn exec_op(
        &mut self,
        ci: usize,
        op: &Op<'_>,
        nonce: &str,
        stdin: Option<&[u8]>,
        run: &mut Run,
        sink: &mut dyn OutputSink,
    ) -> Result<Reply, ExecError> {
        let dir = run.rec.remote_dir.clone();
        if self.side_for(ci, &dir).await? == Side::Helper {
            let cmd = host_helper::invocation(op, &dir, nonce);
            run.host_side = Some(Side::Helper);
            match self
                .exec_cmd(
                    ci,
                    cmd,
                    nonce,
                    stdin,
                    run,
                    sink,
                    Some(host_helper::did_not_run),
                )
                .await?
            {
                Ok(reply) => return Ok(reply),
                Err(why) => {
                    let why = format!("the host helper did not run ({why})");
                    tracing::info!("cairn: {why}; using the sh script");
                    self.decide_side(ci, &dir, Err(why.clone()));
                    if self.host_helper == HostHelper::Always {
                        return Err(ExecError::Refused(format!("--host-helper always: {why}")));
                    }
                }
            }
        }
        run.host_side = Some(Side::Script);
        // The script installed in the marker home; where it is not (yet) there, installed
        // first; where it cannot be, streamed on stdin (docs/HOST-HELPER.md).
        if !self.script_streamed(ci, &dir) {
            for attempt in 0..2 {
                let cmd = marker::invocation(op, &dir, nonce);
                let not_run = Some(marker::script_did_not_run as fn(Option<u32>) -> bool);
                match self
                    .exec_cmd(ci, cmd, nonce, stdin, run, sink, not_run)
                    .await?
                {
                    Ok(reply) => return Ok(reply),
                    Err(why) => match self.script_missing(ci, &dir, attempt, why).await {
                        Ok(true) => {}
                        Ok(false) => break,
                        // (the connection, not the host: the machine reconnects)
                        Err(e) => {
                            return Ok(Reply {
                                broken: Some(e.to_string()),
                                ..Reply::default()
                            })
                        }
                    },
                }
            }
        }
        let (cmd, mut input) = marker::streamed_invocation(op, &dir, nonce);
        input.extend_from_slice(stdin.unwrap_or_default());
        match self
            .exec_cmd(ci, cmd, nonce, Some(&input), run, sink, None)
            .await?
        {
            Ok(reply) => Ok(reply),
            Err(why) => Err(ExecError::HostReported(why)),
        }
    }

    /// The installed script did not run (`why`) on attempt `attempt` (0 or 1): install it and
    /// say whether to try it again; otherwise this connection streams the script from now on.
    /// `Err`: the installer's exec could not even start (the connection's fault, not the
    /// host's: nothing is decided).
    async fn script_missing(
        &mut self,
        ci: usize,
        dir: &str,
        attempt: usize,
        why: String,
    ) -> Result<bool, crate::ssh::SshError> {
        tracing::debug!("cairn: the host script did not run ({why})");
        let why = if attempt > 0 {
            format!("installed, the host script still did not run ({why})")
        } else {
            match self.install_script(ci, dir).await? {
                Ok(()) => return Ok(true),
                Err(e) => e,
            }
        };
        tracing::info!("cairn: {why}; streaming the script with each operation");
        if let Some((k, _, _)) = self.conns.get(ci) {
            cache_put(script_cache(), &format!("{k}\n{dir}"), Err(why));
        }
        Ok(false)
    }

    /// Whether this connection streams the script to `dir` (it could not be installed there).
    fn script_streamed(&self, ci: usize, dir: &str) -> bool {
        self.conns.get(ci).is_some_and(|(k, _, _)| {
            matches!(
                cache_get(script_cache(), &format!("{k}\n{dir}")),
                Some(Err(_))
            )
        })
    }

    /// Install the host script into marker home `dir` (docs/HOST-HELPER.md): `Ok(Err)`, why
    /// the host could not hold it; `Err`, the exec could not start.
    async fn install_script(
        &mut self,
        ci: usize,
        dir: &str,
    ) -> Result<Result<(), String>, crate::ssh::SshError> {
        let nonce = marker::new_nonce();
        let cmd = marker::install_invocation(dir, &nonce);
        let text = marker::session_script().as_bytes();
        let (lines, errors, exit) = self.small_exec_raw(ci, cmd, &nonce, Some(text)).await?;
        Ok(if lines.contains(&Line::Installed) {
            tracing::info!("cairn: installed the host script ({} bytes)", text.len());
            Ok(())
        } else if !errors.is_empty() {
            Err(errors.join("; "))
        } else {
            Err(format!(
                "installing the host script ended without an answer (exit status {exit:?})"
            ))
        })
    }

    /// Which side runs the marker protocol on this connection and marker home: decided once per
    /// process, by one execution at a time (a probe, and an upload when the helper is missing),
    /// then remembered.
    async fn side_for(&mut self, ci: usize, dir: &str) -> Result<Side, ExecError> {
        if self.host_helper == HostHelper::Never {
            return Ok(Side::Script);
        }
        let key = format!("{}\n{dir}", self.conns[ci].0);
        let decided = match host_helper_cache_get(&key) {
            Some(d) => d,
            None => {
                let gate = host_helper_gate(&key);
                let _decider = gate.lock().await;
                // Another execution may have decided while this one waited.
                match host_helper_cache_get(&key) {
                    Some(d) => d,
                    None => {
                        let d = self.probe_helper(ci, dir).await;
                        if let Err(why) = &d {
                            tracing::info!("cairn: {why}; using the sh script");
                        }
                        host_helper_cache_put(&key, d.clone());
                        d
                    }
                }
            }
        };
        match decided {
            Ok(()) => Ok(Side::Helper),
            Err(why) if self.host_helper == HostHelper::Always => {
                Err(ExecError::Refused(format!("--host-helper always: {why}")))
            }
            Err(_) => Ok(Side::Script),
        }
    }

    fn decide_side(&mut self, ci: usize, dir: &str, d: Result<(), String>) {
        if let Some((k, _, _)) = self.conns.get(ci) {
            host_helper_cache_put(&format!("{k}\n{dir}"), d);
        }
    }

    /// Ask the host (with the script) for its architecture and the helper's state; upload the
    /// helper when it is missing or not the expected file. `Ok`: the helper runs there.
    async fn probe_helper(&mut self, ci: usize, dir: &str) -> Result<(), String> {
        if !host_helper::available() {
            return Err("this cairn was built without the host helper".into());
        }
        let sha = host_helper::SHA256;
        let (lines, _) = self
            .small_exec(ci, &Op::Probe { helper_sha256: sha }, dir, None)
            .await?;
        let hello = lines
            .iter()
            .find_map(|l| match l {
                Line::Hello(h) => Some(h.clone()),
                _ => None,
            })
            .ok_or("the host did not answer the helper probe")?;
        let arch = hello.arch.unwrap_or_default();
        if arch != host_helper::arch() {
            return Err(format!(
                "the host's architecture is {arch:?}; the helper is built for {}",
                host_helper::arch()
            ));
        }
        match hello.helper.as_deref() {
            Some("ok") => return Ok(()),
            Some("absent" | "mismatch") => {}
            Some(other) => return Err(format!("the helper on the host is {other}")),
            None => return Err("the host's script does not report the helper".into()),
        }
        let op = Op::Install {
            helper_sha256: sha,
            len: host_helper::BINARY.len(),
        };
        let (lines, errors) = self
            .small_exec(ci, &op, dir, Some(host_helper::BINARY))
            .await?;
        match lines.iter().find_map(|l| match l {
            Line::Helper(s) => Some(s.as_str()),
            _ => None,
        }) {
            Some("ok") => {
                tracing::info!(
                    "cairn: uploaded the host helper ({} bytes)",
                    host_helper::BINARY.len()
                );
                Ok(())
            }
            Some(state) => Err(format!("the uploaded helper is {state} on the host")),
            None => Err(format!(
                "uploading the helper failed: {}",
                errors.join("; ")
            )),
        }
    }

    /// One exec of the script whose reply is a few protocol lines: those, and the errors.
    /// The script installed in the marker home (installed first when it is missing), or
    /// streamed where it cannot be installed.
    async fn small_exec(
        &mut self,
        ci: usize,
        op: &Op<'_>,
        dir: &str,
        stdin: Option<&[u8]>,
    ) -> Result<(Vec<Line>, Vec<String>), String> {
        if !self.script_streamed(ci, dir) {
            for attempt in 0..2 {
                let nonce = marker::new_nonce();
                let cmd = marker::invocation(op, dir, &nonce);
                let (lines, errors, exit) = self
                    .small_exec_raw(ci, cmd, &nonce, stdin)
                    .await
                    .map_err(|e| e.to_string())?;
                if !lines.is_empty() || !errors.is_empty() || !marker::script_did_not_run(exit) {
                    return Ok((lines, errors));
                }
                let why = format!("exit status {}, no protocol line", exit.unwrap_or(0));
                let again = self
                    .script_missing(ci, dir, attempt, why)
                    .await
                    .map_err(|e| e.to_string())?;
                if !again {
                    break;
                }
            }
        }
        let nonce = marker::new_nonce();
        let (cmd, mut input) = marker::streamed_invocation(op, dir, &nonce);
        input.extend_from_slice(stdin.unwrap_or_default());
        let (lines, errors, _) = self
            .small_exec_raw(ci, cmd, &nonce, Some(&input))
            .await
            .map_err(|e| e.to_string())?;
        Ok((lines, errors))
    }

    /// One exec of `cmd` whose reply is a few protocol lines: those, the errors, the exit
    /// status.
    async fn small_exec_raw(
        &mut self,
        ci: usize,
        cmd: String,
        nonce: &str,
        stdin: Option<&[u8]>,
    ) -> Result<(Vec<Line>, Vec<String>, Option<u32>), crate::ssh::SshError> {
        let exec = self.conns[ci].1.exec(cmd.as_bytes()).await;
        drop(cmd);
        let mut exec = exec?;
        if let Some(data) = stdin {
            exec.write_stdin(data).await?;
        }
        let _ = exec.close_stdin().await;
        let mut demux = StderrDemux::new(nonce);
        let (mut lines, mut errors, mut exit) = (Vec::new(), Vec::new(), None);
        loop {
            match exec.next().await {
                Ok(Some(ExecEvent::Stderr(d))) => {
                    let mut pieces = Vec::new();
                    demux.feed(&d, &mut pieces);
                    for p in pieces {
                        match p {
                            Piece::Line(Ok(Line::Error(e))) => errors.push(e),
                            Piece::Line(Ok(l)) => lines.push(l),
                            Piece::Line(Err(e)) => errors.push(e),
                            Piece::Stderr(_) => {}
                        }
                    }
                }
                Ok(Some(ExecEvent::ExitStatus(c))) => exit = Some(c),
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => return Err(e),
            }
        }
        Ok((lines, errors, exit))
    }

    /// One exec of `cmd`. `Err(why)`: a host side that did not run (`not_run` says so of the
    /// exit status, and no protocol line came): what it wrote is held back, not taken as the
    /// command's output.
    #[allow(clippy::too_many_arguments)]
    async fn exec_cmd(
        &mut self,
        ci: usize,
        cmd: String,
        nonce: &str,
        stdin: Option<&[u8]>,
        run: &mut Run,
        sink: &mut dyn OutputSink,
        not_run: Option<fn(Option<u32>) -> bool>,
    ) -> Result<Result<Reply, String>, ExecError> {
        let mut reply = Reply::default();
        let exec = self.conns[ci].1.exec(cmd.as_bytes()).await;
        drop(cmd);
        let mut exec = match exec {
            Ok(e) => e,
            Err(e) => {
                reply.broken = Some(e.to_string());
                return Ok(Ok(reply));
            }
        };
        let sent = match stdin {
            Some(data) => exec.write_stdin(data).await.and(exec.close_stdin().await),
            None => exec.close_stdin().await,
        };
        if let Err(e) = sent {
            reply.broken = Some(e.to_string());
            return Ok(Ok(reply));
        }
        let mut demux = StderrDemux::new(nonce);
        let mut pieces = Vec::new();
        // (a helper's bytes before its first protocol line: held until that line comes)
        let mut held: Option<Vec<(bool, Vec<u8>)>> = not_run.map(|_| Vec::new());
        let mut exit = None;
        loop {
            let next = match hold_left(run) {
                None => exec.next().await,
                Some(left) => match tokio::time::timeout(left, exec.next()).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.flush_held(run)?;
                        continue;
                    }
                },
            };
            let ev = match next {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    reply.broken = Some(e.to_string());
                    break;
                }
            };
            match ev {
                ExecEvent::Stdout(d) => match &mut held {
                    Some(h) => h.push((false, d)),
                    None => self.take_output(run, sink, &d, false)?,
                },
                ExecEvent::Stderr(d) => {
                    demux.feed(&d, &mut pieces);
                    for p in pieces.drain(..) {
                        match p {
                            Piece::Stderr(s) => match &mut held {
                                Some(h) => h.push((true, s)),
                                None => self.take_output(run, sink, &s, true)?,
                            },
                            Piece::Line(l) => {
                                if let Some(h) = held.take() {
                                    for (err, b) in h {
                                        self.take_output(run, sink, &b, err)?;
                                    }
                                }
                                match l {
                                    Ok(line) => self.on_line(line, run, &mut reply)?,
                                    Err(e) => reply.bad.push(e),
                                }
                            }
                        }
                    }
                }
                ExecEvent::ExitStatus(c) => exit = Some(c),
                ExecEvent::ExitSignal(_) => {}
            }
        }
        if let Some(h) = held {
            if reply.broken.is_none() && not_run.is_some_and(|f| f(exit)) {
                let text: Vec<u8> = h.into_iter().flat_map(|(_, b)| b).collect();
                let text = String::from_utf8_lossy(&text).trim().replace('\n', " ");
                return Ok(Err(format!("exit status {}: {text}", exit.unwrap_or(0))));
            }
            for (err, b) in h {
                self.take_output(run, sink, &b, err)?;
            }
        }
        self.reply_over(run, reply).map(Ok)
    }

    /// A dispatch through the connection's host session; the same reply as [`Self::exec_op`]
    /// gives for a `dispatch` exec. `None`: the session never sent it (dispatch it on an exec).
    async fn session_op(
        &mut self,
        sess: &crate::session::HostSession,
        run: &mut Run,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<Reply>, ExecError> {
        use crate::session::{Event, Request};
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let req = Request {
            id: run.rec.id.clone(),
            digest: run.rec.command_digest.clone(),
            timeout_secs: run.rec.timeout_secs,
            command: run.rec.command.clone(),
            events: tx,
        };
        if sess.dispatch(req).is_err() {
            return Ok(None);
        }
        run.host_side = Some(sess.side());
        let mut reply = Reply::default();
        loop {
            let next = match hold_left(run) {
                None => rx.recv().await,
                Some(left) => match tokio::time::timeout(left, rx.recv()).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.flush_held(run)?;
                        continue;
                    }
                },
            };
            match next {
                // (only ever the first event: a request the session never sent)
                Some(Event::Unavailable(why)) if reply.hello.is_none() => {
                    tracing::debug!("host session unavailable ({why}); dispatching on an exec");
                    return Ok(None);
                }
                Some(Event::Unavailable(why) | Event::Broken(why)) => {
                    reply.broken = Some(why);
                    break;
                }
                None => {
                    reply.broken = Some("the host session went away".into());
                    break;
                }
                Some(Event::Stdout(d)) => self.take_output(run, sink, &d, false)?,
                Some(Event::Stderr(d)) => self.take_output(run, sink, &d, true)?,
                Some(Event::Line(Ok(line))) => {
                    let end = line == Line::End;
                    self.on_line(line, run, &mut reply)?;
                    if end {
                        break;
                    }
                }
                Some(Event::Line(Err(e))) => reply.bad.push(e),
            }
        }
        self.reply_over(run, reply).map(Some)
    }

    /// Command output received: to the sink, unless this run does not want the bytes.
    fn take_output(
        &mut self,
        run: &mut Run,
        sink: &mut dyn OutputSink,
        d: &[u8],
        stderr: bool,
    ) -> Result<(), ExecError> {
        let off = if stderr {
            &mut run.err_off
        } else {
            &mut run.out_off
        };
        if *off < NO_BYTES {
            // (counted once the sink has them: the offset is what was delivered)
            if stderr {
                sink.stderr(d)?;
            } else {
                sink.stdout(d)?;
            }
            *off += d.len() as u64;
            self.save_cursor(run, false);
        }
        Ok(())
    }

    /// The reply has ended (or broken): settle what it held.
    fn reply_over(&mut self, run: &mut Run, mut reply: Reply) -> Result<Reply, ExecError> {
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

    fn on_line(&mut self, line: Line, run: &mut Run, reply: &mut Reply) -> Result<(), ExecError> {
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
        let mode = Mode {
            dispatch_first,
            detach,
            live,
        };
        let r = self.drive_inner(target, run, mode, sink).await;
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
                    let attempt = match within {
                        Some(left) => {
                            match tokio::time::timeout(left, self.connection(target)).await {
                                Ok(r) => r,
                                Err(_) => Err(SshError::Timeout {
                                    what: "reconnecting within --reconnect-for",
                                    after: left,
                                }),
                            }
                        }
                        None => self.connection(target).await,
                    };
                    let event = match attempt {
                        Ok(i) => {
                            ci = Some(i);
                            Event::Connected {
                                presented: self.conns[i].1.host_key_fingerprint().to_owned(),
                                pinned: run.host_key.clone(),
                            }
                        }
                        Err(e) => Event::ConnectFailed {
                            transient: e.is_transient(),
                            error: e.to_string(),
                        },
                    };
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
                    let nonce = marker::new_nonce();
                    let idc = run.rec.id.clone();
                    let op = Op::Watch {
                        id: &idc,
                        out_off: run.out_off,
                        err_off: run.err_off,
                        wait,
                    };
                    let reply = self.exec_op(i, &op, &nonce, None, run, sink).await?;
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
                    self.drop_connection(i);
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
                let why = match self.connection(target).await {
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
                        self.drop_connection(ci);
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
        // A new execution whose request's caller is gone sends nothing (src/gate.rs).
        let gate = fresh.then(crate::gate::current).flatten();
        let crossing = match gate.as_deref().map(|g| g.cross(&run.rec.id)) {
            Some(Err(why)) => return Ok((Event::DispatchRefused(why), Vec::new())),
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
    async fn send(
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
        let side = if self.host_session {
            self.side_for(ci, &run.rec.remote_dir).await?
        } else {
            Side::Script
        };
        let session = match &self.conns[ci].2 {
            Some(lease)
                if self.host_session
                    && secrets.is_empty()
                    && !detach
                    && run.rec.command.len() <= crate::session::MAX_COMMAND
                    && marker::session_can_carry(&run.rec.command) =>
            {
                Some(lease.session(&self.conns[ci].1, &run.rec.remote_dir, side == Side::Helper))
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
    fn answer_of(&self, run: &Run, reply: &Reply) -> (Answer, Probe) {
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
    fn record(&mut self, run: &mut Run, event: NewEvent) -> Result<Option<Illegal>, ExecError> {
        run.held.push(event);
        self.flush_held(run)
    }

    /// Commit the events `run` holds, if any, in one transaction. The journal checks each
    /// transition against the state recorded at that moment: when another process moved the
    /// execution on meanwhile (an `attach` recorded its result, a `cancel` came first) it
    /// refuses them all, and that state stands; the held notes are then committed alone and
    /// the refusal returned, for the caller that acts on it.
    fn flush_held(&mut self, run: &mut Run) -> Result<Option<Illegal>, ExecError> {
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

    fn conclude(
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

    /// Record `delivered` for an execution whose result the caller now holds. The journal
    /// takes it only after a result (`completed`, `cancelled`), once: a refusal means there is
    /// nothing (more) to record.
    pub fn mark_delivered(&mut self, id: &ExecutionId, how: &str) -> Result<(), ExecError> {
        match self
            .journal
            .append_evidence(id, Evidence::Delivered { to: how })
        {
            Err(e) if e.refused().is_none() => Err(e.into()),
            _ => Ok(()),
        }
    }

    fn outcome_from_journal(&self, run: &Run) -> Result<Outcome, ExecError> {
        let status = self.journal.status(&run.rec.id)?;
        let events = self.journal.events(&run.rec.id)?;
        // The reason of the current state only: a reason recorded for an earlier state (an
        // `unknown` that a later recover resolved) no longer describes the outcome.
        let reason = events
            .iter()
            .rev()
            .find(|e| e.state.is_some())
            .and_then(|e| {
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
        let intent = self.journal.intent_of(&run.rec.id)?;
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
            attached: false,
            needs_review: matches!(state, State::Unknown | State::Interrupted),
            fingerprint: intent.as_ref().map(|i| i.fingerprint.clone()),
            class: intent.map(|i| i.class),
            held_by: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn assert_send<T: Send>(_: &T) {}

    /// Every public future of the executor is `Send`, so a front can `tokio::spawn` it on the
    /// process's one multi-thread runtime instead of driving it on a thread of its own.
    /// (Constructed and dropped, never polled: the check is the compiler's.)
    #[test]
    fn public_futures_are_send() {
        let d = tempfile::tempdir().unwrap();
        let journal = Journal::open(&d.path().join("j.db")).unwrap();
        let mut ex = Executor::new(journal, ConnectOptions::default(), Patience::default());
        let id = ExecutionId::generate();
        let req = || RunRequest {
            destination: "host".into(),
            command: b"true".to_vec(),
            id: None,
            timeout_secs: 0,
            detach: false,
            remote_dir: ".cairn".into(),
        };
        let mut sink = Discard;
        assert_send(&ex.run(req(), &mut sink));
        assert_send(&ex.execute(req(), Intent::default(), &mut sink));
        assert_send(&ex.authorize_accepted(&id, b"true", &Intent::default(), &mut sink));
        assert_send(&ex.redispatch(&id, false, &mut sink));
        assert_send(&ex.retry_never_started(&id, "why", b"true", &Intent::default(), &mut sink));
        assert_send(&ex.resolve(&id, crate::review::Resolution::Failed, "r", "me", &mut sink));
        assert_send(&ex.attach_replay(&id, &mut sink));
        assert_send(&ex.attach(&id, &mut sink));
        assert_send(&ex.recover_one(&id, false));
        assert_send(&ex.probe(&id));
        assert_send(&ex.predict(&id));
        assert_send(&ex.output(&id, false, &mut sink));
        assert_send(&ex.output_from(&id, false, 0, &mut sink));
        assert_send(&ex.cancel(&id, 1));
        assert_send(&ex.recover_all(false, |_, _, _, _| {}));
        let rec = ExecutionRecord {
            id: id.clone(),
            created_at: String::new(),
            destination: "host".into(),
            host: "host".into(),
            port: 22,
            user: "me".into(),
            command: b"true".to_vec(),
            command_digest: String::new(),
            remote_dir: ".cairn".into(),
            timeout_secs: 0,
            client: String::new(),
        };
        assert_send(&ex.gc_host(&rec, Duration::ZERO, Duration::ZERO));
    }

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

    #[test]
    fn a_recorded_correlation_wakes_only_those_waiting_for_it_and_once() {
        let (a, b) = (ExecutionId::generate(), ExecutionId::generate());
        // recorded before anyone waited: nobody is told (the journal has it)
        correlation_recorded(Some("test-corr-early"), &a);
        let mut early = await_correlation("test-corr-early");
        assert!(early.try_recv().is_err());
        let mut one = await_correlation("test-corr-x");
        let mut two = await_correlation("test-corr-x");
        let mut other = await_correlation("test-corr-y");
        correlation_recorded(Some("test-corr-x"), &a);
        correlation_recorded(None, &b);
        assert_eq!(one.try_recv().unwrap(), a);
        assert_eq!(two.try_recv().unwrap(), a);
        assert!(other.try_recv().is_err());
        // told once: a later record of the same correlation goes to later waiters only
        let mut later = await_correlation("test-corr-x");
        correlation_recorded(Some("test-corr-x"), &b);
        assert_eq!(later.try_recv().unwrap(), b);
        // a waiter that gave up is dropped from the table
        drop(other);
        forget_correlation("test-corr-y");
        drop(early);
        forget_correlation("test-corr-early");
        let w = correlation_waiters();
        assert!(!w.contains_key("test-corr-y") && !w.contains_key("test-corr-early"));
    }
}
