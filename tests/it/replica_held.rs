//! An execution a live owner leaves alone (docs/REPLICAS.md): replica A runs a call with
//! `detach: true`, so no call of A drives it and A's sweep leaves it alone, while A heartbeats
//! (its lease never expires). A caller on replica B attaching to it waits for A at most its
//! own reconnect window, then answers what the journal holds, held by A, concluding nothing:
//! never driving it, never appending as its owner. Against a real sshd and the test binary's
//! PostgreSQL server; the test counts the runs on the host and reads the journal.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::{token, Server};
use crate::replica_wait::gated;
use crate::replicas::{execute_maybe, replicated_host, rpc_within};
use crate::support::host::*;

const LIMIT: Duration = Duration::from_secs(90);

/// A detaches the gated command (it runs until the gate opens); B, with a reconnect window
/// of 3 s, gets the same intent: its caller attaches, waits for A, and answers within a bound
/// `running`, held by A's process, naming replica A, nothing concluded. The command ran
/// once; B wrote nothing but its `intent-matched`; no takeover, no redrive, A still owns it
/// at epoch 1. Then the gate opens and the same call sent to A, the owner, gets the result.
// Long: one scenario, its phases in order.
#[test]
fn a_caller_on_another_replica_gets_a_detached_execution_as_held_by_its_live_owner() {
    let test = "held_detached";
    let Some((h, key)) = replicated_host(test) else {
        return;
    };
    let tok = token(&h, "agent:alice", &[]);
    let auth = format!("Bearer {tok}");
    // A short lease, so that A's sweep looks at its executions often (and leaves this alone).
    let args = ["--intent-key", key.to_str().unwrap(), "--lease-for", "2s"];
    let a = Server::start(&h, 0, &args);
    let b = Server::start_reconnect(&h, 0, &args, &[], "3s");
    let gate: PathBuf = h.sshd.dir().join("gate");
    let cmd = gated(&h, &gate);

    let detached = json!({"jsonrpc": "2.0", "id": 1, "method": "execute",
                          "params": {"destination": "127.0.0.1", "command": cmd,
                                     "detach": true}});
    let ra = rpc_within(a.port, &auth, &detached, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("A answered nothing\n{}", a.log()));
    let id = ra["result"]["execution_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{ra}\n{}", a.log()))
        .to_owned();
    assert_eq!(ra["result"]["state"], "running", "{ra}\n{}", a.log());
    // Past a whole lease of A's sweeps: A leaves it alone (detached).
    std::thread::sleep(Duration::from_secs(3));

    let t0 = Instant::now();
    let rb = execute_maybe(b.port, &auth, 2, &cmd);
    let took = t0.elapsed();
    let logs = format!("replica A:\n{}\nreplica B:\n{}", a.log(), b.log());
    let rb: Value = rb.unwrap_or_else(|| panic!("B answered nothing\n{logs}"));
    let r = &rb["result"];
    assert_eq!(r["execution_id"], id.as_str(), "{rb}\n{logs}");
    assert_eq!(r["state"], "running", "{rb}\n{logs}");
    assert_eq!(r["attached"], true, "{rb}\n{logs}");
    let by_a = format!("{}@", a.pid());
    assert!(
        r["held_by"].as_str().is_some_and(|o| o.starts_with(&by_a)),
        "held by A's process: {rb}\n{logs}"
    );
    let reason = r["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("held by its owner, replica") && reason.contains("nothing is concluded"),
        "{rb}\n{logs}"
    );
    assert!(
        r["summary"]
            .as_str()
            .is_some_and(|s| s.contains("held by its live owner")),
        "{rb}\n{logs}"
    );
    // The window (3 s) and a little: never the command's two minutes.
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(20),
        "B answered after {took:?}\n{logs}"
    );
    assert!(
        b.log()
            .contains("not settled after this call's reconnect window"),
        "{logs}"
    );
    assert_eq!(h.runs(), 1, "ran once\n{logs}");

    let j = h.journal();
    let xid = cairn::ExecutionId::parse(&id).unwrap();
    let evs = j.events(&xid).unwrap();
    let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
    let count = |k: &str| kinds.iter().filter(|x| **x == k).count();
    assert_eq!(count("dispatched"), 1, "{kinds:?}");
    assert_eq!(count("takeover"), 0, "{kinds:?}");
    assert_eq!(count("redrive"), 0, "{kinds:?}");
    assert_eq!(count("intent-matched"), 1, "{kinds:?}");
    let by_b = format!("{}@", b.pid());
    for e in &evs {
        if e.client.starts_with(&by_b) {
            assert_eq!(e.kind, "intent-matched", "B appended only that: {e:?}");
        }
        if e.state.is_some() {
            assert!(e.client.starts_with(&by_a), "states by A alone: {e:?}");
        }
    }
    let o = j.ownership(&xid).unwrap().expect("an owner row");
    assert!(!o.settled && o.epoch == 1 && o.takeovers == 0, "{o:?}");
    assert!(o.client.starts_with(&by_a), "{o:?}");
    assert_eq!(j.list().unwrap().len(), 1);

    // The owner drives it when asked: the same call sent to A gets the result.
    std::fs::write(&gate, b"").unwrap();
    let again = execute_maybe(a.port, &auth, 3, &cmd);
    let logs = format!("replica A:\n{}\nreplica B:\n{}", a.log(), b.log());
    let again = again.unwrap_or_else(|| panic!("A answered nothing\n{logs}"));
    assert_eq!(again["result"]["execution_id"], id.as_str(), "{again}");
    assert_eq!(again["result"]["state"], "completed", "{again}\n{logs}");
    assert_eq!(again["result"]["stdout"], "finished\n", "{again}\n{logs}");
    wait_for("the journal settled", LIMIT, || {
        j.ownership(&xid).unwrap().filter(|o| o.settled).map(|_| ())
    });
    assert_eq!(h.runs(), 1, "ran once\n{logs}");
    let kinds = h.kinds(&id);
    assert_eq!(
        kinds.iter().filter(|k| *k == "takeover").count(),
        0,
        "{kinds:?}"
    );
}

/// The bound is for what the owner leaves alone, not for a run it drives: A drives the gated
/// command (not detached); B, with a reconnect window of 3 s, gets the same intent and waits
/// past two of its windows until the gate opens, then answers `completed` with the bytes, as
/// a second caller on one gateway would. Ran once; B wrote nothing but its `intent-matched`.
#[test]
fn a_caller_on_another_replica_waits_past_its_window_for_a_run_its_owner_drives() {
    let test = "held_driven";
    let Some((h, key)) = replicated_host(test) else {
        return;
    };
    let tok = token(&h, "agent:alice", &[]);
    let auth = format!("Bearer {tok}");
    let args = ["--intent-key", key.to_str().unwrap(), "--lease-for", "2s"];
    let a = Server::start(&h, 0, &args);
    let b = Server::start_reconnect(&h, 0, &args, &[], "3s");
    let gate: PathBuf = h.sshd.dir().join("gate");
    let cmd = gated(&h, &gate);

    let (pa, auth_a, cmd_a) = (a.port, auth.clone(), cmd.clone());
    let first = std::thread::spawn(move || execute_maybe(pa, &auth_a, 1, &cmd_a));
    wait_for("A dispatched it", LIMIT, || (h.runs() == 1).then_some(()));
    let (pb, auth_b, cmd_b) = (b.port, auth.clone(), cmd.clone());
    let t0 = Instant::now();
    let second = std::thread::spawn(move || execute_maybe(pb, &auth_b, 2, &cmd_b));
    // Two of B's windows: B keeps waiting for the owner that drives it.
    std::thread::sleep(Duration::from_secs(7));
    assert!(!second.is_finished(), "B answered before the run ended");
    std::fs::write(&gate, b"").unwrap();
    let (ra, rb) = (first.join().unwrap(), second.join().unwrap());
    let took = t0.elapsed();
    let logs = format!("replica A:\n{}\nreplica B:\n{}", a.log(), b.log());
    let ra = ra.unwrap_or_else(|| panic!("A answered nothing\n{logs}"));
    let rb = rb.unwrap_or_else(|| panic!("B answered nothing\n{logs}"));
    let id = ra["result"]["execution_id"].as_str().unwrap_or_default();
    assert!(!id.is_empty(), "{ra}\n{logs}");
    assert_eq!(
        rb["result"]["execution_id"], id,
        "one execution: {rb}\n{logs}"
    );
    for r in [&ra, &rb] {
        assert_eq!(r["result"]["state"], "completed", "{r}\n{logs}");
        assert_eq!(r["result"]["stdout"], "finished\n", "{r}\n{logs}");
    }
    assert!(took >= Duration::from_secs(7), "{took:?}");
    assert!(
        !b.log()
            .contains("not settled after this call's reconnect window"),
        "{logs}"
    );
    assert_eq!(h.runs(), 1, "ran once\n{logs}");
    let kinds = h.kinds(id);
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(count("dispatched"), 1, "{kinds:?}");
    assert_eq!(count("takeover"), 0, "{kinds:?}");
    assert_eq!(count("redrive"), 0, "{kinds:?}");
}
