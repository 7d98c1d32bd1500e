//! The one place that sequences an execution:
//! accept → connect → dispatch → stream → (reconnect → probe → decide) → conclude → deliver.
//!
//! Everything that happens is appended to the journal before it is acted on. Once an execution
//! is driven (dispatch or probe, stream, reconnect), every decision is [`crate::machine`]'s;
//! this module is its driver: it connects, runs the execs (a `watch` is both the probe and,
//! when the command is still running, the reattach stream), writes the journal, sleeps, and
//! feeds the machine what happened.
//!
//! One room per concern, each an `impl Executor` of its own file:
//! - `admission`: a request becomes an execution (or attaches to the one it matches), is
//!   authorized, and is handed to the drive.
//! - `claims`: who may dispatch; its doc lists every registry that decides it.
//! - `drive`: the driver of [`crate::machine::Machine`] and every event a drive records.
//! - `link`: the host link, `HostLink`: connections, the host script and helper, one exec.
//! - `operator`: commands on existing executions (attach, recover, resolve, cancel, output,
//!   gc); `outcome`: an outcome as the journal holds it.

use std::time::{Duration, Instant};

use crate::approve::{Allow, Approver};
use crate::host_helper::Side;
use crate::id::ExecutionId;
use crate::intent::IntentKey;
use crate::journal::{ExecutionRecord, Journal, NewEvent};
use crate::machine::{Machine, Note, Step};
use crate::marker::{FinishRecord, Hello, StartRecord};
use crate::recovery::{Liveness, Prior, Probe};
use crate::ssh::{ConnectOptions, Connection, SshError};
use crate::state::State;

mod admission;
pub(crate) mod claims;
mod drive;
mod link;
mod operator;
mod outcome;

pub use admission::{await_correlation, choose_match, forget_correlation};
pub use claims::MAX_REDRIVES;
pub(crate) use claims::{drive_taken, drive_undriven, driven_here, may_redrive, Driving};
pub(crate) use link::HostLink;

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
    /// and may still send it: nothing is concluded (see `exec::claims::owner`). On a shared
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
    pub probe: Result<Probe, NotProbed>,
    /// What the machine would note before its next step (a re-dispatch, a lost connection).
    pub notes: Vec<Note>,
    /// What `cairn recover` does next; a conclusion's evidence is in words.
    pub next: Step,
}

/// Why a prediction has no fresh probe of the host.
///
/// Layer: the executor's `predict`/`probe` (`cairn status`, the gateway's `status` with a
/// probe). Never an error that ends anything: the fronts show its Display after
/// "not probed: ".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotProbed {
    /// No connection to the host (the SSH error, in words).
    #[error("{0}")]
    Connect(String),
    /// The probe's stream broke before its end.
    #[error("probe did not complete: {0}")]
    Incomplete(String),
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
    /// Lines that did not parse.
    bad: Vec<crate::marker::MarkerError>,
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
pub struct Executor {
    pub journal: Journal,
    pub(crate) patience: Patience,
    /// How this executor reaches hosts: its connections, the pool, the host script and helper.
    pub(crate) link: HostLink,
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

impl Executor {
    pub fn new(journal: Journal, connect: ConnectOptions, patience: Patience) -> Self {
        Executor {
            journal,
            patience,
            link: HostLink::new(connect),
            intent_key_path: None,
            intent_key: None,
            approver: Box::new(Allow {
                by: "local-cli".into(),
            }),
            session_id: None,
            secrets: std::collections::HashMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::Intent;

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
}
