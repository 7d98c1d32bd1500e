//! What the command line reads from the journal, asked of the executor instead of reaching
//! through it (`ex.journal`): the executions recorded (`cairn gc` visits the places they were
//! dispatched to), an execution's record (`cairn status`), the pruning of local cursors.
//!
//! Methods of [`Executor`] written beside the command line, so that `src/exec/` stays
//! the driver of executions and the journal behind it can change without the CLI knowing its
//! methods. (The end of a session: `Executor::end_session`, beside the fleet.)

use crate::executor::{ExecError, Executor};
use crate::id::ExecutionId;
use crate::journal::{ExecutionRecord, Status};

impl Executor {
    /// Every execution the journal recorded, with its state (`cairn gc`).
    pub fn recorded_executions(&self) -> Result<Vec<(ExecutionRecord, Status)>, ExecError> {
        Ok(self.journal.list()?)
    }

    /// An execution's record (where and what it ran), if the journal has it.
    pub fn execution_record(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>, ExecError> {
        Ok(self.journal.execution(id)?)
    }

    /// Drop the local read cursors no execution needs any more; how many went.
    pub fn prune_local_cursors(&self) -> Result<usize, ExecError> {
        Ok(self.journal.prune_cursors()?)
    }
}
