//! cairn runs commands on remote hosts over SSH so that a dropped connection never turns into
//! a second run.
//!
//! Each dispatch gets an execution ID; a supervisor on the host writes a durable marker before
//! the command starts and a finish record when it ends; a local journal records every step.
//! After a reconnect, or after cairn itself was killed, cairn probes the marker and reattaches,
//! returns the stored result, or says plainly that the outcome is unknown. It never just sends
//! the command again.
//!
//! # Surface
//! A gateway embedding cairn builds an [`Executor`] with [`ExecutorBuilder`] (configured by
//! [`options`], authorized by [`approve`]), runs a [`RunRequest`] and reads an [`Outcome`]
//! ([`outcome`] renders it) or an [`ExecError`] ([`error`]), reads the [`journal`], and
//! resolves SSH targets with [`ssh`]. Those modules, [`exec`] (also [`executor`]), [`runner`],
//! [`intent`] and the pure core's modules are the public ones. Every other module in the map
//! below is crate-private (named there without a link). The hidden module `testing` re-exports, item by item, what cairn's
//! own binary, integration tests and benches reach of them; it is not API and has no stability
//! promise.
//!
//! # Map
//! `ARCHITECTURE.md` has the whole picture; `docs/DESIGN.md` is the contract. Edges go one way,
//! from the fronts down:
//!
//! Fronts (each knows its wire format; nothing below them does):
//! - `cli`: the `cairn` command line; the only module that knows clap.
//! - `fleet`: `cairn run --hosts`: batches over many hosts, progress, `cairn batch`.
//! - `front`: the server fronts, one folder:
//!   - `front::gateway`: the operations `cairn serve --stdio` and `cairn mcp` expose, as JSON.
//!   - `front::rpc`: the JSON-RPC method table, written once for stdio and `/rpc`.
//!   - `front::stdio`, `front::mcp`, `front::tasks`: JSON-RPC and MCP on stdio; MCP
//!     tasks keyed by execution.
//!   - `front::http`: `cairn mcp --listen`: MCP over Streamable HTTP and JSON-RPC at `/rpc`,
//!     behind bearer tokens (`front::token`) that decide each request's actor
//!     (`front::caller`).
//!
//!   No front reaches through the executor into the journal: what they read and record
//!   there are methods of [`Executor`] written beside them.
//! - `operations`: named operations with a written replay contract (`cairn op`, `cairn ops`,
//!   JSON-RPC `call`, one MCP tool per operation).
//!
//! Running executions:
//! - [`runner`]: [`ExecutorBuilder`], the session of a front, `recover` over the journal.
//! - `rt`: the process's one async runtime, and which threads may wait on a commit.
//! - [`options`]: the plain option structs the library takes.
//! - [`outcome`]: an outcome as JSON and as one plain sentence; the output kept for it.
//! - [`exec`] (also [`executor`], its old path): sequences accept → dispatch → stream →
//!   reconnect → recover, one room per concern: admission (a request becomes an execution),
//!   claims (the one room for who may dispatch), drive (the driver of [`machine`]: it does the
//!   SSH, journal and clock work and feeds the machine what happened), the host link
//!   (connections, host script and helper), operator commands and outcomes.
//! - [`error`]: [`ExecError`], what ends an operation before an outcome is recorded.
//! - `review`: executions waiting for a human, and `cairn resolve`'s decisions.
//! - [`approve`]: authorization: allow, deny, prompt on a tty, a policy file.
//! - `gate` and `owner`, parts of the executor's claims room kept under their old paths:
//!   one request's dispatch boundary (a caller gone before it means nothing is sent); who may
//!   still dispatch an accepted execution (this process's claims, a live PID), so that no
//!   other process concludes "never dispatched" while its owner sends it.
//!
//! Pure decisions (no I/O): the crate `cairn-core` (`crates/cairn-core`), re-exported here under
//! the same paths; its dependency list keeps tokio, SQLite, SSH and clap out of it. [`intent`]
//! stays in this crate (it reads the key file).
//! - [`machine`]: one drive of an execution as a state machine (events and `now` in, the next
//!   step out): every final decision after connect, dispatch and probe, the reconnect window
//!   and backoff. `recover`, `attach`, runs and `status` all ask it.
//! - [`recovery`]: the recovery table (journal × probe → action), consulted by [`machine`];
//!   the backoff arithmetic.
//! - [`epoch`]: host epochs as evidence: which epoch an execution is bound to.
//! - [`intent`]: the canonical operation record, its keyed fingerprint, operation classes.
//! - [`state`], [`id`], [`event`]: the lifecycle states of docs/DESIGN.md; execution IDs; the
//!   kinds of journal events as typed values.
//!
//! Storage and evidence:
//! - [`journal`]: SQLite journal: executions, append-only hash-chained events, the anchor,
//!   group commit, batches, host bookkeeping, cursors; the executor holds a [`journal::Journal`],
//!   whose store (the SQLite file or the PostgreSQL database) sits behind one private trait.
//! - `evidence`: the evidence of each event the executor appends, as typed values whose JSON
//!   is the journal's format (held byte for byte by the golden journal).
//! - `audit`, `audit_show`: offline verification (`cairn audit verify`) and timelines.
//! - `reach`: how an execution reached its host (recorded at acceptance), so recovery needs
//!   no flags retyped; flags override it part by part.
//!
//! Reaching hosts:
//! - [`ssh`]: russh client: config, known_hosts, auth, keepalive, the quickack stream.
//! - `pool`: SSH connections and host sessions shared by a server's executions.
//! - `session`: host sessions: one long-lived exec per connection starting dispatches in batches.
//! - `marker`: client side of the marker protocol: exec strings, reply parsing.
//!   The host side is `remote-scripts/cairn.sh`, embedded at build time.
//!
//! The decision after a lost connection is [`machine::Machine`] around the table
//! [`recovery::decide`]: both can be read without knowing russh or SQLite.

// The library's surface is the modules declared `pub` here and the re-exports below; every
// other module is crate-private. What the binary, the integration tests and the benches need
// from those is re-exported item by item in the hidden [`testing`] module, which is not API.
pub mod approve;
pub(crate) mod audit;
pub(crate) mod audit_show;
pub(crate) mod cli;
pub mod error;
pub(crate) mod evidence;
pub mod exec;
pub(crate) mod failpoint;
pub(crate) mod fleet;
pub(crate) mod front;
pub(crate) mod host_helper;
pub mod intent;
pub mod journal;
pub(crate) mod marker;
pub(crate) mod operations;
pub mod options;
pub mod outcome;
pub(crate) mod pool;
pub(crate) mod reach;
pub(crate) mod review;
pub(crate) mod rt;
pub mod runner;
pub(crate) mod session;
pub mod ssh;
#[doc(hidden)]
pub mod testing;

// The pure core is its own crate (crates/cairn-core); its modules keep their paths here.
pub use cairn_core::{admission, epoch, event, id, lifecycle, location, machine, recovery, state};

// The executor's old path: `crate::executor::X` and `cairn::executor::X` name the rooms' items.
pub use exec as executor;
// Who may dispatch lives in the executor's claims room; its parts keep their old paths.
pub(crate) use exec::claims::{gate, owner};

pub use event::EventKind;
pub use executor::{ExecError, Executor, Outcome, OutputSink, Patience, RunRequest};
pub use id::ExecutionId;
pub use runner::ExecutorBuilder;
pub use state::State;
