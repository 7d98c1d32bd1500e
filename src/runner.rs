//! What every front does around an execution: build the executor, start the front's session in
//! the journal, and recover every unsettled execution.
//!
//! The command line, fleet runs and the gateway servers all set their executors up here
//! ([`ExecutorBuilder`]), so a flag such as `--intent-key` reaches every executor the same way.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::approve::{Allow, Approver};
use crate::error::ExecError;
use crate::executor::{Executor, Outcome, Patience};
use crate::id::ExecutionId;
use crate::journal::{Journal, SessionRecord};
use crate::options::{ApproveOptions, HostOptions};
use crate::pool::Pool;
use crate::ssh::ConnectOptions;
use crate::state::State;

/// Who decides whether a new execution may start.
enum Approval {
    /// Approvers made from the `--approve` / `--policy` options, recorded as decided `by`.
    Options { options: ApproveOptions, by: String },
    /// An approver the caller made.
    Given(Box<dyn Approver>),
}

/// Builds an [`Executor`]: the journal it records into, how it reaches hosts, how patient it
/// is after losing one, the intent key, the approver, the session it records new executions
/// under, and the connections it shares.
///
/// ```no_run
/// # fn main() -> Result<(), cairn::ExecError> {
/// let ex = cairn::ExecutorBuilder::new("/var/lib/gw/journal.db")
///     .intent_key(Some("/var/lib/gw/intent.key".into()))
///     .build()?;
/// # Ok(()) }
/// ```
pub struct ExecutorBuilder {
    journal: PathBuf,
    connect: ConnectOptions,
    patience: Patience,
    intent_key: Option<PathBuf>,
    approval: Approval,
    session_id: Option<String>,
    pool: Option<Arc<Pool>>,
    host_session: bool,
    host_helper: crate::host_helper::HostHelper,
}

impl ExecutorBuilder {
    /// An executor on the journal at `journal`, with default connection options and patience,
    /// the default intent key (next to the journal), approval by the request itself, no session
    /// and no shared connections.
    pub fn new(journal: impl Into<PathBuf>) -> Self {
        ExecutorBuilder {
            journal: journal.into(),
            connect: ConnectOptions::default(),
            patience: Patience::default(),
            intent_key: None,
            approval: Approval::Given(Box::new(Allow {
                by: "local-cli".into(),
            })),
            session_id: None,
            pool: None,
            host_session: false,
            host_helper: crate::host_helper::HostHelper::Auto,
        }
    }

    /// The journal, connection options, reconnect window and intent key of `h`.
    pub fn host(h: &HostOptions) -> Self {
        ExecutorBuilder::new(h.journal_path())
            .connect(h.connect.clone())
            .patience(Patience {
                reconnect_for: h.reconnect_for,
                ..Patience::default()
            })
            .intent_key(h.intent_key.clone())
            .host_helper(h.host_helper)
    }

    /// Which host implementation runs the marker protocol: the native helper where it runs
    /// (`Auto`, the default; uploaded on first contact), the sh script only (`Never`), or the
    /// helper or an error (`Always`). See `docs/HOST-HELPER.md`.
    pub fn host_helper(mut self, mode: crate::host_helper::HostHelper) -> Self {
        self.host_helper = mode;
        self
    }

    pub fn connect(mut self, connect: ConnectOptions) -> Self {
        self.connect = connect;
        self
    }

    pub fn patience(mut self, patience: Patience) -> Self {
        self.patience = patience;
        self
    }

    /// The intent fingerprint key file (`None`: `intent.key` next to the journal).
    pub fn intent_key(mut self, path: Option<PathBuf>) -> Self {
        self.intent_key = path;
        self
    }

    /// Approvers from the approve options; decisions are recorded as made `by` this caller.
    /// A policy file that does not load fails [`build`](Self::build).
    pub fn approve(mut self, options: &ApproveOptions, by: &str) -> Self {
        self.approval = Approval::Options {
            options: options.clone(),
            by: by.to_owned(),
        };
        self
    }

    /// An approver of the caller's own.
    pub fn approver(mut self, approver: Box<dyn Approver>) -> Self {
        self.approval = Approval::Given(approver);
        self
    }

    /// The session new executions are recorded under.
    pub fn session(mut self, id: Option<String>) -> Self {
        self.session_id = id;
        self
    }

    /// Connections shared with other executors of this process (`None`: connect for itself).
    pub fn pool(mut self, pool: Option<Arc<Pool>>) -> Self {
        self.pool = pool;
        self
    }

    /// Dispatch through the pooled connection's host session when the dispatch allows it
    /// (`crate::session`); without a pool this has no effect.
    pub fn host_session(mut self, on: bool) -> Self {
        self.host_session = on;
        self
    }

    /// Open the journal and make the approver.
    pub fn build(self) -> Result<Executor, ExecError> {
        let journal = Journal::open(&self.journal)?;
        let mut ex = Executor::new(journal, self.connect, self.patience);
        ex.intent_key_path = self.intent_key;
        ex.session_id = self.session_id;
        ex.link.host_session = self.host_session && self.pool.is_some();
        ex.link.host_helper = self.host_helper;
        ex.link.pool = self.pool;
        ex.approver = match self.approval {
            Approval::Given(a) => a,
            Approval::Options { options, by } => {
                crate::approve::from_flags(&options.mode, options.policy.as_deref(), &by)?
            }
        };
        Ok(ex)
    }
}

/// Start a session row for this process.
pub fn start_session(
    j: &mut Journal,
    kind: &str,
    actor: &str,
    detail: serde_json::Value,
) -> Result<String, ExecError> {
    let id = format!("se_{}", uuid::Uuid::now_v7().simple());
    j.start_session(&SessionRecord {
        id: id.clone(),
        kind: kind.to_owned(),
        actor: actor.to_owned(),
        pid: std::process::id() as i64,
        client: crate::journal::client_identity().to_owned(),
        started_at: crate::journal::now_rfc3339(),
        detail,
    })?;
    Ok(id)
}

/// Prepare an executor for a command that creates executions: its approver, and a session
/// for this process that new executions are recorded under.
pub(crate) fn prepare(
    ex: &mut Executor,
    approve: &ApproveOptions,
    kind: &str,
    actor: &str,
) -> Result<String, ExecError> {
    ex.approver =
        crate::approve::from_flags(&approve.mode, approve.policy.as_deref(), "local-cli")?;
    let argv: Vec<String> = std::env::args().take(2).collect();
    let s = start_session(
        &mut ex.journal,
        kind,
        actor,
        serde_json::json!({"argv": argv}),
    )?;
    ex.session_id = Some(s.clone());
    Ok(s)
}

/// How many executions `recover` works on at once. Recovering one can take as long as its
/// reconnect window (a host that is cut off) or its command (`--wait`); one at a time, a journal
/// with many unsettled executions (a shared one, or a fleet's) takes their sum, so a healthy
/// host's execution waits behind every unreachable one.
pub const RECOVER_PARALLEL: usize = 8;

impl Executor {
    /// `recover`: the recovery table applied to every execution that is not settled, up to
    /// [`RECOVER_PARALLEL`] at once (each on its own journal handle and connection, on this
    /// task). `each` is told every execution's place in the journal's order, its state before
    /// and what recovering it gave, as soon as it is known (so not necessarily in that order).
    pub async fn recover_all(
        &mut self,
        wait: bool,
        each: impl FnMut(usize, &ExecutionId, State, Result<Outcome, ExecError>),
    ) -> Result<(), ExecError> {
        let todo: std::collections::VecDeque<_> = self
            .journal
            .list()?
            .into_iter()
            .filter(|(_, st)| !st.state.is_settled())
            .enumerate()
            .map(|(i, (r, st))| (i, r.id, st.state))
            .collect();
        let mut others = Vec::new();
        for _ in 1..todo.len().min(RECOVER_PARALLEL) {
            others.push(self.sibling()?);
        }
        // Mutexes rather than RefCells so that the future is `Send` (when `each` is): no lock is
        // held across an await, so they are never contended.
        let todo = Mutex::new(todo);
        let each = Mutex::new(each);
        let mut workers = vec![recover_queue(self, &todo, &each, wait)];
        workers.extend(
            others
                .iter_mut()
                .map(|ex| recover_queue(ex, &todo, &each, wait)),
        );
        futures::future::join_all(workers).await;
        Ok(())
    }

    /// Another executor like this one, on its own handle of the same journal (it shares the
    /// process's group commit or pool) and its own connections: for work side by side on one
    /// task. It approves nothing (recovery never starts an execution: should it ever ask, the
    /// answer is no) and holds no secrets.
    fn sibling(&self) -> Result<Executor, ExecError> {
        let journal = Journal::open(self.journal.path())?;
        let mut ex = Executor::new(journal, self.link.connect.clone(), self.patience.clone());
        ex.approver = Box::new(crate::approve::Deny);
        ex.intent_key_path.clone_from(&self.intent_key_path);
        ex.session_id.clone_from(&self.session_id);
        ex.link.host_session = self.link.host_session;
        ex.link.host_helper = self.link.host_helper;
        ex.link.pool.clone_from(&self.link.pool);
        Ok(ex)
    }
}

/// One `recover` worker: take the next execution from the queue every worker shares, recover it
/// and report it, until the queue is empty.
async fn recover_queue<F>(
    ex: &mut Executor,
    todo: &Mutex<std::collections::VecDeque<(usize, ExecutionId, State)>>,
    each: &Mutex<F>,
    wait: bool,
) where
    F: FnMut(usize, &ExecutionId, State, Result<Outcome, ExecError>),
{
    loop {
        // The lock ends before the await: the queue is shared by every worker.
        let next = lock(todo).pop_front();
        let Some((i, id, before)) = next else {
            break;
        };
        let r = ex.recover_one(&id, wait).await;
        (lock(each))(i, &id, before, r);
    }
}

/// A lock that a panicking `each` poisoned still hands out its data: the queue stays sound.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every front gets the intent key, the session and the approver it names, and a policy
    /// that does not load is refused before anything is recorded.
    #[test]
    fn the_builder_passes_every_option_to_the_executor() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostOptions {
            journal: Some(dir.path().join("j.db")),
            intent_key: Some(dir.path().join("k")),
            reconnect_for: std::time::Duration::from_secs(7),
            ..HostOptions::default()
        };
        let ex = ExecutorBuilder::host(&host)
            .session(Some("se_1".into()))
            .host_session(true)
            .build()
            .unwrap();
        assert_eq!(ex.intent_key_path, host.intent_key);
        assert_eq!(ex.session_id.as_deref(), Some("se_1"));
        assert_eq!(ex.patience.reconnect_for, std::time::Duration::from_secs(7));
        assert!(!ex.link.host_session, "a host session needs a pool");
        assert_eq!(ex.journal.path(), dir.path().join("j.db"));

        let bad = ApproveOptions {
            mode: "allow".into(),
            policy: Some(dir.path().join("no-such-policy.json")),
        };
        let e = ExecutorBuilder::host(&host)
            .approve(&bad, "t")
            .build()
            .err()
            .expect("a missing policy file is refused");
        assert!(matches!(e, ExecError::Setup(_)), "{e}");
    }
}
