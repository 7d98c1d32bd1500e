//! `cairn audit verify` against journals damaged by writing their storage directly, one test
//! per kind of damage, each run on a SQLite file and on a PostgreSQL database (as its
//! superuser, which can switch the append-only triggers off); the PostgreSQL journal's own
//! heads and sealed checkpoints; and `cairn audit show`.

use std::path::{Path, PathBuf};
use std::process::Command;

use cairn::journal::{
    accepted_evidence, chain_hash, now_rfc3339, ChainFields, ExecutionRecord, Journal,
};
use cairn::{EventKind, ExecutionId, State};

use crate::support::postgres::{self, PgServer};

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

/// Where an audit test's journal is kept: every test of the chain runs on a SQLite file and
/// on a fresh database of the test PostgreSQL server (without PostgreSQL: loudly skipped
/// outside CI, a failure in CI).
enum Store {
    Sqlite {
        _dir: tempfile::TempDir,
        path: PathBuf,
    },
    Postgres {
        server: &'static PgServer,
        db: String,
        url: String,
    },
}

fn stores(test: &str) -> Vec<Store> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let mut v = vec![Store::Sqlite { _dir: dir, path }];
    if let Some(server) = postgres::server(test) {
        let url = server.database(test);
        let db = url.rsplit('/').next().unwrap().to_owned();
        v.push(Store::Postgres { server, db, url });
    }
    v
}

impl Store {
    fn name(&self) -> &'static str {
        match self {
            Store::Sqlite { .. } => "sqlite",
            Store::Postgres { .. } => "postgres",
        }
    }

    fn is_pg(&self) -> bool {
        matches!(self, Store::Postgres { .. })
    }

    /// `sqlite` on a SQLite file, `pg` on PostgreSQL: where the two report one damage
    /// differently (PostgreSQL numbers events with gaps and keeps a head per execution).
    fn pick<T>(&self, sqlite: T, pg: T) -> T {
        if self.is_pg() {
            pg
        } else {
            sqlite
        }
    }

    fn location(&self) -> PathBuf {
        match self {
            Store::Sqlite { path, .. } => path.clone(),
            Store::Postgres { url, .. } => PathBuf::from(url),
        }
    }

    fn open(&self) -> Journal {
        Journal::open(&self.location()).unwrap()
    }

    /// Run SQL as someone who can write the journal's storage directly: on the SQLite file
    /// with the append-only triggers dropped first; on PostgreSQL as the superuser, with
    /// triggers (and foreign keys) off for the session.
    fn tamper(&self, sql: &str) {
        match self {
            Store::Sqlite { path, .. } => {
                let c = rusqlite::Connection::open(path).unwrap();
                c.execute_batch(
                    "DROP TRIGGER IF EXISTS events_append_only_u;
                     DROP TRIGGER IF EXISTS events_append_only_d;
                     DROP TRIGGER IF EXISTS executions_fixed_u;
                     DROP TRIGGER IF EXISTS session_events_append_only_u;
                     DROP TRIGGER IF EXISTS session_events_append_only_d;
                     DROP TRIGGER IF EXISTS sessions_fixed_u;",
                )
                .unwrap();
                c.execute_batch(sql).unwrap();
            }
            Store::Postgres { server, db, .. } => {
                server
                    .psql(
                        db,
                        &format!("SET session_replication_role = replica; {sql}"),
                    )
                    .unwrap();
            }
        }
    }

    /// One value, read directly.
    fn query(&self, sql: &str) -> String {
        match self {
            Store::Sqlite { path, .. } => rusqlite::Connection::open(path)
                .unwrap()
                .query_row(sql, [], |r| r.get(0))
                .unwrap(),
            Store::Postgres { server, db, .. } => server.psql(db, sql).unwrap().trim().to_owned(),
        }
    }
}

/// A journal with two executions and 8 events (seq 1..=8: ex_a 1..=4, ex_b 5..=8), anchored.
fn journal(s: &Store) {
    let mut j = s.open();
    for id in ["ex_a", "ex_b"] {
        let r = record(id);
        j.accept(&r, accepted_evidence(&r)).unwrap();
        for st in [State::Authorized, State::Dispatched, State::Running] {
            j.append(
                &r.id,
                EventKind::of_state(st),
                Some(st),
                serde_json::json!({"n": id}),
            )
            .unwrap();
        }
    }
}

/// A fixture on every backend.
fn journals(test: &str) -> Vec<Store> {
    let v = stores(test);
    for s in &v {
        journal(s);
    }
    v
}

fn verify(path: &Path) -> (i32, serde_json::Value) {
    verify_with(path, &[])
}

fn verify_with(path: &Path, extra: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(BIN)
        .args(["audit", "verify", "--json", "--journal"])
        .arg(path)
        .args(extra)
        .env_remove("CAIRN_ANCHOR")
        .env_remove("CAIRN_SEAL_KEY")
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
    for s in journals("an_intact_journal_verifies") {
        let (code, v) = verify(&s.location());
        assert_eq!(code, 0, "{}: {v}", s.name());
        assert_eq!(v["events"], 8, "{}", s.name());
        assert_eq!(v["executions"], 2, "{}", s.name());
        assert_eq!(v["findings"].as_array().unwrap().len(), 0, "{}", s.name());
        if s.is_pg() {
            // No checkpoint yet: everything is not yet sealed, which is not damage.
            assert_eq!(v["sealing"]["checkpoints"], 0, "{v}");
            assert_eq!(v["sealing"]["unsealed_events"], 8, "{v}");
            assert_eq!(v["sealing"]["unsealed_executions"], 2, "{v}");
        } else {
            assert_eq!(v["anchored_seq"], 8);
        }
    }
}

#[test]
fn a_modified_field_is_detected() {
    for s in journals("a_modified_field_is_detected") {
        s.tamper("UPDATE events SET evidence = '{\"n\":\"forged\"}' WHERE seq = 3");
        assert_eq!(
            first_damage(&s.location()),
            ("modified".into(), 3),
            "{}",
            s.name()
        );
    }
}

#[test]
fn a_deleted_row_is_detected() {
    for s in journals("a_deleted_row_is_detected") {
        s.tamper("DELETE FROM events WHERE seq = 3");
        // SQLite names the missing number; PostgreSQL's numbers have gaps, so it names the
        // event that no longer follows from its predecessor.
        assert_eq!(
            first_damage(&s.location()),
            ("deleted".into(), s.pick(3, 4)),
            "{}",
            s.name()
        );
    }
}

#[test]
fn a_deleted_row_with_the_rest_renumbered_is_detected() {
    for s in journals("a_deleted_row_with_the_rest_renumbered") {
        s.tamper(
            "DELETE FROM events WHERE seq = 3;
             UPDATE events SET seq = -(seq - 1) WHERE seq > 3;
             UPDATE events SET seq = -seq WHERE seq < 0;",
        );
        assert_eq!(
            first_damage(&s.location()),
            ("deleted".into(), 3),
            "{}",
            s.name()
        );
    }
}

#[test]
fn an_inserted_row_is_detected_even_with_a_valid_hash() {
    for s in journals("an_inserted_row_is_detected") {
        // Make room at seq 4 and insert a forged entry whose own hash and link are correct.
        s.tamper(
            "UPDATE events SET seq = -seq WHERE seq >= 4; UPDATE events SET seq = 1 - seq WHERE seq < 0;",
        );
        let prev = s.query("SELECT hash FROM events WHERE seq = 3");
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
        s.tamper(&format!(
            "INSERT INTO events (seq, execution_id, at, kind, state, evidence, client, prev_hash, hash)
             VALUES (4, 'ex_a', '{at}', 'completed', 'completed', '{ev}', '{client}', '{prev}', '{hash}')"
        ));
        assert_eq!(
            first_damage(&s.location()),
            ("inserted".into(), 4),
            "{}",
            s.name()
        );
    }
}

#[test]
fn reordered_rows_are_detected() {
    for s in journals("reordered_rows_are_detected") {
        // Swap the contents of entries 3 and 4.
        s.tamper(
            "UPDATE events SET seq = 100 WHERE seq = 3;
             UPDATE events SET seq = 3 WHERE seq = 4;
             UPDATE events SET seq = 4 WHERE seq = 100;",
        );
        assert_eq!(
            first_damage(&s.location()),
            ("reordered".into(), 3),
            "{}",
            s.name()
        );
    }
}

#[test]
fn a_truncated_tail_is_detected() {
    for s in journals("a_truncated_tail_is_detected") {
        s.tamper("DELETE FROM events WHERE seq >= 7");
        // SQLite: the anchor names entry 8, the chain ends at 6. PostgreSQL: ex_b's stored
        // head names event 8.
        assert_eq!(
            first_damage(&s.location()),
            ("truncated".into(), s.pick(7, 8)),
            "{}",
            s.name()
        );
    }
}

#[test]
fn a_replaced_anchor_is_detected() {
    let s = sqlite_journal();
    let p = s.location();
    let anchor = PathBuf::from(format!("{}.anchor", p.display()));
    let forged =
        serde_json::json!({"v": 1, "seq": 8, "hash": "00".repeat(32), "mac": "00".repeat(32)});
    std::fs::write(&anchor, forged.to_string()).unwrap();
    let (damage, _) = first_damage(&p);
    assert_eq!(damage, "anchor-replaced");
}

#[test]
fn a_missing_anchor_is_reported() {
    let s = sqlite_journal();
    let p = s.location();
    std::fs::remove_file(format!("{}.anchor", p.display())).unwrap();
    let (damage, _) = first_damage(&p);
    assert_eq!(damage, "anchor-missing");
}

/// The anchor's key missing, unreadable or too short: the MAC cannot be checked, and that is a
/// finding, never a check skipped in silence.
#[test]
fn a_missing_unreadable_or_short_anchor_key_is_a_finding() {
    for damage in ["missing", "short", "unreadable"] {
        let s = sqlite_journal();
        let p = s.location();
        let key = PathBuf::from(format!("{}.anchor.key", p.display()));
        match damage {
            "missing" => std::fs::remove_file(&key).unwrap(),
            "short" => std::fs::write(&key, b"0123456789").unwrap(),
            _ => {
                // a directory where the key file should be: reading it fails, even as root
                std::fs::remove_file(&key).unwrap();
                std::fs::create_dir(&key).unwrap();
            }
        }
        let (code, v) = verify(&p);
        assert_eq!(code, 1, "{damage}: verify must fail: {v}");
        assert_eq!(
            v["findings"][0]["damage"], "anchor-key-missing",
            "{damage}: {v}"
        );
        assert_eq!(v["findings"].as_array().unwrap().len(), 1, "{damage}: {v}");
    }
}

/// An anchor that does not parse is a finding, and the next append does not replace it with a
/// fresh one (that would erase the evidence): it stays as it was, and stays a finding.
#[test]
fn an_unparseable_anchor_is_a_finding_and_is_never_overwritten() {
    let s = sqlite_journal();
    let p = s.location();
    let anchor = PathBuf::from(format!("{}.anchor", p.display()));
    std::fs::write(&anchor, b"{\"v\": 1, \"seq\": ").unwrap();
    let (damage, _) = first_damage(&p);
    assert_eq!(damage, "anchor-replaced");
    let mut j = s.open();
    j.append(
        &ExecutionId::parse("ex_a").unwrap(),
        EventKind::Note,
        None,
        serde_json::json!({"after": "damage"}),
    )
    .unwrap();
    drop(j);
    assert_eq!(std::fs::read(&anchor).unwrap(), b"{\"v\": 1, \"seq\": ");
    let (code, v) = verify(&p);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["findings"][0]["damage"], "anchor-replaced", "{v}");
    assert!(
        v["findings"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("does not parse"),
        "{v}"
    );
}

/// The SQLite fixture alone (for what only a SQLite file has: its anchor file).
fn sqlite_journal() -> Store {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let s = Store::Sqlite { _dir: dir, path };
    journal(&s);
    s
}

#[test]
fn a_modified_execution_record_is_detected() {
    for s in journals("a_modified_execution_record") {
        s.tamper("UPDATE executions SET host = '10.6.6.6' WHERE id = 'ex_b'");
        let (code, v) = verify(&s.location());
        assert_eq!(code, 1, "{}: {v}", s.name());
        assert_eq!(v["findings"][0]["damage"], "record-modified", "{v}");
        assert_eq!(v["findings"][0]["execution_id"], "ex_b", "{v}");
    }
}

#[test]
fn concurrent_writers_never_cause_a_false_alarm() {
    for s in journals("concurrent_writers") {
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let p = s.location();
                std::thread::spawn(move || {
                    let mut j = Journal::open(&p).unwrap();
                    let id = ExecutionId::parse(if t % 2 == 0 { "ex_a" } else { "ex_b" }).unwrap();
                    for i in 0..40 {
                        j.append(
                            &id,
                            EventKind::Note,
                            None,
                            serde_json::json!({"t": t, "i": i}),
                        )
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (code, v) = verify(&s.location());
        assert_eq!(code, 0, "{}: {v}", s.name());
        assert_eq!(v["events"], 128, "{}", s.name());
        if !s.is_pg() {
            assert_eq!(v["anchored_seq"], 128);
        }
    }
}

#[test]
fn audit_show_answers_the_investigators_questions() {
    for s in journals("audit_show_answers") {
        let out = Command::new(BIN)
            .args(["audit", "show", "ex_a", "--journal"])
            .arg(s.location())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}: {text}", s.name());
        for q in [
            "one client process or more?",
            "was it authorized, and did it reach dispatch?",
            "was a result observed from the host?",
            "did only delivery fail?",
            "did a later request reuse this execution or create a new one?",
        ] {
            assert!(text.contains(q), "{}: {q} missing in:\n{text}", s.name());
        }
        assert!(
            text.contains("not yet: the journal has no outcome"),
            "{}: {text}",
            s.name()
        );
    }
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

/// Two sessions with four entries in their chains (se_1: 1, 2; se_2: 3, 4) beside the fixture.
fn add_sessions(s: &Store) {
    let mut j = s.open();
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
    let with_sessions = |test: &str| {
        let v = journals(test);
        v.iter().for_each(add_sessions);
        v
    };
    for s in with_sessions("sessions_intact") {
        let (code, v) = verify(&s.location());
        assert_eq!(code, 0, "{}: {v}", s.name());
        assert_eq!(v["session_events"], 4, "{}", s.name());
    }
    for s in with_sessions("sessions_modified") {
        s.tamper("UPDATE session_events SET evidence = '{\"code\":1}' WHERE seq = 2");
        assert_eq!(
            first_session_damage(&s.location()),
            ("sessions".into(), "modified".into(), 2),
            "{}",
            s.name()
        );
    }
    for s in with_sessions("sessions_truncated") {
        s.tamper("DELETE FROM session_events WHERE seq = 4");
        // SQLite: the anchor's sessions head; PostgreSQL: se_2's stored head.
        assert_eq!(
            first_session_damage(&s.location()),
            ("sessions".into(), "truncated".into(), 4),
            "{}",
            s.name()
        );
    }
    for s in with_sessions("sessions_record_modified") {
        s.tamper("UPDATE sessions SET actor = 'someone-else' WHERE id = 'se_2'");
        let (chain, damage, _) = first_session_damage(&s.location());
        assert_eq!(
            (chain.as_str(), damage.as_str()),
            ("sessions", "record-modified"),
            "{}",
            s.name()
        );
    }
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
// does not repeat the password, from every command. Nothing is created in the working directory
// either way.
#[test]
fn a_postgres_journal_that_cannot_be_reached_fails_clearly_and_creates_nothing() {
    let cwd = tempfile::tempdir().unwrap();
    let url = "postgres://ops:s3cret-pw@127.0.0.1:1/cairn";
    for (args, want) in [
        (
            &["ls", "--journal", url][..],
            "postgres://ops:***@127.0.0.1:1/cairn",
        ),
        (
            &["audit", "verify", "--journal", url][..],
            "postgres://ops:***@127.0.0.1:1/cairn",
        ),
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

// --- PostgreSQL: a chain per execution, its stored head, sealed checkpoints ---

/// The fixture on PostgreSQL alone; `None` (said loudly) without PostgreSQL outside CI.
fn pg_journal(test: &str) -> Option<Store> {
    let s = stores(test).into_iter().find(Store::is_pg)?;
    journal(&s);
    Some(s)
}

/// A seal key file in a fresh directory.
fn seal_key() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("seal.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    (dir, key)
}

fn seal(s: &Store, key: &Path) -> String {
    let out = Command::new(BIN)
        .args(["audit", "seal", "--journal"])
        .arg(s.location())
        .arg("--seal-key")
        .arg(key)
        .env_remove("CAIRN_SEAL_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every finding of a failed verify, as (damage, execution or session, seq).
fn findings(v: &serde_json::Value) -> Vec<(String, String, i64)> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["damage"].as_str().unwrap().to_owned(),
                f["execution_id"].as_str().unwrap_or("").to_owned(),
                f["seq"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

/// An event of `id` with a correct hash linked to `prev`, as someone who knows the encoding
/// would forge it: SQL that inserts it.
fn forged_event(seq: i64, id: &str, prev: &str) -> String {
    let (at, ev, client) = (now_rfc3339(), "{\"forged\":true}", "666@attacker");
    let hash = chain_hash(&ChainFields {
        prev_hash: prev,
        seq,
        execution_id: id,
        at: &at,
        kind: "completed",
        state: "completed",
        evidence: ev,
        client,
    });
    format!(
        "INSERT INTO events (seq, execution_id, at, kind, state, evidence, client, prev_hash, hash)
         VALUES ({seq}, '{id}', '{at}', 'completed', 'completed', '{ev}', '{client}', '{prev}', '{hash}')"
    )
}

#[test]
fn a_postgres_verify_names_the_execution_and_event_and_exits_1() {
    let Some(s) = pg_journal("pg_verify_text") else {
        return;
    };
    let run = || {
        Command::new(BIN)
            .args(["audit", "verify", "--journal"])
            .arg(s.location())
            .env_remove("CAIRN_SEAL_KEY")
            .output()
            .unwrap()
    };
    let clean = run();
    let text = String::from_utf8_lossy(&clean.stdout);
    assert_eq!(clean.status.code(), Some(0), "{text}");
    assert!(text.contains("8 events in 2 executions"), "{text}");
    assert!(
        text.contains("not yet sealed: 8 event(s) in 2 execution(s)"),
        "{text}"
    );
    assert!(text.contains("ok: every chain is intact"), "{text}");

    s.tamper("UPDATE events SET evidence = '{\"n\":\"forged\"}' WHERE seq = 6");
    let bad = run();
    let text = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(1), "{text}");
    assert!(
        text.contains("DAMAGE Modified in the activity journal at entry 6 (execution ex_b)")
            && text.contains("execution ex_b: event 6 (authorized) no longer matches its hash"),
        "{text}"
    );
    assert!(!text.contains("ok:"), "{text}");
}

#[test]
fn a_postgres_gap_in_the_numbers_is_not_damage_but_an_event_forged_into_it_is() {
    let Some(s) = pg_journal("pg_inserted_in_a_gap") else {
        return;
    };
    // Rolled-back appends use numbers: ex_a's next events are 21 and 22.
    s.tamper("SELECT setval('event_seq', 20)");
    let mut j = s.open();
    let a = ExecutionId::parse("ex_a").unwrap();
    for n in 0..2 {
        j.append(&a, EventKind::Note, None, serde_json::json!({ "n": n }))
            .unwrap();
    }
    let (code, v) = verify(&s.location());
    assert_eq!(code, 0, "a gap is not damage: {v}");
    // A forged event at 15, correctly hashed and linked to ex_a's event 4.
    let prev = s.query("SELECT hash FROM events WHERE seq = 4");
    s.tamper(&forged_event(15, "ex_a", &prev));
    let (code, v) = verify(&s.location());
    assert_eq!(code, 1, "{v}");
    assert_eq!(
        findings(&v),
        [("inserted".to_owned(), "ex_a".to_owned(), 15)],
        "{v}"
    );
    assert!(
        v["findings"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("execution ex_a: event 21 follows event 4 directly, but event 15 sits"),
        "{v}"
    );
}

#[test]
fn a_postgres_stored_head_that_does_not_match_its_chain_is_detected() {
    let Some(s) = pg_journal("pg_head_mismatch") else {
        return;
    };
    s.tamper(&format!(
        "UPDATE chain_heads SET hash = '{}' WHERE execution_id = 'ex_a'",
        "0".repeat(64)
    ));
    let (code, v) = verify(&s.location());
    assert_eq!(code, 1, "{v}");
    assert_eq!(
        findings(&v),
        [("head-mismatch".to_owned(), "ex_a".to_owned(), 4)],
        "{v}"
    );

    // An event appended after the head, correctly hashed and linked, without moving the head.
    let Some(s) = pg_journal("pg_after_head") else {
        return;
    };
    let prev = s.query("SELECT hash FROM events WHERE seq = 8");
    s.tamper(&forged_event(9, "ex_b", &prev));
    let (_, v) = verify(&s.location());
    assert_eq!(
        findings(&v),
        [("inserted".to_owned(), "ex_b".to_owned(), 9)],
        "{v}"
    );

    // Events of an execution the journal does not have.
    let Some(s) = pg_journal("pg_unknown_execution") else {
        return;
    };
    s.tamper(&forged_event(9, "ex_ghost", ""));
    let (_, v) = verify(&s.location());
    assert_eq!(
        findings(&v),
        [("inserted".to_owned(), "ex_ghost".to_owned(), 9)],
        "{v}"
    );
}

#[test]
fn a_postgres_checkpoint_catches_a_tail_cut_off_with_its_head_moved_back() {
    let Some(s) = pg_journal("pg_sealed_truncation") else {
        return;
    };
    let (_k, key) = seal_key();
    assert!(seal(&s, &key).contains("sealed checkpoint 1"));
    let six = s.query("SELECT hash FROM events WHERE seq = 6");
    s.tamper(&format!(
        "DELETE FROM events WHERE seq >= 7;
         UPDATE chain_heads SET seq = 6, hash = '{six}' WHERE execution_id = 'ex_b'"
    ));
    let (code, v) = verify_with(&s.location(), &["--seal-key", key.to_str().unwrap()]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(
        findings(&v),
        [("truncated".to_owned(), "ex_b".to_owned(), 8)],
        "{v}"
    );
}

#[test]
fn a_postgres_checkpoint_catches_a_chain_rewritten_with_valid_hashes() {
    let Some(s) = pg_journal("pg_sealed_rewrite") else {
        return;
    };
    let (_k, key) = seal_key();
    seal(&s, &key);
    // Replace ex_a's last event with a forged one, hashed and linked correctly, and move the
    // stored head to it: every chain and head check passes; the checkpoint does not.
    let prev = s.query("SELECT hash FROM events WHERE seq = 3");
    s.tamper(&format!(
        "DELETE FROM events WHERE seq = 4; {}",
        forged_event(4, "ex_a", &prev)
    ));
    let forged = s.query("SELECT hash FROM events WHERE seq = 4");
    s.tamper(&format!(
        "UPDATE chain_heads SET hash = '{forged}' WHERE execution_id = 'ex_a'"
    ));
    let (code, v) = verify_with(&s.location(), &["--seal-key", key.to_str().unwrap()]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(
        findings(&v),
        [("anchor-replaced".to_owned(), "ex_a".to_owned(), 4)],
        "{v}"
    );
}

#[test]
fn a_postgres_append_after_the_newest_checkpoint_is_not_yet_sealed_not_damage() {
    let Some(s) = pg_journal("pg_unsealed") else {
        return;
    };
    let (_k, key) = seal_key();
    assert!(seal(&s, &key).contains("sealed checkpoint 1"));
    assert!(seal(&s, &key).contains("nothing to seal"), "no head moved");
    let mut j = s.open();
    let a = ExecutionId::parse("ex_a").unwrap();
    for n in 0..2 {
        j.append(&a, EventKind::Note, None, serde_json::json!({ "n": n }))
            .unwrap();
    }
    let key_arg = ["--seal-key", key.to_str().unwrap()];
    let (code, v) = verify_with(&s.location(), &key_arg);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["sealing"]["checkpoints"], 1, "{v}");
    assert_eq!(v["sealing"]["macs_checked"], true, "{v}");
    assert_eq!(v["sealing"]["unsealed_events"], 2, "{v}");
    assert_eq!(v["sealing"]["unsealed_executions"], 1, "{v}");
    // The next checkpoint seals exactly what moved: ex_a's head.
    assert!(seal(&s, &key).contains("sealed checkpoint 2"));
    assert_eq!(
        s.query("SELECT body FROM checkpoints WHERE n = 2")
            .matches("ex_")
            .count(),
        1
    );
    let (code, v) = verify_with(&s.location(), &key_arg);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["sealing"]["newest"], 2, "{v}");
    assert_eq!(v["sealing"]["unsealed_events"], 0, "{v}");
}

#[test]
fn a_postgres_checkpoint_forged_or_deleted_is_detected() {
    let Some(s) = pg_journal("pg_checkpoints_tampered") else {
        return;
    };
    let (_k, key) = seal_key();
    seal(&s, &key);
    let mut j = s.open();
    let a = ExecutionId::parse("ex_a").unwrap();
    j.append(&a, EventKind::Note, None, serde_json::json!({}))
        .unwrap();
    seal(&s, &key);
    let key_arg = ["--seal-key", key.to_str().unwrap()];
    assert_eq!(verify_with(&s.location(), &key_arg).0, 0);

    // Sealed under another key: the MAC does not verify (without the key it is not checked).
    let (_k2, other) = seal_key();
    std::fs::write(&other, [9u8; 32]).unwrap();
    j.append(&a, EventKind::Note, None, serde_json::json!({}))
        .unwrap();
    seal(&s, &other);
    let (code, v) = verify_with(&s.location(), &key_arg);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["findings"][0]["chain"], "checkpoints", "{v}");
    assert_eq!(v["findings"][0]["damage"], "anchor-replaced", "{v}");
    assert_eq!(v["findings"][0]["seq"], 3, "{v}");
    let (code, v) = verify(&s.location());
    assert_eq!(
        (code, &v["sealing"]["macs_checked"]),
        (0, &false.into()),
        "{v}"
    );

    // A deleted checkpoint breaks the checkpoints' own chain.
    s.tamper("DELETE FROM checkpoints WHERE n = 1");
    let (code, v) = verify(&s.location());
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["findings"][0]["chain"], "checkpoints", "{v}");
    assert_eq!(v["findings"][0]["damage"], "deleted", "{v}");
    assert_eq!(v["findings"][0]["seq"], 2, "{v}");
}

/// A replica (`cairn serve`) given the seal key seals by itself while it runs: its session's
/// start is in a checkpoint it wrote, under the key, before it is told to stop.
#[test]
fn a_postgres_replica_with_the_seal_key_seals_checkpoints_while_it_runs() {
    use std::io::Write;
    let Some(s) = pg_journal("pg_replica_seals") else {
        return;
    };
    let (_k, key) = seal_key();
    let mut replica = Command::new(BIN)
        .args(["serve", "--stdio", "--journal"])
        .arg(s.location())
        .env("CAIRN_SEAL_KEY", &key)
        .env("CAIRN_SEAL_INTERVAL", "0.05")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait (boundedly) for a checkpoint that holds the replica's own session.
    let mut sealed = None;
    for _ in 0..600 {
        let session = s.query("SELECT COALESCE(MAX(id), '') FROM sessions");
        let bodies = s.query("SELECT COALESCE(string_agg(body, ' '), '') FROM checkpoints");
        if !session.is_empty() && bodies.contains(&session) {
            sealed = Some(session);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let still_running = replica.try_wait().unwrap().is_none();
    let mut stdin = replica.stdin.take().unwrap();
    let _ = stdin.flush();
    drop(stdin);
    assert_eq!(replica.wait().unwrap().code(), Some(0));
    assert!(still_running, "the replica sealed while it ran");
    assert!(
        sealed.is_some(),
        "no checkpoint holds the replica's session"
    );
    let by = s.query("SELECT by_client FROM checkpoints ORDER BY n LIMIT 1");
    assert!(
        by.starts_with(&format!("{}@", replica.id())),
        "sealed by the replica: {by}"
    );
    let (code, v) = verify_with(&s.location(), &["--seal-key", key.to_str().unwrap()]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["sealing"]["macs_checked"], true, "{v}");
    assert_eq!(
        v["sealing"]["unsealed_events"], 0,
        "the fixture was sealed too: {v}"
    );
}
