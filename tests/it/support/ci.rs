//! Whether this run is CI, and a developer's opt-out of a kind of test by name: the one rule
//! every harness that needs an outside server (PostgreSQL, Docker, the Python MCP SDK) follows.
//!
//! Missing, such a server fails the test that needs it, with what to install; a developer who
//! cannot have it skips those tests by name (`CAIRN_PG_TESTS=0`, `CAIRN_DOCKER_TESTS=0`), loudly,
//! and never under CI, where a skipped test must not count as passed.
//!
//! `postgres.rs` includes it (`support::postgres::ci`, re-exported as `support::ci`), so the
//! library's unit tests, which include `postgres.rs`, share it too.
#![allow(dead_code)]

/// Whether this run is CI: `CI` set to anything but empty, `0` or `false` (as CI services and
/// `.ci/run` set it).
pub fn is_ci() -> bool {
    ci_value(std::env::var_os("CI").as_deref().and_then(|v| v.to_str()))
}

fn ci_value(v: Option<&str>) -> bool {
    v.is_some_and(|v| !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"))
}

/// Whether the developer opted out of the tests needing `what` by setting `var` to `0`; said
/// loudly on stderr (which `cargo test` shows for a failing run, and `--nocapture` always).
/// Panics under CI: there the opt-out is refused.
pub fn opted_out(var: &str, test: &str, what: &str) -> bool {
    if std::env::var(var).as_deref() != Ok("0") {
        return false;
    }
    assert!(
        !is_ci(),
        "{test}: {var}=0 is refused in CI (CI is set): the tests needing {what} are part of the \
         suite there"
    );
    eprintln!("!!! SKIPPED {test}: {var}=0 (the tests needing {what} did not run)");
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn ci_is_any_value_but_empty_zero_or_false() {
        for (v, ci) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("false"), false),
            (Some("1"), true),
            (Some("true"), true),
            (Some("yes"), true),
        ] {
            assert_eq!(super::ci_value(v), ci, "{v:?}");
        }
    }
}
