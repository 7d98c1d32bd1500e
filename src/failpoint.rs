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
