//! The SQLite backend: a journal file on this machine, its anchor next to it, and the group
//! commit (with the connection pool) shared with every other handle on the file in this
//! process. It implements [`Backend`] like the PostgreSQL one; what both do alike stays in
//! [`Journal`].

use std::path::PathBuf;
use std::sync::Arc;

use rusqlite::{params, OptionalExtension};

use super::backend::{Backend, Named};
use super::{
    advance_anchor, anchor, connect, group, redact_url, Event, ExecutionRecord, GroupCommitStats,
    JournalError, Result, Status,
};
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

    /// Where this file is, fit for a message.
    pub(super) fn location(&self) -> String {
        redact_url(&self.path.to_string_lossy())
    }

    /// Move the anchor to a committed event. A failure leaves the event unanchored (reported by
    /// `cairn audit verify`), never fails the operation.
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
}
