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
//! - [`lifecycle`]: which transitions between states the journal accepts, as one table.
//! - [`admission`]: where a request for an execution that may already exist goes (a new run,
//!   an attach, a wait for its owner, review …), as one table.

#![forbid(unsafe_code)]

pub mod admission;
pub mod epoch;
pub mod event;
pub mod id;
pub mod lifecycle;
pub mod location;
pub mod machine;
pub mod recovery;
pub mod state;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    /// Crates that do I/O (or that only I/O code needs): none may join the core's dependency
    /// tree, directly or through another crate.
    const IO_CRATES: &[&str] = &[
        "tokio",
        "mio",
        "socket2",
        "rusqlite",
        "libsqlite3-sys",
        "russh",
        "clap",
        "tokio-postgres",
        "deadpool-postgres",
        "rmcp",
        "axum",
        "hyper",
    ];

    /// The dependency tree of `cairn-core` as the workspace's Cargo.lock records it (every
    /// version and target of a crate taken together, so the tree can only be over-counted).
    fn core_tree() -> BTreeSet<String> {
        let lock = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock"));
        let mut deps: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for package in lock.split("[[package]]").skip(1) {
            let mut lines = package.lines();
            let name = lines
                .find_map(|l| l.strip_prefix("name = "))
                .map(|n| n.trim_matches('"'))
                .expect("a package has a name");
            let entry = deps.entry(name).or_default();
            let mut in_deps = false;
            for line in package.lines() {
                let line = line.trim();
                if line == "dependencies = [" {
                    in_deps = true;
                } else if in_deps && line == "]" {
                    in_deps = false;
                } else if in_deps {
                    let dep = line.trim_end_matches(',').trim_matches('"');
                    entry.insert(dep.split(' ').next().unwrap_or(dep));
                }
            }
        }
        let mut seen = BTreeSet::new();
        let mut todo = vec!["cairn-core"];
        while let Some(name) = todo.pop() {
            if seen.insert(name.to_string()) {
                todo.extend(deps.get(name).into_iter().flatten());
            }
        }
        seen
    }

    /// The core does no I/O because it cannot: no crate that could do it for the core is in
    /// its dependency tree (the lock file is read, so an indirect dependency counts too).
    #[test]
    fn the_core_depends_on_no_io_crate() {
        let tree = core_tree();
        assert!(
            tree.contains("serde"),
            "the lock file was not read: {tree:?}"
        );
        let io: Vec<_> = IO_CRATES.iter().filter(|c| tree.contains(**c)).collect();
        assert!(io.is_empty(), "cairn-core depends on {io:?}");
        assert!(!tree.contains("cairn"), "cairn-core depends on cairn");
    }
}
