//! What the fronts read from and record in an execution's journal, asked of the executor
//! instead of reaching through it (`ex.journal`): an execution's review record and timeline,
//! the life of its MCP task, the `attached` event of a front's caller, the executions
//! waiting for review.
//!
//! These are methods of [`Executor`] written here, beside the fronts that need them, so that
//! `src/exec/` stays the driver of executions and the journal behind it can change
//! without the fronts knowing its methods.

use crate::evidence::Evidence;
use crate::executor::{ExecError, Executor};
use crate::id::ExecutionId;
use crate::journal::Event;
use crate::review::ReviewRecord;

impl Executor {
    /// An execution's review record: when it was accepted and first dispatched, its intent,
    /// and any decision a human recorded (`status`, an MCP task's creation time).
    pub fn review_record(&self, id: &ExecutionId) -> Result<ReviewRecord, ExecError> {
        crate::review::record(&self.journal, id)
    }

    /// An execution's events in journal order (`status`'s timeline, an MCP task's last update).
    pub fn timeline(&self, id: &ExecutionId) -> Result<Vec<Event>, ExecError> {
        Ok(self.journal.events(id)?)
    }

    /// How long an MCP task of this execution is kept, in milliseconds: the retention of its
    /// intent; `None` without one (a host never identified) or when the journal cannot say.
    pub fn task_ttl_ms(&self, id: &ExecutionId) -> Option<u64> {
        self.journal
            .intent_of(id)
            .ok()
            .flatten()
            .map(|c| c.retention_secs * 1000)
    }

    /// Record that a front's caller attached to an execution (its correlation ID and the
    /// server's session), before the front waits for the outcome.
    pub fn record_attached(
        &mut self,
        id: &ExecutionId,
        correlation_id: &str,
        session_id: Option<&str>,
    ) -> Result<(), ExecError> {
        self.journal.append_evidence(
            id,
            Evidence::Attached {
                correlation_id,
                session_id,
                method: (),
            },
        )?;
        Ok(())
    }
}

impl Executor {
    /// The executions waiting for a human (`unknown` or `interrupted`, not yet resolved),
    /// with their original record (`review`).
    pub fn pending_reviews(&self) -> Result<Vec<ReviewRecord>, ExecError> {
        crate::review::pending(&self.journal)
    }
}
