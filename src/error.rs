//! The error that ends an operation before an outcome could be recorded.
//!
//! Its own module so that every layer below the executor (review, the gateway operations) can
//! return it without depending on the executor.

use crate::journal::JournalError;
use crate::ssh::SshError;

/// Errors that end an operation before an outcome could be recorded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    #[error(transparent)]
    Ssh(#[from] SshError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Input(String),
    #[error("no execution {0} in journal {1}")]
    NoSuchExecution(String, String),
    #[error(
        "execution ID {id} already exists in the journal for another operation:\n  \
         recorded: {recorded}\n  requested: {requested}\n\
         Use a new ID, or rerun with exactly the recorded destination and command"
    )]
    IdConflict {
        id: String,
        recorded: String,
        requested: String,
    },
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
    /// The operation failed after the execution crossed the dispatch boundary (its
    /// `dispatched` event is durable): the command may be running or done on the host, so this
    /// is never "nothing was dispatched". The CLI exits 254; `cairn recover` or
    /// `cairn status ID` finds the truth.
    #[error(
        "{source}; execution {id} was dispatched, and its outcome is not known here: \
         `cairn status {id}` or `cairn recover` finds it (do not send it again)"
    )]
    Unsettled {
        id: String,
        #[source]
        source: Box<ExecError>,
    },
}

impl ExecError {
    /// The execution this error leaves unsettled past its dispatch, if any.
    pub fn unsettled_id(&self) -> Option<&str> {
        match self {
            ExecError::Unsettled { id, .. } => Some(id),
            _ => None,
        }
    }
}
