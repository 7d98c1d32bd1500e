//! Host epochs as evidence, end to end on loopback (issue 16): a marker home wiped once or twice
//! makes nothing uncertain for executions dispatched after the wipe; one dispatched before it
//! stays uncertain, with a reason naming both epochs; hosts that share a host key never share
//! an execution through the intent fingerprint.

use std::fs;
use std::time::Duration;

use cairn::{ExecutionId, State};

use crate::support::host::*;

/// The host "reboots" under a detached execution: its supervisor and command are killed and
/// the boot identity changes. The command (which counts itself first) has begun by then: the
/// started record alone precedes the command's first line, and a kill in between would leave
/// it never run, another case than the one these tests pin.
fn reboot(h: &Host, id: &str) {
    wait_for("the command to begin", Duration::from_secs(10), || {
        (h.runs() > 0).then_some(())
    });
    let rec = h.start_record(id);
    let sup: i32 = rec
        .split_whitespace()
        .find_map(|f| f.strip_prefix("sup_pid="))
        .unwrap()
        .parse()
        .unwrap();
    let pgid: i32 = wait_for("the command's pgid", Duration::from_secs(10), || {
        fs::read_to_string(h.x().join(id).join("pgid"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
    });
    sigkill(sup, true);
    sigkill(pgid, true);
    let boot = format!("00000000-0000-4000-8000-{:012}\n", std::process::id());
    fs::write(h.sshd.boot_id_file(), boot).unwrap();
}

fn detached(h: &Host, command: &str) -> String {
    let out = h.run_cmd(&["--detach"], command).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn wipe(h: &Host) {
    fs::remove_dir_all(&h.remote_dir).unwrap();
}

/// Every event of every execution in the journal of `h`, as (execution, kind, evidence).
fn all_events(h: &Host) -> Vec<(String, String, serde_json::Value)> {
    let j = h.journal();
    let mut v = Vec::new();
    for (rec, _) in j.list().unwrap() {
        for e in j.events(&rec.id).unwrap() {
            v.push((rec.id.to_string(), e.kind.to_string(), e.evidence));
        }
    }
    v
}

fn recover_json(h: &Host) -> serde_json::Value {
    let out = h.cairn("recover").arg("--json").output().unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn a_reboot_after_the_marker_home_was_wiped_twice_reads_interrupted() {
    let h = Host::new();
    let first = h.run_cmd(&[], "true").output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    wipe(&h);
    let second = h.run_cmd(&[], "true").output().unwrap();
    assert_eq!(second.status.code(), Some(0), "{second:?}");
    wipe(&h);
    let id = detached(&h, &format!("{}sleep 60", h.count()));
    reboot(&h, &id);
    let v = recover_json(&h);
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[0]["state"], "interrupted", "{v}");
    let reason = v[0]["reason"].as_str().unwrap();
    assert!(reason.contains("rebooted"), "{reason}");
    assert!(reason.contains("boot identity"), "{reason}");
    assert!(!reason.contains("epoch changed"), "{reason}");
    assert_eq!(h.state(&id), State::Interrupted);
    assert_eq!(h.runs(), 1);
    // Each wipe was said once, by the first dispatch that met the new epoch.
    let changes: Vec<_> = all_events(&h)
        .into_iter()
        .filter(|(_, k, _)| k == "host-epoch-changed")
        .collect();
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_ne!(changes[0].0, changes[1].0);
    // (newest execution first) the second change starts where the first ended
    assert_eq!(changes[1].2["new"], changes[0].2["old"], "{changes:?}");
    let kinds = h.kinds(&id);
    assert!(kinds.contains(&"dispatch-epoch".to_string()), "{kinds:?}");
    let audit = std::process::Command::new(BIN)
        .args(["audit", "verify", "--journal"])
        .arg(&h.journal)
        .output()
        .unwrap();
    assert_eq!(audit.status.code(), Some(0), "{audit:?}");
}

#[test]
fn an_execution_from_before_a_wipe_stays_unknown_naming_both_epochs() {
    let h = Host::new();
    let id = detached(&h, &format!("{}sleep 60", h.count()));
    let before = h.start_record(&id);
    let e1 = before
        .split_whitespace()
        .find_map(|f| f.strip_prefix("epoch="))
        .unwrap()
        .to_owned();
    reboot(&h, &id);
    wipe(&h);
    let v = recover_json(&h);
    assert_eq!(v[0]["state"], "unknown", "{v}");
    let reason = v[0]["reason"].as_str().unwrap();
    assert!(reason.contains("epoch changed"), "{reason}");
    assert!(
        reason.contains(&format!("its started record was written under epoch {e1}")),
        "{reason}"
    );
    assert!(reason.contains("now has epoch"), "{reason}");
    assert_eq!(h.runs(), 1);
    // A later execution on the wiped host is not affected.
    let out = h
        .run_cmd(&["--json"], &format!("{}echo later", h.count()))
        .output()
        .unwrap();
    let o = json_of(&out);
    assert_eq!(o["state"], "completed", "{o}");
    assert_eq!(h.runs(), 2);
}

#[test]
fn two_hosts_sharing_a_host_key_get_an_execution_each_for_one_intent() {
    let a = Host::new();
    let mut b = Host::new();
    // b presents a's host key (a cloned image), and shares a's journal and intent key.
    for f in ["ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"] {
        fs::copy(a.sshd.dir().join(f), b.sshd.dir().join(f)).unwrap();
    }
    b.sshd.restart_sshd();
    b.known_hosts = b.sshd.known_hosts_for_port(b.proxy.port());
    b.journal = a.journal.clone();
    // One command text for both: each host's sshd says where its own counter is.
    let cmd = "echo ran >> \"${CAIRN_BOOT_ID_FILE%/*}/ran.count\"; sleep 1; echo done";
    let first = detached(&a, cmd);
    let out = b.run_cmd(&["--json"], cmd).output().unwrap();
    let o = json_of(&out);
    assert_eq!(o["state"], "completed", "{o}");
    assert_eq!(o["attached"], false, "{o}");
    assert_ne!(o["execution_id"], first.as_str());
    a.wait_done(&first);
    assert_eq!(a.runs(), 1, "ran once on a");
    assert_eq!(b.runs(), 1, "ran once on b");
    let j = a.journal();
    assert_eq!(j.list().unwrap().len(), 2);
    let fa = j
        .intent_of(&ExecutionId::parse(&first).unwrap())
        .unwrap()
        .unwrap();
    let second = ExecutionId::parse(o["execution_id"].as_str().unwrap()).unwrap();
    let fb = j.intent_of(&second).unwrap().unwrap();
    assert_eq!(fa.intent["host_key"], fb.intent["host_key"], "one key");
    assert_ne!(fa.fingerprint, fb.fingerprint);
}
