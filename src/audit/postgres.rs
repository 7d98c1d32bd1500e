//! `cairn audit verify` on a PostgreSQL journal.
//!
//! There, `seq` is one sequence over all events, increasing but not gapless (a rolled-back
//! append uses a number), and each execution's events form a chain of their own: the first
//! follows `""`, each next one the hash of the one before it, and the execution's row in
//! `chain_heads` names the last. Sessions likewise, with `session_heads`. So a gap in the
//! numbers is not damage; a broken link is. Each chain is checked on its own and its first
//! break named with its execution (or session) and event:
//!
//! - `modified`: an entry no longer matches its hash;
//! - `deleted`: an entry follows one that is not in the journal (deleted, or replaced by one
//!   cairn did not append), or was renumbered down over a deleted one;
//! - `inserted`: entries sit between two that cairn chained directly (even with valid forged
//!   hashes), or follow the stored head, or name an execution the journal does not have;
//! - `reordered`: entries hold what was appended at each other's places;
//! - `truncated`: the stored head names an entry the chain no longer has;
//! - `head-mismatch`: the stored head does not name the chain's last entry;
//! - `record-modified`: an execution or session record differs from what its first entry
//!   committed to.
//!
//! A head stored in the same database can be rewritten together with its chain; the sealed
//! checkpoints (see `journal/postgres/checkpoint.rs`) are what a rewrite cannot forge without the
//! seal key.

mod read;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::{
    check_record, check_session_record, AuditError, Chain, Damage, Finding, Report, Row, Sealing,
};
use crate::journal::postgres_checkpoint as ck;
use read::{snapshot, ChainRow, CheckpointRow, Head};

impl Row {
    fn from_chain(chain: Chain, r: ChainRow) -> Row {
        Row {
            chain,
            seq: r.seq,
            execution_id: r.id,
            at: r.at,
            kind: r.kind,
            state: r.state,
            evidence: r.evidence,
            client: r.client,
            prev_hash: r.prev_hash,
            hash: r.hash,
        }
    }

    /// The number this entry's content was hashed for, among `seqs` (its chain's numbers) and a
    /// few places either way of its own.
    fn home_among(&self, seqs: &[i64]) -> Option<i64> {
        seqs.iter()
            .copied()
            .chain((-16..=16).map(|d| self.seq + d))
            .find(|s| *s != self.seq && self.hash_at(*s) == self.hash)
    }
}

/// Words for messages: what a chain belongs to and what its entries are called.
fn nouns(chain: Chain) -> (&'static str, &'static str) {
    match chain {
        Chain::Activity => ("execution", "event"),
        Chain::Sessions => ("session", "entry"),
        Chain::Checkpoints => ("checkpoint chain", "checkpoint"),
    }
}

/// The rows of each chain, in seq order, chains in order of their first entry.
fn chains(rows: &[Row]) -> Vec<(&str, Vec<&Row>)> {
    let mut order: Vec<(&str, Vec<&Row>)> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for r in rows {
        let i = *at.entry(r.execution_id.as_str()).or_insert_with(|| {
            order.push((r.execution_id.as_str(), Vec::new()));
            order.len() - 1
        });
        order[i].1.push(r);
    }
    order
}

// Long: the checks of one snapshot in order (chains, records, sessions, heads, checkpoints),
// all adding to one list of findings.
pub(super) fn verify(url: &str, seal_key: Option<&Path>) -> Result<Report, AuditError> {
    let key = seal_key
        .map(ck::read_key)
        .transpose()
        .map_err(AuditError::SealKey)?;
    let snap = snapshot(url)?;
    let rows: Vec<Row> = snap
        .events
        .into_iter()
        .map(|r| Row::from_chain(Chain::Activity, r))
        .collect();
    let session_rows: Vec<Row> = snap
        .session_events
        .into_iter()
        .map(|r| Row::from_chain(Chain::Sessions, r))
        .collect();
    let mut findings = Vec::new();

    let records: HashSet<&str> = snap.executions.iter().map(|r| r.id.as_str()).collect();
    let by_execution = chains(&rows);
    check_chains(
        Chain::Activity,
        &by_execution,
        &records,
        &snap.heads,
        &mut findings,
    );
    let accepted: HashMap<&str, &Row> = by_execution
        .iter()
        .filter_map(|(id, c)| c.iter().find(|r| r.kind == "accepted").map(|r| (*id, *r)))
        .collect();
    for rec in &snap.executions {
        let acc = accepted.get(rec.id.as_str()).copied();
        check_record(&rec.id, &rec.fields, &rec.command, acc, &mut findings);
    }

    let sessions: HashSet<&str> = snap.sessions.iter().map(|s| s.id.as_str()).collect();
    let by_session = chains(&session_rows);
    check_chains(
        Chain::Sessions,
        &by_session,
        &sessions,
        &snap.session_heads,
        &mut findings,
    );
    let started: HashMap<&str, &Row> = by_session
        .iter()
        .filter_map(|(id, c)| c.iter().find(|r| r.kind == "started").map(|r| (*id, *r)))
        .collect();
    for rec in &snap.sessions {
        check_session_record(rec, started.get(rec.id.as_str()).copied(), &mut findings);
    }

    let (sealed_executions, sealed_sessions) =
        check_checkpoints(&snap.checkpoints, key.as_deref(), &mut findings);
    let (unsealed_events, unsealed_executions) = check_sealed(
        Chain::Activity,
        &by_execution,
        &sealed_executions,
        &mut findings,
    );
    let (unsealed_session_entries, _) = check_sealed(
        Chain::Sessions,
        &by_session,
        &sealed_sessions,
        &mut findings,
    );
    let sealing = Sealing {
        checkpoints: snap.checkpoints.len(),
        newest: snap.checkpoints.last().map(|c| c.n),
        macs_checked: key.is_some(),
        unsealed_events,
        unsealed_executions,
        unsealed_session_entries,
    };
    Ok(Report {
        journal: snap.location,
        anchor: "sealed checkpoints in the database".into(),
        events: rows.len(),
        session_events: session_rows.len(),
        executions: snap.executions.len(),
        head_seq: rows.last().map(|r| r.seq).unwrap_or(0),
        anchored_seq: None,
        unanchored: 0,
        sealing: Some(sealing),
        findings,
    })
}

/// Every chain of one kind: its links, its owner's record, its stored head; then the stored
/// heads whose chains have no entry left.
fn check_chains(
    chain: Chain,
    by_owner: &[(&str, Vec<&Row>)],
    owners: &HashSet<&str>,
    heads: &[Head],
    findings: &mut Vec<Finding>,
) {
    let (owner, entry) = nouns(chain);
    let heads: HashMap<&str, &Head> = heads.iter().map(|h| (h.id.as_str(), h)).collect();
    for (id, rows) in by_owner {
        if !owners.contains(id) {
            let seqs: Vec<String> = rows.iter().map(|r| r.seq.to_string()).collect();
            findings.push(Finding {
                damage: Damage::Inserted,
                chain,
                seq: Some(rows[0].seq),
                execution_id: Some((*id).to_owned()),
                detail: format!(
                    "{entry} {} name{} {owner} {id}, which is not in the journal: cairn never \
                     appended {}",
                    seqs.join(", "),
                    if rows.len() == 1 { "s" } else { "" },
                    if rows.len() == 1 { "it" } else { "them" }
                ),
            });
            continue;
        }
        let broken = check_links(chain, id, rows);
        let intact = broken.is_none();
        findings.extend(broken);
        // A chain already found broken is not judged by its head as well: the head names what
        // cairn appended last, which the break may have moved.
        if intact {
            findings.extend(check_head(chain, id, rows, heads.get(id).copied()));
        }
    }
    let with_rows: HashSet<&str> = by_owner.iter().map(|(id, _)| *id).collect();
    for id in owners.iter().filter(|id| !with_rows.contains(*id)) {
        findings.extend(check_head(chain, id, &[], heads.get(id).copied()));
    }
}

/// The first break in one owner's chain (`rows` in seq order), classified.
// Long: one walk down the chain; its arms tell modified, reordered, inserted and deleted
// entries apart in the order that distinguishes them, and read best side by side.
fn check_links(chain: Chain, id: &str, rows: &[&Row]) -> Option<Finding> {
    let (owner, entry) = nouns(chain);
    let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    let finding = |damage, seq, detail: String| Finding {
        damage,
        chain,
        seq: Some(seq),
        execution_id: Some(id.to_owned()),
        detail: format!("{owner} {id}: {detail}"),
    };
    for (i, r) in rows.iter().enumerate() {
        if r.hash_at(r.seq) != r.hash {
            return Some(match r.home_among(&seqs) {
                None => finding(
                    Damage::Modified,
                    r.seq,
                    format!(
                        "{entry} {} ({}) no longer matches its hash: a field was changed",
                        r.seq, r.kind
                    ),
                ),
                Some(h)
                    if rows[i + 1..]
                        .iter()
                        .any(|o| o.home_among(&seqs) == Some(r.seq)) =>
                {
                    finding(
                        Damage::Reordered,
                        r.seq,
                        format!(
                            "{entry} {} holds what was appended as {entry} {h}: its {entry}s \
                             were reordered",
                            r.seq
                        ),
                    )
                }
                // Renumbered up: what now sits at or after its old number was put there.
                Some(h) if h < r.seq => finding(
                    Damage::Inserted,
                    rows[..i]
                        .iter()
                        .find(|o| o.seq >= h)
                        .map_or(r.seq, |o| o.seq),
                    format!(
                        "{entry} {} was appended as {entry} {h}: it was renumbered to make room \
                         for an {entry} cairn did not append",
                        r.seq
                    ),
                ),
                Some(h) => finding(
                    Damage::Deleted,
                    r.seq,
                    format!(
                        "{entry} {} was appended as {entry} {h}: it was renumbered over a \
                         deleted {entry}",
                        r.seq
                    ),
                ),
            });
        }
        let expected_prev = if i == 0 {
            ""
        } else {
            rows[i - 1].hash.as_str()
        };
        if r.prev_hash == expected_prev {
            continue;
        }
        let follows = rows.iter().position(|o| o.hash == r.prev_hash);
        return Some(match follows {
            Some(j) if j + 1 < i => finding(
                Damage::Inserted,
                rows[j + 1].seq,
                format!(
                    "{entry} {} follows {entry} {} directly, but {entry}{} {} sit{} between \
                     them: cairn never appended {}",
                    r.seq,
                    rows[j].seq,
                    if i - j - 1 == 1 { "" } else { "s" },
                    rows[j + 1..i]
                        .iter()
                        .map(|o| o.seq.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    if i - j - 1 == 1 { "s" } else { "" },
                    if i - j - 1 == 1 { "it" } else { "them" },
                ),
            ),
            Some(_) => finding(
                Damage::Reordered,
                r.seq,
                format!(
                    "{entry} {} follows an {entry} that comes after it: its {entry}s were \
                     reordered",
                    r.seq
                ),
            ),
            None if r.prev_hash.is_empty() => finding(
                Damage::Inserted,
                r.seq,
                format!(
                    "{entry} {} claims to be the first of its chain, but {entry} {} comes \
                     before it: one of them was not appended by cairn",
                    r.seq, rows[0].seq
                ),
            ),
            None if i == 0 => finding(
                Damage::Deleted,
                r.seq,
                format!(
                    "{entry} {} ({}) follows an {entry} that is not in the journal: the first \
                     {entry}(s) of its chain were deleted",
                    r.seq, r.kind
                ),
            ),
            None => finding(
                Damage::Deleted,
                r.seq,
                format!(
                    "{entry} {} ({}) does not follow from {entry} {}: the {entry}(s) between \
                     them were deleted (or replaced by ones cairn did not append)",
                    r.seq,
                    r.kind,
                    rows[i - 1].seq
                ),
            ),
        });
    }
    None
}

/// The stored head against the last entry of an intact chain.
fn check_head(chain: Chain, id: &str, rows: &[&Row], head: Option<&Head>) -> Option<Finding> {
    let (owner, entry) = nouns(chain);
    let finding = |damage, seq: Option<i64>, detail: String| Finding {
        damage,
        chain,
        seq,
        execution_id: Some(id.to_owned()),
        detail: format!("{owner} {id}: {detail}"),
    };
    let last = rows.last();
    let Some(h) = head else {
        return Some(finding(
            Damage::HeadMismatch,
            last.map(|l| l.seq),
            format!("it has no stored chain head, so its newest {entry}s cannot be checked"),
        ));
    };
    let Some(l) = last else {
        return (h.seq != 0).then(|| {
            finding(
                Damage::Truncated,
                Some(h.seq),
                format!(
                    "its stored head names {entry} {}, but none of its {entry}s is left: they \
                     were deleted",
                    h.seq
                ),
            )
        });
    };
    if h.seq == l.seq && h.hash == l.hash {
        return None;
    }
    if h.seq > l.seq && !rows.iter().any(|r| r.seq == h.seq) {
        return Some(finding(
            Damage::Truncated,
            Some(h.seq),
            format!(
                "its stored head names {entry} {}, but its chain ends at {entry} {}: its \
                 newest {entry}(s) were cut off",
                h.seq, l.seq
            ),
        ));
    }
    if let Some(k) = rows.iter().position(|r| r.seq == h.seq && r.hash == h.hash) {
        let after: Vec<String> = rows[k + 1..].iter().map(|r| r.seq.to_string()).collect();
        return Some(finding(
            Damage::Inserted,
            Some(rows[k + 1].seq),
            format!(
                "{entry}(s) {} follow its stored head ({entry} {}): cairn never appended them",
                after.join(", "),
                h.seq
            ),
        ));
    }
    Some(finding(
        Damage::HeadMismatch,
        Some(h.seq),
        format!(
            "its stored head ({entry} {}, hash {}) is not its last {entry} ({entry} {}, hash {})",
            h.seq, h.hash, l.seq, l.hash
        ),
    ))
}

/// What a checkpoint sealed of one chain: its head then, and which checkpoint said so.
struct Sealed {
    seq: i64,
    hash: String,
    n: i64,
}

type SealedHeads = HashMap<String, Sealed>;

/// The checkpoints' own chain (numbers without gaps, each following the digest of the one
/// before, each matching its digest and, with the key, its MAC); the newest sealed head of each
/// execution and session, from the checkpoints that pass.
// Long: one walk down the checkpoints' own chain; each check is a few lines and they share the
// walk's state.
fn check_checkpoints(
    cps: &[CheckpointRow],
    key: Option<&[u8]>,
    findings: &mut Vec<Finding>,
) -> (SealedHeads, SealedHeads) {
    let mut executions = SealedHeads::new();
    let mut sessions = SealedHeads::new();
    let mut prev_digest = String::new();
    let mut expected = 1;
    for cp in cps {
        let finding = |damage, detail: String| Finding {
            damage,
            chain: Chain::Checkpoints,
            seq: Some(cp.n),
            execution_id: None,
            detail: format!("checkpoint {}: {detail}", cp.n),
        };
        let text = ck::sealed_text(cp.n, &cp.at, &cp.prev_digest, &cp.body);
        if ck::digest(&text) != cp.digest {
            findings.push(finding(
                Damage::Modified,
                "it no longer matches its digest: a field was changed".into(),
            ));
            continue;
        }
        if let Some(k) = key {
            if ck::mac(k, &text) != cp.mac {
                findings.push(finding(
                    Damage::AnchorReplaced,
                    format!(
                        "its MAC does not verify under the seal key: it was not written by a \
                         replica holding the key (written by {}, it says)",
                        cp.by_client
                    ),
                ));
                continue;
            }
        }
        if cp.n != expected {
            findings.push(finding(
                Damage::Deleted,
                format!(
                    "checkpoint{} {} before it {} missing",
                    if cp.n - expected == 1 { "" } else { "s" },
                    if cp.n - expected == 1 {
                        expected.to_string()
                    } else {
                        format!("{expected}..={}", cp.n - 1)
                    },
                    if cp.n - expected == 1 { "is" } else { "are" }
                ),
            ));
        } else if cp.prev_digest != prev_digest {
            findings.push(finding(
                Damage::Inserted,
                format!(
                    "it does not follow from checkpoint {}: one of them was not written by cairn",
                    cp.n - 1
                ),
            ));
        }
        match serde_json::from_str::<ck::Body>(&cp.body) {
            Ok(body) => {
                for (into, heads) in [
                    (&mut executions, body.executions),
                    (&mut sessions, body.sessions),
                ] {
                    for (id, seq, hash) in heads {
                        into.insert(id, Sealed { seq, hash, n: cp.n });
                    }
                }
            }
            Err(e) => findings.push(finding(
                Damage::Modified,
                format!("its body does not parse: {e}"),
            )),
        }
        prev_digest = cp.digest.clone();
        expected = cp.n + 1;
    }
    (executions, sessions)
}

/// Each sealed head against its chain: the sealed entry must still be there with the hash that
/// was sealed. Returns the entries after their chain's sealed head (not yet sealed, not damage)
/// and how many chains have such entries.
fn check_sealed(
    chain: Chain,
    by_owner: &[(&str, Vec<&Row>)],
    sealed: &SealedHeads,
    findings: &mut Vec<Finding>,
) -> (i64, usize) {
    let (owner, entry) = nouns(chain);
    let rows_of: HashMap<&str, &Vec<&Row>> = by_owner.iter().map(|(id, r)| (*id, r)).collect();
    let mut ids: Vec<&String> = sealed.keys().collect();
    ids.sort();
    for id in ids {
        let s = &sealed[id];
        let rows = rows_of
            .get(id.as_str())
            .map(|r| r.as_slice())
            .unwrap_or(&[]);
        let finding = |damage, detail: String| Finding {
            damage,
            chain,
            seq: Some(s.seq),
            execution_id: Some(id.clone()),
            detail: format!("{owner} {id}: {detail}"),
        };
        match rows.iter().find(|r| r.seq == s.seq) {
            Some(r) if r.hash == s.hash => {}
            Some(r) => findings.push(finding(
                Damage::AnchorReplaced,
                format!(
                    "{entry} {} has hash {}, but checkpoint {} sealed {}: its chain was \
                     rewritten after it was sealed",
                    s.seq, r.hash, s.n, s.hash
                ),
            )),
            None => {
                let last = rows.last().map(|l| l.seq);
                findings.push(match last {
                    Some(l) if l > s.seq => finding(
                        Damage::Deleted,
                        format!(
                            "checkpoint {} sealed {entry} {}, which is missing",
                            s.n, s.seq
                        ),
                    ),
                    _ => finding(
                        Damage::Truncated,
                        format!(
                            "checkpoint {} sealed {entry} {}, but its chain {}: its newest \
                             {entry}(s) were cut off",
                            s.n,
                            s.seq,
                            last.map(|l| format!("ends at {entry} {l}"))
                                .unwrap_or_else(|| "has no entry left".into())
                        ),
                    ),
                });
            }
        }
    }
    let mut entries = 0;
    let mut chains = 0;
    for (id, rows) in by_owner {
        let after = sealed.get(*id).map(|s| s.seq).unwrap_or(0);
        let n = rows.iter().filter(|r| r.seq > after).count() as i64;
        if n > 0 {
            entries += n;
            chains += 1;
        }
    }
    (entries, chains)
}
