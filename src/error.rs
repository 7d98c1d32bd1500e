//! The error that ends an operation before an outcome could be recorded.
//!
//! Its own module so that every layer below the executor (review, the gateway operations) can
//! return it without depending on the executor.

use crate::journal::JournalError;
use crate::ssh::SshError;

/// Exit code when nothing was dispatched (as `ssh` uses 255 for its own errors).
pub const EXIT_NOT_DISPATCHED: i32 = 255;
/// Exit code when the outcome is `interrupted` or `unknown`.
pub const EXIT_UNKNOWN: i32 = 254;

/// Errors that end an operation before an outcome could be recorded.
///
/// Layer: the executor and everything that drives it (review, the runner, the CLI, the
/// gateway operations). The layers below convert into it at their boundary: `SshError` and
/// `JournalError` by `#[from]`, `AuditError`, `ApproveError`, `OperationsError` and the
/// HTTP front's `HttpError` into [`ExecError::Setup`] by their `From` impls. The fronts convert
/// it last: `GatewayError::exec` (JSON-RPC, MCP, HTTP) and `cli::main` (exit codes).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    #[error(transparent)]
    Ssh(#[from] SshError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The request cannot be used as given: a malformed execution ID, `--env` pair,
    /// destination or command; flags that contradict each other; an intent, a marker home or
    /// operation arguments that fail validation; a batch or token it names that is not there.
    /// Nothing was sent to any host. The caller fixes the request and sends it again.
    #[error("{0}")]
    InvalidRequest(String),
    /// cairn declines to do what was asked, though the request is well formed: a rule of this
    /// cairn (`--host-helper always` on a host whose helper cannot run, `--listen` on another
    /// machine's address without `--allow-remote`) or the journal's record forbids it (a retry
    /// of an execution that may have started, a resolution of one not under review, a batch ID
    /// in use, an execution ID another process accepted at the same moment). The same request
    /// gets the same answer; the message says what to do instead.
    #[error("{0}")]
    Refused(String),
    /// Something on this machine that cairn needs could not be used: a file it reads (the
    /// operations file, an inventory, the approval policy, the intent key, a TLS certificate,
    /// the journal to verify), a secret missing from its environment, a socket to listen on,
    /// or the server it runs. The request itself was fine; the operator fixes the setup and
    /// runs it again.
    #[error("{0}")]
    Setup(String),
    /// The host answered, and its answer ends the operation: an error line of the marker
    /// protocol, no answer in that protocol at all, no record of the execution, or output that
    /// `cairn gc` removed. Nothing new was dispatched; the message quotes the host.
    #[error("{0}")]
    HostReported(String),
    /// cairn's own bookkeeping went wrong (a step without its connection, a batch member whose
    /// ID does not parse, intent matching that did not settle): a bug or a race it could not
    /// settle, never the caller's doing. Sending the same request again (same ID) attaches to
    /// whatever did happen.
    #[error("{0}")]
    Internal(String),
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

    /// The JSON-RPC error code every gateway front (`cairn serve`, `cairn mcp`, HTTP, the
    /// operations' `call`) answers this error with (documented in docs/GATEWAYS.md):
    /// `-32602` invalid params when the caller must change the request (invalid, refused, an
    /// ID reused for another command), `-32004` no such execution, `-32603` internal error,
    /// and `-32000` for everything else: the host, the connection, the journal, this server's
    /// setup, and an execution left unsettled past its dispatch (whatever its cause).
    pub fn rpc_code(&self) -> i64 {
        match self {
            ExecError::InvalidRequest(_) | ExecError::Refused(_) | ExecError::IdConflict { .. } => {
                -32602
            }
            ExecError::NoSuchExecution(..) => -32004,
            ExecError::Internal(_) => -32603,
            ExecError::Ssh(_)
            | ExecError::Journal(_)
            | ExecError::Setup(_)
            | ExecError::HostReported(_)
            | ExecError::Output(_)
            | ExecError::Unsettled { .. } => -32000,
        }
    }

    /// The process exit code the CLI ends with on this error (documented in the README):
    /// `254` (outcome unknown) when the execution crossed the dispatch boundary, else `255`
    /// (nothing was dispatched).
    pub fn exit_code(&self) -> i32 {
        match self {
            ExecError::Unsettled { .. } => EXIT_UNKNOWN,
            _ => EXIT_NOT_DISPATCHED,
        }
    }
}

/// The intent key file is local setup: an `IntentError` ends the operation as `Setup`. (Written
/// here, above `intent`, so that `intent` names no layer above it.)
impl From<crate::intent::IntentError> for ExecError {
    fn from(e: crate::intent::IntentError) -> ExecError {
        ExecError::Setup(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every() -> Vec<(ExecError, i64, i32)> {
        let s = || "m".to_owned();
        let unsettled = |source: ExecError| ExecError::Unsettled {
            id: "ex_1".into(),
            source: Box::new(source),
        };
        vec![
            (ExecError::Ssh(SshError::Disconnected(s())), -32000, 255),
            (
                ExecError::Journal(JournalError::Io {
                    path: "j".into(),
                    message: s(),
                }),
                -32000,
                255,
            ),
            (ExecError::InvalidRequest(s()), -32602, 255),
            (ExecError::Refused(s()), -32602, 255),
            (ExecError::Setup(s()), -32000, 255),
            (ExecError::HostReported(s()), -32000, 255),
            (ExecError::Internal(s()), -32603, 255),
            (ExecError::NoSuchExecution(s(), s()), -32004, 255),
            (
                ExecError::IdConflict {
                    id: s(),
                    recorded: s(),
                    requested: s(),
                },
                -32602,
                255,
            ),
            (ExecError::Output(std::io::Error::other("m")), -32000, 255),
            // Past the dispatch boundary the cause does not matter: the outcome is unknown.
            (unsettled(ExecError::InvalidRequest(s())), -32000, 254),
            (unsettled(ExecError::HostReported(s())), -32000, 254),
            (unsettled(ExecError::NoSuchExecution(s(), s())), -32000, 254),
        ]
    }

    #[test]
    fn every_variant_has_its_rpc_code_and_exit_code() {
        for (e, rpc, exit) in every() {
            assert_eq!(e.rpc_code(), rpc, "{e:?}");
            assert_eq!(e.exit_code(), exit, "{e:?}");
        }
    }

    #[test]
    fn typed_variants_show_their_message_as_given() {
        for e in [
            ExecError::InvalidRequest("--env \"x\": expected NAME=VALUE".into()),
            ExecError::Refused("--host-helper always: no".into()),
            ExecError::Setup("cannot listen on 127.0.0.1:1: busy".into()),
            ExecError::HostReported("the host reported: disk full".into()),
            ExecError::Internal("internal: no connection".into()),
        ] {
            let m = match &e {
                ExecError::InvalidRequest(m)
                | ExecError::Refused(m)
                | ExecError::Setup(m)
                | ExecError::HostReported(m)
                | ExecError::Internal(m) => m.clone(),
                _ => unreachable!(),
            };
            assert_eq!(e.to_string(), m);
        }
    }
}
