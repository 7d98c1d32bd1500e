//! Host epochs as evidence (docs/DESIGN.md, marker protocol item 7). Pure: no I/O; the journal keeps
//! the bookkeeping and the executor feeds it what the host announced.
//!
//! A host's marker home has an epoch: a random ID created the first time cairn uses it, and
//! again whenever it was wiped (`rm -rf ~/.cairn`, a re-imaged host). Two questions use it:
//!
//! 1. **Which epoch was this execution bound to?** The one its started record was written
//!    under; before the start guard was crossed, the one the host announced on the connection
//!    that carried the dispatch ([`expected`]). Only when the host's epoch *now* differs from
//!    that one was the state the execution relied on wiped, and only then does a missing marker
//!    prove nothing ([`check`]). A host wiped long ago makes nothing uncertain for executions
//!    dispatched since.
//! 2. **What did this journal last see at that marker home?** Bookkeeping per place: the
//!    destination as resolved (account, HostName, port), the host key and the remote dir
//!    ([`HostPlace`]), never the key alone, because hosts cloned from one image share a key.
//!    An announcement that differs from the last one seen there is a change, recorded once
//!    ([`announce`]); two places with one key and different epochs are one key on two hosts
//!    (a cloned image), said once per pair.

use std::collections::{BTreeMap, BTreeSet};

/// One marker home as this journal reaches it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct HostPlace {
    /// The destination as resolved: `account@HostName:port`.
    pub destination: String,
    /// The host key fingerprint the connection verified (`SHA256:…`).
    pub host_key: String,
    /// The marker home on the host.
    pub remote_dir: String,
}

impl HostPlace {
    pub fn new(user: &str, hostname: &str, port: u16, host_key: &str, remote_dir: &str) -> Self {
        HostPlace {
            destination: resolved_destination(user, hostname, port),
            host_key: host_key.to_owned(),
            remote_dir: remote_dir.to_owned(),
        }
    }
}

/// `account@HostName:port`, the form bookkeeping and the intent record use for a destination.
pub fn resolved_destination(user: &str, hostname: &str, port: u16) -> String {
    format!("{user}@{hostname}:{port}")
}

/// Where an execution's expected epoch comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// The epoch field of its started record, written by the host before the command ran.
    StartRecord,
    /// The epoch the host announced on the connection that carried the dispatch (or, when the
    /// reply to the dispatch never arrived, the one last seen there before it was sent).
    Dispatch,
}

impl Basis {
    fn words(self) -> &'static str {
        match self {
            Basis::StartRecord => "its started record was written under epoch",
            Basis::Dispatch => "it was dispatched under epoch",
        }
    }
}

/// The epoch an execution is bound to, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub epoch: String,
    pub basis: Basis,
}

/// The epoch an execution is bound to: its started record's, else its dispatch's. `None` when
/// neither was recorded (a dispatch that was meant to run in whatever epoch the host has).
pub fn expected(start_epoch: Option<&str>, dispatch_epoch: Option<&str>) -> Option<Expected> {
    match (start_epoch, dispatch_epoch) {
        (Some(e), _) => Some(Expected {
            epoch: e.to_owned(),
            basis: Basis::StartRecord,
        }),
        (None, Some(e)) => Some(Expected {
            epoch: e.to_owned(),
            basis: Basis::Dispatch,
        }),
        (None, None) => None,
    }
}

/// A probe's epoch against the execution's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// The host announced the epoch the execution is bound to.
    Same { epoch: String },
    /// The host's marker home has another epoch: the state the execution relied on was wiped.
    Differs { expected: Expected, now: String },
    /// The execution recorded no epoch; whatever the host has counts as its own.
    NotRecorded { now: String },
}

impl Check {
    /// Whether the probe may be read as being about the execution's own marker home.
    pub fn same(&self) -> bool {
        !matches!(self, Check::Differs { .. })
    }

    /// The evidence, in words, for a reason string.
    pub fn evidence(&self) -> String {
        match self {
            Check::Same { epoch } => format!("the host's marker home still has epoch {epoch}"),
            Check::Differs { expected, now } => format!(
                "the host's marker home now has epoch {now}, but {} {}",
                expected.basis.words(),
                expected.epoch
            ),
            Check::NotRecorded { now } => format!(
                "the host's marker home has epoch {now} (this execution recorded none of its own)"
            ),
        }
    }
}

/// Compare the epoch a host announced with the one an execution is bound to.
pub fn check(expected: Option<Expected>, announced: &str) -> Check {
    match expected {
        Some(e) if e.epoch != announced => Check::Differs {
            expected: e,
            now: announced.to_owned(),
        },
        Some(e) => Check::Same { epoch: e.epoch },
        None => Check::NotRecorded {
            now: announced.to_owned(),
        },
    }
}

/// What one announcement means for the bookkeeping of its place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Announced {
    /// Store the announced epoch as the one last seen at the place (new place or a change).
    pub store: bool,
    /// The epoch last seen there, when this announcement changes it: a `host-epoch-changed`
    /// event.
    pub changed_from: Option<String>,
    /// Other destinations presenting the same key (same remote dir) whose last seen epoch
    /// differs, not yet said: one `host-key-shared` event (and a warning) for each.
    pub shared_with: Vec<(String, String)>,
}

/// Apply an announcement to the bookkeeping of `place`. `last_here`: the epoch last seen at
/// `place`; `same_key`: every other destination with the same key and remote dir, with its
/// last seen epoch; `said`: the destinations already said to share the key with this one.
pub fn announce(
    place: &HostPlace,
    epoch: &str,
    last_here: Option<&str>,
    same_key: &[(String, String)],
    said: &BTreeSet<String>,
) -> Announced {
    let mut a = Announced {
        store: last_here != Some(epoch),
        changed_from: last_here.filter(|l| *l != epoch).map(str::to_owned),
        ..Announced::default()
    };
    for (dest, other) in same_key {
        if *dest != place.destination && other != epoch && !said.contains(dest) {
            a.shared_with.push((dest.clone(), other.clone()));
        }
    }
    a
}

/// The pair key under which "these two destinations share a key" is said once.
pub fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

/// The bookkeeping in memory, with the same rules the journal applies (for tests and for
/// reasoning about them): the epoch last seen per place, and the pairs already said to share a
/// key.
#[derive(Clone, Debug, Default)]
pub struct HostBook {
    last: BTreeMap<HostPlace, String>,
    said: BTreeSet<(String, String, String, String)>,
}

impl HostBook {
    pub fn last_seen(&self, place: &HostPlace) -> Option<&str> {
        self.last.get(place).map(String::as_str)
    }

    /// Record that `place` announced `epoch`; returns what to append to the journal.
    pub fn announce(&mut self, place: &HostPlace, epoch: &str) -> Announced {
        let same_key: Vec<(String, String)> = self
            .last
            .iter()
            .filter(|(p, _)| p.host_key == place.host_key && p.remote_dir == place.remote_dir)
            .map(|(p, e)| (p.destination.clone(), e.clone()))
            .collect();
        let said: BTreeSet<String> = same_key
            .iter()
            .map(|(d, _)| d.clone())
            .filter(|d| {
                let (a, b) = pair(d, &place.destination);
                self.said
                    .contains(&(place.host_key.clone(), place.remote_dir.clone(), a, b))
            })
            .collect();
        let a = announce(place, epoch, self.last_seen(place), &same_key, &said);
        if a.store {
            self.last.insert(place.clone(), epoch.to_owned());
        }
        for (d, _) in &a.shared_with {
            let (x, y) = pair(d, &place.destination);
            self.said
                .insert((place.host_key.clone(), place.remote_dir.clone(), x, y));
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(host: &str, key: &str) -> HostPlace {
        HostPlace::new("ops", host, 22, key, ".cairn")
    }

    /// An execution as the executor sees it: bound to its dispatch epoch until its started
    /// record is seen, then to the record's.
    struct Exec {
        dispatch: Option<String>,
        start: Option<String>,
    }

    impl Exec {
        fn dispatched(book: &HostBook, p: &HostPlace, announced_in_reply: &str) -> Exec {
            // The dispatched event carries the epoch last seen there; the reply's hello (before
            // the start guard) is what the dispatch actually ran under.
            let before = book.last_seen(p).map(str::to_owned);
            let dispatch = Some(announced_in_reply.to_owned()).or(before);
            Exec {
                dispatch,
                start: None,
            }
        }
        fn started(mut self, epoch: &str) -> Exec {
            self.start = Some(epoch.to_owned());
            self
        }
        fn probe(&self, announced: &str) -> Check {
            check(
                expected(self.start.as_deref(), self.dispatch.as_deref()),
                announced,
            )
        }
    }

    #[test]
    fn wiped_once_later_executions_are_bound_to_the_new_epoch() {
        let mut book = HostBook::default();
        let p = place("10.0.0.5", "SHA256:k");
        assert_eq!(
            book.announce(&p, "e1"),
            Announced {
                store: true,
                ..Announced::default()
            }
        );
        // wiped: the next reply announces e2, once
        let a = book.announce(&p, "e2");
        assert_eq!(a.changed_from.as_deref(), Some("e1"));
        assert!(book.announce(&p, "e2").changed_from.is_none(), "said once");
        assert_eq!(book.last_seen(&p), Some("e2"));
        // dispatched and started after the wipe, then rebooted: same epoch, so the probe
        // reads the marker (interrupted), not "epoch changed"
        let x = Exec::dispatched(&book, &p, "e2").started("e2");
        assert!(x.probe("e2").same());
        // before the start guard: bound to the dispatch's epoch
        let y = Exec::dispatched(&book, &p, "e2");
        assert!(y.probe("e2").same());
    }

    #[test]
    fn wiped_twice_each_change_is_said_once_and_binds_only_later_executions() {
        let mut book = HostBook::default();
        let p = place("10.0.0.5", "SHA256:k");
        book.announce(&p, "e1");
        let x1 = Exec::dispatched(&book, &p, "e1").started("e1");
        assert_eq!(book.announce(&p, "e2").changed_from.as_deref(), Some("e1"));
        let x2 = Exec::dispatched(&book, &p, "e2").started("e2");
        assert_eq!(book.announce(&p, "e3").changed_from.as_deref(), Some("e2"));
        assert!(book.announce(&p, "e3").changed_from.is_none());
        let x3 = Exec::dispatched(&book, &p, "e3").started("e3");
        assert!(!x1.probe("e3").same());
        assert!(!x2.probe("e3").same());
        assert!(x3.probe("e3").same());
        let why = x2.probe("e3").evidence();
        assert!(why.contains("now has epoch e3"), "{why}");
        assert!(
            why.contains("started record was written under epoch e2"),
            "{why}"
        );
    }

    #[test]
    fn two_hosts_one_key_keep_their_own_epochs_and_are_said_once() {
        let mut book = HostBook::default();
        let a = place("10.0.0.5", "SHA256:same");
        let b = place("10.0.0.6", "SHA256:same");
        book.announce(&a, "ea");
        let first_b = book.announce(&b, "eb");
        assert!(
            first_b.changed_from.is_none(),
            "a new place is not a change"
        );
        assert_eq!(
            first_b.shared_with,
            [("ops@10.0.0.5:22".to_owned(), "ea".to_owned())]
        );
        // alternating announcements never look like wipes, and the pair is said once
        for _ in 0..3 {
            assert_eq!(book.announce(&a, "ea"), Announced::default());
            assert_eq!(book.announce(&b, "eb"), Announced::default());
        }
        assert_eq!(book.last_seen(&a), Some("ea"));
        assert_eq!(book.last_seen(&b), Some("eb"));
        // an execution on each is bound to its own host's epoch
        let xa = Exec::dispatched(&book, &a, "ea").started("ea");
        let xb = Exec::dispatched(&book, &b, "eb").started("eb");
        assert!(xa.probe("ea").same() && xb.probe("eb").same());
        // one host reached under two names (same key, same epoch) is not a clone of itself
        let alias = place("db-1.example", "SHA256:same");
        let said: Vec<String> = book
            .announce(&alias, "ea")
            .shared_with
            .into_iter()
            .map(|(d, _)| d)
            .collect();
        assert_eq!(said, ["ops@10.0.0.6:22"]);
    }

    #[test]
    fn an_old_execution_after_a_wipe_keeps_the_old_rule() {
        let mut book = HostBook::default();
        let p = place("10.0.0.5", "SHA256:k");
        book.announce(&p, "e1");
        let old_started = Exec::dispatched(&book, &p, "e1").started("e1");
        // dispatched, reply lost before the host said anything: bound to the last seen epoch
        let old_unstarted = Exec {
            dispatch: book.last_seen(&p).map(str::to_owned),
            start: None,
        };
        book.announce(&p, "e2");
        for x in [&old_started, &old_unstarted] {
            let c = x.probe("e2");
            assert!(!c.same(), "a missing marker proves nothing: {c:?}");
        }
        assert!(old_unstarted
            .probe("e2")
            .evidence()
            .contains("dispatched under epoch e1"));
        // a later execution on the same host is not affected
        assert!(Exec::dispatched(&book, &p, "e2").probe("e2").same());
    }

    #[test]
    fn the_start_record_wins_over_the_dispatch_epoch() {
        let e = expected(Some("s"), Some("d")).unwrap();
        assert_eq!((e.epoch.as_str(), e.basis), ("s", Basis::StartRecord));
        let e = expected(None, Some("d")).unwrap();
        assert_eq!((e.epoch.as_str(), e.basis), ("d", Basis::Dispatch));
        assert_eq!(expected(None, None), None);
        assert!(check(None, "x").same());
    }
}
