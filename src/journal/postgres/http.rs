//! API tokens and the HTTP gateway's records on a PostgreSQL journal: its event streams (for
//! resumable SSE), its MCP sessions, and their pruning.

use super::Pg;
use crate::journal::backend::HttpStore;
use crate::journal::{now_ms, now_rfc3339, Result, StoredEvent, StreamRecord, TokenRecord};

impl Pg {
    fn tokens_where(&self, by_hash: Option<&str>) -> Result<Vec<TokenRecord>> {
        let rows = self.query(
            "SELECT id, hash, actor, scope_prefix, created_at, expires_at, expires_ms, revoked_at
             FROM tokens WHERE $1::text IS NULL OR hash = $1 ORDER BY created_at, id",
            &[&by_hash],
        )?;
        Ok(rows
            .iter()
            .map(|r| TokenRecord {
                id: r.get(0),
                hash: r.get(1),
                actor: r.get(2),
                scope_prefix: r.get(3),
                created_at: r.get(4),
                expires_at: r.get(5),
                expires_ms: r.get(6),
                revoked_at: r.get(7),
            })
            .collect())
    }
}

impl HttpStore for Pg {
    fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        Ok(self.tokens_where(Some(hash))?.pop())
    }

    fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.tokens_where(None)
    }

    fn execution_by_correlation(&self, correlation: &str) -> Result<Option<String>> {
        self.execution_by_correlation_after(correlation, 0)
    }

    fn add_token(&self, t: &TokenRecord) -> Result<()> {
        self.exec(
            "INSERT INTO tokens (id, hash, actor, scope_prefix, created_at, expires_at,
                                 expires_ms, revoked_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, NULL)",
            &[
                &t.id,
                &t.hash,
                &t.actor,
                &t.scope_prefix,
                &t.created_at,
                &t.expires_at,
                &t.expires_ms,
            ],
        )
        .map(|_| ())
    }

    fn revoke_token(&self, id: &str) -> Result<bool> {
        Ok(self.exec(
            "UPDATE tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL",
            &[&id, &now_rfc3339()],
        )? > 0)
    }

    fn store_http_event(
        &self,
        stream_id: &str,
        retry_ms: Option<i64>,
        message: Option<&str>,
    ) -> Result<i64> {
        let r = self.query_opt(
            "INSERT INTO http_events (stream_id, at_ms, retry_ms, message)
             VALUES ($1, $2, $3, $4) RETURNING seq",
            &[&stream_id, &now_ms(), &retry_ms, &message],
        )?;
        r.map(|r| r.get(0))
            .ok_or_else(|| self.fail("the insert returned no sequence"))
    }

    fn http_event_stream(&self, seq: i64) -> Result<Option<String>> {
        Ok(self
            .query_opt("SELECT stream_id FROM http_events WHERE seq = $1", &[&seq])?
            .map(|r| r.get(0)))
    }

    fn http_events_after(&self, stream_id: &str, seq: i64) -> Result<Vec<StoredEvent>> {
        Ok(self
            .query(
                "SELECT seq, stream_id, retry_ms, message FROM http_events
                 WHERE stream_id = $1 AND seq > $2 ORDER BY seq",
                &[&stream_id, &seq],
            )?
            .iter()
            .map(|r| StoredEvent {
                seq: r.get(0),
                stream_id: r.get(1),
                retry_ms: r.get(2),
                message: r.get(3),
            })
            .collect())
    }

    fn record_http_stream(&self, s: &StreamRecord) -> Result<()> {
        self.exec(
            "INSERT INTO http_streams (stream_id, session_id, actor, request, opened_ms)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            &[&s.stream_id, &s.session_id, &s.actor, &s.request, &now_ms()],
        )
        .map(|_| ())
    }

    fn http_stream(&self, stream_id: &str) -> Result<Option<StreamRecord>> {
        Ok(self
            .query_opt(
                "SELECT stream_id, session_id, actor, request FROM http_streams
                 WHERE stream_id = $1",
                &[&stream_id],
            )?
            .map(|r| StreamRecord {
                stream_id: r.get(0),
                session_id: r.get(1),
                actor: r.get(2),
                request: r.get(3),
            }))
    }

    fn store_http_session(&self, id: &str, state: &str) -> Result<()> {
        self.exec(
            "INSERT INTO http_sessions (id, created_at, created_ms, state) VALUES ($1, $2, $3, $4)
             ON CONFLICT (id) DO UPDATE SET state = excluded.state",
            &[&id, &now_rfc3339(), &now_ms(), &state],
        )
        .map(|_| ())
    }

    fn bind_http_session(&self, id: &str, actor: &str) -> Result<()> {
        self.exec(
            "INSERT INTO http_sessions AS s (id, actor, created_at, created_ms)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (id) DO UPDATE SET actor = COALESCE(s.actor, excluded.actor)",
            &[&id, &actor, &now_rfc3339(), &now_ms()],
        )
        .map(|_| ())
    }

    fn http_session(&self, id: &str) -> Result<Option<(Option<String>, Option<String>)>> {
        Ok(self
            .query_opt(
                "SELECT actor, state FROM http_sessions WHERE id = $1",
                &[&id],
            )?
            .map(|r| (r.get(0), r.get(1))))
    }

    fn delete_http_session(&self, id: &str) -> Result<()> {
        self.exec("DELETE FROM http_sessions WHERE id = $1", &[&id])
            .map(|_| ())
    }

    fn execution_by_correlation_after(
        &self,
        correlation: &str,
        after_seq: i64,
    ) -> Result<Option<String>> {
        Ok(self
            .query_opt(
                "SELECT execution_id FROM events
                 WHERE seq > $2 AND kind IN ('correlation', 'intent-matched', 'request-reused')
                   AND (evidence::jsonb) ->> 'correlation_id' = $1
                 ORDER BY seq DESC LIMIT 1",
                &[&correlation, &after_seq],
            )?
            .map(|r| r.get(0)))
    }

    fn prune_http_events(&self, before_ms: i64) -> Result<usize> {
        self.block(async {
            let c = self.client().await?;
            let n = c
                .execute("DELETE FROM http_events WHERE at_ms < $1", &[&before_ms])
                .await
                .map_err(|e| self.err(e))?;
            for sql in [
                "DELETE FROM http_streams WHERE opened_ms < $1",
                "DELETE FROM http_sessions WHERE created_ms < $1",
            ] {
                c.execute(sql, &[&before_ms])
                    .await
                    .map_err(|e| self.err(e))?;
            }
            Ok(n as usize)
        })
    }
}
