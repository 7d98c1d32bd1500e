//! Sessions and batches on a PostgreSQL journal: each session's own chain of entries (a session
//! is one process: one replica), and the batches that group executions.

use super::{Pg, Tx};
use crate::id::ExecutionId;
use crate::journal::{
    client_identity, now_rfc3339, session_chain_hash, session_started_evidence, BatchMember,
    BatchRecord, ChainFields, Result, SessionRecord, SessionView,
};

impl Pg {
    /// Append a chained entry to `session`'s chain inside `tx`.
    async fn session_append_in(
        &self,
        tx: &Tx<'_>,
        session: &str,
        at: &str,
        kind: &str,
        evidence: &str,
    ) -> Result<()> {
        let head = tx
            .query_opt(
                "UPDATE session_heads SET seq = nextval('session_event_seq') WHERE session_id = $1
                 RETURNING hash, seq",
                &[&session],
            )
            .await
            .map_err(|e| self.err(e))?
            .ok_or_else(|| self.fail(format!("no session {session} in this journal")))?;
        let prev_hash: String = head.get(0);
        let seq: i64 = head.get(1);
        let hash = session_chain_hash(&ChainFields {
            prev_hash: &prev_hash,
            seq,
            execution_id: session,
            at,
            kind,
            state: "",
            evidence,
            client: "",
        });
        tx.execute(
            "WITH e AS (
                INSERT INTO session_events (seq, session_id, at, kind, evidence, prev_hash, hash)
                VALUES ($1, $2, $3, $4, $5, $6, $7))
             UPDATE session_heads SET hash = $7 WHERE session_id = $2",
            &[&seq, &session, &at, &kind, &evidence, &prev_hash, &hash],
        )
        .await
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub(in crate::journal) fn start_session(&self, s: &SessionRecord) -> Result<()> {
        self.block(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            tx.execute(
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
            .map_err(|e| self.err(e))?;
            let evidence = session_started_evidence(s);
            self.session_append_in(&tx, &s.id, &s.started_at, "started", &evidence)
                .await?;
            tx.commit().await.map_err(|e| self.err(e))
        })
    }

    pub(in crate::journal) fn session_event(
        &self,
        session: &str,
        kind: &str,
        evidence: &serde_json::Value,
    ) -> Result<()> {
        self.block(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            self.session_append_in(&tx, session, &now_rfc3339(), kind, &evidence.to_string())
                .await?;
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
                record: SessionRecord {
                    id: r.get(0),
                    kind: r.get(1),
                    actor: r.get(2),
                    pid: r.get(3),
                    client: r.get(4),
                    started_at: r.get(5),
                    detail: serde_json::from_str(r.get::<_, &str>(6)).unwrap_or_default(),
                },
                ended_at: r.get(7),
                executions: r.get::<_, i64>(8).max(0) as u64,
            })
            .collect())
    }

    pub(in crate::journal) fn create_batch(
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

    pub(in crate::journal) fn batch(&self, id: &str) -> Result<Option<BatchRecord>> {
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

    pub(in crate::journal) fn batch_ids(&self) -> Result<Vec<String>> {
        Ok(self
            .query("SELECT id FROM batches ORDER BY created_at, id", &[])?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }
}
