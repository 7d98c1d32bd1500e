//! Named operations: operator-written contracts that gateways expose as tools instead of a shell.
//!
//! An operations file (TOML; `docs/OPERATIONS.md` is its reference) declares operations such as
//! `deploy_release(service, version, region)`: typed arguments, an argv template whose
//! placeholders are whole words, where it may run, its operation class, retention, timeout,
//! approval rule, secret names, working directory and environment, and which arguments form the
//! intent fingerprint. Each operation's **replay contract** (what happens when a caller loses the
//! response) is derived from those fields and written next to it wherever it is exposed.
//!
//! - [`contract`]: the file format, parsing, and a call's canonical arguments, command and intent.
//! - [`check`]: the safety rules every file must pass before it is used (`cairn ops check`).
//! - [`doc`]: the contract in plain words and as data (MCP `_meta`), and `cairn ops doc`.
//! - [`call`]: running a call through the executor, for the CLI and the gateways.
//! - one MCP tool per operation: `crate::front::mcp::operations`, in the MCP front.
//!
//! Loading a file runs every check: a server never exposes an operation that `ops check` refuses.

pub mod call;
pub mod check;
pub mod contract;
pub mod doc;

pub use contract::{Call, Operation, OperationsFile};

/// Why an operations file cannot be used: it cannot be read, or the checks found something
/// in it (the message lists every finding with its line and a fix).
///
/// Layer: named operations (`src/operations/**`), for loading the file. The CLI converts it
/// with `From<OperationsError> for ExecError` into
/// [`ExecError::Setup`](crate::error::ExecError::Setup). A call of an operation is checked by
/// the contract's parsers (`contract.rs`, [`call::prepare`]), which return the located message
/// itself: the caller wraps it as `ExecError::InvalidRequest` or `GatewayError::params`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperationsError {
    /// The file could not be read.
    #[error("operations file {}: {source}", path.display())]
    Unreadable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The checks found something; the text is every finding, rendered.
    #[error("{0}")]
    Refused(String),
}

impl From<OperationsError> for crate::error::ExecError {
    fn from(e: OperationsError) -> Self {
        crate::error::ExecError::Setup(e.to_string())
    }
}

/// Load and check an operations file; every finding is an error (with its line and a fix).
pub fn load(path: &std::path::Path) -> Result<OperationsFile, OperationsError> {
    let text = std::fs::read_to_string(path).map_err(|source| OperationsError::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    let shown = path.display().to_string();
    OperationsFile::parse(&text, &shown)
        .map_err(|findings| OperationsError::Refused(check::render(&shown, &findings)))
}
