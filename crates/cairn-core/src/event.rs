//! What each event in an execution's history says happened: its kind as a typed value.
//!
//! The journal stores a kind as its name (`dispatched`, `intent-matched` …), in the event row and
//! in the hash chain's input, so the names are part of the journal format: [`EventKind::as_str`]
//! gives exactly the names journals written before this type existed hold, and a name this build
//! does not know reads back as [`EventKind::Other`] (a newer build's event stays readable and
//! verifiable). Code that asks "was this dispatched?" compares kinds, never strings.
//!
//! A kind named after a state (`completed`, `unknown` …) is the event that moved the execution to
//! that state; [`EventKind::of_state`] names it.

use std::fmt;

use crate::state::State;

macro_rules! kinds {
    ($($(#[$doc:meta])* $v:ident = $name:literal,)*) => {
        /// The kind of a journal event (see the module documentation).
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum EventKind {
            $($(#[$doc])* $v,)*
            /// A kind this build does not know (written by a newer one): kept as written.
            Other(String),
        }

        impl EventKind {
            /// Every kind this build writes, in the order of a typical history.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$v,)*];

            /// The name the journal stores.
            pub fn as_str(&self) -> &str {
                match self {
                    $(EventKind::$v => $name,)*
                    EventKind::Other(s) => s,
                }
            }

            /// The kind the journal's `name` stands for.
            pub fn parse(name: &str) -> EventKind {
                match name {
                    $($name => EventKind::$v,)*
                    other => EventKind::Other(other.to_owned()),
                }
            }
        }
    };
}

kinds! {
    /// The request was taken and given its ID; the execution record is fixed.
    Accepted = "accepted",
    /// A request with the same intent was answered with this execution (no new one).
    IntentMatched = "intent-matched",
    /// A request reused this execution's ID for the same operation.
    RequestReused = "request-reused",
    /// The caller's correlation data (request IDs of the front that asked).
    Correlation = "correlation",
    /// Authorization said yes.
    Authorized = "authorized",
    /// Authorization said no; nothing was sent.
    Rejected = "rejected",
    /// The host's boot identity and epoch a dispatch is bound to.
    DispatchEpoch = "dispatch-epoch",
    /// A host's place (destination, host key, remote dir) announced another epoch than the one
    /// last seen there: its cairn state was wiped. Said once per change.
    HostEpochChanged = "host-epoch-changed",
    /// Another destination presents the same host key with a different epoch (a cloned image):
    /// the two are kept apart. Said once per pair.
    HostKeyShared = "host-key-shared",
    /// The dispatch is durable; its bytes may have left.
    Dispatched = "dispatched",
    /// The host refused the dispatch before the start guard: nothing ran.
    DispatchWithheld = "dispatch-withheld",
    /// The host's started record was seen.
    Running = "running",
    /// The connection broke.
    ConnectionLost = "connection-lost",
    /// The host was reached again after an outage.
    Reconnected = "reconnected",
    /// A marker probe and what it answered.
    Probe = "probe",
    /// The start guard was found crossed by an earlier attempt.
    GuardExists = "guard-exists",
    /// The marker is absent and the guard was never crossed: dispatched again under the same ID.
    RetrySameId = "retry-same-id",
    /// A reviewer asked for a new attempt.
    Retry = "retry",
    /// An attach picked up an execution another process had been driving.
    Resumed = "resumed",
    /// A cancel was asked for.
    CancelRequested = "cancel-requested",
    /// Another replica took the execution over after its owner's lease expired.
    Takeover = "takeover",
    /// The owning replica picked up an execution none of its calls drove any more (its call
    /// failed, say with a journal error) and recovers it.
    Redrive = "redrive",
    /// A human decision recorded as evidence.
    Resolved = "resolved",
    /// The host reported an exit status.
    Completed = "completed",
    /// Proven never started.
    Failed = "failed",
    /// Started and cannot finish.
    Interrupted = "interrupted",
    /// What happened cannot be proved.
    Unknown = "unknown",
    /// Stopped on request.
    Cancelled = "cancelled",
    /// The result reached its caller.
    Delivered = "delivered",
    /// The caller went away after the dispatch boundary; the command was left to finish.
    DeliveryAbandoned = "delivery-abandoned",
    /// One step of a named operation.
    Step = "step",
    /// A free-form note.
    Note = "note",
}

impl EventKind {
    /// The event that moves an execution to `state`.
    pub fn of_state(state: State) -> EventKind {
        EventKind::parse(state.as_str())
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for EventKind {
    fn from(name: &str) -> EventKind {
        EventKind::parse(name)
    }
}

impl From<String> for EventKind {
    fn from(name: String) -> EventKind {
        EventKind::parse(&name)
    }
}

impl PartialEq<str> for EventKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for EventKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl serde::Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<EventKind, D::Error> {
        String::deserialize(d).map(EventKind::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are the journal's format: each kind reads back as itself, and the names
    /// journals already hold are exactly these.
    #[test]
    fn every_kind_reads_back_as_itself_under_the_name_journals_hold() {
        for k in EventKind::ALL {
            assert_eq!(&EventKind::parse(k.as_str()), k);
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        let names: Vec<&str> = EventKind::ALL.iter().map(EventKind::as_str).collect();
        for name in [
            "accepted",
            "intent-matched",
            "dispatched",
            "running",
            "takeover",
            "host-epoch-changed",
            "host-key-shared",
            "redrive",
        ] {
            assert!(names.contains(&name), "{name}");
        }
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "two kinds share a name");
    }

    /// A kind written by a newer build is kept as written, not refused or renamed.
    #[test]
    fn an_unknown_kind_is_kept_as_written() {
        let k = EventKind::parse("lease-renewed");
        assert_eq!(k, EventKind::Other("lease-renewed".into()));
        assert_eq!(k.as_str(), "lease-renewed");
        assert_eq!(k, "lease-renewed");
    }

    /// Every state has the event that records it, by the state's own name.
    #[test]
    fn each_state_is_recorded_by_the_kind_of_its_name() {
        for s in State::ALL {
            let k = EventKind::of_state(s);
            assert_eq!(k.as_str(), s.as_str());
            assert!(!matches!(k, EventKind::Other(_)), "{s}");
        }
    }
}
