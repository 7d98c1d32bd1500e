//! A golden journal: one SQLite journal (and its anchor) holding every event kind cairn appends,
//! with the evidence each kind carries, kept in `tests/fixtures/journal/` as it was written.
//!
//! The journal's format is its compatibility promise: a journal written by an older build must
//! still open, read and verify. Two tests hold it:
//! - the committed file verifies (`audit verify`: chains, records, anchor) and every entry reads
//!   back exactly as the committed text dump says, byte for byte;
//! - writing the same history with this build gives the same kinds, states and evidence text, so
//!   a change in how evidence is built (say, typed values in place of `json!`) cannot quietly
//!   change what the journal stores.
//!
//! `CAIRN_WRITE_GOLDEN=1 cargo test --lib -- golden::write_golden --ignored` writes the fixture
//! anew; do that only for a deliberate format change, and say so in the commit.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};
use serde_json::{json, Value};

use super::hosts::{host_epoch_changed_evidence, host_key_shared_evidence};
use super::{accepted_evidence, ExecutionRecord, Journal, SessionRecord};
use crate::epoch::HostPlace;
use crate::event::EventKind;
use crate::evidence::{Evidence, ResolvedDetail, SessionEvidence};
use crate::id::ExecutionId;
use crate::intent::OpClass;
use crate::state::State;

/// Where the fixture lives.
fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/journal")
}

const BY: &str = "4242@golden-host";
const KEY: &str = "SHA256:Kx5oZbX8bq1wQJ2lKp0m2vJtq7c9uH4y1aR3sFh8dE0";
const EPOCH: &str = "ep_0190a1b2c3d47e5f8a9b0c1d2e3f4a5b";
const OLD_EPOCH: &str = "ep_0190a1b2c3d47e5f8a9b0c1d2e3f0000";
const START: &str = "S 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a01 1 ep_0190a1b2c3d47e5f8a9b0c1d2e3f4a5b \
                     supervisor=4711 digest=2a5b9c";
const FINISH: &str = "F 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a01 0 12 0";
const SESSION: &str = "se_0190a1b2c3d47e5f8a9b0c1d2e3f4a99";

fn record(id: &str, command: &[u8]) -> ExecutionRecord {
    use sha2::{Digest, Sha256};
    ExecutionRecord {
        id: ExecutionId::parse(id).unwrap(),
        created_at: "2026-12-02T19:00:00.000Z".into(),
        destination: "db-1".into(),
        host: "db-1.example".into(),
        port: 22,
        user: "ops".into(),
        command: command.to_vec(),
        command_digest: hex::encode(Sha256::digest(command)),
        remote_dir: ".cairn".into(),
        timeout_secs: 600,
        client: BY.into(),
    }
}

/// An event of `id` from its typed evidence: kind, state and JSON as the executor appends them.
fn typed(id: &'static str, e: Evidence<'_>) -> (&'static str, EventKind, Option<State>, Value) {
    let (kind, state, evidence) = e.into_event();
    (id, kind, state, evidence)
}

/// Every kind of event cairn appends, each with its evidence built as the code that appends it
/// builds it (the same fields, the same kinds of value, sample values in place of live ones):
/// each from its typed [`Evidence`] (all but the free-form `step` and `note`), so this history
/// (and the fixture it is compared with) holds their JSON byte for byte.
/// `(execution, kind, state, evidence)` in append order.
// One list, long because it names every kind: splitting it would hide which are covered.
fn history() -> Vec<(&'static str, EventKind, Option<State>, Value)> {
    use EventKind as K;
    let a = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a01";
    let b = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a02";
    let c = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a03";
    let d = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a04";
    let e = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a05";
    let place = HostPlace {
        destination: "ops@db-1.example:22".into(),
        host_key: KEY.into(),
        remote_dir: ".cairn".into(),
    };
    let at = "2026-12-02T19:00:01.000Z";
    let decided = |allow| Evidence::Decided {
        allow,
        by: "policy",
        rule: Some("ops may run anything"),
        reason: "allowed by rule 1",
        at,
        host_key: KEY,
        actor: "ops@example",
    };
    let resolved = |state, decision, detail| Evidence::Resolved {
        state,
        decision,
        by: "alice",
        reason: "checked the host by hand",
        client: BY,
        state_before: State::Unknown,
        detail,
    };
    vec![
        // a: the executor's way through a run that loses its connection and completes
        typed(
            a,
            Evidence::Correlation {
                correlation_id: "rpc-7",
                session_id: Some(SESSION),
                new_execution: true,
            },
        ),
        typed(a, decided(true)),
        typed(a, host_epoch_changed_evidence(&place, OLD_EPOCH, EPOCH, at)),
        typed(
            a,
            host_key_shared_evidence(&place, EPOCH, "db-2", OLD_EPOCH, at),
        ),
        typed(
            a,
            Evidence::Dispatched {
                epoch: Some(EPOCH),
                host_key: Some(KEY),
                attempt: 0,
                detach: false,
                timeout_secs: 600,
            },
        ),
        typed(
            a,
            Evidence::DispatchEpoch {
                epoch: EPOCH,
                recorded_before: Some(OLD_EPOCH),
                evidence: (),
            },
        ),
        typed(
            a,
            Evidence::Running {
                start_record: START.into(),
                host_key: Some(KEY),
                host_side: Some("helper"),
                helper_sha256: Some(
                    "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                ),
            },
        ),
        typed(
            a,
            Evidence::ConnectionLost {
                error: "connection reset by peer",
                out_off: 12,
                err_off: 0,
            },
        ),
        typed(a, Evidence::Reconnected { reconnects: 1 }),
        typed(
            a,
            Evidence::Finished {
                state: State::Completed,
                finish_record: FINISH.into(),
                recovered: true,
                reconnects: 1,
            },
        ),
        typed(a, Evidence::Delivered { to: "stream" }),
        // b: an unknown outcome, probed, reused, matched and resolved
        typed(
            b,
            Evidence::Dispatched {
                epoch: None,
                host_key: Some(KEY),
                attempt: 2,
                detach: true,
                timeout_secs: 0,
            },
        ),
        typed(
            b,
            Evidence::GuardExists {
                start_record: Some(START.into()),
            },
        ),
        typed(
            b,
            Evidence::ProbeAbsent {
                result: (),
                decision: (),
            },
        ),
        typed(
            b,
            Evidence::RetrySameId {
                class: OpClass::Idempotent,
                reason: (),
            },
        ),
        typed(
            b,
            Evidence::Concluded {
                state: State::Unknown,
                reason: "the connection broke after the start guard and the host cannot be reached",
                reconnects: 3,
                start_record: Some(START.into()),
            },
        ),
        typed(
            b,
            Evidence::RequestReused {
                by: BY,
                correlation_id: Some("rpc-8"),
                session_id: Some(SESSION),
                decision: (),
            },
        ),
        typed(
            b,
            Evidence::IntentMatched {
                by: BY,
                session_id: Some(SESSION),
                correlation_id: None,
                fingerprint: "if2_3b1f0c",
                decision: (),
            },
        ),
        typed(
            b,
            resolved(None, "retry", Some(ResolvedDetail::ABSENT_SAME_EPOCH)),
        ),
        typed(b, resolved(Some(State::Completed), "completed", None)),
        // c: refused by the approver
        typed(c, decided(false)),
        // d: resumed, withheld, cancelled, redriven, abandoned by its caller
        typed(d, Evidence::Resumed { by: BY, why: () }),
        typed(
            d,
            Evidence::DispatchWithheld {
                by: BY,
                state: Some(State::Cancelled),
                withheld: vec!["authorized"],
                reason: (),
            },
        ),
        typed(d, Evidence::CancelRequested { grace_secs: 5 }),
        typed(
            d,
            Evidence::Concluded {
                state: State::Cancelled,
                reason: "cancelled before it started: the host had no started record and now \
                         holds a cancel flag that stops any late dispatch of this ID",
                reconnects: 0,
                start_record: None,
            },
        ),
        typed(
            d,
            Evidence::Redrive {
                by: BY,
                replica: "rp_0190a1b2",
                state: State::Dispatched,
                redrive: 1,
                max_redrives: 3,
                undriven_ms: 1500,
                reason: (),
            },
        ),
        typed(
            d,
            Evidence::DeliveryAbandoned {
                correlation_id: "rpc-9",
                session_id: Some(SESSION),
                reason: (),
                cancel: false,
            },
        ),
        typed(
            d,
            Evidence::Attached {
                correlation_id: "rpc-10",
                session_id: Some(SESSION),
                method: (),
            },
        ),
        // e: never started, retried, interrupted; the shared journal's takeover; steps and notes
        typed(
            e,
            Evidence::Concluded {
                state: State::Failed,
                reason: "never dispatched: connection refused",
                reconnects: 0,
                start_record: None,
            },
        ),
        typed(
            e,
            Evidence::Retry {
                why: "the host is back",
                by: BY,
            },
        ),
        typed(
            e,
            Evidence::Concluded {
                state: State::Interrupted,
                reason: "the host rebooted while the command ran: its supervisor is gone",
                reconnects: 1,
                start_record: Some(START.into()),
            },
        ),
        typed(
            e,
            Evidence::Takeover {
                from: "rp_old",
                from_client: "17@old-host",
                to: "rp_new",
                to_client: BY,
                epoch: 2,
                takeover: 1,
                max_takeovers: 5,
                lease_ms: 10000,
                reason: (),
            },
        ),
        (e, K::Step, None, json!({"i": 0})),
        (e, K::Note, None, json!({"n": 0})),
    ]
}

/// The `accepted` evidence of each execution, as the executor builds it.
fn accepted(rec: &ExecutionRecord, with_intent: bool) -> Value {
    let mut evidence = accepted_evidence(rec);
    evidence["connection"] = json!("direct");
    if with_intent {
        evidence["fingerprint"] = "if2_3b1f0c".into();
        evidence["actor"] = "ops@example".into();
        evidence["scope"] = "default".into();
        evidence["class"] = "idempotent".into();
        evidence["retention_secs"] = 86400u64.into();
        evidence["session_id"] = json!(Some(SESSION));
        evidence["intent"] = json!({"v": 2, "host": "db-1.example:22", "user": "ops"});
    }
    evidence
}

/// The sessions journal: a session's record and the entries the fronts append to it.
fn session_entries() -> (SessionRecord, Vec<SessionEvidence<'static>>) {
    let s = SessionRecord {
        id: SESSION.into(),
        kind: "mcp".into(),
        actor: "ops@example".into(),
        pid: 4242,
        client: BY.into(),
        started_at: "2026-12-02T18:59:59.000Z".into(),
        detail: json!({"argv": ["cairn", "mcp"], "transport": "stdio"}),
    };
    let entries = vec![
        SessionEvidence::BatchResume {
            batch_id: "ba_0190a1b2",
        },
        SessionEvidence::Refused {
            status: 401,
            reason: "no bearer token",
            method: "POST",
            path: "/mcp",
            peer: "127.0.0.1:50123".into(),
            origin: None,
            token_id: None,
        },
        SessionEvidence::EndedWithExit { exit: 0 },
        SessionEvidence::EndedOperation {
            operation: "restart-web",
        },
        SessionEvidence::EndedExecution {
            execution_id: Some("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a01"),
        },
        SessionEvidence::Ended {
            reason: "Cancelled",
        },
    ];
    (s, entries)
}

/// Write the golden history into a new journal at `path`.
pub(crate) fn write(path: &Path) {
    let mut j = Journal::open(path).unwrap();
    let (s, entries) = session_entries();
    j.start_session(&s).unwrap();
    let hist = history();
    let mut seen = Vec::new();
    for (id, kind, state, evidence) in hist {
        if !seen.contains(&id) {
            seen.push(id);
            let rec = record(id, format!("echo {}", seen.len()).as_bytes());
            j.accept(&rec, accepted(&rec, seen.len() == 1)).unwrap();
        }
        // The history holds every kind, not one life the lifecycle allows (`b` is dispatched
        // without an authorization, `e` interrupted after failing): it is written past the
        // lifecycle check, as journals written before the journal enforced it were, in one
        // transaction per event as an append makes, with the anchor moved after each.
        let mut c = j.conn().unwrap();
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .unwrap();
        let ev = super::append_in(&tx, id, kind.as_str(), state, &evidence).unwrap();
        tx.commit().unwrap();
        drop(c);
        super::advance_anchor(&j.file().unwrap().anchor, &ev);
    }
    for evidence in entries {
        j.session_evidence(SESSION, evidence).unwrap();
    }
}

/// Every entry of both chains as stored, one line each: chain, seq, execution or session, at,
/// kind, state, client, hash, evidence (tab-separated; the evidence text exactly as stored).
pub(crate) fn dump(path: &Path) -> String {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut out = String::new();
    for (chain, sql) in [
        (
            "activity",
            "SELECT seq, execution_id, at, kind, COALESCE(state, '-'), client, hash, evidence
             FROM events ORDER BY seq",
        ),
        (
            "sessions",
            "SELECT seq, session_id, at, kind, '-', '-', hash, evidence
             FROM session_events ORDER BY seq",
        ),
    ] {
        let mut st = conn.prepare(sql).unwrap();
        let rows = st
            .query_map([], |r| {
                Ok(format!(
                    "{chain}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, String>(7)?,
                ))
            })
            .unwrap();
        for row in rows {
            out.push_str(&row.unwrap());
        }
    }
    out
}

/// What a rewrite must reproduce: chain, execution or session, kind, state and evidence (the
/// sequence numbers, times, clients and hashes of a new write differ).
fn content(dump: &str) -> Vec<String> {
    dump.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            [f[0], f[2], f[4], f[5], f[8]].join("\t")
        })
        .collect()
}

/// The fixture copied to a fresh directory (opening a journal may add files next to it).
fn fixture_copy(dir: &Path) -> PathBuf {
    for f in ["journal.db", "journal.db.anchor", "journal.db.anchor.key"] {
        std::fs::copy(fixture_dir().join(f), dir.join(f)).unwrap();
    }
    dir.join("journal.db")
}

#[test]
fn the_golden_journal_verifies_and_reads_back_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture_copy(dir.path());
    let anchor = crate::audit::Anchor::at(dir.path().join("journal.db.anchor"));
    let report = crate::audit::verify(&path, &anchor).unwrap();
    assert!(report.ok(), "{:?}", report.findings);
    assert_eq!(report.unanchored, 0);
    let want = std::fs::read_to_string(fixture_dir().join("events.txt")).unwrap();
    assert_eq!(dump(&path), want);
    // and the journal reads it: every event of every execution, every evidence as JSON
    let j = Journal::open(&path).unwrap();
    let mut events = 0;
    for (rec, _) in j.list().unwrap() {
        let evs = j.events(&rec.id).unwrap();
        events += evs.len();
        // the state kept with the execution (filled from the events on first open) is the
        // replayed one
        let replayed = crate::journal::status_from_events(&evs);
        assert_eq!(j.status(&rec.id).unwrap(), replayed, "{}", rec.id);
    }
    assert_eq!(events, report.events);
}

#[test]
fn this_build_writes_the_golden_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    write(&path);
    let want = std::fs::read_to_string(fixture_dir().join("events.txt")).unwrap();
    assert_eq!(content(&dump(&path)), content(&want));
}

#[test]
fn the_golden_journal_holds_every_kind() {
    let kinds: Vec<String> =
        content(&std::fs::read_to_string(fixture_dir().join("events.txt")).unwrap())
            .iter()
            .filter(|l| l.starts_with("activity"))
            .map(|l| l.split('\t').nth(2).unwrap().to_owned())
            .collect();
    for k in EventKind::ALL {
        assert!(kinds.iter().any(|n| n == k.as_str()), "{k} is missing");
    }
}

/// Writes the fixture anew (see the module documentation).
#[test]
#[ignore]
fn write_golden() {
    if std::env::var_os("CAIRN_WRITE_GOLDEN").is_none() {
        return;
    }
    let out = fixture_dir();
    std::fs::create_dir_all(&out).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    write(&path);
    // one self-contained file: the write-ahead log folded in, no sidecars to commit
    let conn = Connection::open(&path).unwrap();
    conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
    drop(conn);
    for f in ["journal.db", "journal.db.anchor", "journal.db.anchor.key"] {
        std::fs::copy(dir.path().join(f), out.join(f)).unwrap();
    }
    std::fs::write(out.join("events.txt"), dump(&path)).unwrap();
}
