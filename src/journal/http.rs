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

/// What `/metrics` reads from the journal (see `src/front/http/metrics.rs`).
#[derive(Clone, Debug, Default)]
pub struct JournalMetrics {
    pub by_state: Vec<(String, i64)>,
    pub dispatch_latencies: Vec<f64>,
    pub reconnects: u64,
    pub attached_by_intent: u64,
    pub attached_by_id: u64,
    pub delivery_abandoned: u64,
    /// Executions taken over from a replica whose lease expired (shared journals only).
    pub takeovers: u64,
    /// Executions the owning replica picked up after none of its calls drove them any more
    /// (shared journals only).
    pub redrives: u64,
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
    pub fn add_token(&mut self, t: &TokenRecord) -> Result<()> {
        self.backend().add_token(t)
    }

    /// The token whose SHA-256 (hex) is `hash`, revoked or not.
    pub fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        self.backend().token_by_hash(hash)
    }

    pub fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.backend().tokens()
    }

    /// Revoke a token by its ID; `false` if there is no such token (or it was revoked before).
    pub fn revoke_token(&mut self, id: &str) -> Result<bool> {
        self.backend().revoke_token(id)
    }

    /// Store one SSE event (committed before this returns); its ID is the returned sequence.
    pub fn store_http_event(
        &self,
        stream_id: &str,
        retry_ms: Option<i64>,
        message: Option<&str>,
    ) -> Result<i64> {
        self.backend()
            .store_http_event(stream_id, retry_ms, message)
    }

    /// The stream an event belongs to.
    pub fn http_event_stream(&self, seq: i64) -> Result<Option<String>> {
        self.backend().http_event_stream(seq)
    }

    /// The events of `stream_id` after `seq`, in order.
    pub fn http_events_after(&self, stream_id: &str, seq: i64) -> Result<Vec<StoredEvent>> {
        self.backend().http_events_after(stream_id, seq)
    }

    pub fn record_http_stream(&self, s: &StreamRecord) -> Result<()> {
        self.backend().record_http_stream(s)
    }

    pub fn http_stream(&self, stream_id: &str) -> Result<Option<StreamRecord>> {
        self.backend().http_stream(stream_id)
    }

    /// Remember an MCP session's `initialize` parameters (JSON), so a restarted server can
    /// restore it.
    pub fn store_http_session(&self, id: &str, state: &str) -> Result<()> {
        self.backend().store_http_session(id, state)
    }

    /// Bind an MCP session to the actor whose token opened it (once; later calls keep it).
    pub fn bind_http_session(&self, id: &str, actor: &str) -> Result<()> {
        self.backend().bind_http_session(id, actor)
    }

    /// A stored MCP session: (actor, state).
    pub fn http_session(&self, id: &str) -> Result<Option<(Option<String>, Option<String>)>> {
        self.backend().http_session(id)
    }

    pub fn delete_http_session(&self, id: &str) -> Result<()> {
        self.backend().delete_http_session(id)
    }

    /// The execution a request with this correlation started or attached to (the newest).
    pub fn execution_by_correlation(&self, correlation: &str) -> Result<Option<String>> {
        self.backend().execution_by_correlation(correlation)
    }

    /// Forget stored SSE events, stream records and MCP sessions older than `before_ms` (a
    /// client resumes within seconds or minutes; these are state, not evidence). Returns the
    /// events removed.
    pub fn prune_http_events(&self, before_ms: i64) -> Result<usize> {
        self.backend().prune_http_events(before_ms)
    }

    /// [`Journal::execution_by_correlation`] among events after `after_seq`.
    pub fn execution_by_correlation_after(
        &self,
        correlation: &str,
        after_seq: i64,
    ) -> Result<Option<String>> {
        self.backend()
            .execution_by_correlation_after(correlation, after_seq)
    }

    /// The sequence of the journal's last execution event (0 when empty).
    pub fn last_event_seq(&self) -> Result<i64> {
        self.backend().last_event_seq()
    }

    /// The journal's numbers for `/metrics` (one read transaction's worth of queries).
    pub fn metrics(&self) -> Result<JournalMetrics> {
        self.backend().metrics()
    }
}

/// The SQLite side of these methods ([`super::backend::Backend`] for [`super::sqlite::Sqlite`]).
impl super::sqlite::Sqlite {
    /// Add the HTTP front's tables to a journal made before them (schema version 1 is
    /// unreleased; the tables are outside the hash chains, so old journals verify as before).
    pub(super) fn add_http_schema(&self, c: &rusqlite::Connection) -> Result<()> {
        self.add_tables(
            c,
            "http_streams",
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
}

impl super::backend::HttpStore for super::sqlite::Sqlite {
    fn add_token(&self, t: &TokenRecord) -> Result<()> {
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

    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        Ok(self.token_where("WHERE hash = ?1", hash)?.pop())
    }

    fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.token_where("", "")
    }

    fn revoke_token(&self, id: &str) -> Result<bool> {
        let n = self
            .conn()?
            .execute(
                "UPDATE tokens SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                params![id, now_rfc3339()],
            )
            .map_err(|e| self.err(e))?;
        Ok(n > 0)
    }

    fn store_http_event(
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

    fn http_event_stream(&self, seq: i64) -> Result<Option<String>> {
        self.conn()?
            .query_row(
                "SELECT stream_id FROM http_events WHERE seq = ?1",
                [seq],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    fn http_events_after(&self, stream_id: &str, seq: i64) -> Result<Vec<StoredEvent>> {
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

    fn record_http_stream(&self, s: &StreamRecord) -> Result<()> {
        self.conn()?
            .execute(
                "INSERT OR IGNORE INTO http_streams (stream_id, session_id, actor, request, opened_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![s.stream_id, s.session_id, s.actor, s.request, now_ms()],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn http_stream(&self, stream_id: &str) -> Result<Option<StreamRecord>> {
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

    fn store_http_session(&self, id: &str, state: &str) -> Result<()> {
        self.conn()?
            .execute(
                "INSERT INTO http_sessions (id, created_at, state) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET state = excluded.state",
                params![id, now_rfc3339(), state],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn bind_http_session(&self, id: &str, actor: &str) -> Result<()> {
        self.conn()?
            .execute(
                "INSERT INTO http_sessions (id, actor, created_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT(id) DO UPDATE SET actor = COALESCE(actor, excluded.actor)",
                params![id, actor, now_rfc3339()],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn http_session(&self, id: &str) -> Result<Option<(Option<String>, Option<String>)>> {
        self.conn()?
            .query_row(
                "SELECT actor, state FROM http_sessions WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    fn delete_http_session(&self, id: &str) -> Result<()> {
        self.conn()?
            .execute("DELETE FROM http_sessions WHERE id = ?1", [id])
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn execution_by_correlation(&self, correlation: &str) -> Result<Option<String>> {
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

    fn prune_http_events(&self, before_ms: i64) -> Result<usize> {
        let c = self.conn()?;
        let n = c
            .execute("DELETE FROM http_events WHERE at_ms < ?1", [before_ms])
            .map_err(|e| self.err(e))?;
        c.execute("DELETE FROM http_streams WHERE opened_ms < ?1", [before_ms])
            .map_err(|e| self.err(e))?;
        // (created_at is RFC 3339 text; julianday reads it)
        c.execute(
            "DELETE FROM http_sessions WHERE julianday(created_at) * 86400000.0
                                             - 210866760000000.0 < ?1",
            [before_ms],
        )
        .map_err(|e| self.err(e))?;
        Ok(n)
    }

    fn execution_by_correlation_after(
        &self,
        correlation: &str,
        after_seq: i64,
    ) -> Result<Option<String>> {
        self.conn()?
            .query_row(
                "SELECT execution_id FROM events
                 WHERE seq > ?2 AND kind IN ('correlation', 'intent-matched', 'request-reused')
                   AND json_extract(evidence, '$.correlation_id') = ?1
                 ORDER BY seq DESC LIMIT 1",
                params![correlation, after_seq],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }
}

impl super::sqlite::Sqlite {
    pub(super) fn last_event_seq(&self) -> Result<i64> {
        self.conn()?
            .query_row("SELECT COALESCE(MAX(seq), 0) FROM events", [], |r| r.get(0))
            .map_err(|e| self.err(e))
    }

    pub(super) fn metrics(&self) -> Result<JournalMetrics> {
        let c = self.conn()?;
        let e = |e| self.err(e);
        let mut m = JournalMetrics::default();
        let mut st = c
            .prepare(
                "SELECT st, COUNT(*) FROM (
                    SELECT (SELECT v.state FROM events v
                            WHERE v.execution_id = x.id AND v.state IS NOT NULL
                            ORDER BY v.seq DESC LIMIT 1) AS st
                    FROM executions x)
                 WHERE st IS NOT NULL GROUP BY st ORDER BY st",
            )
            .map_err(e)?;
        m.by_state = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(e)?;
        let mut st = c
            .prepare(
                "SELECT (julianday(d.at) - julianday(a.at)) * 86400.0
                 FROM events a JOIN events d
                   ON d.seq = (SELECT MIN(seq) FROM events
                               WHERE execution_id = a.execution_id AND kind = 'dispatched')
                 WHERE a.kind = 'accepted'",
            )
            .map_err(e)?;
        m.dispatch_latencies = st
            .query_map([], |r| r.get::<_, Option<f64>>(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(e)?
            .into_iter()
            .flatten()
            .map(|s| s.max(0.0))
            .collect();
        let count = |kind: &str| -> Result<u64> {
            c.query_row("SELECT COUNT(*) FROM events WHERE kind = ?1", [kind], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n.max(0) as u64)
            .map_err(e)
        };
        m.attached_by_intent = count("intent-matched")?;
        m.attached_by_id = count("request-reused")?;
        m.delivery_abandoned = count("delivery-abandoned")?;
        m.reconnects = c
            .query_row(
                "SELECT COALESCE(SUM(json_extract(evidence, '$.reconnects')), 0) FROM events
                 WHERE state IS NOT NULL",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map_err(e)?
            .max(0) as u64;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_streams_and_sessions_are_pruned_by_age_only() {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::open(&d.path().join("j.db")).unwrap();
        let seq = j.store_http_event("s1", Some(3000), None).unwrap();
        j.store_http_session("se", "{}").unwrap();
        assert_eq!(j.prune_http_events(0).unwrap(), 0, "nothing is that old");
        assert_eq!(j.http_event_stream(seq).unwrap().as_deref(), Some("s1"));
        assert!(j.http_session("se").unwrap().is_some());
        assert_eq!(j.prune_http_events(now_ms() + 60_000).unwrap(), 1);
        assert_eq!(j.http_event_stream(seq).unwrap(), None);
        assert!(j.http_session("se").unwrap().is_none());
    }
}
