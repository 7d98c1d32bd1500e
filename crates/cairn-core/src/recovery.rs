//! The recovery decision: what to do with an execution after a reconnect or a restart.
//!
//! This is docs/DESIGN.md's recovery table as a pure function of what the journal knows and what the
//! marker on the host says. No I/O happens here; the executor gathers the inputs (journal read,
//! one probe exec) and carries out the action. Keeping it pure is what lets every row be tested
//! without a network.
//!
//! | marker on the host                                   | action                        |
//! |------------------------------------------------------|-------------------------------|
//! | (not dispatched, its owner alive)                    | wait: nothing is concluded    |
//! | (not dispatched, its owner gone)                     | `failed`: nothing was sent    |
//! | absent, same epoch, guard never crossed              | dispatch again, same ID       |
//! | started, supervisor alive                            | reattach from the offsets     |
//! | finished                                             | collect the stored result     |
//! | started, boot changed or supervisor dead, no finish  | `interrupted`                 |
//! | epoch changed / unreadable / other protocol version  | `unknown`                     |

use std::time::Duration;

use crate::state::State;

/// What the journal says happened before the probe, reduced to what the decision needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prior {
    /// Accepted or authorized: the `dispatched` event was never written, so no byte of the
    /// dispatch left this machine (the event is durable before the bytes are sent).
    NotDispatched,
    /// Accepted or authorized, not dispatched, and the process that owns it may still send it
    /// (see `cairn::owner`): nothing can be concluded while it lives.
    Held,
    /// `dispatched` was written; the host may or may not have received it.
    Dispatched,
    /// The host's started record was seen (`running`).
    Started,
    /// The journal already holds a settled outcome.
    Settled,
}

impl Prior {
    /// Map the journal's current state (and, for `unknown`, the state before it) to a prior.
    pub fn from_journal(current: State, before_unknown: Option<State>) -> Prior {
        match current {
            State::Accepted | State::Authorized => Prior::NotDispatched,
            State::Dispatched => Prior::Dispatched,
            State::Running => Prior::Started,
            State::Unknown => match before_unknown {
                Some(State::Running) => Prior::Started,
                Some(State::Accepted) | Some(State::Authorized) => Prior::NotDispatched,
                _ => Prior::Dispatched,
            },
            State::Rejected
            | State::Completed
            | State::Failed
            | State::Interrupted
            | State::Cancelled
            | State::Delivered => Prior::Settled,
        }
    }
}

/// Supervisor liveness as the host decided it from evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    /// Same boot identity, the supervisor's PID exists with the recorded start time, not a zombie.
    Alive,
    /// Same boot identity, but the supervisor process is gone (or its PID was reused).
    Dead,
    /// The boot identity changed since the started record was written.
    Rebooted,
}

/// What one probe of the host found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Could not reach the host (or the probe did not finish) within the deadline.
    Unreachable,
    /// No started record. `same_epoch` is false when the host's epoch differs from the one
    /// recorded before the dispatch (the marker home was wiped: absence proves nothing).
    Absent { same_epoch: bool },
    /// A started record and no finish record.
    Started {
        liveness: Liveness,
        same_epoch: bool,
    },
    /// A finish record exists.
    Finished,
    /// The host answered something cairn cannot trust: another protocol version, a record that
    /// does not parse, a record for another command, an error instead of a probe.
    Unreadable(String),
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send the dispatch again under the same execution ID (the start guard makes this safe).
    Dispatch,
    /// Stream output from the stored offsets and wait for the finish record.
    Reattach,
    /// Read the finish record and the rest of the output; never run again.
    Collect,
    /// Record a settled or unknown outcome; `reason` is the evidence in words.
    Conclude { state: State, reason: String },
    /// Nothing can be decided now (host unreachable); leave the journal as it is and try later.
    Retry { reason: String },
    /// The journal already holds a settled outcome.
    Nothing,
}

fn conclude(state: State, reason: &str) -> Action {
    Action::Conclude {
        state,
        reason: reason.to_owned(),
    }
}

/// The recovery table. Pure: same inputs, same answer.
pub fn decide(prior: Prior, probe: &Probe) -> Action {
    use Liveness::*;
    match (prior, probe) {
        (Prior::Settled, _) => Action::Nothing,

        // Its owner may still send it: "never dispatched" would be a guess, and `failed` tells
        // a caller it is safe to send again. Wait for the owner, whatever the host says now.
        (Prior::Held, _) => Action::Retry {
            reason: "accepted by a process that is still alive and has not dispatched it yet; \
                     nothing is concluded while it may still send it"
                .to_owned(),
        },

        // Nothing was ever sent: no host can have started it, whatever the probe says
        // (and if a host does hold a marker for this ID, it was not this journal's dispatch).
        (Prior::NotDispatched, Probe::Started { .. }) | (Prior::NotDispatched, Probe::Finished) => {
            conclude(
                State::Unknown,
                "the host holds a marker for this ID, but this journal never dispatched it \
                 (another journal used the same ID?)",
            )
        }
        (Prior::NotDispatched, _) => conclude(
            State::Failed,
            "never dispatched: the client stopped before any byte of the command was sent",
        ),

        (_, Probe::Unreachable) => Action::Retry {
            reason: "host unreachable; the outcome is not known yet".to_owned(),
        },
        (_, Probe::Unreadable(why)) => conclude(State::Unknown, &format!("marker unreadable: {why}")),

        (_, Probe::Finished) => Action::Collect,

        (_, Probe::Absent { same_epoch: false }) | (_, Probe::Started { same_epoch: false, .. }) => {
            conclude(
                State::Unknown,
                "the host's epoch changed (its cairn state was wiped); a missing marker proves nothing",
            )
        }

        (Prior::Dispatched, Probe::Absent { same_epoch: true }) => Action::Dispatch,
        (Prior::Started, Probe::Absent { same_epoch: true }) => conclude(
            State::Unknown,
            "the started record was seen earlier but is gone now, with the same epoch (removed by hand?)",
        ),

        (_, Probe::Started { liveness: Alive, .. }) => Action::Reattach,
        (_, Probe::Started { liveness: Rebooted, .. }) => conclude(
            State::Interrupted,
            "the host rebooted after the command started (boot identity changed) and no finish record exists",
        ),
        (_, Probe::Started { liveness: Dead, .. }) => conclude(
            State::Interrupted,
            "the supervisor is gone (PID absent or reused) and no finish record exists",
        ),
    }
}

/// The pause between reconnect attempts while a host is unreachable, as plain arithmetic (the
/// caller reads the clock): `min` during the first `fast_for` of an outage (a blip usually ends
/// within seconds, and a failed attempt while the link is down is cheap), then doubling up to
/// `max`; back to `min` once the host answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pause: Duration,
    min: Duration,
    max: Duration,
    fast_for: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration, fast_for: Duration) -> Self {
        Backoff {
            pause: min,
            min,
            max,
            fast_for,
        }
    }

    /// How long to wait before the next attempt.
    pub fn pause(&self) -> Duration {
        self.pause
    }

    /// An attempt failed and its pause was waited, `lost_for` into the outage.
    pub fn after_pause(&mut self, lost_for: Duration) {
        if lost_for >= self.fast_for {
            self.pause = (self.pause * 2).min(self.max);
        }
    }

    /// The host answered.
    pub fn reset(&mut self) {
        self.pause = self.min;
    }
}

/// What an outage of `lost_for` leaves of the reconnect window `reconnect_for`; `None` once it
/// is used up (the outcome is then `unknown`).
pub fn window_left(reconnect_for: Duration, lost_for: Duration) -> Option<Duration> {
    (lost_for < reconnect_for).then(|| reconnect_for - lost_for)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use Liveness::*;

    /// Every probe answer the table distinguishes (shared with the machine's tests).
    pub(crate) fn all_probes() -> Vec<Probe> {
        let mut v = vec![
            Probe::Unreachable,
            Probe::Absent { same_epoch: true },
            Probe::Absent { same_epoch: false },
            Probe::Finished,
            Probe::Unreadable("v=2".into()),
        ];
        for l in [Alive, Dead, Rebooted] {
            for e in [true, false] {
                v.push(Probe::Started {
                    liveness: l,
                    same_epoch: e,
                });
            }
        }
        v
    }

    fn state_of(a: &Action) -> Option<State> {
        match a {
            Action::Conclude { state, .. } => Some(*state),
            _ => None,
        }
    }

    #[test]
    fn absent_same_epoch_guard_never_crossed_dispatches_again() {
        assert_eq!(
            decide(Prior::Dispatched, &Probe::Absent { same_epoch: true }),
            Action::Dispatch
        );
    }

    #[test]
    fn started_and_alive_reattaches() {
        for p in [Prior::Dispatched, Prior::Started] {
            let probe = Probe::Started {
                liveness: Alive,
                same_epoch: true,
            };
            assert_eq!(decide(p, &probe), Action::Reattach);
        }
    }

    #[test]
    fn finished_collects_the_stored_result_never_runs_again() {
        for p in [Prior::Dispatched, Prior::Started] {
            assert_eq!(decide(p, &Probe::Finished), Action::Collect);
        }
    }

    #[test]
    fn boot_changed_or_supervisor_dead_without_finish_is_interrupted() {
        for p in [Prior::Dispatched, Prior::Started] {
            for l in [Dead, Rebooted] {
                let probe = Probe::Started {
                    liveness: l,
                    same_epoch: true,
                };
                assert_eq!(state_of(&decide(p, &probe)), Some(State::Interrupted));
            }
        }
    }

    #[test]
    fn epoch_changed_or_unreadable_is_unknown() {
        for p in [Prior::Dispatched, Prior::Started] {
            assert_eq!(
                state_of(&decide(p, &Probe::Absent { same_epoch: false })),
                Some(State::Unknown)
            );
            for l in [Alive, Dead, Rebooted] {
                let probe = Probe::Started {
                    liveness: l,
                    same_epoch: false,
                };
                assert_eq!(state_of(&decide(p, &probe)), Some(State::Unknown));
            }
            assert_eq!(
                state_of(&decide(p, &Probe::Unreadable("protocol v=9".into()))),
                Some(State::Unknown)
            );
        }
    }

    #[test]
    fn a_marker_that_vanished_after_it_was_seen_is_unknown_not_a_redispatch() {
        assert_eq!(
            state_of(&decide(Prior::Started, &Probe::Absent { same_epoch: true })),
            Some(State::Unknown)
        );
    }

    #[test]
    fn unreachable_host_decides_nothing() {
        for p in [Prior::Dispatched, Prior::Started] {
            assert!(matches!(
                decide(p, &Probe::Unreachable),
                Action::Retry { .. }
            ));
        }
    }

    #[test]
    fn never_dispatched_is_failed_unless_a_foreign_marker_exists() {
        for probe in all_probes() {
            let a = decide(Prior::NotDispatched, &probe);
            let want = match probe {
                Probe::Started { .. } | Probe::Finished => State::Unknown,
                _ => State::Failed,
            };
            assert_eq!(state_of(&a), Some(want), "{probe:?}");
        }
    }

    #[test]
    fn not_dispatched_with_a_live_owner_concludes_nothing() {
        for probe in all_probes() {
            assert!(
                matches!(decide(Prior::Held, &probe), Action::Retry { .. }),
                "{probe:?}"
            );
        }
    }

    #[test]
    fn settled_executions_are_left_alone() {
        for probe in all_probes() {
            assert_eq!(decide(Prior::Settled, &probe), Action::Nothing);
        }
    }

    /// Exhaustive safety properties over every (prior, probe) pair: the table never re-dispatches
    /// anything whose start was seen or whose marker exists, and never calls an outcome
    /// `completed` or `failed` from a probe that does not prove it.
    #[test]
    fn no_row_redispatches_a_started_execution_or_guesses_an_outcome() {
        for prior in [
            Prior::NotDispatched,
            Prior::Held,
            Prior::Dispatched,
            Prior::Started,
            Prior::Settled,
        ] {
            for probe in all_probes() {
                let a = decide(prior, &probe);
                if a == Action::Dispatch {
                    assert_eq!(prior, Prior::Dispatched);
                    assert_eq!(probe, Probe::Absent { same_epoch: true });
                }
                if let Some(s) = state_of(&a) {
                    assert_ne!(s, State::Completed, "{prior:?} {probe:?}");
                    if s == State::Failed {
                        assert_eq!(prior, Prior::NotDispatched);
                    }
                }
            }
        }
    }

    #[test]
    fn prior_from_journal_uses_the_state_before_unknown() {
        assert_eq!(
            Prior::from_journal(State::Unknown, Some(State::Running)),
            Prior::Started
        );
        assert_eq!(
            Prior::from_journal(State::Unknown, Some(State::Dispatched)),
            Prior::Dispatched
        );
        assert_eq!(Prior::from_journal(State::Unknown, None), Prior::Dispatched);
        assert_eq!(
            Prior::from_journal(State::Authorized, None),
            Prior::NotDispatched
        );
        assert_eq!(Prior::from_journal(State::Delivered, None), Prior::Settled);
    }

    #[test]
    fn backoff_stays_fast_at_first_then_doubles_up_to_its_ceiling() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500), ms(1000));
        assert_eq!(b.pause(), ms(100));
        b.after_pause(ms(300));
        assert_eq!(b.pause(), ms(100), "within the fast phase");
        b.after_pause(ms(1000));
        assert_eq!(b.pause(), ms(200));
        b.after_pause(ms(1200));
        assert_eq!(b.pause(), ms(400));
        b.after_pause(ms(1600));
        assert_eq!(b.pause(), ms(500), "capped");
        b.after_pause(ms(2100));
        assert_eq!(b.pause(), ms(500));
        b.reset();
        assert_eq!(b.pause(), ms(100));
    }

    #[test]
    fn the_reconnect_window_ends_exactly_at_its_length() {
        let s = Duration::from_secs;
        assert_eq!(window_left(s(300), s(0)), Some(s(300)));
        assert_eq!(window_left(s(300), s(299)), Some(s(1)));
        assert_eq!(window_left(s(300), s(300)), None);
        assert_eq!(window_left(s(300), s(301)), None);
    }
}
