//! Group commit: appends from every [`Journal`](super::Journal) handle on one file in this process
//! share transactions, so that many executions in flight pay for one fsync between them instead of
//! one each.
//!
//! Each journal file (with its anchor) has one [`Group`], found through a process-wide registry.
//! Who leads which batch is the leader queue shared with PostgreSQL (`journal/leader_queue.rs`),
//! here with one leader at a time and no batch limit: an append enqueues its request with a
//! ticket; when no leader is active, the caller becomes the leader, leases a connection, takes
//! everything queued and writes it; the others wait for their ticket, and when a leader steps
//! down with requests still queued one of their owners leads the next batch, so no caller leads
//! for ever under sustained load. What is this file's own is how a batch is written: in one
//! `BEGIN IMMEDIATE` transaction on the leased connection (the chain head is read inside the
//! transaction, as for a lone append, so the chain stays correct with other processes writing
//! too), committed, then the anchor moved once to the batch's last event.
//!
//! Every caller still returns only once its own event is committed (or has failed), with the seq
//! and hash stored. One request's failure is not its neighbours': a request whose insert fails
//! gets that error and the rest of its batch is written again without it; a batch whose
//! transaction cannot begin or commit is retried one request per transaction, each getting what
//! its own attempt gives. A leader that panics publishes "outcome unknown" ([`Failure::LeaderLost`])
//! to the requests it had taken and steps down (the queue's drop guard), so nobody waits for it
//! for ever.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use rusqlite::{Connection, TransactionBehavior};

use super::anchor::Anchor;
use super::leader_queue::{LeaderQueue, Limits, Prepared};
use super::GroupCommitStats;
use super::{Event, ExecutionRecord};
use crate::lifecycle::{self, Illegal};
use crate::state::State;

/// One write a caller wants committed.
pub(super) enum Request {
    /// [`Journal::append`](super::Journal::append).
    Append {
        id: String,
        kind: String,
        state: Option<State>,
        evidence: serde_json::Value,
    },
    /// [`Journal::append_all`](super::Journal::append_all): several events of one execution,
    /// in order; its outcome is the last one.
    AppendAll {
        id: String,
        events: Vec<(String, Option<State>, serde_json::Value)>,
        /// Written only while the execution holds one of these states
        /// ([`Journal::append_all_if`](super::Journal::append_all_if)).
        expect: Option<Vec<State>>,
    },
    /// [`Journal::accept`](super::Journal::accept): the execution row and its `accepted` event.
    Accept {
        rec: ExecutionRecord,
        evidence: serde_json::Value,
    },
}

impl Request {
    /// The execution the request writes.
    pub(super) fn execution_id(&self) -> &str {
        match self {
            Request::Append { id, .. } | Request::AppendAll { id, .. } => id,
            Request::Accept { rec, .. } => rec.id.as_str(),
        }
    }
}

/// Why a request has no event.
pub(super) enum Failure {
    Sqlite(rusqlite::Error),
    /// The lifecycle (or the request's condition) refused one of its transitions from the state
    /// the execution held inside the transaction: nothing of it was written.
    Refused {
        refused: Illegal,
        conditional: bool,
    },
    /// The leader writing it panicked: it may or may not have been committed.
    LeaderLost,
}

pub(super) type Outcome = std::result::Result<Event, Failure>;

/// The group commit of one journal file in this process.
pub(super) struct Group {
    /// Who leads which batch (`leader_queue.rs`): one leader at a time, no batch limit.
    queue: LeaderQueue<Request, Outcome>,
    /// SQLite connections to this file not in use by any handle (see [`Lease`]).
    idle: Mutex<Vec<Connection>>,
    /// Which file the pooled connections are to.
    file: Mutex<FileState>,
    /// SQLite connections opened for this file in this process.
    opened: AtomicU64,
}

/// The file (device, inode) at the journal's path as this process last saw it.
#[derive(Clone, Copy, Default)]
struct FileState {
    identity: Option<(u64, u64)>,
    /// How many times the file at the path changed: a connection leased before a change is not
    /// pooled again.
    generation: u64,
    /// A handle checked (or made) this file's schema.
    checked: bool,
}

/// Most idle SQLite connections kept per journal file; more are closed when returned.
const IDLE_MAX: usize = 8;

/// A SQLite connection lent to one journal operation. Handles own no connection: each operation
/// leases one for its duration (its transaction, its cached statements), so a process holding a
/// thousand handles on one journal (a gateway with a thousand executions in flight) holds only as
/// many connections as operations run at once. Returned to the pool on drop, unless it was left
/// inside a transaction or the file was replaced meanwhile.
pub(super) struct Lease<'a> {
    group: &'a Group,
    conn: Option<Connection>,
    generation: u64,
}

impl std::ops::Deref for Lease<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a lease holds its connection until dropped")
    }
}

impl std::ops::DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }
}

impl Lease<'_> {
    /// Close this connection instead of pooling it (its settings could not be restored).
    pub(super) fn discard(mut self) {
        self.conn = None;
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
            if !conn.is_autocommit() {
                return;
            }
        }
        if self.group.file_state().generation != self.generation {
            return;
        }
        let mut idle = self
            .group
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if idle.len() < IDLE_MAX {
            idle.push(conn);
        }
    }
}

/// The group of the journal at `journal` with its anchor at `anchor`: shared by every handle on
/// the same two files (however their paths are spelt), created on first use, dropped with the
/// last handle.
pub(super) fn group_for(journal: &Path, anchor: &Path) -> Arc<Group> {
    type Registry = Mutex<HashMap<(PathBuf, PathBuf), Weak<Group>>>;
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    let key = (canonical(journal), canonical(anchor));
    let mut reg = REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(g) = reg.get(&key).and_then(Weak::upgrade) {
        return g;
    }
    reg.retain(|_, g| g.strong_count() > 0);
    let g = Arc::new(Group {
        queue: LeaderQueue::new(
            Limits {
                leaders: 1,
                batch: usize::MAX,
            },
            || Err(Failure::LeaderLost),
        ),
        idle: Mutex::new(Vec::new()),
        file: Mutex::new(FileState::default()),
        opened: AtomicU64::new(0),
    });
    reg.insert(key, Arc::downgrade(&g));
    g
}

/// The path with symlinks and `..` resolved; for a file that does not exist yet, its directory
/// resolved. Unresolvable paths stay as they are (at worst two spellings get two groups, which is
/// slower, not wrong: SQLite still serialises their transactions).
fn canonical(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    match (p.parent(), p.file_name()) {
        (Some(dir), Some(name)) => {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            std::fs::canonicalize(dir)
                .map(|d| d.join(name))
                .unwrap_or_else(|_| p.to_owned())
        }
        _ => p.to_owned(),
    }
}

impl Group {
    fn file_state(&self) -> FileState {
        *self.file.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a handle of this process has checked the schema of the file `identity`.
    pub(super) fn checked(&self, identity: Option<(u64, u64)>) -> bool {
        let f = self.file_state();
        identity.is_some() && f.identity == identity && f.checked
    }

    /// The file at the path is now `identity` (`None`: there is none yet). Connections to an
    /// earlier file at the same path are closed and never pooled again; connections opened
    /// while there was none are to this one.
    pub(super) fn retarget(&self, identity: Option<(u64, u64)>) {
        let mut f = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if f.identity == identity {
            return;
        }
        if f.identity.is_some() {
            f.generation += 1;
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }
        f.identity = identity;
        f.checked = false;
    }

    /// The schema of the file `identity` is checked: later handles need not check it again.
    pub(super) fn mark_checked(&self, identity: Option<(u64, u64)>) {
        let mut f = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if identity.is_some() && f.identity == identity {
            f.checked = true;
        }
    }

    /// A connection for one operation: an idle one, else a new one from `open`.
    pub(super) fn lease(
        &self,
        open: &dyn Fn() -> rusqlite::Result<Connection>,
    ) -> rusqlite::Result<Lease<'_>> {
        let generation = self.file_state().generation;
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let c = open()?;
                self.opened.fetch_add(1, Ordering::Relaxed);
                c
            }
        };
        Ok(Lease {
            group: self,
            conn: Some(conn),
            generation,
        })
    }

    /// SQLite connections opened for this file in this process so far.
    pub(super) fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    pub(super) fn stats(&self) -> GroupCommitStats {
        self.queue.stats()
    }

    /// Commit `req` together with whatever else is queued; return once it is committed (or has
    /// failed). A caller that leads a batch leases a connection (`open` makes one if none is
    /// idle) and writes with `anchor`; a caller that only waits holds no connection.
    pub(super) fn submit(
        &self,
        req: Request,
        open: &dyn Fn() -> rusqlite::Result<Connection>,
        anchor: &Anchor,
    ) -> Outcome {
        self.queue.submit(
            req,
            || match self.lease(open) {
                Ok(lease) => Prepared::Ready(lease),
                Err(e) => Prepared::Failed(Err(Failure::Sqlite(e))),
            },
            |conn, reqs| self.write_batch(conn, anchor, &reqs),
        )
    }

    /// Write `reqs` in as few transactions as their failures allow; one outcome per request, in
    /// order.
    pub(super) fn write_batch(
        &self,
        conn: &mut Connection,
        anchor: &Anchor,
        reqs: &[Request],
    ) -> Vec<Outcome> {
        let mut out: Vec<Option<Outcome>> = reqs.iter().map(|_| None).collect();
        loop {
            let pending: Vec<usize> = (0..reqs.len()).filter(|&i| out[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            match self.transaction(conn, anchor, reqs, &pending) {
                Ok(events) => {
                    for (i, ev) in pending.into_iter().zip(events) {
                        out[i] = Some(Ok(ev));
                    }
                }
                // That request's own insert failed (unknown execution, duplicate ID, a transition
                // the lifecycle refuses …): it gets the error; the others go again without it.
                // Each round removes one request.
                Err(Failed::Request(i, e)) => out[i] = Some(Err(e)),
                // Nobody's in particular: each request gets a transaction of its own.
                Err(Failed::Transaction(e)) => {
                    if let [i] = pending[..] {
                        out[i] = Some(Err(Failure::Sqlite(e)));
                        continue;
                    }
                    for i in pending {
                        out[i] = Some(match self.transaction(conn, anchor, reqs, &[i]) {
                            Ok(mut evs) => Ok(evs.remove(0)),
                            Err(Failed::Request(_, f)) => Err(f),
                            Err(Failed::Transaction(e)) => Err(Failure::Sqlite(e)),
                        });
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or(Err(Failure::LeaderLost)))
            .collect()
    }

    /// One `BEGIN IMMEDIATE` transaction holding `reqs[i]` for each `i` in `which`, in order; on
    /// success the anchor is moved to its last event.
    fn transaction(
        &self,
        conn: &mut Connection,
        anchor: &Anchor,
        reqs: &[Request],
        which: &[usize],
    ) -> std::result::Result<Vec<Event>, Failed> {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(Failed::Transaction)?;
        let mut events = Vec::with_capacity(which.len());
        let mut rows = 0u64;
        for &i in which {
            let ev = match &reqs[i] {
                Request::Append {
                    id,
                    kind,
                    state,
                    evidence,
                } => {
                    #[cfg(test)]
                    if kind == tests::PANIC_KIND {
                        panic!("test: the group-commit leader panics mid-batch");
                    }
                    check_in(&tx, id, None, [*state]).map_err(|f| Failed::Request(i, f))?;
                    rows += 1;
                    super::append_in(&tx, id, kind, *state, evidence)
                }
                Request::AppendAll { id, events, expect } => {
                    let states = events.iter().map(|(_, s, _)| *s);
                    check_in(&tx, id, expect.as_deref(), states)
                        .map_err(|f| Failed::Request(i, f))?;
                    let mut last = Err(rusqlite::Error::InvalidQuery);
                    for (kind, state, evidence) in events {
                        rows += 1;
                        last = super::append_in(&tx, id, kind, *state, evidence);
                        if last.is_err() {
                            break;
                        }
                    }
                    last
                }
                Request::Accept { rec, evidence } => {
                    rows += 1;
                    super::insert_accepted(&tx, rec, None, evidence)
                }
            }
            .map_err(|e| Failed::Request(i, Failure::Sqlite(e)))?;
            events.push(ev);
        }
        // Dropping `tx` on an error above rolls it back.
        tx.commit().map_err(Failed::Transaction)?;
        self.queue.committed(rows);
        if let Some(last) = events.last() {
            super::advance_anchor(anchor, last);
        }
        Ok(events)
    }
}

/// The compare of the journal's compare-and-set: `states` (in order; `None` for a note) are
/// legal from the state `id` holds inside `tx` (and, with `expect`, it holds one of those).
/// Notes alone need no read.
fn check_in(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    expect: Option<&[State]>,
    states: impl IntoIterator<Item = Option<State>>,
) -> std::result::Result<(), Failure> {
    let states: Vec<Option<State>> = states.into_iter().collect();
    if expect.is_none() && states.iter().all(Option::is_none) {
        return Ok(());
    }
    let now = super::state_in(tx, id).map_err(Failure::Sqlite)?;
    if let Some(expect) = expect {
        if !now.is_some_and(|s| expect.contains(&s)) {
            let to = states
                .iter()
                .flatten()
                .next()
                .copied()
                .unwrap_or(State::Accepted);
            return Err(Failure::Refused {
                refused: Illegal { from: now, to },
                conditional: true,
            });
        }
    }
    lifecycle::check_all(now, states)
        .map(|_| ())
        .map_err(|refused| Failure::Refused {
            refused,
            conditional: false,
        })
}

enum Failed {
    /// The request at this index could not be inserted; the transaction was rolled back.
    Request(usize, Failure),
    /// Beginning or committing failed; nothing was written.
    Transaction(rusqlite::Error),
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::id::ExecutionId;

    /// An append of this kind makes the leader panic inside its transaction (tests only).
    pub(in crate::journal) const PANIC_KIND: &str = "test-leader-panics";

    fn append(id: &str, n: u32) -> Request {
        Request::Append {
            id: id.to_owned(),
            kind: "note".into(),
            state: None,
            evidence: serde_json::json!({ "n": n }),
        }
    }

    #[test]
    fn a_failing_request_fails_alone_and_the_rest_share_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut j = super::super::Journal::open(&path).unwrap();
        let id = ExecutionId::parse("ex_ok").unwrap();
        let rec = super::super::tests::rec(id.as_str());
        j.accept(&rec, super::super::accepted_evidence(&rec))
            .unwrap();
        let before = j.group_commit_stats();

        let dup = super::super::tests::rec(id.as_str());
        let reqs = vec![
            append("ex_ok", 1),
            // No execution row: the foreign key refuses the event.
            append("ex_missing", 2),
            append("ex_ok", 3),
            // Already accepted: the primary key refuses the row.
            Request::Accept {
                rec: dup,
                evidence: serde_json::json!({}),
            },
            append("ex_ok", 4),
        ];
        let (group, anchor) = {
            let f = j.file().unwrap();
            (f.group.clone(), f.anchor.clone())
        };
        let out = group.write_batch(&mut j.conn().unwrap(), &anchor, &reqs);
        let ok: Vec<bool> = out.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [true, false, true, false, true]);

        let after = j.group_commit_stats();
        assert_eq!(
            after.transactions - before.transactions,
            1,
            "the three good appends were committed together"
        );
        assert_eq!(after.events - before.events, 3);

        let evs = j.events(&id).unwrap();
        let ns: Vec<_> = evs[1..].iter().map(|e| e.evidence["n"].clone()).collect();
        assert_eq!(ns, [1, 3, 4]);
        let stored: Vec<(i64, String)> = evs[1..].iter().map(|e| (e.seq, e.hash.clone())).collect();
        let returned: Vec<(i64, String)> = out
            .into_iter()
            .filter_map(Result::ok)
            .map(|e| (e.seq, e.hash))
            .collect();
        assert_eq!(returned, stored, "callers get the seq and hash stored");
        let report = crate::audit::verify(&path, &anchor).unwrap();
        assert!(report.ok(), "{:?}", report.findings);
        assert_eq!(report.anchored_seq, Some(report.head_seq));
    }
}
