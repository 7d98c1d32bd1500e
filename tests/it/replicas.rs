//! Gateway replicas on one PostgreSQL journal (docs/REPLICAS.md): two `cairn mcp --listen`
//! processes sharing a database behave as one gateway for intent matching. Against a real
//! sshd and the private PostgreSQL server of this test binary; every test counts how many times
//! the command ran on the host.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::http::{request, token, Server, JSON};
use crate::support::host::*;
use crate::support::postgres;

/// A test host whose journal is a fresh PostgreSQL database, and the intent key file every
/// replica shares. `None` when PostgreSQL is missing outside CI (said loudly).
pub(crate) fn replicated_host(test: &str) -> Option<(Host, PathBuf)> {
    let server = postgres::server(test)?;
    let mut h = Host::new();
    h.journal = PathBuf::from(server.database(test));
    let key = h.sshd.dir().join("intent.key");
    Some((h, key))
}

fn replica(h: &Host, key: &std::path::Path) -> Server {
    Server::start(h, 0, &["--intent-key", key.to_str().unwrap()])
}

/// `execute` over `/rpc` on `port` as `auth`: the result object (or the error, as JSON).
pub(crate) fn execute(port: u16, auth: &str, id: u64, command: &str) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "execute",
                      "params": {"destination": "127.0.0.1", "command": command}});
    let (status, text) = request(
        port,
        "POST",
        "/rpc",
        &[JSON, ("Authorization", auth)],
        &body.to_string(),
    );
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

// Long: one scenario, its phases in order.
#[test]
fn six_identical_calls_over_two_replicas_at_once_make_one_execution_that_runs_once() {
    let Some((h, key)) = replicated_host("six_identical_calls") else {
        return;
    };
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    let (a, b) = (replica(&h, &key), replica(&h, &key));
    // Long enough that every call arrives while the first is still running.
    let cmd = format!("{}sleep 2; echo once", h.count());
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
    let calls: Vec<_> = (0..6u64)
        .map(|i| {
            let port = if i % 2 == 0 { a.port } else { b.port };
            let (auth, cmd, barrier) = (auth.clone(), cmd.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                execute(port, &auth, i + 1, &cmd)
            })
        })
        .collect();
    let answers: Vec<Value> = calls.into_iter().map(|t| t.join().unwrap()).collect();
    let logs = format!("replica A:\n{}\nreplica B:\n{}", a.log(), b.log());
    let ids: std::collections::BTreeSet<String> = answers
        .iter()
        .map(|r| {
            assert_eq!(r["result"]["state"], "completed", "{r}\n{logs}");
            assert_eq!(r["result"]["stdout"], "once\n", "{r}\n{logs}");
            r["result"]["execution_id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "one execution for six calls: {answers:?}\n{logs}"
    );
    assert_eq!(h.runs(), 1, "ran once on the host\n{logs}");
    let j = h.journal();
    assert_eq!(
        j.list().unwrap().len(),
        1,
        "one execution in the shared journal"
    );
    let id = cairn::ExecutionId::parse(ids.iter().next().unwrap()).unwrap();
    let events = j.events(&id).unwrap();
    let count = |kind: &str| events.iter().filter(|e| e.kind == kind).count();
    assert_eq!(
        count("intent-matched"),
        5,
        "five calls attached: {events:#?}"
    );
    assert_eq!(count("dispatched"), 1, "dispatched once");
    // Both replicas took part: each answered its three calls, and their sessions are recorded.
    let sessions = j.sessions().unwrap();
    assert_eq!(
        sessions
            .iter()
            .filter(|s| s.record.kind == "mcp-http")
            .count(),
        2,
        "{sessions:?}"
    );
    let matched_by: std::collections::BTreeSet<String> = events
        .iter()
        .filter(|e| e.kind == "intent-matched")
        .map(|e| e.evidence["by"].as_str().unwrap_or_default().to_owned())
        .chain(std::iter::once(events[0].client.clone()))
        .collect();
    assert_eq!(
        matched_by.len(),
        2,
        "both replicas' processes: {matched_by:?}"
    );

    // The CLI reads the shared journal as it reads a file.
    let ls = output(h.local("ls"), std::time::Duration::from_secs(30));
    let listed = String::from_utf8_lossy(&ls.stdout);
    assert!(
        ls.status.success() && listed.contains(id.as_str()),
        "{ls:?}"
    );

    // After delivery a new identical call is a new run (a delivered execution is never
    // attached to), whichever replica gets it, as on one machine.
    h.wait_delivered(id.as_str());
    let again = execute(b.port, &auth, 7, &cmd);
    assert_ne!(again["result"]["execution_id"], id.as_str(), "{again}");
    assert_eq!(h.runs(), 2);
}

#[test]
fn a_replica_without_the_shared_intent_key_refuses_to_run_and_says_why() {
    let Some((h, _key)) = replicated_host("replica_without_key") else {
        return;
    };
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    let s = Server::start(&h, 0, &[]);
    let r = execute(s.port, &auth, 1, &format!("{}echo never", h.count()));
    let text = r.to_string();
    assert!(text.contains("--intent-key"), "{text}");
    assert_eq!(h.runs(), 0, "nothing ran");
}

/// `execute` over `/rpc` that may meet a dying server: the parsed answer, or `None` when the
/// connection ended without one.
pub(crate) fn execute_maybe(port: u16, auth: &str, id: u64, command: &str) -> Option<Value> {
    execute_within(port, auth, id, command, std::time::Duration::from_secs(60))
}

/// [`execute_maybe`], reading for at most `patience` without a byte.
fn execute_within(
    port: u16,
    auth: &str,
    id: u64,
    command: &str,
    patience: std::time::Duration,
) -> Option<Value> {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "execute",
                      "params": {"destination": "127.0.0.1", "command": command}});
    rpc_within(port, auth, &body, patience)
}

/// One JSON-RPC request `body` over `/rpc` on `port` as `auth`, reading for at most `patience`
/// without a byte: the parsed answer, or `None` when the connection ended without one.
pub(crate) fn rpc_within(
    port: u16,
    auth: &str,
    body: &Value,
    patience: std::time::Duration,
) -> Option<Value> {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(patience)).ok()?;
    let req = format!(
        "POST /rpc HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Authorization: {auth}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let (_, body) = text.split_once("\r\n\r\n")?;
    serde_json::from_str(body).ok()
}

/// A replica with a short lease (heartbeat every third of it), so a takeover comes soon.
pub(crate) fn replica_with_lease(h: &Host, key: &std::path::Path) -> Server {
    Server::start(
        h,
        0,
        &["--intent-key", key.to_str().unwrap(), "--lease-for", "2s"],
    )
}

/// Send `sig` (`STOP`, `CONT`) to a process this test started.
fn signal(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(st.success(), "kill -{sig} {pid}");
}

/// The takeover events of `id`, and the checks every takeover test makes of the journal:
/// one dispatch, one takeover from A to B at epoch 2, one outcome recorded (by B), and B the
/// owner of the settled execution.
pub(crate) fn check_taken_over(h: &Host, id: &str, a: u32, b: u32) -> Vec<cairn::journal::Event> {
    let j = h.journal();
    let xid = cairn::ExecutionId::parse(id).unwrap();
    let evs = j.events(&xid).unwrap();
    let kinds: Vec<&str> = evs.iter().map(|e| e.kind.as_str()).collect();
    let count = |k: &str| kinds.iter().filter(|x| **x == k).count();
    assert_eq!(count("dispatched"), 1, "{kinds:?}");
    assert_eq!(count("takeover"), 1, "one takeover: {kinds:?}");
    assert_eq!(count("completed"), 1, "one outcome: {kinds:?}");
    let (by_a, by_b) = (format!("{a}@"), format!("{b}@"));
    let t = evs.iter().position(|e| e.kind == "takeover").unwrap();
    let took = &evs[t];
    assert!(took.client.starts_with(&by_b), "{took:?}");
    assert!(
        took.evidence["from_client"]
            .as_str()
            .unwrap()
            .starts_with(&by_a),
        "{took:?}"
    );
    assert!(
        took.evidence["to_client"]
            .as_str()
            .unwrap()
            .starts_with(&by_b),
        "{took:?}"
    );
    assert_eq!(took.evidence["epoch"], 2, "{took:?}");
    assert_eq!(took.evidence["takeover"], 1, "{took:?}");
    let c = evs.iter().position(|e| e.kind == "completed").unwrap();
    assert!(
        c > t,
        "the outcome is recorded after the takeover: {kinds:?}"
    );
    assert!(
        evs[c].client.starts_with(&by_b),
        "B recorded it: {:?}",
        evs[c]
    );
    assert!(
        evs[t..].iter().all(|e| !e.client.starts_with(&by_a)),
        "nothing from A after the takeover: {evs:#?}"
    );
    let o = j.ownership(&xid).unwrap().expect("an owner row");
    assert_eq!(o.epoch, 2, "{o:?}");
    assert_eq!(o.takeovers, 1, "{o:?}");
    assert!(o.settled, "{o:?}");
    assert!(o.client.starts_with(&by_b), "{o:?}");
    assert_eq!(j.takeover_counts().unwrap().get(id), Some(&1));
    assert_eq!(j.list().unwrap().len(), 1);
    evs
}

/// Replica A is killed (`kill -9`) while its command runs; the client's retry goes to B, which
/// recognises the same intent in the shared journal, waits for A's lease to expire, takes the
/// execution over (a `takeover` event, epoch 2), attaches to it on the host and returns its
/// result. The command ran once, and the journal shows B finishing it.
#[test]
fn a_replica_killed_mid_run_is_taken_over_after_its_lease_and_the_command_runs_once() {
    let Some((h, key)) = replicated_host("replica_killed_mid_run") else {
        return;
    };
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    let (mut a, b) = (replica_with_lease(&h, &key), replica_with_lease(&h, &key));
    let cmd = format!("{}sleep 3; echo finished", h.count());
    let (port_a, auth2, cmd2) = (a.port, auth.clone(), cmd.clone());
    let first = std::thread::spawn(move || execute_maybe(port_a, &auth2, 1, &cmd2));
    let started = h.wait_started();
    let pid_a = a.pid();
    a.kill9();
    let lost = first.join().unwrap();
    assert!(
        lost.as_ref().is_none_or(|v| v.get("result").is_none()),
        "A answered before it died: {lost:?}"
    );
    let retry = execute(b.port, &auth, 2, &cmd);
    let logs = b.log();
    assert_eq!(retry["result"]["state"], "completed", "{retry}\n{logs}");
    assert_eq!(retry["result"]["stdout"], "finished\n", "{retry}");
    assert_eq!(retry["result"]["execution_id"], started.as_str(), "{retry}");
    assert_eq!(h.runs(), 1, "ran once");
    let evs = check_taken_over(&h, &started, pid_a, b.pid());
    let matched = evs
        .iter()
        .find(|e| e.kind == "intent-matched")
        .expect("B matched");
    assert!(
        matched.client.starts_with(&format!("{}@", b.pid())),
        "{matched:?}"
    );
    // `cairn ls` shows how often it was taken over.
    let mut ls = h.local("ls");
    ls.arg("--json");
    let ls = output(ls, std::time::Duration::from_secs(30));
    let rows: Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(rows[0]["takeovers"], 1, "{rows}");
}

/// Replica A is paused (SIGSTOP) past its lease while its command runs, and its connection to
/// the host is cut meanwhile. The client's retry goes to B, which takes the execution over and
/// returns its result. A is resumed (SIGCONT): it finds its connection gone and tries to record
/// that, as owner of the execution at its old epoch; the fence refuses the append, A's caller
/// gets the error, and A neither dispatches nor records anything. Ran once, nothing lost.
#[test]
fn a_replica_paused_past_its_lease_is_fenced_when_it_resumes_and_the_command_runs_once() {
    let Some((h, key)) = replicated_host("replica_paused") else {
        return;
    };
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    let (a, b) = (replica_with_lease(&h, &key), replica_with_lease(&h, &key));
    let cmd = format!("{}sleep 3; echo finished", h.count());
    let (port_a, auth2, cmd2) = (a.port, auth.clone(), cmd.clone());
    let first = std::thread::spawn(move || execute_maybe(port_a, &auth2, 1, &cmd2));
    let started = h.wait_started();
    signal(a.pid(), "STOP");
    // Only A is connected to the host yet: its connection dies while it cannot notice.
    h.proxy.cut();
    let retry = execute(b.port, &auth, 2, &cmd);
    assert_eq!(
        retry["result"]["state"],
        "completed",
        "{retry}\n{}",
        b.log()
    );
    assert_eq!(retry["result"]["stdout"], "finished\n", "{retry}");
    assert_eq!(retry["result"]["execution_id"], started.as_str(), "{retry}");
    // B records the delivery after it answers.
    h.wait_delivered(&started);
    let before = h.kinds(&started);
    signal(a.pid(), "CONT");
    let late = first.join().unwrap();
    let logs = a.log();
    assert!(
        late.as_ref().is_none_or(|v| v.get("result").is_none()),
        "A answered as if it still owned it: {late:?}\n{logs}"
    );
    // (A's stderr is read by a thread of its own: the line may come after the answer)
    let fenced = (0..300).any(|_| {
        let seen = a.log().contains("was taken over by replica");
        if !seen {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        seen
    });
    assert!(
        fenced,
        "A's late append was refused by the fence: {late:?}\n{}",
        a.log()
    );
    if let Some(v) = &late {
        assert!(
            v.to_string().contains("was taken over by replica"),
            "A's caller is told why: {v}"
        );
    }
    assert_eq!(
        h.kinds(&started),
        before,
        "A recorded nothing after it resumed"
    );
    assert_eq!(h.runs(), 1, "ran once");
    check_taken_over(&h, &started, a.pid(), b.pid());
}

/// PostgreSQL crashes and comes back (immediate shutdown, then start) while a command runs:
/// the replica reconnects, the call completes (or, had a write met the outage, a retry
/// attaches), nothing recorded is lost, and the command ran once.
#[test]
fn postgres_restarted_mid_run_loses_nothing_and_the_command_runs_once() {
    // A server of its own: the crash must not reach the other tests' journals.
    let Some(server) = postgres::own_server("postgres_restarted_mid_run") else {
        return;
    };
    let mut h = Host::new();
    h.journal = PathBuf::from(server.database("restarted"));
    let key = h.sshd.dir().join("intent.key");
    let auth = format!("Bearer {}", token(&h, "agent:alice", &[]));
    let a = replica(&h, &key);
    let cmd = format!("{}sleep 3; echo survived", h.count());
    let (port, auth2, cmd2) = (a.port, auth.clone(), cmd.clone());
    let call = std::thread::spawn(move || execute_maybe(port, &auth2, 1, &cmd2));
    let started = h.wait_started();
    let before = h.kinds(&started);
    server.restart();
    let answer = call.join().unwrap();
    let result = match answer {
        Some(v) if v["result"]["state"] == "completed" => v,
        // a write met the outage and the call failed: the retry attaches
        other => {
            eprintln!("first call after the restart: {other:?}");
            execute(a.port, &auth, 2, &cmd)
        }
    };
    assert_eq!(
        result["result"]["stdout"],
        "survived\n",
        "{result}\n{}",
        a.log()
    );
    assert_eq!(result["result"]["execution_id"], started.as_str());
    assert_eq!(h.runs(), 1, "ran once");
    let after = h.kinds(&started);
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "nothing recorded before the crash was lost"
    );
    assert!(after.iter().any(|k| k == "completed"), "{after:?}");
    assert_eq!(after.iter().filter(|k| *k == "dispatched").count(), 1);
}

mod campaign;

/// Seeded random trials of calls, faults and retries over three replicas on one PostgreSQL
/// journal (see `replicas/campaign.rs`).
#[test]
fn randomized_replica_campaign() {
    campaign::run();
}
