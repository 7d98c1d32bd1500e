//! Intent matching, operation classes, authorization, review, sessions and the gateway
//! servers (`cairn serve --stdio`, `cairn mcp`), end to end against a real sshd. Every test
//! counts how many times the command really ran on the host.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cairn::journal::Journal;
use cairn::{ExecutionId, State};
use serde_json::{json, Value};

use crate::support::host::*;

const T: Duration = Duration::from_secs(60);

// ----- intent matching ---------------------------------------------------------------------

#[test]
fn a_repeat_while_running_attaches_and_the_command_runs_once() {
    let h = Host::new();
    // The command ends only when the test says so: after the repeat has matched it.
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}echo start; while [ ! -e '{}' ]; do sleep 0.05; done; echo end; exit 3",
        h.count(),
        go.display()
    );
    let first = spawn(h.run_cmd(&["--json"], &cmd));
    let id = h.wait_started();
    let second = spawn(h.run_cmd(&["--json"], &cmd));
    wait_for("the repeat to match the running execution", T, || {
        h.kinds(&id)
            .iter()
            .any(|k| k == "intent-matched")
            .then_some(())
    });
    assert!(
        !h.x().join(format!("{id}.done")).exists(),
        "still running when the repeat matched"
    );
    fs::write(&go, "").unwrap();
    let second = wait_child(second, T);
    let first = wait_child(first, T);
    let (a, b) = (json_of(&first), json_of(&second));
    assert_eq!(first.status.code(), Some(3), "{a}");
    assert_eq!(second.status.code(), Some(3), "{b}");
    assert_eq!(a["execution_id"], id.as_str());
    assert_eq!(b["execution_id"], id.as_str(), "the repeat attaches: {b}");
    assert_eq!(b["attached"], true);
    assert_eq!(a["attached"], false);
    assert_eq!(b["stdout"], "start\nend\n");
    assert_eq!(h.runs(), 1, "the command must run once");
    assert_eq!(h.executions(), 1);
    assert!(h.kinds(&id).contains(&"intent-matched".to_string()));
    assert_eq!(a["fingerprint"], b["fingerprint"]);
    assert_eq!(a["fingerprint"].as_str().unwrap().len(), 64);
    assert_eq!(h.state(&id), State::Delivered);
}

#[test]
fn identical_requests_at_the_same_instant_make_one_execution() {
    let h = Host::new();
    // The command ends only after all six have reached the one execution.
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.05; done; echo once",
        h.count(),
        go.display()
    );
    let children: Vec<_> = (0..6)
        .map(|_| spawn(h.run_cmd(&["--json"], &cmd)))
        .collect();
    let first = h.wait_started();
    wait_for("five repeats to match", T, || {
        (h.kinds(&first)
            .iter()
            .filter(|k| *k == "intent-matched")
            .count()
            == 5)
            .then_some(())
    });
    fs::write(&go, "").unwrap();
    let outs: Vec<_> = children.into_iter().map(|c| wait_child(c, T)).collect();
    let mut ids = std::collections::BTreeSet::new();
    for o in &outs {
        let v = json_of(o);
        assert_eq!(o.status.code(), Some(0), "{v}");
        assert_eq!(v["stdout"], "once\n", "{v}");
        ids.insert(v["execution_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "one execution for all: {ids:?}");
    assert_eq!(h.runs(), 1, "the command ran once");
    assert_eq!(h.executions(), 1);
    let id = ids.into_iter().next().unwrap();
    let kinds = h.kinds(&id);
    assert_eq!(
        kinds.iter().filter(|k| *k == "intent-matched").count(),
        5,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| *k == "authorized").count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(first, id);
    assert_eq!(h.state(&id), State::Delivered);
}

#[test]
fn threads_in_one_process_racing_the_journal_make_one_execution() {
    // The check-and-insert itself, without ssh: many handles, one fingerprint.
    let h = Host::new();
    let path = h.journal.clone();
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let path = path.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                // Every thread reaches the barrier, even one whose open fails, so a failure
                // fails the test instead of leaving the others waiting for ever.
                let opened = Journal::open(&path);
                let id = ExecutionId::generate();
                let rec = cairn::journal::ExecutionRecord {
                    id: id.clone(),
                    created_at: cairn::journal::now_rfc3339(),
                    destination: "h".into(),
                    host: "h".into(),
                    port: 22,
                    user: "u".into(),
                    command: b"true".to_vec(),
                    command_digest: "00".into(),
                    remote_dir: ".cairn".into(),
                    timeout_secs: 0,
                    client: format!("t{i}"),
                };
                let cols = cairn::journal::IntentColumns {
                    fingerprint: "f".repeat(64),
                    actor: "a".into(),
                    scope: "default".into(),
                    class: "remote-command".into(),
                    retention_secs: 60,
                    accepted_ms: cairn::journal::now_ms(),
                    session_id: None,
                    intent: json!({}),
                };
                barrier.wait();
                let mut j = opened.unwrap();
                match j
                    .accept_or_match(
                        &rec,
                        &cols,
                        json!({}),
                        json!({}),
                        cairn::executor::choose_match,
                    )
                    .unwrap()
                {
                    cairn::journal::AcceptOrMatch::Accepted(_) => Some(id),
                    cairn::journal::AcceptOrMatch::Matched(_) => None,
                }
            })
        })
        .collect();
    let accepted: Vec<_> = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(accepted.len(), 1, "exactly one accepted");
    assert_eq!(h.executions(), 1);
}

#[test]
fn after_delivery_or_with_another_scope_or_class_it_is_a_new_execution() {
    let h = Host::new();
    let cmd = format!("{}echo hi", h.count());
    let a = json_of(&output(h.run_cmd(&["--json"], &cmd), T));
    let b = json_of(&output(h.run_cmd(&["--json"], &cmd), T));
    assert_ne!(a["execution_id"], b["execution_id"], "delivered: a new run");
    assert_eq!(h.runs(), 2);
    // While a detached one runs, another scope or class is another operation.
    let slow = format!("{}sleep 2", h.count());
    let d = output(h.run_cmd(&["--detach", "--json"], &slow), T);
    let d = json_of(&d);
    let again = json_of(&output(h.run_cmd(&["--detach", "--json"], &slow), T));
    assert_eq!(
        again["execution_id"], d["execution_id"],
        "same intent attaches"
    );
    let scoped = json_of(&output(
        h.run_cmd(&["--detach", "--json", "--scope", "ticket-42"], &slow),
        T,
    ));
    assert_ne!(scoped["execution_id"], d["execution_id"]);
    assert_ne!(scoped["fingerprint"], d["fingerprint"]);
    let classed = json_of(&output(
        h.run_cmd(&["--detach", "--json", "--class", "idempotent"], &slow),
        T,
    ));
    assert_ne!(classed["execution_id"], d["execution_id"]);
    let actor = json_of(&output(
        h.run_cmd(&["--detach", "--json", "--actor", "someone-else"], &slow),
        T,
    ));
    assert_ne!(actor["execution_id"], d["execution_id"]);
    wait_for("four detached runs", T, || (h.runs() == 6).then_some(()));
}

#[test]
fn past_the_retention_window_it_is_a_new_execution() {
    let h = Host::new();
    let slow = format!("{}sleep 3", h.count());
    let a = json_of(&output(
        h.run_cmd(&["--detach", "--json", "--retention", "1s"], &slow),
        T,
    ));
    std::thread::sleep(Duration::from_millis(1300));
    let b = json_of(&output(
        h.run_cmd(&["--detach", "--json", "--retention", "1s"], &slow),
        T,
    ));
    assert_ne!(a["execution_id"], b["execution_id"]);
    wait_for("two runs", T, || (h.runs() == 2).then_some(()));
}

#[test]
fn cwd_and_env_reach_the_host_and_are_part_of_the_intent() {
    let h = Host::new();
    let dir = h.sshd.dir().join("work dir");
    fs::create_dir_all(&dir).unwrap();
    let cmd = format!("{}pwd; echo \"$MODE\"", h.count());
    let out = output(
        h.run_cmd(
            &[
                "--json",
                "--cwd",
                dir.to_str().unwrap(),
                "--env",
                "MODE=it's fast",
            ],
            &cmd,
        ),
        T,
    );
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!(v["stdout"], format!("{}\nit's fast\n", dir.display()));
    let j = h.journal();
    let id = ExecutionId::parse(v["execution_id"].as_str().unwrap()).unwrap();
    let intent = j.intent_of(&id).unwrap().unwrap();
    assert_eq!(intent.intent["cwd"], dir.to_str().unwrap());
    assert_eq!(intent.intent["env"]["MODE"], "it's fast");
    assert_eq!(intent.intent["command"], cmd.as_str());
    assert!(intent.intent["host_key"]
        .as_str()
        .unwrap()
        .starts_with("SHA256:"));
}

#[test]
fn the_intent_key_is_created_0600_and_never_logged() {
    use std::os::unix::fs::PermissionsExt;
    let h = Host::new();
    let out = output(h.run_cmd(&[], &format!("{}true", h.count())), T);
    assert_eq!(out.status.code(), Some(0));
    let key = h.journal.parent().unwrap().join("intent.key");
    let mode = fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let k = fs::read_to_string(&key).unwrap();
    let k = k.trim();
    assert!(!String::from_utf8_lossy(&out.stderr).contains(k));
    assert!(!fs::read(&h.journal)
        .unwrap()
        .windows(k.len())
        .any(|w| w == k.as_bytes()));
    // --intent-key moves it; another key gives other fingerprints.
    let other = h.sshd.dir().join("other.key");
    let v = json_of(&output(
        h.run_cmd(&["--json", "--intent-key", other.to_str().unwrap()], "true"),
        T,
    ));
    let w = json_of(&output(h.run_cmd(&["--json"], "true"), T));
    assert!(other.exists());
    assert_ne!(v["fingerprint"], w["fingerprint"]);
}

#[test]
fn a_secret_never_reaches_the_journal_the_marker_or_argv() {
    let h = Host::new();
    let secret = "s3cr3t-value-that-must-not-leak";
    let digest_file = h.sshd.dir().join("secret.sha");
    let mut c = h.run_cmd(
        &["--json", "--secret-env", "CAIRN_TEST_TOKEN"],
        &format!(
            "{}printf '%s' \"$CAIRN_TEST_TOKEN\" | sha256sum > '{}'",
            h.count(),
            digest_file.display()
        ),
    );
    c.env("CAIRN_TEST_TOKEN", secret).env("CAIRN_LOG", "debug");
    let out = output(c, T);
    let v = json_of(&out);
    // Wherever cairn wrote: journal, anchor, marker home, its own output.
    let mut hay: Vec<Vec<u8>> = vec![out.stdout.clone(), out.stderr.clone()];
    for dir in [
        h.journal.parent().unwrap().to_path_buf(),
        h.remote_dir.clone(),
    ] {
        for e in walk(&dir) {
            hay.push(fs::read(e).unwrap_or_default());
        }
    }
    for bytes in &hay {
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret leaked"
        );
    }
    let id = ExecutionId::parse(v["execution_id"].as_str().unwrap()).unwrap();
    let intent = h.journal().intent_of(&id).unwrap().unwrap();
    assert_eq!(intent.intent["secret_env"], json!(["CAIRN_TEST_TOKEN"]));
    // The command saw the value (out of band: stdin to the supervisor, then its environment),
    // used here as an argument of printf: a secret argument is written "$NAME".
    assert_eq!(v["state"], "completed", "{v}");
    {
        use sha2::Digest;
        let want = hex::encode(sha2::Sha256::digest(secret.as_bytes()));
        assert!(fs::read_to_string(&digest_file).unwrap().starts_with(&want));
        assert_eq!(h.runs(), 1);
    }
    // A missing secret is refused before anything is sent.
    let out = output(h.run_cmd(&["--secret-env", "CAIRN_TEST_ABSENT"], "true"), T);
    assert_eq!(out.status.code(), Some(255));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CAIRN_TEST_ABSENT"));
}

fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else if p.is_file() {
                // (regular files only: reading the marker's wake fifo would block)
                out.push(p);
            }
        }
    }
    out
}

// ----- unknown outcomes, classes, review ---------------------------------------------------

/// Run `cmd` with `extra`, lose the host mid-run for longer than --reconnect-for, so that the
/// outcome is recorded `unknown`; then let the host be reachable again.
fn make_unknown(h: &Host, extra: &[&str], cmd: &str) -> String {
    let mut c = Command::new(BIN);
    c.arg("run");
    h.conn_args(&mut c, "1s");
    c.arg("--remote-dir")
        .arg(&h.remote_dir)
        .args(["--json"])
        .args(extra);
    c.arg("127.0.0.1").arg("--").arg(cmd);
    let child = spawn(c);
    let id = h.wait_started();
    h.proxy.set_refuse(true);
    h.proxy.cut();
    let out = wait_child(child, T);
    h.proxy.set_refuse(false);
    let v = json_of(&out);
    assert_eq!(v["state"], "unknown", "{v}");
    assert_eq!(out.status.code(), Some(254));
    assert_eq!(v["needs_review"], true);
    id
}

/// A class the journal holds that does not parse (damaged, or a newer build's) is read back
/// as needing review: the retry neither probes (which could dispatch again) nor runs it, and an
/// unknown class in a request is refused before anything is accepted.
#[test]
fn an_unparseable_recorded_class_is_left_for_review_and_an_unknown_one_is_refused() {
    let h = Host::new();
    let cmd = format!("{}sleep 1; echo paid", h.count());
    let id = make_unknown(&h, &["--class", "irreversible"], &cmd);
    h.wait_done(&id);
    let c = rusqlite::Connection::open(&h.journal).unwrap();
    c.execute_batch(
        "DROP TRIGGER IF EXISTS executions_fixed_u;
         UPDATE executions SET class = 'irreversable';",
    )
    .unwrap();
    drop(c);
    let out = output(h.run_cmd(&["--json", "--class", "irreversible"], &cmd), T);
    let v = json_of(&out);
    assert_eq!(v["execution_id"], id.as_str(), "{v}");
    assert_eq!(v["state"], "unknown", "not probed and collected: {v}");
    assert_eq!(v["needs_review"], true, "{v}");
    assert_eq!(out.status.code(), Some(254), "{v}");
    assert_eq!(h.runs(), 1);
    assert_eq!(h.executions(), 1);
    // An unknown class in a request: refused, nothing accepted.
    let out = output(h.run_cmd(&["--json", "--class", "irreversable"], &cmd), T);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("irreversable"),
        "{out:?}"
    );
    let mut rpc = Rpc::start(&h, "60s");
    let r = rpc.call(
        json!(1),
        "execute",
        json!({"destination": "127.0.0.1", "command": cmd, "class": "irreversable"}),
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown operation class")),
        "{r}"
    );
    drop(rpc);
    assert_eq!(h.executions(), 1, "nothing accepted");
    assert_eq!(h.runs(), 1);
}

#[test]
fn irreversible_after_unknown_stops_for_review_and_resolve_records_the_decision() {
    let h = Host::new();
    let cmd = format!("{}sleep 1; echo paid", h.count());
    let id = make_unknown(&h, &["--class", "irreversible"], &cmd);
    h.wait_done(&id);
    let connections = h.proxy.connections();
    // The retry attaches to the review record: nothing resent, no new approval, no contact.
    let out = output(
        h.run_cmd(
            &["--json", "--class", "irreversible", "--approve", "deny"],
            &cmd,
        ),
        T,
    );
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(254), "{v}");
    assert_eq!(v["execution_id"], id.as_str());
    assert_eq!(v["attached"], true);
    assert_eq!(v["state"], "unknown");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("needs review") && reason.contains("irreversible"),
        "{reason}"
    );
    assert!(reason.contains("first dispatched 20"), "{reason}");
    assert_eq!(h.runs(), 1);
    assert_eq!(h.executions(), 1);
    assert_eq!(
        h.proxy.connections(),
        connections + 1,
        "one connect to learn the host key"
    );
    let kinds = h.kinds(&id);
    assert!(
        !kinds.contains(&"rejected".to_string()),
        "no second approval: {kinds:?}"
    );
    // cairn review shows the original record.
    let r = output(
        {
            let mut c = h.local("review");
            c.arg("--json");
            c
        },
        T,
    );
    let list: Value = serde_json::from_slice(&r.stdout).unwrap();
    let item = &list.as_array().unwrap()[0];
    assert_eq!(item["execution_id"], id.as_str());
    assert_eq!(item["class"], "irreversible");
    assert!(item["target"].as_str().unwrap().contains("127.0.0.1"));
    assert!(item["first_dispatched_at"].is_string());
    assert!(item["why_not_resent"]
        .as_str()
        .unwrap()
        .contains("irreversible"));
    assert_eq!(item["command"], cmd.as_str());
    // A human decides; the decision is evidence.
    let mut c = h.cairn("resolve");
    c.args([
        &id,
        "--as",
        "completed",
        "--reason",
        "checked the ledger: paid once",
    ]);
    let out = output(c, T);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(h.state(&id), State::Completed);
    let ev = h
        .journal()
        .events(&ExecutionId::parse(&id).unwrap())
        .unwrap();
    let res = ev.iter().find(|e| e.kind == "resolved").unwrap();
    assert_eq!(res.evidence["reason"], "checked the ledger: paid once");
    assert!(res.evidence["by"].as_str().unwrap().starts_with("local:"));
    let r = output(h.local("review"), T);
    assert!(String::from_utf8_lossy(&r.stdout).contains("nothing needs review"));
    assert_eq!(h.runs(), 1);
}

#[test]
fn remote_command_after_unknown_probes_the_marker_and_returns_the_stored_result() {
    let h = Host::new();
    let cmd = format!("{}sleep 1; echo stored; exit 6", h.count());
    let id = make_unknown(&h, &[], &cmd);
    h.wait_done(&id);
    let out = output(h.run_cmd(&["--json"], &cmd), T);
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(6), "{v}");
    assert_eq!(v["execution_id"], id.as_str());
    assert_eq!(v["attached"], true);
    assert_eq!(v["recovered"], true);
    assert_eq!(v["state"], "completed");
    assert_eq!(v["stdout"], "stored\n");
    assert_eq!(h.runs(), 1);
}

#[test]
fn read_only_after_unknown_runs_again() {
    let h = Host::new();
    let cmd = format!("{}sleep 1; echo status", h.count());
    let id = make_unknown(&h, &["--class", "read-only"], &cmd);
    h.wait_done(&id);
    let v = json_of(&output(
        h.run_cmd(&["--json", "--class", "read-only"], &cmd),
        T,
    ));
    assert_ne!(
        v["execution_id"],
        id.as_str(),
        "read-only retries as a new execution"
    );
    assert_eq!(v["state"], "completed");
    assert_eq!(h.runs(), 2);
}

#[test]
fn resolve_retry_refuses_what_started_and_redispatches_what_never_did() {
    let h = Host::new();
    // Started, then unknown: retry is refused.
    let cmd = format!("{}sleep 1; echo x", h.count());
    let id = make_unknown(&h, &[], &cmd);
    let mut c = h.cairn("resolve");
    c.args([&id, "--as", "retry", "--reason", "try again"]);
    let out = output(c, T);
    assert_eq!(out.status.code(), Some(255), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to retry"));
    h.wait_done(&id);
    assert_eq!(h.runs(), 1);

    // Dispatched, cut before the host had the whole command, the client killed, and the
    // host unreachable for `recover`: unknown, marker absent. Retry dispatches it under the
    // same ID.
    let h = Host::new();
    let c = h.megabyte_run("; echo retried");
    h.proxy.cut_after_upstream_bytes(Some(400_000));
    let mut child = spawn(c);
    wait_for("the first cut", T, || {
        (h.proxy.connections() >= 2).then_some(())
    });
    child.kill().unwrap();
    let _ = child.wait();
    h.proxy.set_refuse(true);
    h.proxy.cut();
    let mut rc = Command::new(BIN);
    rc.arg("recover");
    h.conn_args(&mut rc, "1s");
    rc.arg("--json");
    let out = output(rc, T);
    h.proxy.set_refuse(false);
    h.proxy.cut_after_upstream_bytes(None);
    let v = json_of(&out);
    let v = &v[0];
    assert_eq!(v["state"], "unknown", "{v}");
    let id = v["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(h.runs(), 0);
    let mut c = h.cairn("resolve");
    c.args([
        &id,
        "--as",
        "retry",
        "--reason",
        "the host never got it",
        "--json",
    ]);
    let out = output(c, T);
    let r = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["execution_id"], id.as_str());
    assert_eq!(r["state"], "completed");
    assert_eq!(r["stdout"], "retried\n");
    assert_eq!(h.runs(), 1);
    assert!(h.kinds(&id).contains(&"resolved".to_string()));
}

// ----- authorization -----------------------------------------------------------------------

#[test]
fn a_policy_rejects_with_evidence_and_an_attach_is_never_asked_again() {
    let h = Host::new();
    let policy = h.sshd.dir().join("policy.json");
    fs::write(
        &policy,
        r#"{"default":"deny","rules":[
            {"name":"nothing irreversible","decision":"deny","class":["irreversible"]},
            {"name":"status only","decision":"allow","command_prefix":"echo ran"}]}"#,
    )
    .unwrap();
    let p = policy.to_str().unwrap();
    let out = output(h.run_cmd(&["--json", "--policy", p], "rm -rf /nothing"), T);
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(255), "{v}");
    assert_eq!(v["state"], "rejected");
    assert!(
        v["reason"].as_str().unwrap().contains("no rule matched"),
        "{v}"
    );
    let id = v["execution_id"].as_str().unwrap();
    let ev = h
        .journal()
        .events(&ExecutionId::parse(id).unwrap())
        .unwrap();
    let rej = ev.iter().find(|e| e.kind == "rejected").unwrap();
    assert!(rej.evidence["by"].as_str().unwrap().starts_with("policy:"));
    assert!(rej.evidence["at"].is_string());
    assert!(!ev.iter().any(|e| e.kind == "dispatched"));

    let cmd = format!("{}sleep 1.5; echo ok", h.count());
    let out = output(
        h.run_cmd(&["--json", "--policy", p, "--class", "irreversible"], &cmd),
        T,
    );
    assert_eq!(json_of(&out)["state"], "rejected");
    let first = spawn(h.run_cmd(&["--json", "--policy", p], &cmd));
    let started = h.wait_started();
    let ev = h
        .journal()
        .events(&ExecutionId::parse(&started).unwrap())
        .unwrap();
    let auth = ev.iter().find(|e| e.kind == "authorized").unwrap();
    assert_eq!(auth.evidence["rule"], "status only");
    // The same intent under a deny-all approver attaches: no second approval.
    let second = output(h.run_cmd(&["--json", "--approve", "deny"], &cmd), T);
    let b = json_of(&second);
    assert_eq!(second.status.code(), Some(0), "{b}");
    assert_eq!(b["execution_id"], started.as_str());
    assert_eq!(b["attached"], true);
    wait_child(first, T);
    assert_eq!(h.runs(), 1);
    let kinds = h.kinds(&started);
    assert_eq!(kinds.iter().filter(|k| *k == "authorized").count(), 1);
    assert!(!kinds.contains(&"rejected".to_string()));
}

// ----- sessions ----------------------------------------------------------------------------

#[test]
fn sessions_record_who_created_what() {
    let h = Host::new();
    let v = json_of(&output(
        h.run_cmd(&["--json", "--actor", "ci:job-7"], "echo s"),
        T,
    ));
    let out = output(
        {
            let mut c = h.local("sessions");
            c.arg("--json");
            c
        },
        T,
    );
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &list.as_array().unwrap()[0];
    assert_eq!(s["kind"], "cli");
    assert_eq!(s["actor"], "ci:job-7");
    assert!(s["pid"].as_i64().unwrap() > 0);
    assert!(s["started_at"].is_string());
    assert!(s["ended_at"].is_string());
    assert_eq!(s["executions"], 1);
    assert_eq!(s["execution_ids"], json!([v["execution_id"]]));
    let text = output(h.local("sessions"), T);
    assert!(String::from_utf8_lossy(&text.stdout).contains("ci:job-7"));
}

// ----- cairn serve --stdio -----------------------------------------------------------------

struct Rpc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Responses read while waiting for another one.
    kept: Vec<Value>,
}

impl Rpc {
    fn start(h: &Host, reconnect_for: &str) -> Rpc {
        Rpc::start_with(h, reconnect_for, &[])
    }

    fn start_with(h: &Host, reconnect_for: &str, extra: &[&str]) -> Rpc {
        let mut c = Command::new(BIN);
        c.arg("serve");
        h.conn_args(&mut c, reconnect_for);
        c.arg("--stdio").arg("--remote-dir").arg(&h.remote_dir);
        c.args(extra);
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn cairn serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Rpc {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            kept: Vec::new(),
        }
    }

    fn send(&mut self, msg: &str) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(msg.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
        s.flush().unwrap();
    }

    fn request(&mut self, id: Value, method: &str, params: Value) {
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
    }

    /// The response with this id (others are kept for later, in order).
    fn response(&mut self, id: &Value, limit: Duration) -> Value {
        if let Some(i) = self.kept.iter().position(|v| &v["id"] == id) {
            return self.kept.remove(i);
        }
        let t0 = Instant::now();
        loop {
            let left = limit
                .checked_sub(t0.elapsed())
                .expect("timed out waiting for a response");
            let line = self.lines.recv_timeout(left).expect("a response line");
            let v: Value = serde_json::from_str(&line).expect("response is JSON");
            assert_eq!(v["jsonrpc"], "2.0");
            if &v["id"] == id {
                return v;
            }
            self.kept.push(v);
        }
    }

    fn call(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.request(id.clone(), method, params);
        self.response(&id, T)
    }
}

impl Drop for Rpc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn serve_stdio_executes_echoes_ids_and_pages_output() {
    let h = Host::new();
    let mut rpc = Rpc::start(&h, "60s");
    let cmd = format!(
        "{}printf 'line1\\nline2\\n'; echo err >&2; exit 2",
        h.count()
    );
    let r = rpc.call(
        json!(7),
        "execute",
        json!({"destination": "127.0.0.1", "command": cmd}),
    );
    let res = &r["result"];
    assert_eq!(res["state"], "completed", "{r}");
    assert_eq!(res["exit_code"], 2);
    assert_eq!(res["stdout"], "line1\nline2\n");
    assert_eq!(res["stderr"], "err\n");
    assert_eq!(res["attached"], false);
    assert!(res["summary"].as_str().unwrap().contains("exit status 2"));
    let id = res["execution_id"].as_str().unwrap().to_owned();
    // The id is stored as the correlation ID.
    let ev = h
        .journal()
        .events(&ExecutionId::parse(&id).unwrap())
        .unwrap();
    let corr = ev.iter().find(|e| e.kind == "correlation").unwrap();
    assert_eq!(corr.evidence["correlation_id"], "7");
    wait_for("delivered", T, || {
        (h.state(&id) == State::Delivered).then_some(())
    });

    // output from an offset
    let o = rpc.call(
        json!("o1"),
        "output",
        json!({"execution_id": id, "offset": 6}),
    );
    assert_eq!(o["result"]["data"], "line2\n", "{o}");
    assert_eq!(o["result"]["next_offset"], 12);
    assert_eq!(o["result"]["eof"], true);
    let o = rpc.call(
        json!("o2"),
        "output",
        json!({"execution_id": id, "stream": "stderr", "offset": 0, "limit": 2}),
    );
    assert_eq!(o["result"]["data"], "er");
    assert_eq!(o["result"]["eof"], false);

    // status
    let s = rpc.call(json!({"k": 1}), "status", json!({"execution_id": id}));
    assert_eq!(s["id"], json!({"k": 1}));
    assert_eq!(s["result"]["state"], "completed");
    assert!(s["result"]["events"].as_array().unwrap().len() >= 6);

    // argv form: the same operation as the string form
    let a = rpc.call(
        json!(8),
        "execute",
        json!({"destination": "127.0.0.1", "argv": ["echo", "a b"]}),
    );
    assert_eq!(a["result"]["stdout"], "a b\n", "{a}");

    // errors
    let e = rpc.call(json!(9), "nope", json!({}));
    assert_eq!(e["error"]["code"], -32601);
    let e = rpc.call(json!(10), "execute", json!({"destination": "127.0.0.1"}));
    assert_eq!(e["error"]["code"], -32602);
    let e = rpc.call(
        json!(11),
        "execute",
        json!({"destination": "127.0.0.1", "command": "x", "bogus": 1}),
    );
    assert_eq!(e["error"]["code"], -32602);
    rpc.send("this is not json");
    let e = rpc.response(&Value::Null, T);
    assert_eq!(e["error"]["code"], -32700);
    let rv = rpc.call(json!(12), "review", json!({}));
    assert_eq!(rv["result"], json!([]));
    let rc = rpc.call(json!(13), "recover", json!({}));
    assert!(rc["result"].is_array());
    assert_eq!(h.runs(), 1);

    // The session is recorded, and ends when stdin closes.
    drop(rpc.stdin.take());
    let t0 = Instant::now();
    while rpc.child.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < T, "serve did not exit after stdin closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sessions = h.journal().sessions().unwrap();
    let s = sessions.iter().find(|s| s.record.kind == "serve").unwrap();
    assert!(s.ended_at.is_some());
    assert_eq!(s.executions, 2);
}

#[test]
fn serve_runs_executions_in_flight_on_shared_connections_and_a_few_threads() {
    let h = Host::new();
    let mut rpc = Rpc::start_with(&h, "60s", &["--channels-per-connection", "8"]);
    // Forty at once, each holding its channel until all have started: five connections of
    // eight, and far fewer threads than executions (they are tasks, not threads).
    let go = h.sshd.dir().join("go");
    let n = 40;
    for i in 0..n {
        rpc.request(
            json!(i),
            "execute",
            json!({"destination": "127.0.0.1", "command": format!(
                "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo n{i}", h.count(), go.display())}),
        );
    }
    wait_for("all forty started", T, || (h.runs() == n).then_some(()));
    let threads = threads_of(rpc.child.id());
    fs::write(&go, "").unwrap();
    assert!(
        threads < 30,
        "{threads} threads for {n} executions in flight"
    );
    for i in 0..n {
        let r = rpc.response(&json!(i), T);
        assert_eq!(r["result"]["state"], "completed", "{r}");
        assert_eq!(r["result"]["exit_code"], 0, "{r}");
        assert_eq!(r["result"]["stdout"], format!("n{i}\n"), "{r}");
    }
    assert_eq!(h.runs(), n);
    assert_eq!(h.proxy.connections(), 5, "40 executions, 8 per connection");
    // The next execution to the same host reuses an idle connection: no connect at all.
    let r = rpc.call(
        json!("later"),
        "execute",
        json!({"destination": "127.0.0.1", "command": "echo later"}),
    );
    assert_eq!(r["result"]["stdout"], "later\n", "{r}");
    assert_eq!(h.proxy.connections(), 5);
}

/// Eight executions in flight on `conns` connections; the proxy cuts them while all eight
/// still run (each waits for a file the test creates after the cut). Each completes with its
/// own stdout and stderr, delivered in the journal; returns the journal's event kinds of each.
fn eight_cut_mid_run(h: &Host, rpc: &mut Rpc, conns: usize) -> Vec<Vec<String>> {
    let go = h.sshd.dir().join("go-after-cut");
    for i in 0..8 {
        rpc.request(
            json!(i),
            "execute",
            json!({"destination": "127.0.0.1",
                   "command": format!("{}while [ ! -e '{}' ]; do sleep 0.05; done; \
                                       echo n{i}; echo e{i} >&2", h.count(), go.display())}),
        );
    }
    wait_for("all eight started", T, || (h.runs() == 8).then_some(()));
    assert_eq!(h.proxy.connections(), conns);
    h.proxy.cut();
    fs::write(&go, "").unwrap();
    (0..8)
        .map(|i| {
            let r = rpc.response(&json!(i), T);
            assert_eq!(r["result"]["state"], "completed", "{r}");
            assert_eq!(r["result"]["exit_code"], 0, "{r}");
            assert_eq!(r["result"]["stdout"], format!("n{i}\n"), "{r}");
            assert_eq!(r["result"]["stderr"], format!("e{i}\n"), "{r}");
            let id = id_of(&r);
            h.wait_delivered(id.as_str());
            h.kinds(id.as_str())
        })
        .collect()
}

#[test]
fn executions_sharing_a_cut_connection_each_recover_and_none_runs_twice() {
    let h = Host::new();
    let mut rpc = Rpc::start_with(&h, "60s", &["--channels-per-connection", "4"]);
    for kinds in eight_cut_mid_run(&h, &mut rpc, 2) {
        assert!(kinds.iter().any(|k| k == "connection-lost"), "{kinds:?}");
        assert_eq!(
            kinds.iter().filter(|k| *k == "dispatched").count(),
            1,
            "{kinds:?}"
        );
    }
    // Nobody ran twice, and the eight reattached over two new shared connections, not eight.
    assert_eq!(h.runs(), 8);
    assert_eq!(h.proxy.connections(), 4);
}

/// Runs one request of `serve` to completion and returns its execution ID.
fn id_of(r: &Value) -> ExecutionId {
    ExecutionId::parse(r["result"]["execution_id"].as_str().expect("execution_id")).unwrap()
}

#[test]
fn host_sessions_start_executions_in_batches_once_each_with_exact_bytes() {
    let h = Host::new();
    let mut rpc = Rpc::start_with(
        &h,
        "60s",
        &["--host-session", "--channels-per-connection", "32"],
    );
    let n = 40;
    for i in 0..n {
        // quotes, a newline, non-ASCII, stderr and a status of its own for each
        let cmd = format!(
            "{}printf '%s\\n' \"it's n{i} — ü\"\necho 'e{i}\"' >&2; exit {}",
            h.count(),
            i % 4
        );
        rpc.request(
            json!(i),
            "execute",
            json!({"destination": "127.0.0.1", "command": cmd}),
        );
    }
    for i in 0..n {
        let r = rpc.response(&json!(i), T);
        assert_eq!(r["result"]["state"], "completed", "{r}");
        assert_eq!(r["result"]["exit_code"], i % 4, "{r}");
        assert_eq!(r["result"]["stdout"], format!("it's n{i} — ü\n"), "{r}");
        assert_eq!(r["result"]["stderr"], format!("e{i}\"\n"), "{r}");
        let id = id_of(&r);
        // the session's layout (x/ID.cmd), and the session shell as its supervisor
        let cmd = fs::read_to_string(h.x().join(format!("{id}.cmd"))).expect("x/ID.cmd");
        assert!(cmd.ends_with(&format!("exit {}", i % 4)), "{cmd:?}");
        let kinds = h.kinds(id.as_str());
        assert_eq!(
            kinds.iter().filter(|k| *k == "dispatched").count(),
            1,
            "{kinds:?}"
        );
        assert!(!kinds.iter().any(|k| k == "connection-lost"), "{kinds:?}");
    }
    assert_eq!(h.runs(), n);
    // 40 executions, 32 per connection: two connections, each with one session exec
    assert_eq!(h.proxy.connections(), 2);
    let sups: std::collections::BTreeSet<String> = fs::read_dir(h.x())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".start"))
        .map(|e| {
            let rec = fs::read_to_string(e.path()).unwrap();
            rec.split(' ')
                .find(|kv| kv.starts_with("sup_pid="))
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        sups.len() <= 2,
        "{} supervisors for {n} executions on two sessions",
        sups.len()
    );
}

#[test]
fn a_host_session_cut_mid_flight_recovers_each_execution_and_none_runs_twice() {
    let h = Host::new();
    let mut rpc = Rpc::start_with(&h, "60s", &["--host-session"]);
    for kinds in eight_cut_mid_run(&h, &mut rpc, 1) {
        assert_eq!(
            kinds.iter().filter(|k| *k == "connection-lost").count(),
            1,
            "{kinds:?}"
        );
        assert_eq!(
            kinds.iter().filter(|k| *k == "dispatched").count(),
            1,
            "{kinds:?}"
        );
    }
    // nobody ran twice; the session shell outlived its channel and recorded every finish
    assert_eq!(h.runs(), 8);
    let done = fs::read_dir(h.x())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".done"))
        .count();
    assert_eq!(done, 8);
}

#[test]
fn a_killed_host_session_leaves_its_executions_interrupted_not_guessed() {
    let h = Host::new();
    let mut rpc = Rpc::start_with(&h, "3s", &["--host-session"]);
    for i in 0..3 {
        rpc.request(
            json!(i),
            "execute",
            json!({"destination": "127.0.0.1",
                   "command": format!("{}sleep 3; echo n{i}", h.count())}),
        );
    }
    wait_for("all three started", T, || (h.runs() == 3).then_some(()));
    // the supervisor of all three: the session shell named in their started records
    let id = h.wait_started();
    let rec = h.start_record(&id);
    let pid: i32 = rec
        .split(' ')
        .find_map(|kv| kv.strip_prefix("sup_pid="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(sigkill(pid, false));
    for i in 0..3 {
        let r = rpc.response(&json!(i), T);
        // the commands ran (once) and may well have finished, but with nobody left to
        // record how, the host cannot say: interrupted, for review; never "completed"
        assert_eq!(r["result"]["state"], "interrupted", "{r}");
        assert!(r["result"]["exit_code"].is_null(), "{r}");
        assert_eq!(h.state(id_of(&r).as_str()), State::Interrupted, "{r}");
    }
    assert_eq!(h.runs(), 3);
}

#[test]
fn a_killed_waiter_in_a_live_host_session_leaves_its_execution_interrupted_and_the_rest_complete() {
    let h = Host::new();
    let mut rpc = Rpc::start_with(&h, "60s", &["--host-session", "--host-helper", "never"]);
    rpc.request(
        json!(1),
        "execute",
        json!({"destination": "127.0.0.1", "command": format!("{}sleep 30", h.count())}),
    );
    let id = h.wait_started();
    // the command's process (its PID is in x/ID/pgid) is a child of its waiter
    let pgid: i32 = wait_for("the command's pgid file", T, || {
        fs::read_to_string(h.x().join(&id).join("pgid"))
            .ok()
            .and_then(|s| s.split(' ').next()?.parse().ok())
    });
    let stat = fs::read_to_string(format!("/proc/{pgid}/stat")).expect("the command runs");
    let waiter: i32 = stat
        .rsplit(") ")
        .next()
        .and_then(|s| s.split(' ').nth(1)?.parse().ok())
        .expect("the waiter's PID");
    assert!(sigkill(waiter, false));
    // the session lives on: the next execution goes through it and completes
    rpc.request(
        json!(2),
        "execute",
        json!({"destination": "127.0.0.1", "command": format!("{}echo after", h.count())}),
    );
    let r = rpc.response(&json!(1), T);
    // its exit status is lost with its waiter: interrupted, for review; never "completed"
    assert_eq!(r["result"]["state"], "interrupted", "{r}");
    assert!(r["result"]["exit_code"].is_null(), "{r}");
    assert_eq!(h.state(&id), State::Interrupted);
    let r2 = rpc.response(&json!(2), T);
    assert_eq!(r2["result"]["state"], "completed", "{r2}");
    assert_eq!(r2["result"]["exit_code"], 0, "{r2}");
    assert_eq!(r2["result"]["stdout"], "after\n", "{r2}");
    h.wait_delivered(id_of(&r2).as_str());
    assert!(h.x().join(&id).join("lost").exists());
    assert_eq!(h.runs(), 2);
    sigkill(pgid, true);
}

/// A helper of a host session killed before its last report (someone's kill, the OOM killer):
/// the session notices at its next tick and settles what the helper left. The helper is caught
/// in its flush by a `sync` that stands first in the host's PATH: the first flush naming a
/// `which` file (`.start`: the batch helper's; `.done`: the finish helper's) records its
/// parent, the helper, and waits 2 s; the test kills the helper meanwhile.
fn a_host_session_helper_killed_in_its_flush(which: &str) {
    let shim = tempfile::tempdir().expect("tempdir");
    let flag = shim.path().join("armed");
    let caught = shim.path().join("caught");
    let real = ["/usr/bin/sync", "/bin/sync"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sync(1)");
    let sync = shim.path().join("sync");
    fs::write(
        &sync,
        format!(
            "#!/bin/sh\ncase \"$*\" in\n*{which}*)\n\tif rm '{flag}' 2>/dev/null; then\n\t\techo \"$PPID\" >'{caught}.tmp' && mv '{caught}.tmp' '{caught}'\n\t\tsleep 2\n\tfi\n\t;;\nesac\nexec {real} \"$@\"\n",
            flag = flag.display(),
            caught = caught.display(),
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&sync, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let h = Host::with_path(Some(shim.path()));
    let mut rpc = Rpc::start_with(&h, "60s", &["--host-session", "--host-helper", "never"]);
    // the session is up and flushing through the stand-in before it is armed
    let r = rpc.call(
        json!(0),
        "execute",
        json!({"destination": "127.0.0.1", "command": "true"}),
    );
    assert_eq!(r["result"]["state"], "completed", "{r}");
    fs::write(&flag, "").unwrap();
    rpc.request(
        json!(1),
        "execute",
        json!({"destination": "127.0.0.1", "command": format!("{}echo hello", h.count())}),
    );
    let helper: i32 = wait_for("the helper caught in its flush", T, || {
        fs::read_to_string(&caught).ok()?.trim().parse().ok()
    });
    assert!(sigkill(helper, false), "the helper {helper} was running");
    let r = rpc.response(&json!(1), T);
    assert_eq!(r["result"]["state"], "completed", "{r}");
    assert_eq!(r["result"]["exit_code"], 0, "{r}");
    assert_eq!(r["result"]["stdout"], "hello\n", "{r}");
    let id = id_of(&r);
    assert!(h.x().join(format!("{id}.done")).exists());
    assert!(!flag.exists());
    assert_eq!(h.runs(), 1);
    // the session goes on
    let r = rpc.call(
        json!(2),
        "execute",
        json!({"destination": "127.0.0.1", "command": format!("{}echo after", h.count())}),
    );
    assert_eq!(r["result"]["state"], "completed", "{r}");
    assert_eq!(h.runs(), 2);
}

#[test]
fn a_killed_batch_helper_in_a_live_host_session_still_starts_its_execution_once() {
    a_host_session_helper_killed_in_its_flush(".start");
}

#[test]
fn a_killed_finish_helper_in_a_live_host_session_still_records_and_returns_the_result() {
    a_host_session_helper_killed_in_its_flush(".done");
}

/// The session's reader (the host process that reads requests from the channel) killed: the
/// session reads no more and says so, finishes what it started and ends by itself. A request
/// sent after the kill is never read by the host; cairn must not lose it or run it twice.
#[test]
fn a_killed_reader_in_a_live_host_session_ends_the_session_and_loses_nothing() {
    let h = Host::new();
    let mut rpc = Rpc::start_with(&h, "60s", &["--host-session", "--host-helper", "never"]);
    rpc.request(
        json!(1),
        "execute",
        json!({"destination": "127.0.0.1",
               "command": format!("{}sleep 2; echo first", h.count())}),
    );
    let id = h.wait_started();
    let sup: i32 = wait_for("the session shell in the started record", T, || {
        h.start_record(&id)
            .split(' ')
            .find_map(|kv| kv.strip_prefix("sup_pid="))?
            .parse()
            .ok()
    });
    // the reader: the session shell's child whose stdin is not /dev/null (the others' is)
    let reader: i32 = wait_for("the session's reader", T, || {
        let kids = fs::read_to_string(format!("/proc/{sup}/task/{sup}/children")).ok()?;
        kids.split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .find(|p| {
                fs::read_link(format!("/proc/{p}/fd/0"))
                    .map(|t| t != Path::new("/dev/null"))
                    .unwrap_or(false)
            })
    });
    assert!(sigkill(reader, false), "the reader {reader} was running");
    std::thread::sleep(Duration::from_millis(300));
    rpc.request(
        json!(2),
        "execute",
        json!({"destination": "127.0.0.1",
               "command": format!("{}echo second", h.count())}),
    );
    let r = rpc.response(&json!(1), T);
    assert_eq!(r["result"]["state"], "completed", "{r}");
    assert_eq!(r["result"]["exit_code"], 0, "{r}");
    assert_eq!(r["result"]["stdout"], "first\n", "{r}");
    h.wait_delivered(&id);
    // nothing of request 2 ran on the session; cairn found it absent and sent it on an exec
    let r2 = rpc.response(&json!(2), T);
    assert_eq!(r2["result"]["state"], "completed", "{r2}");
    assert_eq!(r2["result"]["exit_code"], 0, "{r2}");
    assert_eq!(r2["result"]["stdout"], "second\n", "{r2}");
    h.wait_delivered(id_of(&r2).as_str());
    assert_eq!(h.runs(), 2, "each request ran exactly once");
}

#[test]
fn a_host_session_result_beyond_its_inline_limit_is_read_with_watch() {
    let h = Host::new();
    let mut rpc = Rpc::start_with(&h, "60s", &["--host-session"]);
    // 1.5 MiB: more than a session sends inline
    let r = rpc.call(
        json!(1),
        "execute",
        json!({"destination": "127.0.0.1",
               "command": format!("{}head -c 1572864 /dev/zero | tr '\\0' x; echo tail >&2", h.count())}),
    );
    assert_eq!(r["result"]["state"], "completed", "{r}");
    assert_eq!(r["result"]["exit_code"], 0, "{r}");
    // the inline answer is the first MiB (the gateway's inline cap), said to be cut, with the
    // whole size; the rest is on the host, and `cairn output` returns every byte
    let out = r["result"]["stdout"].as_str().unwrap_or_default();
    assert_eq!(out.len(), 1 << 20, "inline bytes");
    assert!(out.bytes().all(|c| c == b'x'), "inline stdout is not all x");
    assert_eq!(
        r["result"]["output_truncated"], true,
        "{}",
        r["result"]["summary"]
    );
    assert_eq!(
        r["result"]["stdout_bytes"], 1572864,
        "{}",
        r["result"]["summary"]
    );
    assert_eq!(
        r["result"]["stderr"], "tail\n",
        "{}",
        r["result"]["summary"]
    );
    let id = id_of(&r);
    h.wait_delivered(id.as_str());
    let mut o = h.cairn("output");
    o.arg(id.as_str());
    // (drained while it runs: a megabyte and a half does not fit in a pipe)
    let o = crate::support::docker::output_within(o, T)
        .unwrap_or_else(|e| panic!("{}", &e[..e.len().min(2000)]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout.len(), 1572864, "cairn output returns every byte");
    assert!(o.stdout.iter().all(|&c| c == b'x'));
    assert!(h.x().join(format!("{}.cmd", id_of(&r))).exists());
    assert_eq!(h.runs(), 1);
}

#[test]
fn a_host_session_enforces_timeouts_and_honours_cancel() {
    let h = Host::new();
    let mut rpc = Rpc::start_with(&h, "60s", &["--host-session"]);
    let beat = h.sshd.dir().join("beat");
    rpc.request(
        json!("t"),
        "execute",
        json!({"destination": "127.0.0.1", "timeout_secs": 1,
               "command": format!("{}sleep 30", h.count())}),
    );
    rpc.request(
        json!("c"),
        "execute",
        json!({"destination": "127.0.0.1",
               "command": format!("{}(while :; do touch '{}'; sleep 0.1; done) & sleep 60",
                                  h.count(), beat.display())}),
    );
    let r = rpc.response(&json!("t"), T);
    assert_eq!(r["result"]["state"], "completed", "{r}");
    assert_eq!(r["result"]["timed_out"], true, "{r}");
    assert!(r["result"]["exit_code"] != 0, "{r}");
    // the timeout ended it: the `sleep 30` never reached its end
    let tid = id_of(&r);
    let done = fs::read_to_string(h.x().join(format!("{tid}.done"))).unwrap();
    assert!(done.contains("timed_out=1"), "{done}");
    wait_for("the second command to run", T, || {
        beat.exists().then_some(())
    });
    // the session's supervisor is alive: cancel from another process signals the group
    let id = fs::read_dir(h.x())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".start").map(str::to_owned))
        .find(|id| !h.x().join(format!("{id}.done")).exists())
        .expect("the running execution");
    let c = h.cairn("cancel").args([&id, "--json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&c.stdout).unwrap_or_else(|_| panic!("{c:?}"));
    assert_eq!(v["state"], "cancelled", "{v}");
    let r = rpc.response(&json!("c"), T);
    assert_eq!(r["result"]["execution_id"], id.as_str(), "{r}");
    assert!(r["result"]["exit_code"] != 0, "{r}");
    let done = fs::read_to_string(h.x().join(format!("{id}.done"))).unwrap();
    assert!(done.contains("cancelled=1"), "{done}");
    fs::remove_file(&beat).ok();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !beat.exists(),
        "a process of the cancelled group is still running"
    );
    assert_eq!(h.runs(), 2);
}

#[test]
fn serve_retry_with_a_new_id_after_the_gateway_died_attaches_to_the_first_execution() {
    let h = Host::new();
    let cmd = format!("{}sleep 1.5; echo done-once", h.count());
    let params = json!({"destination": "127.0.0.1", "command": cmd, "scope": "conv-1"});
    let mut first = Rpc::start(&h, "60s");
    first.request(json!("req-1"), "execute", params.clone());
    let id = h.wait_started();
    drop(first); // the gateway process dies before answering
                 // A new gateway, the same request with a new id and keys in another order.
    let mut second = Rpc::start(&h, "60s");
    let reordered = json!({"scope": "conv-1", "command": cmd, "destination": "127.0.0.1"});
    let r = second.call(json!("req-2"), "execute", reordered);
    let res = &r["result"];
    assert_eq!(res["execution_id"], id.as_str(), "{r}");
    assert_eq!(res["attached"], true);
    assert_eq!(res["state"], "completed");
    assert_eq!(res["stdout"], "done-once\n");
    assert!(res["summary"].as_str().unwrap().contains("not run again"));
    assert_eq!(h.runs(), 1);
    let ev = h
        .journal()
        .events(&ExecutionId::parse(&id).unwrap())
        .unwrap();
    let corr: Vec<_> = ev
        .iter()
        .filter_map(|e| e.evidence.get("correlation_id").and_then(Value::as_str))
        .collect();
    assert!(
        corr.contains(&"req-1") && corr.contains(&"req-2"),
        "{corr:?}"
    );
    // attach by ID returns the same stored result.
    let a = second.call(json!(3), "attach", json!({"execution_id": id}));
    assert_eq!(a["result"]["stdout"], "done-once\n");
    assert_eq!(h.runs(), 1);
}

#[test]
fn serve_reports_unknown_plainly_and_lists_it_for_review() {
    let h = Host::new();
    let mut rpc = Rpc::start(&h, "1s");
    // runs until the test has its answer: the host cannot have finished when cairn gave up
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.05; done; echo x",
        h.count(),
        go.display()
    );
    rpc.request(
        json!(1),
        "execute",
        json!({"destination": "127.0.0.1", "command": cmd, "class": "irreversible"}),
    );
    let id = h.wait_started();
    h.proxy.set_refuse(true);
    h.proxy.cut();
    let r = rpc.response(&json!(1), T);
    h.proxy.set_refuse(false);
    fs::write(&go, "").unwrap();
    let res = &r["result"];
    assert_eq!(res["state"], "unknown", "{r}");
    assert!(res["exit_code"].is_null(), "{r}");
    assert_eq!(h.state(&id), State::Unknown);
    assert_eq!(res["needs_review"], true);
    assert!(res["summary"].as_str().unwrap().contains("OUTCOME UNKNOWN"));
    let rv = rpc.call(json!(2), "review", json!({}));
    assert_eq!(rv["result"][0]["execution_id"], id.as_str());
    let st = rpc.call(json!(3), "status", json!({"execution_id": id}));
    assert_eq!(st["result"]["review"]["class"], "irreversible");
    h.wait_done(&id);
    assert_eq!(h.runs(), 1);
}

// ----- cairn mcp ---------------------------------------------------------------------------

async fn mcp_client(h: &Host) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    mcp_client_pid(h).await.0
}

/// An MCP client of a new `cairn mcp` process, and that process's PID.
async fn mcp_client_pid(h: &Host) -> (rmcp::service::RunningService<rmcp::RoleClient, ()>, u32) {
    use rmcp::ServiceExt;
    let mut c = h.cairn("mcp");
    c.arg("--remote-dir").arg(&h.remote_dir);
    c.stderr(Stdio::null());
    let (transport, _) =
        rmcp::transport::TokioChildProcess::builder(tokio::process::Command::from(c))
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn cairn mcp");
    let pid = transport.id().expect("the server's PID");
    let client = tokio::time::timeout(T, ().serve(transport))
        .await
        .expect("MCP initialize in time")
        .expect("MCP initialize");
    (client, pid)
}

/// The number of threads of process `pid`.
fn threads_of(pid: u32) -> usize {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_calls_in_flight_share_connections_and_a_few_threads() {
    use rmcp::model::CallToolRequestParams;
    let h = Host::new();
    let (client, pid) = mcp_client_pid(&h).await;
    let client = std::sync::Arc::new(client);
    let go = h.sshd.dir().join("go");
    let n = 40;
    let mut calls = Vec::new();
    for i in 0..n {
        let cmd = format!(
            "{}while [ ! -e '{}' ]; do sleep 0.1; done; echo m{i}",
            h.count(),
            go.display()
        );
        let c = client.clone();
        calls.push(tokio::spawn(async move {
            let p = CallToolRequestParams::new("run_command")
                .with_arguments(args(json!({"destination": "127.0.0.1", "command": cmd})));
            tokio::time::timeout(T, c.call_tool(p)).await
        }));
    }
    let hh = &h;
    tokio::task::block_in_place(|| wait_for("all started", T, || (hh.runs() == n).then_some(())));
    let threads = threads_of(pid);
    fs::write(&go, "").unwrap();
    assert!(threads < 30, "{threads} threads for {n} calls in flight");
    for (i, c) in calls.into_iter().enumerate() {
        let r = c
            .await
            .unwrap()
            .expect("answered in time")
            .expect("tools/call");
        let v = r.structured_content.clone().expect("structured content");
        assert_eq!(v["state"], "completed", "{v}");
        assert_eq!(v["stdout"], format!("m{i}\n"), "{v}");
    }
    assert_eq!(h.runs(), n);
    assert_eq!(h.proxy.connections(), 5, "40 calls, 8 per connection");
}

fn args(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_retried_tools_call_after_reconnect_attaches_and_runs_once() {
    use rmcp::model::CallToolRequestParams;
    let h = Host::new();
    let client = mcp_client(&h).await;
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    for n in ["run_command", "execution_status", "read_output"] {
        assert!(names.contains(&n.to_string()), "{names:?}");
    }
    let run = tools.iter().find(|t| t.name == "run_command").unwrap();
    let props = run.input_schema.get("properties").unwrap();
    assert!(props.get("destination").is_some() && props.get("command").is_some());

    let cmd = format!("{}sleep 2; echo mcp-once", h.count());
    let call = || {
        CallToolRequestParams::new("run_command")
            .with_arguments(args(json!({"destination": "127.0.0.1", "command": cmd})))
    };
    // The first call is cut off: the client gives up and goes away while it runs.
    let first = tokio::time::timeout(Duration::from_millis(700), client.call_tool(call())).await;
    assert!(first.is_err(), "the first call should still be running");
    let hh = &h;
    let id = tokio::task::block_in_place(|| hh.wait_started());
    drop(client);

    // A new client process, the same tools/call.
    let client = mcp_client(&h).await;
    let r = tokio::time::timeout(T, client.call_tool(call()))
        .await
        .expect("the retry answers in time")
        .expect("tools/call");
    let v = r.structured_content.clone().expect("structured content");
    assert_eq!(v["execution_id"], id.as_str(), "{v}");
    assert_eq!(v["attached"], true);
    assert_eq!(v["state"], "completed");
    assert_eq!(v["stdout"], "mcp-once\n");
    let text = format!("{:?}", r.content);
    assert!(
        text.contains("attached to it") && text.contains("not run again"),
        "{text}"
    );
    assert_eq!(h.runs(), 1, "the command ran once");

    // status and output from an offset
    let s = client
        .call_tool(
            CallToolRequestParams::new("execution_status")
                .with_arguments(args(json!({"execution_id": id}))),
        )
        .await
        .unwrap();
    assert_eq!(s.structured_content.unwrap()["state"], "completed");
    let o = client
        .call_tool(
            CallToolRequestParams::new("read_output")
                .with_arguments(args(json!({"execution_id": id, "offset": 4}))),
        )
        .await
        .unwrap();
    let o = o.structured_content.unwrap();
    assert_eq!(o["data"], "once\n");
    assert_eq!(o["eof"], true);
    client.cancel().await.unwrap();
    assert_eq!(h.runs(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_says_plainly_when_the_outcome_is_unknown() {
    use rmcp::model::CallToolRequestParams;
    let h = Host::new();
    let mut c = Command::new(BIN);
    c.arg("mcp");
    h.conn_args(&mut c, "1s");
    c.arg("--remote-dir")
        .arg(&h.remote_dir)
        .stderr(Stdio::null());
    let (transport, _) =
        rmcp::transport::TokioChildProcess::builder(tokio::process::Command::from(c))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    let client = rmcp::ServiceExt::serve((), transport).await.unwrap();
    // runs until the test has its answer: the host cannot have finished when cairn gave up
    let go = h.sshd.dir().join("go");
    let cmd = format!(
        "{}while [ ! -e '{}' ]; do sleep 0.05; done; echo x",
        h.count(),
        go.display()
    );
    let call = client.call_tool(
        CallToolRequestParams::new("run_command")
            .with_arguments(args(json!({"destination": "127.0.0.1", "command": cmd}))),
    );
    let hh = &h;
    let cutter = async {
        tokio::task::block_in_place(|| {
            hh.wait_started();
            hh.proxy.set_refuse(true);
            hh.proxy.cut();
        });
    };
    let (r, _) = tokio::join!(tokio::time::timeout(T, call), cutter);
    h.proxy.set_refuse(false);
    let r = r.expect("in time").expect("tools/call");
    let v = r.structured_content.clone().unwrap();
    assert_eq!(v["state"], "unknown", "{v}");
    assert!(v["exit_code"].is_null(), "{v}");
    assert!(format!("{:?}", r.content).contains("OUTCOME UNKNOWN"));
    let id = v["execution_id"].as_str().expect("execution_id").to_owned();
    assert_eq!(h.state(&id), State::Unknown);
    client.cancel().await.unwrap();
    fs::write(&go, "").unwrap();
    tokio::task::block_in_place(|| h.wait_done(&id));
    assert_eq!(h.runs(), 1, "the command ran once");
    assert_eq!(
        h.state(&id),
        State::Unknown,
        "nothing settled it behind the caller"
    );
}
