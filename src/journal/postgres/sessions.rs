//! Sessions and batches on a PostgreSQL journal: the SQL of each session's own chain of entries
//! (a session is one process: one replica; the procedure is `journal/sessions.rs`, shared with
//! SQLite), and the batches that group executions.

use super::{Pg, Tx};
use crate::id::ExecutionId;
use crate::journal::sessions::{write_in, SessionBook, SessionEntry, SessionWrite};
use crate::journal::{
    client_identity, now_rfc3339, BatchMember, BatchRecord, Result, SessionRecord, SessionView,
};

/// PostgreSQL's book: one transaction; a chain per session, its head in `session_heads` (seqs
/// from one sequence, so that a session's seqs rise without a gap-free counter to contend on).
struct PgSessions<'a, 'b> {
    pg: &'a Pg,
    tx: &'a Tx<'b>,
}

impl SessionBook for PgSessions<'_, '_> {
    async fn insert_session(&mut self, s: &SessionRecord) -> Result<()> {
        self.tx
            .execute(
                "WITH s AS (
                    INSERT INTO sessions (id, kind, actor, pid, client, started_at, detail)
                    VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id)
                 INSERT INTO session_heads (session_id, seq, hash) SELECT id, 0, '' FROM s",
                &[
                    &s.id,
                    &s.kind,
                    &s.actor,
                    &s.pid,
                    &s.client,
                    &s.started_at,
                    &s.detail.to_string(),
                ],
            )
            .await
            .map(|_| ())
            .map_err(|e| self.pg.err(e))
    }

    async fn next(&mut self, session: &str) -> Result<(i64, String)> {
        let head = self
            .tx
            .query_opt(
                "UPDATE session_heads SET seq = nextval('session_event_seq') WHERE session_id = $1
                 RETURNING hash, seq",
                &[&session],
            )
            .await
            .map_err(|e| self.pg.err(e))?
            .ok_or_else(|| {
                self.pg
                    .fail(format!("no session {session} in this journal"))
            })?;
        Ok((head.get(1), head.get(0)))
    }

    async fn insert(&mut self, e: &SessionEntry<'_>) -> Result<()> {
        self.tx
            .execute(
                "WITH e AS (
                    INSERT INTO session_events (seq, session_id, at, kind, evidence, prev_hash, hash)
                    VALUES ($1, $2, $3, $4, $5, $6, $7))
                 UPDATE session_heads SET hash = $7 WHERE session_id = $2",
                &[
                    &e.seq,
                    &e.session,
                    &e.at,
                    &e.kind,
                    &e.evidence,
                    &e.prev_hash,
                    &e.hash,
                ],
            )
            .await
            .map(|_| ())
            .map_err(|e| self.pg.err(e))
    }
}

impl Pg {
    /// Record the start of a session: its row, head and `started` entry in one transaction.
    pub(in crate::journal) fn start_session(&self, s: &SessionRecord) -> Result<()> {
        self.write_session(SessionWrite::Start(s))
    }

    /// Append a session event (`ended`, `request` …).
    pub(in crate::journal) fn session_event(
        &self,
        session: &str,
        kind: &str,
        evidence: &serde_json::Value,
    ) -> Result<()> {
        self.write_session(SessionWrite::Entry {
            session,
            kind,
            evidence,
        })
    }

    /// `w` in one transaction ([`write_in`]).
    fn write_session(&self, w: SessionWrite<'_>) -> Result<()> {
        self.block(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            write_in(&mut PgSessions { pg: self, tx: &tx }, w).await?;
            tx.commit().await.map_err(|e| self.err(e))
        })
    }

    pub(in crate::journal) fn sessions(&self) -> Result<Vec<SessionView>> {
        let rows = self.query(
            "SELECT s.id, s.kind, s.actor, s.pid, s.client, s.started_at, s.detail,
                (SELECT at FROM session_events e WHERE e.session_id = s.id AND e.kind = 'ended'
                    ORDER BY seq DESC LIMIT 1),
                (SELECT COUNT(*) FROM executions x WHERE x.session_id = s.id)
             FROM sessions s ORDER BY s.started_at DESC, s.id DESC",
            &[],
        )?;
        Ok(rows
            .iter()
            .map(|r| SessionView {
                record: SessionRecord::from_pg_row(r),
                ended_at: r.get(7),
                executions: r.get::<_, i64>(8).max(0) as u64,
            })
            .collect())
    }
}

impl crate::journal::backend::BatchStore for Pg {
    fn create_batch(
        &self,
        id: &str,
        command: &[u8],
        options: &serde_json::Value,
        members: &[(String, ExecutionId)],
    ) -> Result<()> {
        self.block(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            tx.execute(
                "INSERT INTO batches (id, created_at, command, options, client)
                 VALUES ($1, $2, $3, $4, $5)",
                &[
                    &id,
                    &now_rfc3339(),
                    &command,
                    &options.to_string(),
                    &client_identity(),
                ],
            )
            .await
            .map_err(|e| self.err(e))?;
            for (i, (dest, ex)) in members.iter().enumerate() {
                tx.execute(
                    "INSERT INTO batch_members (batch_id, position, destination, execution_id)
                     VALUES ($1, $2, $3, $4)",
                    &[&id, &(i as i64), dest, &ex.as_str()],
                )
                .await
                .map_err(|e| self.err(e))?;
            }
            tx.commit().await.map_err(|e| self.err(e))
        })
    }

    fn batch(&self, id: &str) -> Result<Option<BatchRecord>> {
        let Some(head) = self.query_opt(
            "SELECT id, created_at, command, options, client FROM batches WHERE id = $1",
            &[&id],
        )?
        else {
            return Ok(None);
        };
        let members = self
            .query(
                "SELECT position, destination, execution_id FROM batch_members
                 WHERE batch_id = $1 ORDER BY position",
                &[&id],
            )?
            .iter()
            .map(|r| BatchMember {
                position: r.get(0),
                destination: r.get(1),
                execution_id: r.get(2),
            })
            .collect();
        Ok(Some(BatchRecord {
            id: head.get(0),
            created_at: head.get(1),
            command: head.get(2),
            options: serde_json::from_str(head.get::<_, &str>(3)).unwrap_or_default(),
            client: head.get(4),
            members,
        }))
    }

    fn batch_ids(&self) -> Result<Vec<String>> {
        Ok(self
            .query("SELECT id FROM batches ORDER BY created_at, id", &[])?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }
}
