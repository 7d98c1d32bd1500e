//! `cairn audit verify` against journals damaged by editing the SQLite file directly, one test
//! per kind of damage, and `cairn audit show`.

use std::path::{Path, PathBuf};
use std::process::Command;

use cairn::journal::{
    accepted_evidence, chain_hash, now_rfc3339, ChainFields, ExecutionRecord, Journal,
};
use cairn::{ExecutionId, State};
use rusqlite::params;

const BIN: &str = env!("CARGO_BIN_EXE_cairn");

fn record(id: &str) -> ExecutionRecord {
    ExecutionRecord {
        id: ExecutionId::parse(id).unwrap(),
        created_at: now_rfc3339(),
        destination: "db-1".into(),
        host: "10.0.0.5".into(),
        port: 22,
        user: "ops".into(),
        command: b"./migrate.sh".to_vec(),
        command_digest: {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(b"./migrate.sh"))
        },
        remote_dir: ".cairn".into(),
        timeout_secs: 0,
        client: "1@test".into(),
    }
}

/// A journal with two executions and 8 events (seq 1..=8), anchored.
fn journal() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let mut j = Journal::open(&path).unwrap();
    for id in ["ex_a", "ex_b"] {
        let r = record(id);
        j.accept(&r, accepted_evidence(&r)).unwrap();
        for s in [State::Authorized, State::Dispatched, State::Running] {
            j.append(&r.id, s.as_str(), Some(s), serde_json::json!({"n": id}))
                .unwrap();
        }
    }
    (dir, path)
}

fn raw(path: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).unwrap();
    // An attacker with the file can drop the append-only triggers first.
    c.execute_batch(
        "DROP TRIGGER events_append_only_u; DROP TRIGGER events_append_only_d;
         DROP TRIGGER executions_fixed_u;",
    )
    .unwrap();
    c
}

fn verify(path: &Path) -> (i32, serde_json::Value) {
    let out = Command::new(BIN)
        .args(["audit", "verify", "--json", "--journal"])
        .arg(path)
        .env_remove("CAIRN_ANCHOR")
        .output()
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out.status.code().unwrap(), v)
}

fn first_damage(path: &Path) -> (String, i64) {
    let (code, v) = verify(path);
    assert_eq!(code, 1, "verify must fail: {v}");
    let f = &v["findings"][0];
    (
        f["damage"].as_str().unwrap().to_owned(),
        f["seq"].as_i64().unwrap_or(-1),
    )
}

#[test]
fn an_intact_journal_verifies() {
    let (_d, p) = journal();
    let (code, v) = verify(&p);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["events"], 8);
    assert_eq!(v["anchored_seq"], 8);
    assert_eq!(v["findings"].as_array().unwrap().len(), 0);
}

#[test]
fn a_modified_field_is_detected() {
    let (_d, p) = journal();
    raw(&p)
        .execute(
            "UPDATE events SET evidence = '{\"n\":\"forged\"}' WHERE seq = 3",
            [],
        )
        .unwrap();
    assert_eq!(first_damage(&p), ("modified".into(), 3));
}

#[test]
fn a_deleted_row_is_detected() {
    let (_d, p) = journal();
    raw(&p)
        .execute("DELETE FROM events WHERE seq = 4", [])
        .unwrap();
    assert_eq!(first_damage(&p), ("deleted".into(), 4));
}

#[test]
fn a_deleted_row_with_the_rest_renumbered_is_detected() {
    let (_d, p) = journal();
    let c = raw(&p);
    c.execute("DELETE FROM events WHERE seq = 4", []).unwrap();
    c.execute("UPDATE events SET seq = seq - 1 WHERE seq > 4", [])
        .unwrap();
    assert_eq!(first_damage(&p), ("deleted".into(), 4));
}

#[test]
fn an_inserted_row_is_detected_even_with_a_valid_hash() {
    let (_d, p) = journal();
    let c = raw(&p);
    // Make room at seq 4 and insert a forged entry whose own hash and link are correct.
    c.execute_batch(
        "UPDATE events SET seq = -seq WHERE seq >= 4; UPDATE events SET seq = 1 - seq WHERE seq < 0;",
    )
    .unwrap();
    let prev: String = c
        .query_row("SELECT hash FROM events WHERE seq = 3", [], |r| r.get(0))
        .unwrap();
    let (at, ev, client) = (now_rfc3339(), "{\"forged\":true}", "666@attacker");
    let hash = chain_hash(&ChainFields {
        prev_hash: &prev,
        seq: 4,
        execution_id: "ex_a",
        at: &at,
        kind: "completed",
        state: "completed",
        evidence: ev,
        client,
    });
    c.execute(
        "INSERT INTO events (seq, execution_id, at, kind, state, evidence, client, prev_hash, hash)
         VALUES (4, 'ex_a', ?1, 'completed', 'completed', ?2, ?3, ?4, ?5)",
        params![at, ev, client, prev, hash],
    )
    .unwrap();
    assert_eq!(first_damage(&p), ("inserted".into(), 4));
}

#[test]
fn reordered_rows_are_detected() {
    let (_d, p) = journal();
    let c = raw(&p);
    // Swap the contents of entries 3 and 4.
    c.execute_batch(
        "UPDATE events SET seq = 100 WHERE seq = 3;
         UPDATE events SET seq = 3 WHERE seq = 4;
         UPDATE events SET seq = 4 WHERE seq = 100;",
    )
    .unwrap();
    assert_eq!(first_damage(&p), ("reordered".into(), 3));
}

#[test]
fn a_truncated_tail_is_detected_by_the_anchor() {
    let (_d, p) = journal();
    raw(&p)
        .execute("DELETE FROM events WHERE seq >= 7", [])
        .unwrap();
    assert_eq!(first_damage(&p), ("truncated".into(), 7));
}

#[test]
fn a_replaced_anchor_is_detected() {
    let (_d, p) = journal();
    let anchor = PathBuf::from(format!("{}.anchor", p.display()));
    let forged =
        serde_json::json!({"v": 1, "seq": 8, "hash": "00".repeat(32), "mac": "00".repeat(32)});
    std::fs::write(&anchor, forged.to_string()).unwrap();
    let (damage, _) = first_damage(&p);
    assert_eq!(damage, "anchor-replaced");
}

#[test]
fn a_missing_anchor_is_reported() {
    let (_d, p) = journal();
    std::fs::remove_file(format!("{}.anchor", p.display())).unwrap();
    let (damage, _) = first_damage(&p);
    assert_eq!(damage, "anchor-missing");
}

#[test]
fn a_modified_execution_record_is_detected() {
    let (_d, p) = journal();
    raw(&p)
        .execute(
            "UPDATE executions SET host = '10.6.6.6' WHERE id = 'ex_b'",
            [],
        )
        .unwrap();
    let (code, v) = verify(&p);
    assert_eq!(code, 1);
    assert_eq!(v["findings"][0]["damage"], "record-modified", "{v}");
    assert_eq!(v["findings"][0]["execution_id"], "ex_b");
}

#[test]
fn concurrent_writers_never_cause_a_false_alarm() {
    let (_d, p) = journal();
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut j = Journal::open(&p).unwrap();
                let id = ExecutionId::parse(if t % 2 == 0 { "ex_a" } else { "ex_b" }).unwrap();
                for i in 0..40 {
                    j.append(&id, "note", None, serde_json::json!({"t": t, "i": i}))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let (code, v) = verify(&p);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["events"], 128);
    assert_eq!(v["anchored_seq"], 128);
}

#[test]
fn audit_show_answers_the_investigators_questions() {
    let (_d, p) = journal();
    let out = Command::new(BIN)
        .args(["audit", "show", "ex_a", "--journal"])
        .arg(&p)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for q in [
        "one client process or more?",
        "was it authorized, and did it reach dispatch?",
        "was a result observed from the host?",
        "did only delivery fail?",
        "did a later request reuse this execution or create a new one?",
    ] {
        assert!(text.contains(q), "{q} missing in:\n{text}");
    }
    assert!(
        text.contains("not yet: the journal has no outcome"),
        "{text}"
    );
}

#[test]
fn a_journal_directory_writable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(BIN)
        .args(["ls", "--journal"])
        .arg(shared.join("j.db"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("writable by others") && err.contains("chmod o-w"),
        "{err}"
    );
    assert!(!shared.join("j.db").exists());
}

/// A journal whose sessions chain has two sessions and four entries.
fn journal_with_sessions() -> (tempfile::TempDir, PathBuf) {
    let (d, p) = journal();
    let mut j = Journal::open(&p).unwrap();
    for (i, id) in ["se_1", "se_2"].iter().enumerate() {
        j.start_session(&cairn::journal::SessionRecord {
            id: id.to_string(),
            kind: "cli".into(),
            actor: "ops".into(),
            pid: 100 + i as i64,
            client: format!("{}@test", 100 + i),
            started_at: now_rfc3339(),
            detail: serde_json::json!({"argv": ["cairn", "run"]}),
        })
        .unwrap();
        j.session_event(id, "ended", serde_json::json!({"code": 0}))
            .unwrap();
    }
    (d, p)
}

fn raw_sessions(path: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(
        "DROP TRIGGER session_events_append_only_u; DROP TRIGGER session_events_append_only_d;
         DROP TRIGGER sessions_fixed_u;",
    )
    .unwrap();
    c
}

fn first_session_damage(path: &Path) -> (String, String, i64) {
    let (code, v) = verify(path);
    assert_eq!(code, 1, "verify must fail: {v}");
    let f = &v["findings"][0];
    (
        f["chain"].as_str().unwrap().to_owned(),
        f["damage"].as_str().unwrap().to_owned(),
        f["seq"].as_i64().unwrap_or(-1),
    )
}

#[test]
fn the_sessions_journal_is_chained_and_anchored_too() {
    let (_d, p) = journal_with_sessions();
    let (code, v) = verify(&p);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["session_events"], 4);

    let (_d2, p2) = journal_with_sessions();
    raw_sessions(&p2)
        .execute(
            "UPDATE session_events SET evidence = '{\"code\":1}' WHERE seq = 2",
            [],
        )
        .unwrap();
    assert_eq!(
        first_session_damage(&p2),
        ("sessions".into(), "modified".into(), 2)
    );

    let (_d3, p3) = journal_with_sessions();
    raw_sessions(&p3)
        .execute("DELETE FROM session_events WHERE seq = 4", [])
        .unwrap();
    assert_eq!(
        first_session_damage(&p3),
        ("sessions".into(), "truncated".into(), 4)
    );

    let (_d4, p4) = journal_with_sessions();
    raw_sessions(&p4)
        .execute(
            "UPDATE sessions SET actor = 'someone-else' WHERE id = 'se_2'",
            [],
        )
        .unwrap();
    let (chain, damage, _) = first_session_damage(&p4);
    assert_eq!(
        (chain.as_str(), damage.as_str()),
        ("sessions", "record-modified")
    );
}

/// A URL-looking journal location is refused with a clear error by every command that opens a
/// journal, the password is never repeated, and nothing is created in the working directory
/// (taken as a path, `postgres://…` would make a directory named `postgres:`).
#[test]
fn a_url_looking_journal_is_refused_and_creates_nothing() {
    let cwd = tempfile::tempdir().unwrap();
    let url = "mysql://ops:s3cret-pw@db.internal:5432/cairn";
    let cases: [&[&str]; 4] = [
        &["ls", "--journal", url],
        &["recover", "--journal", url],
        &["audit", "verify", "--journal", url],
        &[
            "audit",
            "show",
            "ex_0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
            "--journal",
            url,
        ],
    ];
    for args in cases {
        let out = Command::new(BIN)
            .args(args)
            .current_dir(cwd.path())
            .env_remove("CAIRN_JOURNAL")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(
            stderr.contains("looks like a mysql:// URL") && stderr.contains("SQLite file"),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("s3cret-pw"),
            "{args:?} repeated the password: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
        assert!(left.is_empty(), "{args:?} created {left:?}");
    }
    // The same through the environment variable.
    let out = Command::new(BIN)
        .args(["ls"])
        .current_dir(cwd.path())
        .env("CAIRN_JOURNAL", "sqlite:///var/lib/cairn/j.db")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("looks like a sqlite:// URL"));
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);
}

// A postgres:// journal is understood: a database that cannot be reached is a clear error that
// does not repeat the password, and `audit verify` says what it cannot do yet. Nothing is
// created in the working directory either way.
#[test]
fn a_postgres_journal_that_cannot_be_reached_fails_clearly_and_creates_nothing() {
    let cwd = tempfile::tempdir().unwrap();
    let url = "postgres://ops:s3cret-pw@127.0.0.1:1/cairn";
    for (args, want) in [
        (
            &["ls", "--journal", url][..],
            "postgres://ops:***@127.0.0.1:1/cairn",
        ),
        (&["audit", "verify", "--journal", url][..], "not built yet"),
    ] {
        let out = Command::new(BIN)
            .args(args)
            .current_dir(cwd.path())
            .env_remove("CAIRN_JOURNAL")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("s3cret-pw"), "{args:?}: {stderr}");
        assert_eq!(
            std::fs::read_dir(cwd.path()).unwrap().count(),
            0,
            "{args:?}"
        );
    }
}
