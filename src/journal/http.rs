//! What the HTTP front (`cairn mcp --listen`) keeps in the journal file: bearer tokens (only
//! their SHA-256, with the actor they act as), and the Streamable HTTP sessions and SSE events
//! that let a client resume a stream after a cut or a server restart.
//!
//! These tables are state, not evidence: they are outside the hash chains (so adding them to
//! an existing journal leaves it verifiable as it was). What a token *did* is evidence, and is
//! in the chains: executions carry their actor, and refused requests are session events.

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use super::{now_ms, now_rfc3339, Journal, Result};

/// A bearer token as stored: never the token itself.
#[derive(Clone, Debug, Serialize)]
pub struct TokenRecord {
    /// `tk_…`: names the token in `cairn token ls|revoke` (a prefix of its hash).
    pub id: String,
    #[serde(skip)]
    pub hash: String,
    pub actor: String,
    /// Intent scopes this token may act in must start with this.
    pub scope_prefix: Option<String>,
    pub created_at: String,
    pub expires_at: Option<String>,
    #[serde(skip)]
    pub expires_ms: Option<i64>,
    pub revoked_at: Option<String>,
}

/// One stored SSE event of a Streamable HTTP response stream.
#[derive(Clone, Debug)]
pub struct StoredEvent {
    pub seq: i64,
    pub stream_id: String,
    /// The SSE `retry:` hint in milliseconds (priming events).
    pub retry_ms: Option<i64>,
    /// The JSON-RPC message (absent for priming events).
    pub message: Option<String>,
}

/// What a response stream answers: recorded when the stream is opened, so that a client
/// resuming it after a restart can still be given the one answer.
#[derive(Clone, Debug)]
pub struct StreamRecord {
    pub stream_id: String,
    pub session_id: Option<String>,
    pub actor: String,
    /// The client's JSON-RPC request, as received.
    pub request: String,
}

impl Journal {
    /// Add the HTTP front's tables to a journal made before them (schema version 1 is
    /// unreleased; the tables are outside the hash chains, so old journals verify as before).
    pub(super) fn add_http_schema(&self, c: &rusqlite::Connection) -> Result<()> {
        let have: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'http_streams'",
                [],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))?;
        if have > 0 {
            return Ok(());
        }
        c.execute_batch(
            "BEGIN IMMEDIATE;
                 CREATE TABLE IF NOT EXISTS tokens (
                    id TEXT PRIMARY KEY,
                    hash TEXT NOT NULL UNIQUE,
                    actor TEXT NOT NULL,
                    scope_prefix TEXT,
                    created_at TEXT NOT NULL,
                    expires_at TEXT,
                    expires_ms INTEGER,
                    revoked_at TEXT
                 );
                 CREATE TABLE IF NOT EXISTS http_sessions (
                    id TEXT PRIMARY KEY,
                    actor TEXT,
                    created_at TEXT NOT NULL,
                    state TEXT
                 );
                 CREATE TABLE IF NOT EXISTS http_events (
                    seq INTEGER PRIMARY KEY,
                    stream_id TEXT NOT NULL,
                    at_ms INTEGER NOT NULL,
                    retry_ms INTEGER,
                    message TEXT
                 );
                 CREATE INDEX IF NOT EXISTS http_events_by_stream ON http_events(stream_id, seq);
                 CREATE TABLE IF NOT EXISTS http_streams (
                    stream_id TEXT PRIMARY KEY,
                    session_id TEXT,
                    actor TEXT NOT NULL,
                    request TEXT NOT NULL,
                    opened_ms INTEGER NOT NULL
                 );
                 COMMIT;",
        )
        .map_err(|e| {
            let _ = c.execute_batch("ROLLBACK");
            self.err(e)
        })
    }

    pub fn add_token(&mut self, t: &TokenRecord) -> Result<()> {
        self.conn()?
            .execute(
                "INSERT INTO tokens (id, hash, actor, scope_prefix, created_at, expires_at,
                                     expires_ms, revoked_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL)",
                params![
                    t.id,
                    t.hash,
                    t.actor,
                    t.scope_prefix,
                    t.created_at,
                    t.expires_at,
                    t.expires_ms
                ],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn token_where(&self, clause: &str, arg: &str) -> Result<Vec<TokenRecord>> {
        let lease = self.conn()?;
        let mut st = lease
            .prepare(&format!(
                "SELECT id, hash, actor, scope_prefix, created_at, expires_at, expires_ms,
                        revoked_at FROM tokens {clause} ORDER BY created_at, id"
            ))
            .map_err(|e| self.err(e))?;
        let map = |r: &rusqlite::Row<'_>| {
            Ok(TokenRecord {
                id: r.get(0)?,
                hash: r.get(1)?,
                actor: r.get(2)?,
                scope_prefix: r.get(3)?,
                created_at: r.get(4)?,
                expires_at: r.get(5)?,
                expires_ms: r.get(6)?,
                revoked_at: r.get(7)?,
            })
        };
        let rows = if clause.is_empty() {
            st.query_map([], map)
        } else {
            st.query_map([arg], map)
        };
        rows.and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))
    }

    /// The token whose SHA-256 (hex) is `hash`, revoked or not.
    pub fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        Ok(self.token_where("WHERE hash = ?1", hash)?.pop())
    }

    pub fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.token_where("", "")
    }

    /// Revoke a token by its ID; `false` if there is no such token (or it was revoked before).
    pub fn revoke_token(&mut self, id: &str) -> Result<bool> {
        let n = self
            .conn()?
            .execute(
                "UPDATE tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                params![id, now_rfc3339()],
            )
            .map_err(|e| self.err(e))?;
        Ok(n > 0)
    }

    /// Store one SSE event (committed before this returns); its ID is the returned sequence.
    pub fn store_http_event(
        &self,
        stream_id: &str,
        retry_ms: Option<i64>,
        message: Option<&str>,
    ) -> Result<i64> {
        let lease = self.conn()?;
        lease
            .execute(
                "INSERT INTO http_events (stream_id, at_ms, retry_ms, message)
                 VALUES (?1, ?2, ?3, ?4)",
                params![stream_id, now_ms(), retry_ms, message],
            )
            .map_err(|e| self.err(e))?;
        Ok(lease.last_insert_rowid())
    }

    /// The stream an event belongs to.
    pub fn http_event_stream(&self, seq: i64) -> Result<Option<String>> {
        self.conn()?
            .query_row(
                "SELECT stream_id FROM http_events WHERE seq = ?1",
                [seq],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// The events of `stream_id` after `seq`, in order.
    pub fn http_events_after(&self, stream_id: &str, seq: i64) -> Result<Vec<StoredEvent>> {
        let lease = self.conn()?;
        let mut st = lease
            .prepare_cached(
                "SELECT seq, stream_id, retry_ms, message FROM http_events
                 WHERE stream_id = ?1 AND seq > ?2 ORDER BY seq",
            )
            .map_err(|e| self.err(e))?;
        st.query_map(params![stream_id, seq], |r| {
            Ok(StoredEvent {
                seq: r.get(0)?,
                stream_id: r.get(1)?,
                retry_ms: r.get(2)?,
                message: r.get(3)?,
            })
        })
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(|e| self.err(e))
    }

    pub fn record_http_stream(&self, s: &StreamRecord) -> Result<()> {
        self.conn()?
            .execute(
                "INSERT OR IGNORE INTO http_streams (stream_id, session_id, actor, request, opened_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![s.stream_id, s.session_id, s.actor, s.request, now_ms()],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    pub fn http_stream(&self, stream_id: &str) -> Result<Option<StreamRecord>> {
        self.conn()?
            .query_row(
                "SELECT stream_id, session_id, actor, request FROM http_streams
                 WHERE stream_id = ?1",
                [stream_id],
                |r| {
                    Ok(StreamRecord {
                        stream_id: r.get(0)?,
                        session_id: r.get(1)?,
                        actor: r.get(2)?,
                        request: r.get(3)?,
                    })
                },
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Remember an MCP session's `initialize` parameters (JSON), so a restarted server can
    /// restore it.
    pub fn store_http_session(&self, id: &str, state: &str) -> Result<()> {
        self.conn()?
            .execute(
                "INSERT INTO http_sessions (id, created_at, state) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET state = excluded.state",
                params![id, now_rfc3339(), state],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Bind an MCP session to the actor whose token opened it (once; later calls keep it).
    pub fn bind_http_session(&self, id: &str, actor: &str) -> Result<()> {
        self.conn()?
            .execute(
                "INSERT INTO http_sessions (id, actor, created_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET actor = COALESCE(actor, excluded.actor)",
                params![id, actor, now_rfc3339()],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// A stored MCP session: (actor, state).
    pub fn http_session(&self, id: &str) -> Result<Option<(Option<String>, Option<String>)>> {
        self.conn()?
            .query_row(
                "SELECT actor, state FROM http_sessions WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    pub fn delete_http_session(&self, id: &str) -> Result<()> {
        self.conn()?
            .execute("DELETE FROM http_sessions WHERE id = ?1", [id])
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// The execution a request with this correlation started or attached to (the newest).
    pub fn execution_by_correlation(&self, correlation: &str) -> Result<Option<String>> {
        self.conn()?
            .query_row(
                "SELECT execution_id FROM events
                 WHERE kind IN ('correlation', 'intent-matched', 'request-reused')
                   AND json_extract(evidence, '$.correlation_id') = ?1
                 ORDER BY seq DESC LIMIT 1",
                [correlation],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Forget stored SSE events and stream records older than `before_ms` (a client resumes
    /// within seconds or minutes; these are state, not evidence). Returns the events removed.
    pub fn prune_http_events(&self, before_ms: i64) -> Result<usize> {
        let c = self.conn()?;
        let n = c
            .execute("DELETE FROM http_events WHERE at_ms < ?1", [before_ms])
            .map_err(|e| self.err(e))?;
        c.execute("DELETE FROM http_streams WHERE opened_ms < ?1", [before_ms])
            .map_err(|e| self.err(e))?;
        Ok(n)
    }
}
