//! The process's one async runtime.
//!
//! Every SSH connection, host session, timer and HTTP listener of the process runs on this
//! runtime's workers (`cairn-rt`): the binary's `main` drives the command on it, pooled
//! connections live on it, and the fronts' synchronous paths drive their executor futures on it
//! with [`block_on`].
//!
//! The one rule: **an async worker never waits on a journal commit**. A commit is durable on
//! return (SQLite's fsync, or PostgreSQL's round trip on the journal's own threads, see
//! `journal::postgres`), so it blocks whichever thread makes it. Executions therefore run on
//! threads made for that: the gateway's execution threads ([`crate::front::gateway::Workers`]), a
//! fleet's host threads, the blocking pool (`spawn_blocking`) of the HTTP and MCP fronts, and
//! the thread of a single `cairn run`. Each drives its futures with [`block_on`], so a commit
//! stops that thread's own futures and nothing else, while the I/O they wait for is served by
//! the runtime's workers. No runtime is built per call or per thread.
//!
//! The PostgreSQL journal keeps two threads of its own (see `journal::postgres`): its
//! synchronous API may be called from anywhere, an async worker included, and a thread that
//! blocks on the database must not be the one that would drive the database's I/O.

use std::future::Future;
use std::sync::{Mutex, OnceLock, PoisonError};

use tokio::runtime::{Builder, Handle, Runtime};

/// How many async worker threads the runtime has: they do I/O only, never a commit.
pub const WORKERS: usize = 2;

/// The runtime, held until [`shutdown`].
static RT: Mutex<Option<Runtime>> = Mutex::new(None);

/// The runtime's handle, started on first use.
pub fn handle() -> &'static Handle {
    static HANDLE: OnceLock<Handle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let rt = Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("cairn-rt")
            .enable_all()
            .build()
            .expect("start cairn's async runtime");
        let h = rt.handle().clone();
        *RT.lock().unwrap_or_else(PoisonError::into_inner) = Some(rt);
        h
    })
}

/// Drive `f` to its end on the calling thread, with the runtime's I/O and timers. The future
/// need not be `Send`: it is polled here and nowhere else. Call it from a thread that may block
/// (an execution thread, `spawn_blocking`, `main`); like every `block_on`, it panics on an async
/// worker.
pub fn block_on<F: Future>(f: F) -> F::Output {
    handle().block_on(f)
}

/// Stop the runtime: every task still on it is dropped, as when its last user lets go of it
/// (an SSH connection closes, a ProxyCommand's process group is hung up). The binary calls it
/// before it exits, since `process::exit` runs no destructor; nothing may use the runtime after.
pub fn shutdown() {
    let rt = RT.lock().unwrap_or_else(PoisonError::into_inner).take();
    drop(rt);
}
