//! Host bookkeeping (issue 16): the epoch last seen at each marker home, per place (the
//! destination as resolved, the host key, the remote dir; see [`crate::epoch`]), and which
//! destinations were already said to share a host key. Progress, not evidence: what the
//! bookkeeping learns is also appended as events (`host-epoch-changed`, `host-key-shared`) to
//! the execution whose reply taught it, so the chain holds the evidence.
//!
//! Journals made before this kept one epoch per (host key, remote dir) in `host_epochs`; that
//! table is no longer read (it joined hosts that share a key) and is left as it was.

use rusqlite::{params, OptionalExtension};

use std::collections::BTreeSet;

use super::{append_in, now_rfc3339, Event, Journal, JournalError, Result};
use crate::epoch::{self, Announced, HostPlace};
use crate::evidence::Evidence;
use crate::id::ExecutionId;

impl Journal {
    /// The epoch last seen at `place`.
    pub fn host_epoch_at(&self, place: &HostPlace) -> Result<Option<String>> {
        self.backend().host_epoch_at(place)
    }

    /// `place` announced `epoch` in a reply about execution `id`: update the bookkeeping and,
    /// in the same transaction, append to `id` a `host-epoch-changed` event when the epoch
    /// differs from the one last seen there, and a `host-key-shared` event for each other
    /// destination presenting the same key with another epoch that was not yet said
    /// (`observe_in`, one IMMEDIATE transaction here).
    pub fn observe_host_epoch(
        &mut self,
        id: &ExecutionId,
        place: &HostPlace,
        epoch: &str,
    ) -> Result<Announced> {
        self.backend().observe_host_epoch(id, place, epoch)
    }
}

/// The host bookkeeping's reads and writes inside one transaction of a backend: what differs
/// between SQLite and PostgreSQL. The procedure itself is [`observe_in`], written once.
pub(super) trait HostBook {
    /// The epoch last seen at `place`.
    async fn last_epoch(&mut self, place: &HostPlace) -> Result<Option<String>>;
    /// The other destinations seen with `place`'s host key and remote dir, and their epochs,
    /// by destination.
    async fn same_key(&mut self, place: &HostPlace) -> Result<Vec<(String, String)>>;
    /// The destinations already said to share `place`'s host key.
    async fn said(&mut self, place: &HostPlace) -> Result<BTreeSet<String>>;
    /// Remember `epoch` as last seen at `place`.
    async fn store(&mut self, place: &HostPlace, epoch: &str, now: &str) -> Result<()>;
    /// Remember that destinations `x < y` were said to share `place`'s key.
    async fn mark_shared(&mut self, place: &HostPlace, x: &str, y: &str, now: &str) -> Result<()>;
    /// Append `ev` (a note) to `id`'s chain in this transaction.
    async fn note(&mut self, id: &ExecutionId, ev: &Evidence<'_>) -> Result<Event>;
}

/// The host bookkeeping of one reply, inside the caller's transaction (both backends): read
/// what was seen, let [`epoch::announce`] decide, store it and append the evidence. Returns
/// the decision and the last event appended.
pub(super) async fn observe_in(
    book: &mut impl HostBook,
    id: &ExecutionId,
    place: &HostPlace,
    epoch: &str,
) -> Result<(Announced, Option<Event>)> {
    let last = book.last_epoch(place).await?;
    let same_key = book.same_key(place).await?;
    let said = book.said(place).await?;
    let a = epoch::announce(place, epoch, last.as_deref(), &same_key, &said);
    let now = now_rfc3339();
    if a.store {
        book.store(place, epoch, &now).await?;
    }
    let mut last_ev = None;
    if let Some(old) = &a.changed_from {
        let ev = host_epoch_changed_evidence(place, old, epoch, &now);
        last_ev = Some(book.note(id, &ev).await?);
    }
    for (other, other_epoch) in &a.shared_with {
        let (x, y) = epoch::pair(other, &place.destination);
        book.mark_shared(place, &x, &y, &now).await?;
        let ev = host_key_shared_evidence(place, epoch, other, other_epoch, &now);
        last_ev = Some(book.note(id, &ev).await?);
    }
    Ok((a, last_ev))
}

/// The SQLite file's book: one IMMEDIATE transaction.
struct SqliteBook<'a> {
    tx: &'a rusqlite::Transaction<'a>,
    path: &'a std::path::Path,
}

impl SqliteBook<'_> {
    fn sq(&self, source: rusqlite::Error) -> JournalError {
        JournalError::Sqlite {
            path: self.path.to_owned(),
            source,
        }
    }
}

impl HostBook for SqliteBook<'_> {
    async fn last_epoch(&mut self, place: &HostPlace) -> Result<Option<String>> {
        self.tx
            .query_row(
                "SELECT epoch FROM host_places
                 WHERE destination = ?1 AND host_key = ?2 AND remote_dir = ?3",
                params![place.destination, place.host_key, place.remote_dir],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.sq(e))
    }

    async fn same_key(&mut self, place: &HostPlace) -> Result<Vec<(String, String)>> {
        let r = (|| {
            let mut st = self.tx.prepare_cached(
                "SELECT destination, epoch FROM host_places
                 WHERE host_key = ?1 AND remote_dir = ?2 AND destination != ?3
                 ORDER BY destination",
            )?;
            let it = st.query_map(
                params![place.host_key, place.remote_dir, place.destination],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            it.collect::<rusqlite::Result<_>>()
        })();
        r.map_err(|e| self.sq(e))
    }

    async fn said(&mut self, place: &HostPlace) -> Result<BTreeSet<String>> {
        let r = (|| {
            let mut st = self.tx.prepare_cached(
                "SELECT CASE WHEN destination_a = ?3 THEN destination_b ELSE destination_a END
                 FROM host_key_shared
                 WHERE host_key = ?1 AND remote_dir = ?2
                   AND (destination_a = ?3 OR destination_b = ?3)",
            )?;
            let it = st.query_map(
                params![place.host_key, place.remote_dir, place.destination],
                |r| r.get(0),
            )?;
            it.collect::<rusqlite::Result<_>>()
        })();
        r.map_err(|e| self.sq(e))
    }

    async fn store(&mut self, place: &HostPlace, epoch: &str, now: &str) -> Result<()> {
        self.tx
            .execute(
                "INSERT INTO host_places (destination, host_key, remote_dir, epoch, seen_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(destination, host_key, remote_dir) DO UPDATE SET epoch = ?4, seen_at = ?5",
                params![place.destination, place.host_key, place.remote_dir, epoch, now],
            )
            .map(|_| ())
            .map_err(|e| self.sq(e))
    }

    async fn mark_shared(&mut self, place: &HostPlace, x: &str, y: &str, now: &str) -> Result<()> {
        self.tx
            .execute(
                "INSERT OR IGNORE INTO host_key_shared
                    (host_key, remote_dir, destination_a, destination_b, said_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![place.host_key, place.remote_dir, x, y, now],
            )
            .map(|_| ())
            .map_err(|e| self.sq(e))
    }

    async fn note(&mut self, id: &ExecutionId, ev: &Evidence<'_>) -> Result<Event> {
        append_in(
            self.tx,
            id.as_str(),
            ev.kind().as_str(),
            None,
            &ev.to_value(),
        )
        .map_err(|e| self.sq(e))
    }
}

/// The evidence of a `host-epoch-changed` event (both backends write the same).
pub(super) fn host_epoch_changed_evidence<'a>(
    place: &'a HostPlace,
    old: &'a str,
    epoch: &'a str,
    now: &'a str,
) -> Evidence<'a> {
    Evidence::HostEpochChanged {
        destination: &place.destination,
        host_key: &place.host_key,
        remote_dir: &place.remote_dir,
        old,
        new: epoch,
        at: now,
        meaning: (),
    }
}

/// The evidence of a `host-key-shared` event.
pub(super) fn host_key_shared_evidence<'a>(
    place: &'a HostPlace,
    epoch: &'a str,
    other: &'a str,
    other_epoch: &'a str,
    now: &'a str,
) -> Evidence<'a> {
    Evidence::HostKeyShared {
        host_key: &place.host_key,
        remote_dir: &place.remote_dir,
        destination: &place.destination,
        epoch,
        other_destination: other,
        other_epoch,
        at: now,
        meaning: (),
    }
}

/// The SQLite side of these methods ([`super::backend::Backend`] for [`super::sqlite::Sqlite`]).
impl super::sqlite::Sqlite {
    /// Add the host bookkeeping tables to a journal made before them.
    pub(super) fn add_host_schema(&self, c: &rusqlite::Connection) -> Result<()> {
        self.add_tables(
            c,
            "host_key_shared",
            "BEGIN IMMEDIATE;
                 -- The epoch each marker home had when last seen, per place.
                 CREATE TABLE IF NOT EXISTS host_places (
                    destination TEXT NOT NULL,
                    host_key TEXT NOT NULL,
                    remote_dir TEXT NOT NULL,
                    epoch TEXT NOT NULL,
                    seen_at TEXT NOT NULL,
                    PRIMARY KEY (destination, host_key, remote_dir)
                 );
                 CREATE INDEX IF NOT EXISTS host_places_by_key ON host_places(host_key, remote_dir);
                 -- Pairs of destinations (a < b) already said to present one host key.
                 CREATE TABLE IF NOT EXISTS host_key_shared (
                    host_key TEXT NOT NULL,
                    remote_dir TEXT NOT NULL,
                    destination_a TEXT NOT NULL,
                    destination_b TEXT NOT NULL,
                    said_at TEXT NOT NULL,
                    PRIMARY KEY (host_key, remote_dir, destination_a, destination_b)
                 );
                 COMMIT;",
        )
    }

    pub(super) fn host_epoch_at(&self, place: &HostPlace) -> Result<Option<String>> {
        self.conn()?
            .query_row(
                "SELECT epoch FROM host_places
                 WHERE destination = ?1 AND host_key = ?2 AND remote_dir = ?3",
                params![place.destination, place.host_key, place.remote_dir],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    pub(super) fn observe_host_epoch(
        &self,
        id: &ExecutionId,
        place: &HostPlace,
        epoch: &str,
    ) -> Result<Announced> {
        let (a, last_ev) = self.immediate(|tx, path| {
            let mut book = SqliteBook { tx, path };
            // No await point waits: every step of the SQLite book is synchronous.
            futures::executor::block_on(observe_in(&mut book, id, place, epoch))
        })?;
        if let Some(ev) = &last_ev {
            self.anchor_to(ev);
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::rec;
    use super::*;
    use crate::event::EventKind;

    fn place(host: &str, key: &str) -> HostPlace {
        HostPlace::new("ops", host, 22, key, ".cairn")
    }

    #[test]
    fn a_journal_made_before_the_host_tables_gets_them_and_still_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.db");
        {
            let mut j = Journal::open(&old).unwrap();
            let r = rec("o1");
            j.accept(&r, crate::journal::accepted_evidence(&r)).unwrap();
        }
        // Back to the earlier layout: the key-only table, none of the new ones.
        let c = rusqlite::Connection::open(&old).unwrap();
        c.execute_batch(
            "DROP TABLE host_places; DROP TABLE host_key_shared;
             CREATE TABLE host_epochs (host_key TEXT NOT NULL, remote_dir TEXT NOT NULL,
                epoch TEXT NOT NULL, seen_at TEXT NOT NULL, PRIMARY KEY (host_key, remote_dir));
             INSERT INTO host_epochs VALUES ('SHA256:k', '.cairn', 'stale', 'then');
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
        drop(c);
        // A copy is another file to this process, so it is opened (and migrated) afresh.
        let path = dir.path().join("j.db");
        std::fs::copy(&old, &path).unwrap();
        for tail in [".anchor", ".anchor.key"] {
            let name = |p: &std::path::Path| format!("{}{tail}", p.display());
            std::fs::copy(name(&old), name(&path)).unwrap();
        }
        let mut j = Journal::open(&path).unwrap();
        let id = ExecutionId::parse("o1").unwrap();
        let p = place("10.0.0.5", "SHA256:k");
        assert!(
            j.host_epoch_at(&p).unwrap().is_none(),
            "the key-only row is not used"
        );
        j.observe_host_epoch(&id, &p, "e1").unwrap();
        assert_eq!(j.host_epoch_at(&p).unwrap().as_deref(), Some("e1"));
        assert_eq!(
            j.events(&id).unwrap().len(),
            1,
            "a first sighting is no event"
        );
        let report =
            crate::audit::verify(&path, &crate::audit::Anchor::for_journal(&path)).unwrap();
        assert!(report.findings.is_empty(), "{:?}", report.findings);
    }

    #[test]
    fn bookkeeping_is_per_place_and_each_change_is_one_event() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut j = Journal::open(&path).unwrap();
        let r = rec("h1");
        j.accept(&r, crate::journal::accepted_evidence(&r)).unwrap();
        let (a, b) = (place("10.0.0.5", "SHA256:k"), place("10.0.0.6", "SHA256:k"));
        assert!(j.host_epoch_at(&a).unwrap().is_none());
        j.observe_host_epoch(&r.id, &a, "e1").unwrap();
        assert_eq!(j.host_epoch_at(&a).unwrap().as_deref(), Some("e1"));
        // wiped once, then twice: one event per change
        for (new, old) in [("e2", "e1"), ("e2", ""), ("e3", "e2")] {
            let got = j.observe_host_epoch(&r.id, &a, new).unwrap();
            assert_eq!(got.changed_from.as_deref().unwrap_or(""), old);
        }
        // a clone with its own epoch: its own row, said once, and a's epoch untouched
        let s = j.observe_host_epoch(&r.id, &b, "eb").unwrap();
        assert_eq!(s.shared_with.len(), 1);
        assert!(j
            .observe_host_epoch(&r.id, &b, "eb")
            .unwrap()
            .shared_with
            .is_empty());
        assert!(j.observe_host_epoch(&r.id, &a, "e3").unwrap() == Announced::default());
        assert_eq!(j.host_epoch_at(&a).unwrap().as_deref(), Some("e3"));
        assert_eq!(j.host_epoch_at(&b).unwrap().as_deref(), Some("eb"));
        let kinds: Vec<EventKind> = j
            .events(&r.id)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(
            kinds,
            [
                EventKind::Accepted,
                EventKind::HostEpochChanged,
                EventKind::HostEpochChanged,
                EventKind::HostKeyShared
            ]
        );
        assert_eq!(
            kinds.iter().map(EventKind::as_str).collect::<Vec<_>>(),
            [
                "accepted",
                "host-epoch-changed",
                "host-epoch-changed",
                "host-key-shared"
            ]
        );
        let evs = j.events(&r.id).unwrap();
        assert_eq!(evs[2].evidence["old"], "e2");
        assert_eq!(evs[2].evidence["new"], "e3");
        assert_eq!(evs[2].evidence["destination"], "ops@10.0.0.5:22");
        let report =
            crate::audit::verify(&path, &crate::audit::Anchor::for_journal(&path)).unwrap();
        assert!(report.ok(), "{:?}", report.findings);
        assert_eq!(report.anchored_seq, Some(report.head_seq));
    }
}

#[cfg(test)]
mod book_tests {
    use super::*;
    use crate::journal::tests::{backends, rec};
    use rand::{Rng, SeedableRng};

    /// On both backends, one procedure ([`observe_in`]): random announcements from three
    /// destinations (two sharing a host key) decide as the in-memory book does, and append one
    /// `host-epoch-changed` per change and one `host-key-shared` per pair said.
    #[test]
    fn both_backends_keep_the_host_book_as_the_rules_do() {
        let dir = tempfile::tempdir().unwrap();
        let place = |d: &str, key: &str| HostPlace {
            destination: d.into(),
            host_key: key.into(),
            remote_dir: ".cairn".into(),
        };
        let places = [place("a", "k1"), place("b", "k1"), place("c", "k2")];
        for (backend, path) in backends("host_book_both", dir.path()) {
            let mut rng = rand::rngs::StdRng::seed_from_u64(16);
            let mut j = Journal::open(&path).unwrap();
            let r = rec(&ExecutionId::generate().to_string());
            j.accept(&r, serde_json::json!({})).unwrap();
            let mut book = epoch::HostBook::default();
            let (mut changed, mut shared) = (0, 0);
            for _ in 0..40 {
                let p = &places[rng.random_range(0..places.len())];
                let e = format!("e{}", rng.random_range(0..3));
                let want = book.announce(p, &e);
                let got = j.observe_host_epoch(&r.id, p, &e).unwrap();
                assert_eq!(got, want, "{backend} {p:?} {e}");
                changed += usize::from(want.changed_from.is_some());
                shared += want.shared_with.len();
                assert_eq!(j.host_epoch_at(p).unwrap().as_deref(), book.last_seen(p));
            }
            let evs = j.events(&r.id).unwrap();
            let count = |k: &str| evs.iter().filter(|e| e.kind.as_str() == k).count();
            assert_eq!(count("host-epoch-changed"), changed, "{backend}");
            assert_eq!(count("host-key-shared"), shared, "{backend}");
        }
    }
}
