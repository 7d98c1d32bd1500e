//! What `cairn run --hosts` and `cairn batch` read from and record in the journal, asked of
//! the executor instead of reaching through it (`ex.journal`): batches, whether a member was
//! ever accepted and its recorded state, the end of an operator's session (also `cairn run`'s
//! and `cairn op`'s).
//!
//! Methods of [`Executor`] written beside the fleet, so that `src/exec/` stays the
//! driver of executions and the journal behind it can change without the fleet knowing its
//! methods.

use crate::evidence::SessionEvidence;
use crate::executor::{ExecError, Executor};
use crate::id::ExecutionId;
use crate::journal::BatchRecord;
use crate::state::State;

impl Executor {
    /// The batch called `id`, if the journal has one.
    pub fn batch_record(&self, id: &str) -> Result<Option<BatchRecord>, ExecError> {
        Ok(self.journal.batch(id)?)
    }

    /// The batch called `id`; an error naming the journal when it has none.
    pub fn known_batch(&self, id: &str) -> Result<BatchRecord, ExecError> {
        self.batch_record(id)?.ok_or_else(|| {
            ExecError::InvalidRequest(format!(
                "no batch {id} in journal {}",
                self.journal.location()
            ))
        })
    }

    /// The IDs of every batch, oldest first (`cairn batch ls`).
    pub fn batch_ids(&self) -> Result<Vec<String>, ExecError> {
        Ok(self.journal.batch_ids()?)
    }

    /// Record a new batch: its command, options and members (before any member runs).
    pub fn create_batch(
        &mut self,
        id: &str,
        command: &[u8],
        options: &serde_json::Value,
        members: &[(String, ExecutionId)],
    ) -> Result<(), ExecError> {
        Ok(self.journal.create_batch(id, command, options, members)?)
    }

    /// Whether the journal ever accepted the execution (a batch member not yet started has
    /// no record).
    pub fn was_accepted(&self, id: &ExecutionId) -> Result<bool, ExecError> {
        Ok(self.journal.execution(id)?.is_some())
    }

    /// The state its events put the execution in; `None` without events.
    pub fn recorded_state(&self, id: &ExecutionId) -> Result<Option<State>, ExecError> {
        Ok(self.journal.status(id)?.map(|s| s.state))
    }

    /// Record the end of an operator's session (`cairn run`, `cairn op`, a fleet), retried
    /// while the journal is busy; a failure is the caller's to ignore, as its exit code stands.
    pub fn end_session(
        &mut self,
        session: &str,
        evidence: SessionEvidence<'_>,
    ) -> Result<(), ExecError> {
        crate::journal::append_evidence_retrying("the end of the session", || {
            self.journal.session_evidence(session, evidence.clone())
        })?;
        Ok(())
    }
}
