//! The journal as evidence: the chain head's anchor outside the database, and offline
//! verification.
//!
//! Every event commits to the one before it (`journal::chain_hash`). That alone detects an
//! edited, deleted, inserted or reordered entry, but not a cut-off tail, nor a chain rewritten
//! from the first changed entry on. So after each commit the newest `(seq, hash)` is written to
//! an anchor file next to the journal (replaced atomically, never moved backwards), with an
//! HMAC-SHA256 under a key kept in a separate 0600 file. An auditor who copies the anchor (or the
//! key) elsewhere can later prove the journal has not been rewritten.
//!
//! `cairn audit verify` recomputes everything from the SQLite file, read-only, and names the first
//! bad entry and the kind of damage.
//!
//! A PostgreSQL journal keeps a chain per execution and per session, each with its stored head,
//! and sealed checkpoints in place of the anchor file: [`postgres`] checks those.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};
use sha2::{Digest, Sha256};

pub use crate::journal::anchor::Anchor;
use crate::journal::{chain_hash, session_chain_hash, ChainFields};

mod postgres;

/// What keeps `cairn audit verify` from producing a report at all: the journal cannot be found,
/// opened or read, or the seal key cannot be used. Damage the verification finds is never this
/// error but a [`Finding`] in the [`Report`].
///
/// Layer: the audit (`src/audit.rs`, `src/audit/**`). The CLI converts it with
/// `From<AuditError> for ExecError` into [`ExecError::Setup`](crate::error::ExecError::Setup):
/// the operator fixes the setup (path, URL, key) and runs the check again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The journal path is refused as it stands (a URL this build does not read).
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// No SQLite journal at this path.
    #[error("no journal at {}", .0.display())]
    NoJournal(PathBuf),
    /// The SQLite journal could not be opened read-only.
    #[error("opening {} read-only: {source}", path.display())]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// Reading the SQLite journal failed part way.
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// The PostgreSQL URL does not parse (`location` is the URL without its password).
    #[error("journal {location}: not a usable PostgreSQL URL: {detail}")]
    BadUrl { location: String, detail: String },
    /// The PostgreSQL server refused or failed a step of the read (`detail` is the server's
    /// message when there is one).
    #[error("journal {location}: {detail}")]
    Postgres { location: String, detail: String },
    /// The database holds no cairn journal, or one newer than this binary; nothing was read.
    #[error("journal {location}: {detail}")]
    NotReadable { location: String, detail: String },
    /// The seal key named for the checkpoints cannot be used (the message says why).
    #[error("{0}")]
    SealKey(crate::journal::SealKeyError),
}

impl From<AuditError> for crate::error::ExecError {
    fn from(e: AuditError) -> Self {
        crate::error::ExecError::Setup(e.to_string())
    }
}

/// The kind of damage found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Damage {
    /// An entry's content no longer matches its hash.
    Modified,
    /// Entries are missing from the chain.
    Deleted,
    /// An entry that was never appended by cairn sits in the chain.
    Inserted,
    /// Entries are in a different order than they were appended.
    Reordered,
    /// The newest entries were cut off (the anchor names an entry the journal no longer has).
    Truncated,
    /// The anchor is not one cairn wrote (bad MAC) or does not match the journal.
    AnchorReplaced,
    /// No anchor exists, so a cut-off tail or a rewritten chain could not be ruled out.
    AnchorMissing,
    /// The anchor's key is missing, unreadable or too short, so the anchor's MAC could not be
    /// checked: whoever can write the anchor could have rewritten it.
    AnchorKeyMissing,
    /// An execution record differs from what its `accepted` event committed to.
    RecordModified,
    /// A PostgreSQL journal's stored chain head (`chain_heads`, `session_heads`) does not name
    /// the last entry of its chain.
    HeadMismatch,
}

/// The two hash-chained journals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Chain {
    Activity,
    Sessions,
    /// A PostgreSQL journal's sealed checkpoints (a chain of their own).
    Checkpoints,
}

impl std::fmt::Display for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Chain::Activity => "activity",
            Chain::Sessions => "sessions",
            Chain::Checkpoints => "checkpoints",
        })
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Finding {
    pub damage: Damage,
    /// Which chain: the activity journal (execution events) or the sessions journal.
    pub chain: Chain,
    /// The first affected entry (event seq), when there is one.
    pub seq: Option<i64>,
    pub execution_id: Option<String>,
    pub detail: String,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub journal: String,
    pub anchor: String,
    pub events: usize,
    pub session_events: usize,
    pub executions: usize,
    pub head_seq: i64,
    pub anchored_seq: Option<i64>,
    /// Events after the anchor: appended by a process that stopped before it updated the
    /// anchor. Not damage, but not covered by the anchor either.
    pub unanchored: i64,
    /// A PostgreSQL journal: what its sealed checkpoints cover (in place of the anchor).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sealing: Option<Sealing>,
    pub findings: Vec<Finding>,
}

/// What the sealed checkpoints of a PostgreSQL journal cover. Entries appended since the newest
/// checkpoint are not yet sealed: that is not damage, but nothing outside the chains vouches for
/// them yet.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Sealing {
    /// Checkpoints found.
    pub checkpoints: usize,
    /// The newest checkpoint's number.
    pub newest: Option<i64>,
    /// Whether the checkpoints' MACs were checked (a seal key was given).
    pub macs_checked: bool,
    /// Events after their execution's sealed head (or of an execution no checkpoint names).
    pub unsealed_events: i64,
    /// Executions with such events.
    pub unsealed_executions: usize,
    /// Session entries likewise.
    pub unsealed_session_entries: i64,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.findings.is_empty()
    }
}

struct Row {
    chain: Chain,
    seq: i64,
    execution_id: String,
    at: String,
    kind: String,
    state: String,
    evidence: String,
    client: String,
    prev_hash: String,
    hash: String,
}

impl Row {
    fn hash_at(&self, seq: i64) -> String {
        let f = ChainFields {
            prev_hash: &self.prev_hash,
            seq,
            execution_id: &self.execution_id,
            at: &self.at,
            kind: &self.kind,
            state: &self.state,
            evidence: &self.evidence,
            client: &self.client,
        };
        match self.chain {
            Chain::Sessions => session_chain_hash(&f),
            Chain::Activity | Chain::Checkpoints => chain_hash(&f),
        }
    }
    /// The position this entry's content was hashed for, looking a few places either way.
    fn home(&self) -> Option<i64> {
        (-16..=16)
            .map(|d| self.seq + d)
            .find(|s| self.hash_at(*s) == self.hash)
    }
}

/// Verify the PostgreSQL journal at `url` in one read-only transaction: every execution's and
/// every session's chain, their stored heads, the records, and the sealed checkpoints (their
/// MACs too when `seal_key` names the replicas' seal key). Nothing is written.
pub fn verify_postgres(url: &str, seal_key: Option<&Path>) -> Result<Report, AuditError> {
    postgres::verify(url, seal_key)
}

/// Verify the journal at `journal` against `anchor`, reading the file only (a `postgres://`
/// URL: [`verify_postgres`] without a seal key).
pub fn verify(journal: &Path, anchor: &Anchor) -> Result<Report, AuditError> {
    if let Some(url) = journal
        .to_str()
        .filter(|j| crate::journal::is_postgres_url(j))
    {
        return verify_postgres(url, None);
    }
    crate::journal::refuse_url(journal)?;
    if !journal.exists() {
        return Err(AuditError::NoJournal(journal.to_owned()));
    }
    let conn = Connection::open_with_flags(
        journal,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| AuditError::Open {
        path: journal.to_owned(),
        source,
    })?;
    let q = |source: rusqlite::Error| AuditError::Read {
        path: journal.to_owned(),
        source,
    };
    let rows = load_rows(
        &conn,
        "SELECT seq, execution_id, at, kind, COALESCE(state, ''), evidence, client, prev_hash, hash
         FROM events ORDER BY seq",
        Chain::Activity,
    )
    .map_err(q)?;
    let session_rows = load_rows(
        &conn,
        "SELECT seq, session_id, at, kind, '', evidence, '', prev_hash, hash
         FROM session_events ORDER BY seq",
        Chain::Sessions,
    )
    .map_err(q)?;

    let mut findings = Vec::new();
    findings.extend(check_chain(&rows));
    findings.extend(check_chain(&session_rows));
    let executions = check_records(&conn, &rows, &mut findings).map_err(q)?;
    check_sessions(&conn, &session_rows, &mut findings).map_err(q)?;

    let head_seq = rows.last().map(|r| r.seq).unwrap_or(0);
    let (anchored_seq, unanchored) = check_anchor(anchor, &rows, &session_rows, &mut findings);
    Ok(Report {
        journal: journal.display().to_string(),
        anchor: anchor.path.display().to_string(),
        events: rows.len(),
        session_events: session_rows.len(),
        executions,
        head_seq,
        anchored_seq,
        unanchored,
        sealing: None,
        findings,
    })
}

/// Both chains' heads against the anchor (its MAC first, when there is a key): the anchored
/// seq, and how many events follow it.
fn check_anchor(
    anchor: &Anchor,
    rows: &[Row],
    session_rows: &[Row],
    findings: &mut Vec<Finding>,
) -> (Option<i64>, i64) {
    let mut anchored_seq = None;
    let mut unanchored = 0;
    let finding = |damage, detail: String| Finding {
        damage,
        chain: Chain::Activity,
        seq: None,
        execution_id: None,
        detail,
    };
    match anchor.read() {
        Err(e) => findings.push(finding(Damage::AnchorReplaced, e.to_string())),
        Ok(None) if rows.is_empty() && session_rows.is_empty() => {}
        Ok(None) => findings.push(finding(
            Damage::AnchorMissing,
            format!(
                "no anchor at {}: a cut-off tail or a rewritten chain cannot be ruled out",
                anchor.path.display()
            ),
        )),
        Ok(Some(a)) => {
            // Fail closed: without its key the anchor proves nothing, and says so.
            let mac_ok = match anchor.key(false) {
                Ok(Some(k)) => a.mac == Anchor::mac(&k, &a),
                Ok(None) => {
                    findings.push(finding(
                        Damage::AnchorKeyMissing,
                        format!(
                            "no anchor key at {}: the anchor's MAC cannot be checked, so a \
                             rewritten anchor (and chain) cannot be ruled out",
                            anchor.key_path.display()
                        ),
                    ));
                    true
                }
                Err(e) => {
                    findings.push(finding(
                        Damage::AnchorKeyMissing,
                        format!("{e}: the anchor's MAC cannot be checked"),
                    ));
                    true
                }
            };
            if !mac_ok {
                findings.push(finding(
                    Damage::AnchorReplaced,
                    format!(
                        "the anchor's MAC does not verify under {}: the anchor was not written by cairn",
                        anchor.key_path.display()
                    ),
                ));
            } else {
                anchored_seq = Some(a.seq);
                unanchored = check_head(Chain::Activity, rows, a.seq, &a.hash, findings);
                check_head(
                    Chain::Sessions,
                    session_rows,
                    a.sessions_seq,
                    &a.sessions_hash,
                    findings,
                );
            }
        }
    }
    (anchored_seq, unanchored)
}

fn load_rows(conn: &Connection, sql: &str, chain: Chain) -> rusqlite::Result<Vec<Row>> {
    let mut st = conn.prepare(sql)?;
    let rows = st
        .query_map([], |r| {
            Ok(Row {
                chain,
                seq: r.get(0)?,
                execution_id: r.get(1)?,
                at: r.get(2)?,
                kind: r.get(3)?,
                state: r.get(4)?,
                evidence: r.get(5)?,
                client: r.get(6)?,
                prev_hash: r.get(7)?,
                hash: r.get(8)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Compare a chain's head with its anchored `(seq, hash)`; returns how many entries follow the
/// anchor (appended by a process that stopped before it updated the anchor).
fn check_head(
    chain: Chain,
    rows: &[Row],
    seq: i64,
    hash: &str,
    findings: &mut Vec<Finding>,
) -> i64 {
    let head = rows.last().map(|r| r.seq).unwrap_or(0);
    let mut push = |damage, seq, detail| {
        findings.push(Finding {
            damage,
            chain,
            seq: Some(seq),
            execution_id: None,
            detail,
        })
    };
    if seq == 0 {
        return head;
    }
    if seq > head {
        push(
            Damage::Truncated,
            head + 1,
            format!(
                "the anchor names {chain} entry {seq} but the chain ends at {head}: entries {}..={seq} were cut off",
                head + 1
            ),
        );
        return 0;
    }
    match rows.iter().find(|r| r.seq == seq) {
        Some(r) if r.hash == hash => {}
        Some(r) => push(
            Damage::AnchorReplaced,
            seq,
            format!(
                "{chain} entry {seq} has hash {} but the anchor recorded {hash}: the chain was rewritten or the anchor replaced",
                r.hash
            ),
        ),
        None => push(Damage::Deleted, seq, format!("the anchored {chain} entry {seq} is missing")),
    }
    head - seq
}

/// Each session record must match what its `started` entry committed to.
fn check_sessions(
    conn: &Connection,
    rows: &[Row],
    findings: &mut Vec<Finding>,
) -> rusqlite::Result<()> {
    let mut st = conn.prepare(
        "SELECT id, kind, actor, pid, client, started_at, detail FROM sessions ORDER BY id",
    )?;
    let recs = st
        .query_map([], crate::journal::SessionRecord::from_row)?
        .collect::<Result<Vec<_>, _>>()?;
    for rec in recs {
        let started = rows
            .iter()
            .find(|r| r.execution_id == rec.id && r.kind == "started");
        check_session_record(&rec, started, findings);
    }
    Ok(())
}

/// One session record against its `started` entry.
fn check_session_record(
    rec: &crate::journal::SessionRecord,
    started: Option<&Row>,
    findings: &mut Vec<Finding>,
) {
    let want = crate::journal::session_started_evidence(rec);
    if started.map(|r| r.evidence.as_str()) != Some(want.as_str()) {
        findings.push(Finding {
            damage: Damage::RecordModified,
            chain: Chain::Sessions,
            seq: started.map(|r| r.seq),
            execution_id: Some(rec.id.clone()),
            detail: format!(
                "session {}: the record differs from what its started entry committed to",
                rec.id
            ),
        });
    }
}

/// The first break in the chain, classified.
// Long: one walk down the chain; its arms tell modified, reordered, inserted and deleted
// entries apart in the order that distinguishes them, and read best side by side.
fn check_chain(rows: &[Row]) -> Option<Finding> {
    let mut prev: Option<&Row> = None;
    for (i, r) in rows.iter().enumerate() {
        let expected_seq = prev.map(|p| p.seq + 1).unwrap_or(1);
        let expected_prev = prev.map(|p| p.hash.as_str()).unwrap_or("");
        let finding = |damage, seq, detail: String| Finding {
            damage,
            chain: r.chain,
            seq: Some(seq),
            execution_id: Some(r.execution_id.clone()),
            detail,
        };
        if r.hash_at(r.seq) != r.hash {
            return Some(match r.home() {
                None => finding(
                    Damage::Modified,
                    r.seq,
                    format!(
                        "entry {} ({}) no longer matches its hash: a field was changed",
                        r.seq, r.kind
                    ),
                ),
                Some(h) if h < r.seq => finding(
                    Damage::Inserted,
                    expected_seq.min(r.seq - 1),
                    format!(
                        "entry {} was appended as entry {h}: {} entr{} inserted before it",
                        r.seq,
                        r.seq - h,
                        if r.seq - h == 1 { "y was" } else { "ies were" }
                    ),
                ),
                Some(h) => {
                    let swapped = rows[i + 1..].iter().any(|o| o.home() == Some(r.seq));
                    if swapped {
                        finding(
                            Damage::Reordered,
                            r.seq,
                            format!("entry {} holds what was appended as entry {h}: entries were reordered", r.seq),
                        )
                    } else {
                        finding(
                            Damage::Deleted,
                            r.seq,
                            format!(
                                "entry {} was appended as entry {h}: {} entr{} deleted before it and the rest renumbered",
                                r.seq,
                                h - r.seq,
                                if h - r.seq == 1 { "y was" } else { "ies were" }
                            ),
                        )
                    }
                }
            });
        }
        if r.seq != expected_seq {
            return Some(finding(
                Damage::Deleted,
                expected_seq,
                format!("entries {expected_seq}..={} are missing", r.seq - 1),
            ));
        }
        if r.prev_hash != expected_prev {
            let elsewhere = rows.iter().any(|o| o.hash == r.prev_hash);
            return Some(if elsewhere {
                finding(
                    Damage::Reordered,
                    r.seq,
                    format!("entry {} follows an entry that is elsewhere in the journal: entries were reordered", r.seq),
                )
            } else {
                finding(
                    Damage::Inserted,
                    prev.map(|p| p.seq).unwrap_or(r.seq),
                    format!(
                        "entry {} does not follow from entry {}: entry {} is not the one cairn appended",
                        r.seq,
                        expected_seq - 1,
                        expected_seq - 1
                    ),
                )
            });
        }
        prev = Some(r);
    }
    None
}

/// Each execution record must match what its `accepted` event committed to.
fn check_records(
    conn: &Connection,
    rows: &[Row],
    findings: &mut Vec<Finding>,
) -> rusqlite::Result<usize> {
    let mut st = conn.prepare(
        "SELECT id, destination, host, port, user, command, command_digest, remote_dir, timeout_secs, created_at, client
         FROM executions ORDER BY id",
    )?;
    let recs = st
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                serde_json::json!({
                    "destination": r.get::<_, String>(1)?,
                    "host": r.get::<_, String>(2)?,
                    "port": r.get::<_, i64>(3)?,
                    "user": r.get::<_, String>(4)?,
                    "command_digest": r.get::<_, String>(6)?,
                    "remote_dir": r.get::<_, String>(7)?,
                    "timeout_secs": r.get::<_, i64>(8)?,
                    "created_at": r.get::<_, String>(9)?,
                    "client": r.get::<_, String>(10)?,
                }),
                r.get::<_, Vec<u8>>(5)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (id, fields, command) in &recs {
        let accepted = rows
            .iter()
            .find(|r| r.execution_id == *id && r.kind == "accepted");
        check_record(id, fields, command, accepted, findings);
    }
    Ok(recs.len())
}

/// One execution record (`fields`: what the `accepted` event commits to) against its
/// `accepted` entry.
fn check_record(
    id: &str,
    fields: &serde_json::Value,
    command: &[u8],
    accepted: Option<&Row>,
    findings: &mut Vec<Finding>,
) {
    let mk = |detail: String| Finding {
        damage: Damage::RecordModified,
        chain: Chain::Activity,
        seq: accepted.map(|r| r.seq),
        execution_id: Some(id.to_owned()),
        detail,
    };
    let digest = hex::encode(Sha256::digest(command));
    if fields["command_digest"] != digest.as_str() {
        findings.push(mk(format!(
            "execution {id}: the stored command does not match its digest"
        )));
        return;
    }
    let accepted =
        accepted.and_then(|r| serde_json::from_str::<serde_json::Value>(&r.evidence).ok());
    let Some(acc) = accepted else {
        findings.push(mk(format!("execution {id} has no accepted event")));
        return;
    };
    if let Some(obj) = fields.as_object() {
        for (k, v) in obj {
            if acc.get(k) != Some(v) {
                findings.push(mk(format!(
                    "execution {id}: field {k} is {v} but the accepted event committed to {}",
                    acc.get(k).cloned().unwrap_or_default()
                )));
                break;
            }
        }
    }
    if acc.get("command_len").and_then(|v| v.as_u64()) != Some(command.len() as u64) {
        findings.push(mk(format!("execution {id}: the command length changed")));
    }
}
