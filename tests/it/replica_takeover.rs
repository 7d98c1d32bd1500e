//! Takeovers between gateway replicas on one PostgreSQL journal (docs/REPLICAS.md), at their
//! edges: two replicas sweeping the same expired execution at once, an owner that died between
//! accepting and dispatching, the bound on takeovers, and the metric that counts them. Against
//! a real sshd and the test binary's PostgreSQL server; every test counts the runs on the host.

use std::path::PathBuf;
use std::time::Duration;

use cairn::ExecutionId;
use serde_json::Value;

use crate::http::{metrics, token, Server};
use crate::replica_wait::gated;
use crate::replicas::{check_taken_over, execute_maybe, replica_with_lease, replicated_host};
use crate::support::host::*;

const LIMIT: Duration = Duration::from_secs(90);

/// Wait until `id`'s owner row says it was taken over `n` times, by the process `pid`.
fn wait_taken_over(h: &Host, id: &ExecutionId, n: i32, pid: u32) -> cairn::journal::Ownership {
    let by = format!("{pid}@");
    wait_for(&format!("takeover {n} of {id} by {pid}"), LIMIT, || {
        let o = h.journal().ownership(id).ok()??;
        (o.takeovers == n && o.client.starts_with(&by)).then_some(o)
    })
}

/// A is killed mid-run; B and C both sweep for expired leases every third of theirs, and a
/// retry reaches each at the same moment. Exactly one of them takes the execution over (one
/// `takeover` event, the epoch bumped once); both callers get the one result; ran once; the
/// `cairn_takeovers_total` of both replicas' `/metrics` counts the one takeover.
#[test]
fn two_replicas_racing_for_one_expired_execution_take_it_over_once() {
    let Some((h, key)) = replicated_host("two_takers") else {
        return;
    };
    let tok = token(&h, "agent:alice", &[]);
    let auth = format!("Bearer {tok}");
    let gate: PathBuf = h.sshd.dir().join("gate");
    let cmd = gated(&h, &gate);
    let mut a = replica_with_lease(&h, &key);
    let call = |port: u16, n: u64, barrier: Option<std::sync::Arc<std::sync::Barrier>>| {
        let (auth, cmd) = (auth.clone(), cmd.clone());
        std::thread::spawn(move || {
            if let Some(b) = barrier {
                b.wait();
            }
            execute_maybe(port, &auth, n, &cmd)
        })
    };
    let first = call(a.port, 1, None);
    let started = h.wait_started();
    let id = ExecutionId::parse(&started).unwrap();
    let (b, c) = (replica_with_lease(&h, &key), replica_with_lease(&h, &key));
    let pid_a = a.pid();
    a.kill9();
    assert!(first
        .join()
        .unwrap()
        .is_none_or(|v| v.get("result").is_none()));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let retries = [
        call(b.port, 2, Some(barrier.clone())),
        call(c.port, 3, Some(barrier)),
    ];
    let o = wait_for("the takeover", LIMIT, || {
        let o = h.journal().ownership(&id).ok()??;
        (o.takeovers > 0).then_some(o)
    });
    std::fs::write(&gate, b"").unwrap();
    let logs = format!("replica B:\n{}\nreplica C:\n{}", b.log(), c.log());
    for r in retries {
        let r: Value = r
            .join()
            .unwrap()
            .unwrap_or_else(|| panic!("no answer\n{logs}"));
        assert_eq!(r["result"]["state"], "completed", "{r}\n{logs}");
        assert_eq!(r["result"]["stdout"], "finished\n", "{r}");
        assert_eq!(r["result"]["execution_id"], started.as_str(), "{r}");
    }
    assert_eq!(h.runs(), 1, "ran once\n{logs}");
    let taker = [b.pid(), c.pid()]
        .into_iter()
        .find(|p| o.client.starts_with(&format!("{p}@")))
        .unwrap_or_else(|| panic!("taken over by B or C: {o:?}"));
    // one takeover event, epoch 2, one dispatch, one outcome recorded by the taker
    check_taken_over(&h, &started, pid_a, taker);
    for s in [&b, &c] {
        let m = metrics(s.port, &tok);
        assert_eq!(m["cairn_takeovers_total"], 1.0, "{m:?}");
    }
}

/// A replica that asks on a terminal before dispatching (`--approve prompt`, under `script`
/// for a pty): it accepts the call, asks, and waits. Started with `--lease-for 2s`.
struct Asking {
    script: std::process::Child,
    cairn: u32,
    port: u16,
}

fn asking_replica(h: &Host, key: &std::path::Path) -> Asking {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let mut c = h.cairn("mcp");
    c.arg("--remote-dir")
        .arg(&h.remote_dir)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--intent-key", key.to_str().unwrap(), "--lease-for", "2s"])
        .args(["--approve", "prompt"]);
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"));
    let line = std::iter::once(quote(c.get_program()))
        .chain(c.get_args().map(quote))
        .collect::<Vec<_>>()
        .join(" ");
    let mut s = std::process::Command::new("script");
    s.args(["-qefc", &line, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => s.env(k, v),
            None => s.env_remove(k),
        };
    }
    let script = s.spawn().expect("script (util-linux)");
    let bin = std::fs::canonicalize(BIN).unwrap();
    let cairn = wait_for("the cairn process under script", LIMIT, || {
        crate::fleet::descendants(script.id())
            .into_iter()
            .find(|p| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == bin))
    });
    wait_for("the asking replica listening", LIMIT, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    Asking {
        script,
        cairn,
        port,
    }
}

/// A dies (kill -9) after accepting a call and before dispatching it (it was still asking
/// its approver). B's sweep takes the execution over and applies the recovery table: still
/// `accepted`, never dispatched, and A can no longer append `dispatched` (fenced), so it is
/// `failed`, never sent: ran 0 times, one takeover, no `dispatched` event. The client's retry
/// then runs it once, as a new execution (a failed one is never attached to).
#[test]
fn an_execution_whose_owner_died_before_dispatching_it_is_taken_over_as_failed_never_sent() {
    let Some((h, key)) = replicated_host("taken_over_undispatched") else {
        return;
    };
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    let b = replica_with_lease(&h, &key);
    let mut a = asking_replica(&h, &key);
    let cmd = format!("{}echo finished", h.count());
    let (port_a, auth2, cmd2) = (a.port, auth.clone(), cmd.clone());
    let first = std::thread::spawn(move || execute_maybe(port_a, &auth2, 1, &cmd2));
    let started = wait_for(
        "the execution accepted, waiting for approval",
        LIMIT,
        || {
            let l = h.journal().list().ok()?;
            let (rec, st) = l.first()?;
            (st.state == cairn::State::Accepted).then(|| rec.id.to_string())
        },
    );
    assert!(sigkill(a.cairn as i32, false));
    let _ = a.script.kill();
    let _ = a.script.wait();
    assert!(first
        .join()
        .unwrap()
        .is_none_or(|v| v.get("result").is_none()));
    let id = ExecutionId::parse(&started).unwrap();
    let o = wait_taken_over(&h, &id, 1, b.pid());
    wait_for("the recovery's verdict", LIMIT, || {
        (h.state(&started) == cairn::State::Failed).then_some(())
    });
    assert_eq!(h.runs(), 0, "never sent");
    let evs = h.journal().events(&id).unwrap();
    let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
    // (the call's correlation is noted right after its acceptance)
    assert_eq!(
        kinds,
        ["accepted", "correlation", "takeover", "failed"],
        "{evs:#?}"
    );
    assert_eq!(o.epoch, 2, "{o:?}");
    let failed = evs.last().unwrap();
    assert!(
        failed.client.starts_with(&format!("{}@", b.pid())),
        "{failed:?}"
    );
    let o = h.journal().ownership(&id).unwrap().unwrap();
    assert!(o.settled && o.epoch == 2 && o.takeovers == 1, "{o:?}");

    let retry = execute_maybe(b.port, &auth, 2, &cmd).expect("B answers");
    assert_eq!(
        retry["result"]["state"],
        "completed",
        "{retry}\n{}",
        b.log()
    );
    assert_eq!(retry["result"]["stdout"], "finished\n", "{retry}");
    assert_ne!(retry["result"]["execution_id"], started.as_str(), "{retry}");
    assert_eq!(h.runs(), 1, "ran once, after the retry");
    assert_eq!(h.kinds(&started), kinds, "the first one is left as it was");
    assert_eq!(h.journal().list().unwrap().len(), 2);
}

/// An execution whose owners keep dying is taken over at most MAX_TAKEOVERS (3) times: after
/// the third owner dies too, a fourth replica does not take it (its sweep skips it, and a
/// retry that reaches it gets the review record, not a fourth takeover). `cairn ls` shows
/// TAKEOVERS 3; the command ran once.
#[test]
fn an_execution_taken_over_three_times_is_left_for_review_and_a_fourth_replica_leaves_it() {
    let Some((h, key)) = replicated_host("takeover_bound") else {
        return;
    };
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    let gate: PathBuf = h.sshd.dir().join("gate");
    let cmd = gated(&h, &gate);
    let mut owner: Server = replica_with_lease(&h, &key);
    let (port, auth2, cmd2) = (owner.port, auth.clone(), cmd.clone());
    let first = std::thread::spawn(move || execute_maybe(port, &auth2, 1, &cmd2));
    let started = h.wait_started();
    let id = ExecutionId::parse(&started).unwrap();
    let max = cairn::journal::MAX_TAKEOVERS;
    for n in 1..=max {
        let next = replica_with_lease(&h, &key);
        owner.kill9();
        wait_taken_over(&h, &id, n, next.pid());
        owner = next;
    }
    let fourth = replica_with_lease(&h, &key);
    let last = owner.pid();
    owner.kill9();
    let r = execute_maybe(fourth.port, &auth, 2, &cmd).expect("the fourth replica answers");
    let log = fourth.log();
    assert_eq!(r["result"]["needs_review"], true, "{r}\n{log}");
    assert_eq!(r["result"]["execution_id"], started.as_str(), "{r}");
    assert!(log.contains("left for review"), "{log}");
    let o = h.journal().ownership(&id).unwrap().unwrap();
    assert_eq!((o.takeovers, o.epoch), (max, max as i64 + 1), "{o:?}");
    assert!(
        o.client.starts_with(&format!("{last}@")) && !o.settled,
        "{o:?}"
    );
    let evs = h.journal().events(&id).unwrap();
    let takeovers = evs.iter().filter(|e| e.kind == "takeover").count();
    assert_eq!(takeovers, max as usize, "{evs:#?}");
    let by_fourth = format!("{}@", fourth.pid());
    assert!(
        evs.iter()
            .filter(|e| e.state.is_some() || e.kind == "takeover")
            .all(|e| !e.client.starts_with(&by_fourth)),
        "the fourth replica took nothing over and recorded no state: {evs:#?}"
    );
    assert_eq!(evs.iter().filter(|e| e.kind == "dispatched").count(), 1);

    let ls = output(h.local("ls"), LIMIT);
    let text = String::from_utf8_lossy(&ls.stdout);
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header.get(4), Some(&"TAKEOVERS"), "{text}");
    let row = lines
        .find(|l| l.starts_with(started.as_str()))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(row.split_whitespace().nth(4), Some("3"), "{text}");
    let mut json = h.local("ls");
    json.arg("--json");
    let rows: Value = serde_json::from_slice(&output(json, LIMIT).stdout).unwrap();
    assert_eq!(rows[0]["takeovers"], 3, "{rows}");

    assert_eq!(h.runs(), 1, "ran once");
    std::fs::write(&gate, b"").unwrap();
    let _ = first.join();
}

/// A's `dispatched` is committed and A is paused (test hook) before a byte of it is sent; A
/// then stops (SIGSTOP: no heartbeat), its lease expires, and a retry on B takes the execution
/// over, finds the marker absent under the same epoch and dispatches it under its ID. A comes
/// back and sends its old dispatch: the host's start guard (crossed by B's) refuses it, and A's
/// appends are fenced. The command ran once.
#[test]
fn a_takeover_inside_the_pause_between_the_dispatched_commit_and_the_send_runs_once() {
    let Some((h, key)) = replicated_host("takeover_before_send") else {
        return;
    };
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    let cmd = format!("{}echo once", h.count());
    let pause = tempfile::tempdir().unwrap();
    let armed = format!("before-send:{}", pause.path().display());
    let a = Server::start_env(
        &h,
        0,
        &["--intent-key", key.to_str().unwrap(), "--lease-for", "2s"],
        &[("CAIRN_TEST_PAUSE", &armed)],
    );
    let first = {
        let (auth, cmd, port) = (auth.clone(), cmd.clone(), a.port);
        std::thread::spawn(move || execute_maybe(port, &auth, 1, &cmd))
    };
    let reached = pause.path().join("before-send.reached");
    wait_for("A paused before sending its dispatch", LIMIT, || {
        reached.exists().then_some(())
    });
    let kill = |sig: &str| {
        let st = std::process::Command::new("kill")
            .args([sig, &a.pid().to_string()])
            .status()
            .unwrap();
        assert!(st.success(), "kill {sig}");
    };
    kill("-STOP");
    let b = replica_with_lease(&h, &key);
    let second = execute_maybe(b.port, &auth, 2, &cmd).expect("B answers");
    let r = &second["result"];
    assert_eq!(r["state"], "completed", "{second}\n{}", b.log());
    assert_eq!(r["stdout"], "once\n", "{second}");
    assert_eq!(h.runs(), 1, "B's dispatch ran it");
    let id = ExecutionId::parse(r["execution_id"].as_str().unwrap()).unwrap();

    // A comes back and sends the dispatch it committed before the takeover.
    std::fs::write(pause.path().join("before-send.go"), "").unwrap();
    kill("-CONT");
    let _ = first.join().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(h.runs(), 1, "A's late dispatch did not run it again");
    let kinds: Vec<String> = h
        .journal()
        .events(&id)
        .unwrap()
        .iter()
        .map(|e| e.kind.to_string())
        .collect();
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(count("takeover"), 1, "{kinds:?}");
    assert_eq!(count("completed"), 1, "{kinds:?}");
    assert_eq!(count("dispatched"), 2, "A's and B's: {kinds:?}");
    assert_eq!(h.executions(), 1);
}

/// The fence on a non-owner's append (docs/REPLICAS.md, "What the fence covers, exactly"):
/// this test process, never the owner, reads A's running execution (at lease epoch 1) and
/// decides to note something on it; A dies and B takes the execution over (epoch 2) before the
/// note is appended. The note is refused (CA001, `is_fenced`), nothing of it is written, and a
/// second try without reading again is refused too; once the process reads the execution
/// again (epoch 2 observed), its decision made again is appended. Ran once.
#[test]
fn a_non_owners_append_decided_before_a_takeover_is_refused_until_it_reads_again() {
    let Some((h, key)) = replicated_host("non_owner_fenced") else {
        return;
    };
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    let gate: PathBuf = h.sshd.dir().join("gate");
    let cmd = gated(&h, &gate);
    let mut a = replica_with_lease(&h, &key);
    let (port_a, auth2, cmd2) = (a.port, auth.clone(), cmd.clone());
    let first = std::thread::spawn(move || execute_maybe(port_a, &auth2, 1, &cmd2));
    let started = h.wait_started();
    let id = ExecutionId::parse(&started).unwrap();
    let mut j = h.journal();
    // The decision: made on what this process read, at A's epoch.
    let seen = j.status(&id).unwrap().expect("A's execution");
    assert!(!seen.state.is_settled(), "{seen:?}");
    let note = serde_json::json!({"method": "test", "decided_at_epoch": 1});
    let before = j.events(&id).unwrap().len();
    // Read again here: the events read is the observation the decision stands on.
    assert!(j.ownership(&id).unwrap().is_some_and(|o| o.epoch == 1));
    let b = replica_with_lease(&h, &key);
    let pid_a = a.pid();
    a.kill9();
    let _ = first.join();
    // Waited for in the database itself: a read through this process's journal would be an
    // observation of the new epoch.
    let server = crate::support::postgres::server("non_owner_fenced").unwrap();
    let url = h.journal.to_string_lossy().into_owned();
    let db = url.rsplit('/').next().unwrap().to_owned();
    let sql = format!("SELECT epoch FROM owners WHERE execution_id = '{started}'");
    wait_for("B's takeover (epoch 2)", LIMIT, || {
        (server.psql(&db, &sql).ok()?.trim() == "2").then_some(())
    });
    let kind = cairn::journal::EventKind::Correlation;
    let e = j
        .append(&id, kind.clone(), None, note.clone())
        .expect_err("a decision made before the takeover is refused");
    assert!(e.is_fenced(), "{e}");
    let e = j
        .append(&id, kind.clone(), None, note.clone())
        .expect_err("still refused without reading again");
    assert!(e.is_fenced(), "{e}");
    let evs = j.events(&id).unwrap();
    assert!(
        evs.iter().all(|e| e.evidence != note),
        "nothing of the refused note written: {evs:#?}"
    );
    assert!(evs.len() > before, "the takeover is in the journal");
    // Read again (epoch 2 observed, above) and decide again: appended.
    let fresh = serde_json::json!({"method": "test", "decided_at_epoch": 2});
    j.append(&id, kind, None, fresh.clone())
        .expect("a decision made after reading again is appended");
    std::fs::write(&gate, b"").unwrap();
    wait_for("B settles it", LIMIT, || {
        let s = h.journal().status(&id).ok()??;
        s.state.is_settled().then_some(())
    });
    let evs = h.journal().events(&id).unwrap();
    assert_eq!(evs.iter().filter(|e| e.evidence == fresh).count(), 1);
    assert_eq!(h.runs(), 1, "ran once\nB:\n{}", b.log());
    check_taken_over(&h, &started, pid_a, b.pid());
}
