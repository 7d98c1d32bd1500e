//! Recovery remembers how it connected (issue 16): an execution started with `-i KEY
//! --known-hosts FILE -F CONFIG -p PORT` is recovered, attached to, read and cancelled by
//! commands that give none of them (a flag given overrides its part of the record); the host
//! key verified at dispatch pins every later connection for it.

use std::fs;
use std::process::Command;

use cairn::State;

use crate::support::host::*;
use crate::support::sshd::keygen;
use crate::support::KeyKind;

/// A cairn command with the journal and nothing else: no connection flags, no agent, and an
/// empty HOME (so no ~/.ssh of this machine can help).
fn plain(h: &Host, sub: &str, home: &std::path::Path) -> Command {
    let mut c = h.local(sub);
    c.env_remove("SSH_AUTH_SOCK")
        .env_remove("CAIRN_INTENT_KEY")
        .env("HOME", home)
        .env("CAIRN_LOG", "cairn=info");
    c
}

#[test]
fn after_kill_9_a_plain_recover_needs_no_connection_flags() {
    let h = Host::new();
    let home = tempfile::tempdir().unwrap();
    let mut child = spawn(h.run_cmd(
        &[],
        &format!(
            "{}sleep 1; echo finished-while-cairn-was-dead; exit 5",
            h.count()
        ),
    ));
    let id = h.wait_started();
    assert!(sigkill(child.id() as i32, false));
    let _ = child.wait();
    h.wait_done(&id);
    // What the journal recorded: paths and names only.
    let accepted = h
        .journal()
        .events(&cairn::ExecutionId::parse(&id).unwrap())
        .unwrap()[0]
        .clone();
    let conn = &accepted.evidence["connection"];
    assert_eq!(conn["port"], h.proxy.port(), "{conn}");
    assert_eq!(conn["ssh_config"], "/dev/null");
    assert_eq!(
        conn["identity_files"][0],
        h.sshd.client_key().display().to_string()
    );
    assert_eq!(conn["known_hosts"], h.known_hosts.display().to_string());
    let key_text = fs::read_to_string(h.sshd.client_key()).unwrap();
    assert!(!accepted.evidence.to_string().contains(key_text.trim()));

    let out = plain(&h, "recover", home.path())
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    assert_eq!(v[0]["execution_id"], id.as_str(), "{v}");
    assert_eq!(v[0]["state"], "completed", "{v}");
    assert_eq!(v[0]["exit_code"], 5);
    assert_eq!(h.state(&id), State::Completed);
    assert_eq!(h.runs(), 1);
    // The stored bytes, and the status, with no flags either.
    let o = plain(&h, "output", home.path()).arg(&id).output().unwrap();
    assert_eq!(o.stdout, b"finished-while-cairn-was-dead\n", "{o:?}");
    let s = plain(&h, "status", home.path())
        .arg(&id)
        .arg("--json")
        .output()
        .unwrap();
    let sv: serde_json::Value = serde_json::from_slice(&s.stdout).unwrap();
    assert_eq!(sv["state"], "completed", "{sv}");
    // gc reaches the host the same way.
    let gc = plain(&h, "gc", home.path())
        .args([
            "--output-retention",
            "0s",
            "--tombstone-retention",
            "1h",
            "--json",
        ])
        .output()
        .unwrap();
    let gv: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    assert_eq!(gc.status.code(), Some(0), "{gv} {gc:?}");
    let r = gv["hosts"][0]["result"].as_str().unwrap_or_default();
    assert!(r.contains("removed_output=1"), "{gv}");
    assert!(!h.x().join(&id).exists(), "output collected");
    assert!(
        h.x().join(format!("{id}.done")).exists(),
        "the tombstone stays"
    );
    assert_eq!(h.runs(), 1);
}

#[test]
fn attach_and_cancel_reach_the_host_as_the_run_did_and_flags_override() {
    let h = Host::new();
    let home = tempfile::tempdir().unwrap();
    let out = h
        .run_cmd(
            &["--detach", "--id", "rec-attach"],
            &format!("{}sleep 1; echo attached-output; exit 3", h.count()),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let a = plain(&h, "attach", home.path())
        .arg("rec-attach")
        .output()
        .unwrap();
    assert_eq!(a.status.code(), Some(3), "{a:?}");
    assert_eq!(a.stdout, b"attached-output\n");
    // A flag overrides its part of the record: an empty known_hosts file knows no host.
    let empty = home.path().join("empty_known_hosts");
    fs::write(&empty, "").unwrap();
    let _ = h
        .run_cmd(&["--detach", "--id", "rec-cancel"], "sleep 30")
        .output()
        .unwrap();
    let refused = plain(&h, "status", home.path())
        .arg("rec-cancel")
        .arg("--known-hosts")
        .arg(&empty)
        .arg("--json")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&refused.stdout).into_owned()
        + &String::from_utf8_lossy(&refused.stderr);
    assert!(text.contains("not known"), "{text}");
    let c = plain(&h, "cancel", home.path())
        .args(["rec-cancel", "--grace", "1"])
        .output()
        .unwrap();
    assert_eq!(c.status.code(), Some(0), "{c:?}");
    assert_eq!(h.state("rec-cancel"), State::Cancelled);
    assert_eq!(h.runs(), 1);
}

#[test]
fn the_host_key_verified_at_dispatch_pins_later_connections() {
    let h = Host::new();
    let home = tempfile::tempdir().unwrap();
    let out = h
        .run_cmd(
            &["--detach", "--id", "pinned"],
            &format!("{}sleep 60", h.count()),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let old = h
        .journal()
        .events(&cairn::ExecutionId::parse("pinned").unwrap())
        .unwrap();
    let old_fp = old
        .iter()
        .find_map(|e| e.evidence["host_key"].as_str().map(str::to_owned))
        .unwrap();
    // The host gets a new key, and known_hosts is edited to accept it.
    keygen(
        &h.sshd.dir().join("ssh_host_ed25519_key"),
        KeyKind::Ed25519,
        "",
    );
    h.sshd.restart_sshd();
    let edited = h.sshd.known_hosts_for_port(h.proxy.port());
    assert_eq!(edited, h.known_hosts);
    let s = plain(&h, "status", home.path())
        .arg("pinned")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&s.stdout).into_owned() + &String::from_utf8_lossy(&s.stderr);
    assert!(text.contains(&old_fp), "{text}");
    assert!(text.contains("presents host key SHA256:"), "{text}");
    assert!(text.contains("cairn resolve"), "{text}");
    // A new run with the same files connects (the pin is the execution's, not the host's).
    let fresh = h.run_cmd(&["--json"], "echo new-key-ok").output().unwrap();
    assert_eq!(json_of(&fresh)["state"], "completed", "{fresh:?}");
    // recover refuses to call the old one anything but unknown, naming both keys.
    let r = plain(&h, "recover", home.path())
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let one = v
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["execution_id"] == "pinned")
        .unwrap();
    assert_eq!(one["state"], "unknown", "{v}");
    assert!(one["reason"].as_str().unwrap().contains(&old_fp), "{v}");
    assert_eq!(h.runs(), 1);
    if let Ok(p) = fs::read_to_string(h.x().join("pinned").join("pgid")) {
        if let Some(Ok(pgid)) = p.split_whitespace().next().map(str::parse::<i32>) {
            sigkill(pgid, true);
        }
    }
}

/// A client killed after its host started the command: the execution is left `running` in the
/// journal, its command done on the host.
fn killed_after_start(h: &Host, id: &str, word: &str) {
    let mut child = spawn(h.run_cmd(&["--id", id], &format!("{}sleep 1; echo {word}", h.count())));
    assert_eq!(h.wait_started(), id);
    assert!(sigkill(child.id() as i32, false));
    let _ = child.wait();
    h.wait_done(id);
}

/// `recover` works on unsettled executions side by side: one whose host refuses every
/// connection for the whole reconnect window does not hold back one whose host answers, though
/// it comes first in the journal. Nothing runs twice, and the cut one is recovered once its
/// host is back.
#[test]
fn recover_does_not_hold_a_reachable_host_behind_an_unreachable_one() {
    let cut = Host::new();
    let mut up = Host::new();
    up.journal.clone_from(&cut.journal);
    // The journal lists the newest first: the cut one.
    killed_after_start(&up, "reachable", "up-done");
    killed_after_start(&cut, "behind-a-cut", "cut-done");
    let home = tempfile::tempdir().unwrap();
    cut.proxy.set_refuse(true);
    let out = plain(&cut, "recover", home.path())
        .args(["--reconnect-for", "6s"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    // The state before is `dispatched` or `running`, as far as each killed client got.
    assert!(
        lines[0].starts_with("reachable  ") && lines[0].ends_with(" -> completed (exit 0)"),
        "the reachable host's result did not come first: {text}"
    );
    assert!(
        lines[1].starts_with("behind-a-cut  ") && lines[1].contains(" -> unknown: "),
        "{text}"
    );
    assert_eq!(up.state("reachable"), State::Completed);
    assert!(!cut.state("behind-a-cut").has_result(), "{text}");

    cut.proxy.set_refuse(false);
    let again = plain(&cut, "recover", home.path())
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v[0]["execution_id"], "behind-a-cut");
    assert_eq!(v[0]["state"], "completed", "{v}");
    let o = cut.local("output").arg("behind-a-cut").output().unwrap();
    assert_eq!(o.stdout, b"cut-done\n");
    assert_eq!((cut.runs(), up.runs()), (1, 1));
}
