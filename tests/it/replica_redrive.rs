//! An execution its live owner stopped driving (docs/REPLICAS.md): replica A's own call fails
//! with a journal error, its lease stays current (A heartbeats on other connections), and a
//! caller attached to the execution on replica B still gets the result, because A's sweep picks
//! the execution up once no call of A has driven it for a lease. Against a real sshd and the
//! test binary's PostgreSQL server; the test counts the runs on the host and reads the journal.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{metrics, token, Server};
use crate::replica_wait::gated;
use crate::replicas::{execute_maybe, replicated_host};
use crate::support::host::*;
use crate::support::postgres;

const LIMIT: Duration = Duration::from_secs(90);

/// A's call drives the gated command and B's caller waits for A. A row lock taken by the test
/// holds A's next append (the command's outcome, once the gate opens); the test then
/// terminates the database connection that append waits on, so A's call fails with the
/// journal's error, and releases the lock. A picks the execution up by itself (a `redrive`
/// event), collects the stored result, and B's caller gets it within a bound: the command ran
/// once, the journal holds one dispatch, one outcome recorded by A after the `redrive`, no
/// takeover, and A's ownership closed at epoch 1.
// Long: one scenario, its phases in order.
#[test]
fn a_live_owner_whose_call_failed_with_a_journal_error_picks_its_execution_up() {
    let test = "redrive_after_journal_error";
    let Some((h, key)) = replicated_host(test) else {
        return;
    };
    let server = postgres::server(test).unwrap();
    let db = h
        .journal
        .to_string_lossy()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let tok = token(&h, "agent:alice", &[]);
    let auth = format!("Bearer {tok}");
    // A short lease: the grace before A picks the execution up is one lease.
    let args = ["--intent-key", key.to_str().unwrap(), "--lease-for", "3s"];
    let a = Server::start(&h, 0, &args);
    let b = Server::start(&h, 0, &args);
    let gate: PathBuf = h.sshd.dir().join("gate");
    let cmd = gated(&h, &gate);
    let call = |port: u16, n: u64| {
        let (auth, cmd) = (auth.clone(), cmd.clone());
        std::thread::spawn(move || execute_maybe(port, &auth, n, &cmd))
    };
    let first = call(a.port, 1);
    let id = h.wait_started();
    wait_for("A recording the start", LIMIT, || {
        h.kinds(&id).iter().any(|k| k == "running").then_some(())
    });
    let second = call(b.port, 2);
    wait_for("B's caller waiting for A", LIMIT, || {
        b.log()
            .contains(&format!("{id} is driven by replica"))
            .then_some(())
    });

    // Hold the execution's owner row: every append by its owner locks it first.
    let holder = {
        let (server_db, id) = (db.clone(), id.clone());
        let sql = format!(
            "BEGIN; SELECT 1 FROM owners WHERE execution_id = '{id}' FOR UPDATE; \
             SELECT pg_sleep(120); COMMIT;"
        );
        std::thread::spawn(move || {
            let _ = server.psql(&server_db, &sql);
        })
    };
    let backend = |what: &str| {
        let sql = format!(
            "SELECT pid FROM pg_stat_activity WHERE datname = '{db}' AND {what} ORDER BY pid"
        );
        server
            .psql("postgres", &sql)
            .unwrap()
            .lines()
            .next()
            .map(str::to_owned)
    };
    let sleeper = wait_for("the lock holder", LIMIT, || {
        backend("query LIKE '%pg_sleep(120)%' AND pid <> pg_backend_pid()")
    });
    std::fs::write(&gate, b"").unwrap();
    let waiting = wait_for("A's append waiting for the row lock", LIMIT, || {
        backend("application_name = 'cairn' AND wait_event_type = 'Lock'")
    });
    let kill = |pid: &str| {
        let r = server
            .psql("postgres", &format!("SELECT pg_terminate_backend({pid})"))
            .unwrap();
        assert_eq!(r.trim(), "t", "terminated {pid}");
    };
    kill(&waiting);
    let ra = first.join().unwrap();
    let fault = Instant::now();
    kill(&sleeper);
    holder.join().unwrap();
    let ra: Value = ra.unwrap_or_else(|| panic!("A answered nothing\n{}", a.log()));
    assert!(
        ra.get("result").is_none() && ra["error"]["message"].as_str().is_some(),
        "A's call fails with the journal's error: {ra}\n{}",
        a.log()
    );

    let rb = second.join().unwrap();
    let took = fault.elapsed();
    let logs = format!("replica A:\n{}\nreplica B:\n{}", a.log(), b.log());
    let rb: Value = rb.unwrap_or_else(|| panic!("B answered nothing\n{logs}"));
    assert_eq!(rb["result"]["state"], "completed", "{rb}\n{logs}");
    assert_eq!(rb["result"]["stdout"], "finished\n", "{rb}\n{logs}");
    assert_eq!(rb["result"]["execution_id"], id.as_str(), "{rb}\n{logs}");
    // A lease of grace, a sweep every third of it, the recovery and B's next read.
    assert!(
        took < Duration::from_secs(30),
        "B answered after {took:?}\n{logs}"
    );
    assert_eq!(h.runs(), 1, "ran once\n{logs}");

    let j = h.journal();
    let xid = cairn::ExecutionId::parse(&id).unwrap();
    let evs = j.events(&xid).unwrap();
    let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
    let count = |k: &str| kinds.iter().filter(|x| **x == k).count();
    assert_eq!(count("dispatched"), 1, "{kinds:?}");
    assert_eq!(count("completed"), 1, "{kinds:?}");
    assert_eq!(count("redrive"), 1, "{kinds:?}");
    assert_eq!(count("takeover"), 0, "{kinds:?}");
    let by_a = format!("{}@", a.pid());
    let r = evs.iter().position(|e| e.kind == "redrive").unwrap();
    let c = evs.iter().position(|e| e.kind == "completed").unwrap();
    assert!(r < c, "the outcome follows the redrive: {kinds:?}");
    for e in [&evs[r], &evs[c]] {
        assert!(e.client.starts_with(&by_a), "recorded by A: {e:?}");
    }
    assert_eq!(evs[r].evidence["redrive"], 1, "{:?}", evs[r]);
    assert_eq!(evs[r].evidence["state"], "running", "{:?}", evs[r]);
    let o = j.ownership(&xid).unwrap().expect("an owner row");
    assert!(o.settled && o.epoch == 1 && o.takeovers == 0, "{o:?}");
    assert!(o.client.starts_with(&by_a), "{o:?}");
    assert_eq!(j.list().unwrap().len(), 1);
    assert!(
        a.log().contains("picking it up (redrive 1 of at most 3)"),
        "{logs}"
    );
    let m = metrics(a.port, &tok);
    assert_eq!(m["cairn_redrives_total"], 1.0, "{m:?}");
    assert_eq!(m["cairn_takeovers_total"], 0.0, "{m:?}");
}
