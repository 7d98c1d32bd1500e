//! Session chains, written once for both stores: a session (a CLI process, a `serve` or `mcp`
//! run) is recorded with a chain of entries (`started`, `request`, `ended` …), each hashed with
//! [`session_chain_hash`] over the one before, so that `cairn audit verify` detects an edit.
//!
//! The procedure is here ([`write_in`]): take the chain head's next seq and hash, compute the
//! entry's hash, insert the entry and move the head; a start inserts the session's row (and its
//! head) and its `started` entry in the same transaction. What differs between the stores is
//! their SQL, behind [`SessionBook`] (`sqlite.rs`, `postgres/sessions.rs`), and where the head
//! is: the SQLite file keeps one chain for all its sessions (the head is its last entry, and
//! moves the file's anchor after the commit); PostgreSQL keeps one chain per session (`session_heads`, seqs from one sequence), so that
//! replicas never contend on one head.

use super::{
    now_rfc3339, session_chain_hash, session_started_evidence, ChainFields, Result, SessionRecord,
};

/// One write to the session chains.
pub(super) enum SessionWrite<'a> {
    /// A new session: its row (and head) and its `started` entry.
    Start(&'a SessionRecord),
    /// One entry (`ended`, `request` …) on an existing session's chain, stamped now.
    Entry {
        session: &'a str,
        kind: &'a str,
        evidence: &'a serde_json::Value,
    },
}

/// One entry of a session chain, as inserted.
pub(super) struct SessionEntry<'a> {
    pub(super) seq: i64,
    pub(super) session: &'a str,
    pub(super) at: &'a str,
    pub(super) kind: &'a str,
    pub(super) evidence: &'a str,
    pub(super) prev_hash: &'a str,
    pub(super) hash: &'a str,
}

/// The session chains' reads and writes inside one transaction of a store: what differs between
/// SQLite and PostgreSQL. The procedure itself is [`write_in`], written once.
pub(super) trait SessionBook {
    /// Insert the session's row (and, where the store keeps one per session, its head).
    async fn insert_session(&mut self, s: &SessionRecord) -> Result<()>;
    /// Take the seq of the next entry on `session`'s chain, and the hash it follows (`""` for
    /// the first). An unknown session is an error here or at [`Self::insert`].
    async fn next(&mut self, session: &str) -> Result<(i64, String)>;
    /// Insert `entry` and move the chain's head to it.
    async fn insert(&mut self, entry: &SessionEntry<'_>) -> Result<()>;
}

/// `w` inside the caller's transaction (both stores); returns the seq and hash of the entry
/// appended.
pub(super) async fn write_in(
    book: &mut impl SessionBook,
    w: SessionWrite<'_>,
) -> Result<(i64, String)> {
    match w {
        SessionWrite::Start(s) => {
            book.insert_session(s).await?;
            let evidence = session_started_evidence(s);
            append_in(book, &s.id, &s.started_at, "started", &evidence).await
        }
        SessionWrite::Entry {
            session,
            kind,
            evidence,
        } => append_in(book, session, &now_rfc3339(), kind, &evidence.to_string()).await,
    }
}

/// Append one chained entry to `session`'s chain.
async fn append_in(
    book: &mut impl SessionBook,
    session: &str,
    at: &str,
    kind: &str,
    evidence: &str,
) -> Result<(i64, String)> {
    let (seq, prev_hash) = book.next(session).await?;
    let hash = session_chain_hash(&ChainFields {
        prev_hash: &prev_hash,
        seq,
        execution_id: session,
        at,
        kind,
        state: "",
        evidence,
        client: "",
    });
    let entry = SessionEntry {
        seq,
        session,
        at,
        kind,
        evidence,
        prev_hash: &prev_hash,
        hash: &hash,
    };
    book.insert(&entry).await?;
    Ok((seq, hash))
}

#[cfg(test)]
mod tests {
    use crate::journal::tests::backends;
    use crate::journal::{now_rfc3339, Journal, SessionRecord};

    fn session(id: &str, kind: &str) -> SessionRecord {
        SessionRecord {
            id: id.into(),
            kind: kind.into(),
            actor: "agent:a".into(),
            pid: 42,
            client: "42@here".into(),
            started_at: now_rfc3339(),
            detail: serde_json::json!({ "argv": ["cairn", kind] }),
        }
    }

    /// On both stores, one procedure ([`super::write_in`]): two sessions started and written
    /// interleaved, an entry to an unknown session refused, and every chain verifies (each
    /// entry's hash over the one before, each record as its `started` entry committed to); the
    /// SQLite file's anchor names its last session entry.
    #[test]
    fn both_backends_chain_sessions_as_audit_verify_expects() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends("session_chains_both", dir.path()) {
            let mut j = Journal::open(&path).unwrap();
            let (a, b) = (session("se_a", "cli"), session("se_b", "serve"));
            j.start_session(&a).unwrap();
            j.start_session(&b).unwrap();
            assert!(j.start_session(&a).is_err(), "{backend}: started twice");
            for n in 0..3 {
                for s in [&a, &b] {
                    let ev = serde_json::json!({ "n": n });
                    j.session_event(&s.id, "request", ev).unwrap();
                }
            }
            j.session_event("se_a", "ended", serde_json::json!({}))
                .unwrap();
            assert!(
                j.session_event("se_none", "ended", serde_json::json!({}))
                    .is_err(),
                "{backend}: an unknown session"
            );
            let views = j.sessions().unwrap();
            let ended: Vec<(&str, bool)> = views
                .iter()
                .map(|v| (v.record.id.as_str(), v.ended_at.is_some()))
                .collect();
            assert!(ended.contains(&("se_a", true)), "{backend}: {ended:?}");
            assert!(ended.contains(&("se_b", false)), "{backend}: {ended:?}");
            let report = match backend {
                "sqlite" => {
                    let anchor = crate::audit::Anchor::for_journal(&path);
                    let anchored = anchor.read().unwrap().unwrap();
                    assert_eq!(anchored.sessions_seq, 9, "the anchor names the last entry");
                    crate::audit::verify(&path, &anchor).unwrap()
                }
                _ => crate::audit::verify_postgres(path.to_str().unwrap(), None).unwrap(),
            };
            assert!(
                report.findings.is_empty(),
                "{backend}: {:?}",
                report.findings
            );
            assert_eq!(report.session_events, 2 + 6 + 1, "{backend}");
        }
    }
}
