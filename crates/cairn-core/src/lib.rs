//! cairn's pure core: the decisions about an execution, with no I/O.
//!
//! Nothing here opens a socket, a file or a database or spawns a task; the machine reads no clock
//! (it takes `now` as an input; only a new execution ID, a UUIDv7, reads the time). The `cairn` crate drives it over SSH and the journal and
//! re-exports each module under its old path (`cairn::state`, `cairn::machine` …). This crate's
//! dependency list holds the boundary: it has no tokio, rusqlite, russh or clap to call.
//!
//! - [`machine`]: one drive of an execution as a state machine (events and `now` in, the next
//!   step out), and its tests for every disconnect point.
//! - [`recovery`]: the recovery table (journal × probe → action), the reconnect window and the
//!   backoff arithmetic.
//! - [`epoch`]: host epochs as evidence: which epoch an execution is bound to.
//! - [`state`], [`id`], [`event`]: the lifecycle states; execution IDs; the kinds of journal
//!   events as typed values.

pub mod epoch;
pub mod event;
pub mod id;
pub mod machine;
pub mod recovery;
pub mod state;
