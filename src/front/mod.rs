//! The fronts of a server: each knows its wire format; nothing below them does.
//!
//! - [`gateway`]: the operations every server front exposes, as JSON (one place for them).
//! - [`rpc`]: the JSON-RPC method table, written once for [`stdio`] and `POST /rpc`.
//! - [`stdio`]: `cairn serve --stdio`, JSON-RPC 2.0 on stdin/stdout.
//! - [`http`]: `cairn mcp --listen`: MCP over Streamable HTTP and JSON-RPC at `/rpc`, behind
//!   bearer tokens ([`token`]) that decide each request's actor ([`caller`]).
//! - `ledger`: what the fronts read from and record in the journal, as methods of the
//!   executor (no front reaches through it into the journal).
//! - [`mcp`], [`tasks`], [`tool_result`]: MCP on stdio and over HTTP; MCP tasks keyed by
//!   execution; a tool's result as MCP content.
//!
//! The command line (`crate::cli`) and `cairn run --hosts` (`crate::fleet`) are the operator's
//! fronts and stay beside this folder.

pub mod caller;
pub mod gateway;
pub mod http;
mod ledger;
pub mod mcp;
pub mod rpc;
pub mod stdio;
pub mod tasks;
pub mod token;
pub mod tool_result;
