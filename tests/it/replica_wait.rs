//! Waiting across replicas (docs/REPLICAS.md): a caller attached on replica B to an execution
//! that replica A drives gets A's result when A records it, woken by the notification of the
//! settling append; the listener that receives notifications reconnects when its connection is
//! killed; and with no notification at all, polling still delivers. Against a real sshd and the
//! test binary's PostgreSQL server; each test counts the runs on the host and reads the journal.
//!
//! The command waits for a gate file the test creates, so that the order is the test's: A runs
//! it, B's caller waits for it, the test does what it tests, then opens the gate.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::http::{token, Server};
use crate::replicas::{execute_maybe, replicated_host};
use crate::support::host::*;
use crate::support::postgres;

const LIMIT: Duration = Duration::from_secs(90);

/// A polling interval so long (an hour) that a waiter woken before it was woken by something
/// else: a notification, or the listener listening again.
const NEVER_POLL: (&str, &str) = ("CAIRN_TEST_WAIT_POLL_MS", "3600000");
/// The debug lines say what woke a waiter.
const DEBUG: (&str, &str) = ("CAIRN_LOG", "cairn=debug,russh=warn");

/// A command that counts its run, waits (at most two minutes) for `gate` to exist, and says
/// `finished`.
pub(crate) fn gated(h: &Host, gate: &Path) -> String {
    format!(
        "{}i=0; while [ ! -e '{}' ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; \
         echo finished",
        h.count(),
        gate.display()
    )
}

/// The database name of the host's journal URL.
fn db_of(h: &Host) -> String {
    h.journal
        .to_string_lossy()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned()
}

/// The backend PIDs of `pid`'s listener connections to the host's database.
fn listener_backends(h: &Host, server: &postgres::PgServer, pid: u32) -> Vec<String> {
    let sql = format!(
        "SELECT pid FROM pg_stat_activity WHERE datname = '{}' \
         AND application_name = 'cairn-listen {pid}' ORDER BY pid",
        db_of(h)
    );
    server
        .psql("postgres", &sql)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Replica A drives the gated command; replica B (started with `b_env`) gets the same call
/// and waits for A. `during` runs once B waits, then the gate opens. Both callers must get
/// the one result; the command ran once; the journal holds one execution, dispatched once,
/// completed once, never taken over. Returns B's log.
fn a_runs_b_waits(
    test: &str,
    b_env: &[(&str, &str)],
    during: impl FnOnce(&Host, &postgres::PgServer, &Server),
) -> String {
    let Some((h, key)) = replicated_host(test) else {
        return String::new();
    };
    let server = postgres::server(test).unwrap();
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    // Leases of an hour: nothing is taken over, and no lease expiry wakes the waiter.
    let args = ["--intent-key", key.to_str().unwrap(), "--lease-for", "1h"];
    let a = Server::start(&h, 0, &args);
    let b = Server::start_env(&h, 0, &args, b_env);
    let gate: PathBuf = h.sshd.dir().join("gate");
    let cmd = gated(&h, &gate);
    let call = |port: u16, n: u64| {
        let (auth, cmd) = (auth.clone(), cmd.clone());
        std::thread::spawn(move || execute_maybe(port, &auth, n, &cmd))
    };
    let first = call(a.port, 1);
    let id = h.wait_started();
    let second = call(b.port, 2);
    wait_for("B's caller waiting for A", LIMIT, || {
        b.log()
            .contains(&format!("{id} is driven by replica"))
            .then_some(())
    });
    during(&h, server, &b);
    std::fs::write(&gate, b"").unwrap();
    let (ra, rb) = (first.join().unwrap(), second.join().unwrap());
    let logs = format!("replica A:\n{}\nreplica B:\n{}", a.log(), b.log());
    for r in [&ra, &rb] {
        let r: &Value = r.as_ref().unwrap_or_else(|| panic!("no answer\n{logs}"));
        assert_eq!(r["result"]["state"], "completed", "{r}\n{logs}");
        assert_eq!(r["result"]["stdout"], "finished\n", "{r}\n{logs}");
        assert_eq!(r["result"]["execution_id"], id.as_str(), "{r}\n{logs}");
    }
    assert_eq!(h.runs(), 1, "ran once\n{logs}");
    let kinds = h.kinds(&id);
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(count("dispatched"), 1, "{kinds:?}");
    assert_eq!(count("completed"), 1, "{kinds:?}");
    assert_eq!(count("intent-matched"), 1, "{kinds:?}");
    assert_eq!(count("takeover"), 0, "{kinds:?}");
    assert_eq!(h.journal().list().unwrap().len(), 1);
    b.log()
}

/// The waiter on B polls only once an hour: the result reaches it by the notification of A's
/// settling append, and B's log says so.
#[test]
fn a_waiter_on_another_replica_gets_the_result_by_notification() {
    let log = a_runs_b_waits("wait_notified", &[NEVER_POLL, DEBUG], |_, _, _| {});
    if log.is_empty() {
        return; // no PostgreSQL here (said loudly)
    }
    assert!(
        log.contains("woken by the notification of its settling"),
        "{log}"
    );
}

/// B's listener connection is terminated by the server (`pg_terminate_backend`) while B's
/// caller waits: the listener connects again, listens, wakes every waiter (a notification sent
/// while it was down is lost), and the result still reaches the waiter by notification.
#[test]
fn a_waiter_whose_listener_connection_is_killed_gets_the_result_after_it_listens_again() {
    let log = a_runs_b_waits(
        "wait_listener_killed",
        &[NEVER_POLL, DEBUG],
        |h, server, b| {
            let old = wait_for("B's listener connection", LIMIT, || {
                let l = listener_backends(h, server, b.pid());
                (l.len() == 1).then_some(l)
            });
            let killed = server
                .psql(
                    "postgres",
                    &format!("SELECT pg_terminate_backend({})", old[0]),
                )
                .unwrap();
            assert_eq!(killed.trim(), "t", "terminated");
            wait_for("B's listener listening again", LIMIT, || {
                b.log()
                    .contains("listening for settled executions again; woke 1 waiter(s)")
                    .then_some(())
            });
            let new = listener_backends(h, server, b.pid());
            assert_eq!(new.len(), 1, "{new:?}");
            assert_ne!(new, old, "a new connection");
        },
    );
    if log.is_empty() {
        return;
    }
    let broke = log.find("the connection that listens for settled executions broke");
    let again = log.find("listening for settled executions again");
    let notified = log.rfind("woken by the notification of its settling");
    assert!(
        broke.is_some() && again.is_some() && notified.is_some(),
        "{log}"
    );
    assert!(broke < again && again < notified, "in that order: {log}");
}

/// B does not listen at all (every notification lost): its caller still gets the result, by
/// reading the journal every poll interval.
#[test]
fn with_every_notification_lost_a_waiter_still_gets_the_result_by_polling() {
    let off = ("CAIRN_TEST_LISTEN", "off");
    let log = a_runs_b_waits("wait_polling_only", &[off, DEBUG], |h, server, b| {
        assert!(
            listener_backends(h, server, b.pid()).is_empty(),
            "B has no listener connection"
        );
    });
    if log.is_empty() {
        return;
    }
    assert!(log.contains("not listening for notifications"), "{log}");
    assert!(!log.contains("woken by the notification"), "{log}");
}
