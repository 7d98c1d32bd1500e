//! Test hooks that pause a process at a named point between a decision and what follows it
//! (its journal append, its send), so that a test can put another process's action exactly
//! into that window and prove the journal, not luck, decides.
//!
//! `CAIRN_TEST_PAUSE=NAME:DIR` (set only by the tests): the first time this process reaches the
//! point `NAME` it creates `DIR/NAME.reached` and waits until `DIR/NAME.go` exists, at most
//! [`MAX_PAUSE`]; then it goes on. Unset, as always outside the tests, a point costs one look at
//! a value read once per process. No point changes what the process does, only when.
//!
//! The points:
//! - `before-dispatched`: the executor decided to dispatch and is about to append `dispatched`.
//! - `before-send`: `dispatched` is committed; the dispatch's bytes are about to be sent.
//!
//! `CAIRN_TEST_FAIL=NAME[*N][,NAME[*N]…]` makes the check [`fails`] at `NAME` say "fail" (the
//! first `N` times, or every time): how a test makes one journal operation fail while the rest
//! of the process works, to see the caller fail closed or retry. The checks:
//! - `session-lookup`, `session-bind`: the HTTP front's reading and recording of which actor an
//!   MCP session belongs to.
//! - `evidence-append`: each attempt of `journal::append_evidence_retrying` (a session's end, a
//!   delivery, an abandoned stream, a resumable stream's record).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The longest a point waits for its `.go` file.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// The point and directory `CAIRN_TEST_PAUSE` names, read once.
fn armed() -> Option<&'static (String, PathBuf)> {
    static ARMED: OnceLock<Option<(String, PathBuf)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let v = std::env::var("CAIRN_TEST_PAUSE").ok()?;
            let (name, dir) = v.split_once(':')?;
            Some((name.to_owned(), PathBuf::from(dir)))
        })
        .as_ref()
}

/// Pause here if the tests armed the point `name` (see the module documentation).
pub fn pause(name: &str) {
    static DONE: AtomicBool = AtomicBool::new(false);
    let Some((armed, dir)) = armed() else { return };
    if armed != name || DONE.swap(true, Ordering::SeqCst) {
        return;
    }
    let _ = std::fs::write(
        dir.join(format!("{name}.reached")),
        std::process::id().to_string(),
    );
    let go = dir.join(format!("{name}.go"));
    let t0 = Instant::now();
    while !go.exists() && t0.elapsed() < MAX_PAUSE {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether the tests made the operation `name` fail this time (see the module documentation).
pub fn fails(name: &str) -> bool {
    /// Each armed check, and how many more times it fails (`None`: always).
    type Left = std::sync::Mutex<std::collections::HashMap<String, Option<u32>>>;
    static LEFT: OnceLock<Option<Left>> = OnceLock::new();
    let Some(left) = LEFT
        .get_or_init(|| {
            let v = std::env::var("CAIRN_TEST_FAIL").ok()?;
            let points = v
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('*') {
                    Some((n, times)) => (n.to_owned(), times.parse().ok()),
                    None => (p.to_owned(), None),
                })
                .collect();
            Some(Left::new(points))
        })
        .as_ref()
    else {
        return false;
    };
    let mut left = left.lock().unwrap_or_else(|e| e.into_inner());
    match left.get_mut(name) {
        None => false,
        Some(None) => true,
        Some(Some(0)) => false,
        Some(Some(n)) => {
            *n -= 1;
            true
        }
    }
}
