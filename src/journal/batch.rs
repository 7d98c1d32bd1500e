//! Fleet batches (issue 5): which hosts a `cairn run --hosts …` covered, and the execution ID
//! chosen for each before anything was dispatched. A member whose execution ID is not in
//! `executions` was never accepted: cairn stopped before reaching it, so `cairn batch resume`
//! may start it.

use rusqlite::{params, OptionalExtension};
use serde::Serialize;

use super::{client_identity, now_rfc3339, Journal, Result};
use crate::id::ExecutionId;

/// One host of a batch.
#[derive(Clone, Debug, Serialize)]
pub struct BatchMember {
    pub position: i64,
    pub destination: String,
    pub execution_id: String,
}

/// A batch as recorded when it was created.
#[derive(Clone, Debug, Serialize)]
pub struct BatchRecord {
    pub id: String,
    pub created_at: String,
    #[serde(skip)]
    pub command: Vec<u8>,
    pub options: serde_json::Value,
    pub client: String,
    pub members: Vec<BatchMember>,
}

impl BatchRecord {
    pub fn command_display(&self) -> String {
        String::from_utf8_lossy(&self.command).into_owned()
    }
}

impl Journal {
    /// Record a batch and all its members in one transaction, before any dispatch.
    /// Fails if the batch ID exists.
    pub fn create_batch(
        &mut self,
        id: &str,
        command: &[u8],
        options: &serde_json::Value,
        members: &[(String, ExecutionId)],
    ) -> Result<()> {
        self.backend().create_batch(id, command, options, members)
    }

    /// One batch with its members, in order.
    pub fn batch(&self, id: &str) -> Result<Option<BatchRecord>> {
        self.backend().batch(id)
    }

    /// Every batch ID, oldest first.
    pub fn batch_ids(&self) -> Result<Vec<String>> {
        self.backend().batch_ids()
    }
}

/// The SQLite side of these methods ([`super::backend::Backend`] for [`super::sqlite::Sqlite`]).
impl super::sqlite::Sqlite {
    /// Add the batch tables to a journal made before them (schema version 1 is unreleased).
    pub(super) fn add_batch_schema(&self, c: &rusqlite::Connection) -> Result<()> {
        self.add_tables(
            c,
            "batch_members",
            "BEGIN IMMEDIATE;
                 CREATE TABLE IF NOT EXISTS batches (
                    id TEXT PRIMARY KEY,
                    created_at TEXT NOT NULL,
                    command BLOB NOT NULL,
                    options TEXT NOT NULL,
                    client TEXT NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS batch_members (
                    batch_id TEXT NOT NULL REFERENCES batches(id),
                    position INTEGER NOT NULL,
                    destination TEXT NOT NULL,
                    execution_id TEXT NOT NULL,
                    PRIMARY KEY (batch_id, position)
                 );
                 COMMIT;",
        )
    }
}

impl super::backend::BatchStore for super::sqlite::Sqlite {
    fn create_batch(
        &self,
        id: &str,
        command: &[u8],
        options: &serde_json::Value,
        members: &[(String, ExecutionId)],
    ) -> Result<()> {
        let path = self.path.clone();
        let e = |source| super::JournalError::Sqlite {
            path: path.clone(),
            source,
        };
        let mut lease = self.conn()?;
        let tx = lease
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(e)?;
        tx.execute(
            "INSERT INTO batches (id, created_at, command, options, client) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, now_rfc3339(), command, options.to_string(), client_identity()],
        )
        .map_err(e)?;
        for (i, (dest, ex)) in members.iter().enumerate() {
            tx.execute(
                "INSERT INTO batch_members (batch_id, position, destination, execution_id)
                 VALUES (?1, ?2, ?3, ?4)",
                params![id, i as i64, dest, ex.as_str()],
            )
            .map_err(e)?;
        }
        tx.commit().map_err(e)
    }

    fn batch(&self, id: &str) -> Result<Option<BatchRecord>> {
        let head = self
            .conn()?
            .query_row(
                "SELECT id, created_at, command, options, client FROM batches WHERE id = ?1",
                params![id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, Vec<u8>>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                    ))
                },
            )
            .optional()
            .map_err(|e| self.err(e))?;
        let Some((id, created_at, command, options, client)) = head else {
            return Ok(None);
        };
        let lease = self.conn()?;
        let mut st = lease
            .prepare(
                "SELECT position, destination, execution_id FROM batch_members
                 WHERE batch_id = ?1 ORDER BY position",
            )
            .map_err(|e| self.err(e))?;
        let members = st
            .query_map(params![id], |r| {
                Ok(BatchMember {
                    position: r.get(0)?,
                    destination: r.get(1)?,
                    execution_id: r.get(2)?,
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))?;
        Ok(Some(BatchRecord {
            id,
            created_at,
            command,
            options: serde_json::from_str(&options).unwrap_or_default(),
            client,
            members,
        }))
    }

    fn batch_ids(&self) -> Result<Vec<String>> {
        let lease = self.conn()?;
        let mut st = lease
            .prepare("SELECT id FROM batches ORDER BY created_at, id")
            .map_err(|e| self.err(e))?;
        st.query_map([], |r| r.get(0))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<String>>>())
            .map_err(|e| self.err(e))
    }
}
