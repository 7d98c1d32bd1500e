//! The SQLite backend: a journal file on this machine, its anchor next to it, and the group
//! commit (with the connection pool) shared with every other handle on the file in this
//! process. It implements [`Backend`] like the PostgreSQL one; what both do alike stays in
//! [`Journal`] or is a procedure written once over a small trait this store implements with its
//! SQL (session chains: `sessions.rs`; host epochs: `hosts.rs`; group commit's leader queue:
//! `leader_queue.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::backend::{Backend, Choose, Named};
use super::sessions::{write_in, SessionBook, SessionEntry, SessionWrite};
use super::JournalMetrics;
use super::{
    advance_anchor, anchor, append_in, connect, group, insert_accepted, redact_url,
    status_from_states, AcceptOrMatch, Candidate, Event, ExecutionRecord, GroupCommitStats,
    IntentColumns, JournalError, LegacyIntent, Result, SessionRecord, SessionView, Status,
    SCHEMA_VERSION,
};
use crate::epoch::{Announced, HostPlace};
use crate::id::ExecutionId;
use crate::state::State;

/// A SQLite journal file (the default store).
pub(super) struct Sqlite {
    pub(super) path: PathBuf,
    pub(super) anchor: anchor::Anchor,
    pub(super) group: Arc<group::Group>,
}

impl Sqlite {
    /// A SQLite connection for one operation (see [`group::Lease`]).
    pub(super) fn conn(&self) -> Result<group::Lease<'_>> {
        self.group
            .lease(&|| connect(&self.path))
            .map_err(|e| self.err(e))
    }

    pub(super) fn err(&self, source: rusqlite::Error) -> JournalError {
        JournalError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Run `f` in one IMMEDIATE transaction on a leased connection and commit it; the lease is
    /// returned before this returns, so the caller may move the anchor with no connection held.
    /// The host-epoch and session procedures (`hosts.rs`, `sessions.rs`) run their books here.
    pub(super) fn immediate<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>, &std::path::Path) -> Result<T>,
    ) -> Result<T> {
        let mut lease = self.conn()?;
        let tx = lease
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.err(e))?;
        let out = f(&tx, &self.path)?;
        tx.commit().map_err(|e| self.err(e))?;
        Ok(out)
    }

    /// Run `sql` (one `BEGIN IMMEDIATE … COMMIT` batch creating tables) unless the table
    /// `last` already exists: how a journal made before a feature gains that feature's tables.
    pub(super) fn add_tables(&self, c: &rusqlite::Connection, last: &str, sql: &str) -> Result<()> {
        let have: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = ?1",
                [last],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))?;
        if have > 0 {
            return Ok(());
        }
        c.execute_batch(sql).map_err(|e| {
            let _ = c.execute_batch("ROLLBACK");
            self.err(e)
        })
    }

    pub(super) fn init(&self) -> Result<()> {
        let c = self.conn()?;
        // journal_mode returns a row; WAL persists in the file once set.
        let _mode: String = c
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        let version: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        match version {
            0 => self.create_schema(&c),
            SCHEMA_VERSION => self
                .add_intent_schema(&c)
                .and_then(|()| self.add_batch_schema(&c))
                .and_then(|()| self.add_host_schema(&c))
                .and_then(|()| self.add_http_schema(&c))
                .and_then(|()| self.add_state_schema(&c)),
            found => Err(JournalError::Version {
                path: self.path.clone(),
                found,
            }),
        }
    }

    fn create_schema(&self, c: &Connection) -> Result<()> {
        c.execute_batch(
            "BEGIN IMMEDIATE;
                 CREATE TABLE IF NOT EXISTS executions (
                    id TEXT PRIMARY KEY,
                    created_at TEXT NOT NULL,
                    destination TEXT NOT NULL,
                    host TEXT NOT NULL,
                    port INTEGER NOT NULL,
                    user TEXT NOT NULL,
                    command BLOB NOT NULL,
                    command_digest TEXT NOT NULL,
                    remote_dir TEXT NOT NULL,
                    timeout_secs INTEGER NOT NULL,
                    client TEXT NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS events (
                    seq INTEGER PRIMARY KEY,
                    execution_id TEXT NOT NULL REFERENCES executions(id),
                    at TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    state TEXT,
                    evidence TEXT NOT NULL,
                    client TEXT NOT NULL,
                    prev_hash TEXT NOT NULL,
                    hash TEXT NOT NULL
                 );
                 CREATE INDEX IF NOT EXISTS events_by_execution ON events(execution_id, seq);
                 CREATE TRIGGER IF NOT EXISTS events_append_only_u BEFORE UPDATE ON events
                    BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
                 CREATE TRIGGER IF NOT EXISTS events_append_only_d BEFORE DELETE ON events
                    BEGIN SELECT RAISE(ABORT, 'journal events are append-only'); END;
                 CREATE TRIGGER IF NOT EXISTS executions_fixed_u BEFORE UPDATE ON executions
                    BEGIN SELECT RAISE(ABORT, 'an execution record is fixed once accepted'); END;
                 -- Progress, not evidence: how far the caller has been given each stream.
                 CREATE TABLE IF NOT EXISTS cursors (
                    execution_id TEXT PRIMARY KEY REFERENCES executions(id),
                    out_off INTEGER NOT NULL,
                    err_off INTEGER NOT NULL
                 );
                 PRAGMA user_version = 1;
                 COMMIT;",
        )
        .map_err(|e| self.err(e))?;
        // The later parts of version 1 are created by the same steps that add them to a
        // journal made before them.
        self.add_intent_schema(c)?;
        self.add_batch_schema(c)?;
        self.add_host_schema(c)?;
        self.add_http_schema(c)?;
        self.add_state_schema(c)
    }

    /// Intent matching, operation classes and sessions (issue 4). Part of schema version 1
    /// (not yet released); added to a journal made before them, in one transaction.
    fn add_intent_schema(&self, c: &Connection) -> Result<()> {
        let ready = |c: &Connection| -> rusqlite::Result<(bool, bool)> {
            let cols: i64 = c.query_row(
                "SELECT COUNT(*) FROM pragma_table_info('executions') WHERE name = 'fingerprint'",
                [],
                |r| r.get(0),
            )?;
            let sess: i64 = c.query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'session_events'",
                [],
                |r| r.get(0),
            )?;
            Ok((cols > 0, sess > 0))
        };
        if ready(c).map_err(|e| self.err(e))? == (true, true) {
            return Ok(());
        }
        c.execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| self.err(e))?;
        let r = (|| -> rusqlite::Result<()> {
            let (has, _) = ready(c)?;
            let columns = if has {
                ""
            } else {
                // NULL for executions accepted without an intent (library `accept`, old
                // rows): they never match a fingerprint.
                "ALTER TABLE executions ADD COLUMN fingerprint TEXT;
                 ALTER TABLE executions ADD COLUMN actor TEXT;
                 ALTER TABLE executions ADD COLUMN scope TEXT;
                 ALTER TABLE executions ADD COLUMN class TEXT;
                 ALTER TABLE executions ADD COLUMN retention_secs INTEGER;
                 ALTER TABLE executions ADD COLUMN accepted_ms INTEGER;
                 ALTER TABLE executions ADD COLUMN session_id TEXT;
                 ALTER TABLE executions ADD COLUMN intent TEXT;"
            };
            c.execute_batch(&format!(
                "{columns}
                 CREATE INDEX IF NOT EXISTS executions_by_intent
                    ON executions(fingerprint, actor, scope, accepted_ms);
                 -- Which client process / gateway run / actor existed, and when. A row is fixed
                 -- at start; the end is an event.
                 CREATE TABLE IF NOT EXISTS sessions (
                    id TEXT PRIMARY KEY,
                    kind TEXT NOT NULL,
                    actor TEXT NOT NULL,
                    pid INTEGER NOT NULL,
                    client TEXT NOT NULL,
                    started_at TEXT NOT NULL,
                    detail TEXT NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS session_events (
                    seq INTEGER PRIMARY KEY,
                    session_id TEXT NOT NULL REFERENCES sessions(id),
                    at TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    evidence TEXT NOT NULL,
                    prev_hash TEXT NOT NULL,
                    hash TEXT NOT NULL
                 );
                 CREATE INDEX IF NOT EXISTS session_events_by_session ON session_events(session_id, seq);
                 CREATE TRIGGER IF NOT EXISTS sessions_fixed_u BEFORE UPDATE ON sessions
                    BEGIN SELECT RAISE(ABORT, 'a session record is fixed once started'); END;
                 CREATE TRIGGER IF NOT EXISTS session_events_append_only_u BEFORE UPDATE ON session_events
                    BEGIN SELECT RAISE(ABORT, 'session events are append-only'); END;
                 CREATE TRIGGER IF NOT EXISTS session_events_append_only_d BEFORE DELETE ON session_events
                    BEGIN SELECT RAISE(ABORT, 'session events are append-only'); END;"
            ))
        })();
        match r {
            Ok(()) => c.execute_batch("COMMIT").map_err(|e| self.err(e)),
            Err(e) => {
                let _ = c.execute_batch("ROLLBACK");
                Err(self.err(e))
            }
        }
    }

    /// Where this file is, fit for a message.
    pub(super) fn location(&self) -> String {
        redact_url(&self.path.to_string_lossy())
    }

    /// Move the anchor to a committed event. A failure leaves the event unanchored (reported by
    /// `cairn audit verify`), never fails the operation.
    fn anchor_sessions(&self, seq: i64, hash: &str) {
        if let Err(e) = self.anchor.advance_sessions(seq, hash) {
            tracing::warn!("cairn: journal anchor not updated: {e}");
        }
    }

    pub(super) fn anchor_to(&self, ev: &Event) {
        advance_anchor(&self.anchor, ev);
    }

    /// Commit one request through this journal's group.
    fn commit(&self, req: group::Request) -> Result<Event> {
        let group = Arc::clone(&self.group);
        let id = req.execution_id().to_owned();
        group
            .submit(req, &|| connect(&self.path), &self.anchor)
            .map_err(|f| match f {
                group::Failure::Sqlite(source) => self.err(source),
                group::Failure::Refused {
                    refused,
                    conditional,
                } => JournalError::Refused {
                    location: self.location(),
                    id,
                    refused,
                    conditional,
                },
                group::Failure::LeaderLost => JournalError::Io {
                    path: self.path.clone(),
                    message: "the thread committing this write panicked, so whether it was \
                              committed is unknown; read the execution's events to find out"
                        .into(),
                },
            })
    }
}

impl Backend for Sqlite {
    /// Run one SQL statement as the journal's own connection (tests: what the journal's role
    /// may and may not do).
    #[cfg(test)]
    fn raw_execute(&self, sql: &str) -> Result<u64> {
        self.conn()?
            .execute(sql, [])
            .map(|n| n as u64)
            .map_err(|e| self.err(e))
    }

    /// Record a new execution and its `accepted` event in one transaction (group-committed with
    /// other handles' writes, like [`Journal::append`]). Fails if the ID already exists.
    fn accept(&self, rec: &ExecutionRecord, evidence: serde_json::Value) -> Result<Event> {
        self.commit(group::Request::Accept {
            rec: rec.clone(),
            evidence,
        })
    }

    /// Append an event; `state` is `Some` for a lifecycle transition, `None` for a note
    /// (a reconnect, a probe result, a delivery of part of the output …).
    ///
    /// Returns once the event is committed, with its seq and hash as stored. Appends from every
    /// handle on this journal in this process are group-committed: concurrent callers share one
    /// transaction and one fsync (see `journal/group.rs`).
    fn append(
        &self,
        id: &ExecutionId,
        kind: &str,
        state: Option<State>,
        evidence: serde_json::Value,
    ) -> Result<Event> {
        self.commit(group::Request::Append {
            id: id.as_str().to_owned(),
            kind: kind.to_owned(),
            state,
            evidence,
        })
    }

    /// How many transactions and events group commit has written to this journal in this
    /// process (every handle on the file counts).
    fn group_commit_stats(&self) -> GroupCommitStats {
        self.group.stats()
    }

    fn execution(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>> {
        let row = self
            .conn()?
            .query_row(
                "SELECT id, created_at, destination, host, port, user, command, command_digest,
                        remote_dir, timeout_secs, client FROM executions WHERE id = ?1",
                [id.as_str()],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, String>(5)?,
                        r.get::<_, Vec<u8>>(6)?,
                        r.get::<_, String>(7)?,
                        r.get::<_, String>(8)?,
                        r.get::<_, i64>(9)?,
                        r.get::<_, String>(10)?,
                    ))
                },
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let Some(r) = row else { return Ok(None) };
        let corrupt = |message: String| JournalError::Corrupt {
            path: self.path.clone(),
            id: id.to_string(),
            message,
        };
        Ok(Some(ExecutionRecord {
            id: ExecutionId::parse(&r.0).map_err(|e| corrupt(e.to_string()))?,
            created_at: r.1,
            destination: r.2,
            host: r.3,
            port: u16::try_from(r.4).map_err(|_| corrupt(format!("port {} out of range", r.4)))?,
            user: r.5,
            command: r.6,
            command_digest: r.7,
            remote_dir: r.8,
            timeout_secs: u64::try_from(r.9)
                .map_err(|_| corrupt(format!("timeout {} out of range", r.9)))?,
            client: r.10,
        }))
    }

    fn events(&self, id: &ExecutionId) -> Result<Vec<Event>> {
        let lease = self.conn()?;
        let mut st = lease
            .prepare_cached(
                "SELECT seq, execution_id, at, kind, state, evidence, hash, client FROM events
                 WHERE execution_id = ?1 ORDER BY seq",
            )
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([id.as_str()], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, String>(7)?,
                ))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, eid, at, kind, state, evidence, hash, client) =
                row.map_err(|e| self.err(e))?;
            let corrupt = |message: String| JournalError::Corrupt {
                path: self.path.clone(),
                id: eid.clone(),
                message,
            };
            let state = match state {
                Some(s) => Some(
                    s.parse::<State>()
                        .map_err(|e| corrupt(format!("event {seq}: {e}")))?,
                ),
                None => None,
            };
            let evidence = serde_json::from_str(&evidence)
                .map_err(|e| corrupt(format!("event {seq}: evidence is not JSON: {e}")))?;
            out.push(Event {
                seq,
                execution_id: eid.clone(),
                at,
                kind: kind.into(),
                state,
                evidence,
                client,
                hash,
            });
        }
        Ok(out)
    }

    /// The current state: the state of the last transition event, as [`status_from_events`]
    /// derives it, read in one lookup of the state kept with the execution (`journal/heads.rs`),
    /// not by replaying its events.
    fn status(&self, id: &ExecutionId) -> Result<Option<Status>> {
        self.status_kept(id)
    }

    fn cursor(&self, id: &ExecutionId) -> Result<(u64, u64)> {
        let r = self
            .conn()?
            .query_row(
                "SELECT out_off, err_off FROM cursors WHERE execution_id = ?1",
                [id.as_str()],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(r.map(|(o, e)| (o.max(0) as u64, e.max(0) as u64))
            .unwrap_or((0, 0)))
    }

    ///
    /// A cursor is progress, not evidence: it is written without an fsync of its own
    /// (`synchronous=NORMAL` for this one statement) and reaches the disk with the next commit
    /// or checkpoint. A power loss can take back the last few updates (a process crash cannot),
    /// and a reattach then asks the host again from an earlier offset.
    fn set_cursor(&self, id: &ExecutionId, out_off: u64, err_off: u64) -> Result<()> {
        let lease = self.conn()?;
        lease
            .execute_batch("PRAGMA synchronous=NORMAL")
            .map_err(|e| self.err(e))?;
        let r = lease
            .prepare_cached(
                "INSERT INTO cursors (execution_id, out_off, err_off) VALUES (?1, ?2, ?3)
                 ON CONFLICT(execution_id) DO UPDATE SET out_off = ?2, err_off = ?3",
            )
            .and_then(|mut st| st.execute(params![id.as_str(), out_off as i64, err_off as i64]));
        // Every other write on this connection stays fully synchronous, whatever happened
        // above: if that cannot be restored, the connection is closed rather than pooled.
        let back = lease.execute_batch("PRAGMA synchronous=FULL");
        if back.is_err() {
            lease.discard();
        }
        r.map_err(|e| self.err(e))?;
        back.map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Forget the output cursors of delivered executions (progress, not evidence).
    fn prune_cursors(&self) -> Result<usize> {
        self.conn()?
            .execute(
                "DELETE FROM cursors WHERE execution_id IN
                   (SELECT execution_id FROM events WHERE state = 'delivered')",
                [],
            )
            .map_err(|e| self.err(e))
    }

    /// Append several events of one execution, in order, in one transaction (group-committed
    /// like [`Journal::append`]); returns the last as stored. For events that need not be
    /// durable on their own before the next one (the executor's held events).
    fn append_all(&self, id: &ExecutionId, events: Vec<Named>) -> Result<Option<Event>> {
        if events.is_empty() {
            return Ok(None);
        }
        self.commit(group::Request::AppendAll {
            id: id.as_str().to_owned(),
            events,
            expect: None,
        })
        .map(Some)
    }

    /// [`Journal::append_all`] on a condition: written only while `id` holds one of the states
    /// `expect`, checked in the same transaction as the append (else
    /// [`JournalError::Refused`], with the state it holds, and nothing written). For a decision
    /// that is only true of those states (`cancelled` before a dispatch: nothing was sent).
    fn append_all_if(
        &self,
        id: &ExecutionId,
        expect: &[State],
        events: Vec<Named>,
    ) -> Result<Event> {
        self.commit(group::Request::AppendAll {
            id: id.as_str().to_owned(),
            events,
            expect: Some(expect.to_vec()),
        })
    }

    fn execution_ids(&self) -> Result<Vec<String>> {
        let lease = self.conn()?;
        let mut st = lease
            .prepare("SELECT id FROM executions ORDER BY created_at DESC, id DESC")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(|e| self.err(e))?;
        rows.collect::<std::result::Result<_, _>>()
            .map_err(|e| self.err(e))
    }

    // Long: one IMMEDIATE transaction (read the candidates, let the caller choose, append or
    // match); its steps share the transaction.
    fn accept_or_match_with(
        &self,
        rec: &ExecutionRecord,
        cols: &IntentColumns,
        legacy: Option<LegacyIntent<'_>>,
        evidence: serde_json::Value,
        match_evidence: serde_json::Value,
        choose: Choose<'_>,
    ) -> Result<AcceptOrMatch> {
        let path = self.path.clone();
        let sq = |source| JournalError::Sqlite {
            path: path.clone(),
            source,
        };
        let mut lease = self.conn()?;
        let tx = lease
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sq)?;
        let rows: Vec<(String, String, i64, i64)> = {
            let mut st = tx
                .prepare_cached(
                    "SELECT id, class, accepted_ms, retention_secs FROM executions
                     WHERE (fingerprint = ?1 OR (fingerprint = ?5 AND host = ?6 AND port = ?7))
                       AND actor = ?2 AND scope = ?3
                       AND accepted_ms + retention_secs * 1000 > ?4
                     ORDER BY accepted_ms DESC, id DESC",
                )
                .map_err(sq)?;
            let it = st
                .query_map(
                    params![
                        cols.fingerprint,
                        cols.actor,
                        cols.scope,
                        cols.accepted_ms,
                        legacy.map(|l| l.fingerprint),
                        legacy.map(|l| l.host),
                        legacy.map(|l| l.port)
                    ],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .map_err(sq)?;
            it.collect::<rusqlite::Result<_>>().map_err(sq)?
        };
        let mut cands = Vec::new();
        for (id, class, accepted_ms, retention) in rows {
            let states: Vec<Option<String>> = {
                let mut st = tx
                    .prepare_cached(
                        "SELECT state FROM events WHERE execution_id = ?1 AND state IS NOT NULL
                         ORDER BY seq",
                    )
                    .map_err(sq)?;
                let it = st.query_map([&id], |r| r.get(0)).map_err(sq)?;
                it.collect::<rusqlite::Result<_>>().map_err(sq)?
            };
            let states: Vec<State> = states
                .into_iter()
                .flatten()
                .filter_map(|s| s.parse().ok())
                .collect();
            let Some(status) = status_from_states(&states) else {
                continue;
            };
            let Ok(eid) = ExecutionId::parse(&id) else {
                continue;
            };
            cands.push(Candidate {
                id: eid,
                class,
                accepted_ms,
                retention_secs: retention.max(0) as u64,
                status,
            });
        }
        if let Some(i) = choose(&cands).filter(|i| *i < cands.len()) {
            let c = cands.swap_remove(i);
            let ev = append_in(&tx, c.id.as_str(), "intent-matched", None, &match_evidence)
                .map_err(sq)?;
            tx.commit().map_err(sq)?;
            self.anchor_to(&ev);
            return Ok(AcceptOrMatch::Matched(c));
        }
        let ev = insert_accepted(&tx, rec, Some(cols), &evidence).map_err(sq)?;
        tx.commit().map_err(sq)?;
        self.anchor_to(&ev);
        Ok(AcceptOrMatch::Accepted(ev))
    }

    /// The intent an execution was accepted with (`None` for one accepted without).
    fn intent_of(&self, id: &ExecutionId) -> Result<Option<IntentColumns>> {
        let row = self
            .conn()?
            .query_row(
                "SELECT fingerprint, actor, scope, class, retention_secs, accepted_ms, session_id,
                        intent FROM executions WHERE id = ?1 AND fingerprint IS NOT NULL",
                [id.as_str()],
                |r| {
                    Ok(IntentColumns {
                        fingerprint: r.get(0)?,
                        actor: r.get(1)?,
                        scope: r.get(2)?,
                        class: r.get(3)?,
                        retention_secs: r.get::<_, i64>(4)?.max(0) as u64,
                        accepted_ms: r.get(5)?,
                        session_id: r.get(6)?,
                        intent: r
                            .get::<_, Option<String>>(7)?
                            .and_then(|t| serde_json::from_str(&t).ok())
                            .unwrap_or_default(),
                    })
                },
            )
            .optional()
            .map_err(|e| self.err(e))?;
        Ok(row)
    }

    /// Executions created by a session.
    fn executions_of_session(&self, session: &str) -> Result<Vec<String>> {
        let lease = self.conn()?;
        let mut st = lease
            .prepare("SELECT id FROM executions WHERE session_id = ?1 ORDER BY accepted_ms, id")
            .map_err(|e| self.err(e))?;
        let it = st
            .query_map([session], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        it.collect::<rusqlite::Result<_>>().map_err(|e| self.err(e))
    }

    /// Record the start of a session (a CLI process, a `serve` or `mcp` run).
    fn start_session(&self, s: &SessionRecord) -> Result<()> {
        self.write_session(SessionWrite::Start(s))
    }

    /// Append a session event (`ended`, `request` …).
    fn session_event(&self, session: &str, kind: &str, evidence: serde_json::Value) -> Result<()> {
        self.write_session(SessionWrite::Entry {
            session,
            kind,
            evidence: &evidence,
        })
    }

    /// Every session, newest first, with its end (the `ended` event) and execution count.
    fn sessions(&self) -> Result<Vec<SessionView>> {
        let lease = self.conn()?;
        let mut st = lease
            .prepare(
                "SELECT s.id, s.kind, s.actor, s.pid, s.client, s.started_at, s.detail,
                    (SELECT at FROM session_events e WHERE e.session_id = s.id AND e.kind = 'ended'
                        ORDER BY seq DESC LIMIT 1),
                    (SELECT COUNT(*) FROM executions x WHERE x.session_id = s.id)
                 FROM sessions s ORDER BY s.started_at DESC, s.id DESC",
            )
            .map_err(|e| self.err(e))?;
        let it = st
            .query_map([], |r| {
                Ok(SessionView {
                    record: SessionRecord::from_row(r)?,
                    ended_at: r.get(7)?,
                    executions: r.get::<_, i64>(8)?.max(0) as u64,
                })
            })
            .map_err(|e| self.err(e))?;
        it.collect::<rusqlite::Result<_>>().map_err(|e| self.err(e))
    }

    fn host_epoch_at(&self, place: &HostPlace) -> Result<Option<String>> {
        Sqlite::host_epoch_at(self, place)
    }
    fn observe_host_epoch(
        &self,
        id: &ExecutionId,
        place: &HostPlace,
        epoch: &str,
    ) -> Result<Announced> {
        Sqlite::observe_host_epoch(self, id, place, epoch)
    }

    fn last_event_seq(&self) -> Result<i64> {
        Sqlite::last_event_seq(self)
    }
    fn metrics(&self) -> Result<JournalMetrics> {
        Sqlite::metrics(self)
    }
}

/// The SQLite file's book: one IMMEDIATE transaction, one chain for every session of the file.
struct SqliteSessions<'a> {
    tx: &'a rusqlite::Transaction<'a>,
    path: &'a std::path::Path,
}

impl SqliteSessions<'_> {
    fn sq(&self, source: rusqlite::Error) -> JournalError {
        JournalError::Sqlite {
            path: self.path.to_owned(),
            source,
        }
    }
}

impl SessionBook for SqliteSessions<'_> {
    async fn insert_session(&mut self, s: &SessionRecord) -> Result<()> {
        self.tx
            .execute(
                "INSERT INTO sessions (id, kind, actor, pid, client, started_at, detail)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    s.id,
                    s.kind,
                    s.actor,
                    s.pid,
                    s.client,
                    s.started_at,
                    s.detail.to_string()
                ],
            )
            .map(|_| ())
            .map_err(|e| self.sq(e))
    }

    async fn next(&mut self, _session: &str) -> Result<(i64, String)> {
        let (last_seq, prev_hash) = self
            .tx
            .query_row(
                "SELECT seq, hash FROM session_events ORDER BY seq DESC LIMIT 1",
                [],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
            )
            .optional()
            .map_err(|e| self.sq(e))?
            .unwrap_or((0, String::new()));
        Ok((last_seq + 1, prev_hash))
    }

    async fn insert(&mut self, e: &SessionEntry<'_>) -> Result<()> {
        // The head is the last entry: inserting it moves the head.
        self.tx
            .execute(
                "INSERT INTO session_events (seq, session_id, at, kind, evidence, prev_hash, hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    e.seq,
                    e.session,
                    e.at,
                    e.kind,
                    e.evidence,
                    e.prev_hash,
                    e.hash
                ],
            )
            .map(|_| ())
            .map_err(|e| self.sq(e))
    }
}

/// The session writes of [`Backend`] for this store.
impl Sqlite {
    /// `w` in one IMMEDIATE transaction ([`write_in`]); once committed, the sessions anchor is
    /// moved to the entry appended.
    fn write_session(&self, w: SessionWrite<'_>) -> Result<()> {
        let (seq, hash) = self.immediate(|tx, path| {
            let mut book = SqliteSessions { tx, path };
            // No await point waits: every step of the SQLite book is synchronous.
            futures::executor::block_on(write_in(&mut book, w))
        })?;
        self.anchor_sessions(seq, &hash);
        Ok(())
    }
}
