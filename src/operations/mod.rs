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

/// Load and check an operations file; every finding is an error (with its line and a fix).
pub fn load(path: &std::path::Path) -> Result<OperationsFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("operations file {}: {e}", path.display()))?;
    let shown = path.display().to_string();
    OperationsFile::parse(&text, &shown).map_err(|findings| check::render(&shown, &findings))
}
