//! Which lifecycle transitions the journal accepts: one table, the contract's lifecycle
//! (docs/DESIGN.md, "Execution lifecycle") as data.
//!
//! The journal checks every appended transition against [`TRANSITIONS`] in the same transaction
//! as the append, from the state recorded at that moment (a compare-and-set, never a read
//! followed by a separate append): the SQLite file inside its `BEGIN IMMEDIATE` transaction,
//! PostgreSQL inside `cairn_append_as` under the execution's row lock, from a copy of this table
//! that its migration wrote (a test holds the two equal). A note (an event without a state) is
//! always accepted.
//!
//! | from | to | rule |
//! |---|---|---|
//! | (none) | `accepted` | [`Rule::Accept`] |
//! | `accepted` | `authorized`, `rejected` | [`Rule::Authorize`] |
//! | `authorized` | `dispatched` | [`Rule::Dispatch`] |
//! | `dispatched`, `unknown` | `dispatched` | [`Rule::Redispatch`] |
//! | `dispatched`, `running`, `unknown` | `running` | [`Rule::Start`] |
//! | `accepted`, `authorized` | `failed`, `cancelled`, `unknown` | [`Rule::NeverSent`] |
//! | `dispatched`, `running`, `unknown` | `completed`, `cancelled`, `interrupted`, `unknown` | [`Rule::Outcome`] |
//! | `dispatched`, `unknown` | `failed` | [`Rule::Outcome`] |
//! | `interrupted` | `completed`, `failed` | [`Rule::Review`] |
//! | `failed` | `authorized`, `rejected`, `dispatched` | [`Rule::Retry`] |
//! | `completed`, `cancelled` | `delivered` | [`Rule::Deliver`] |
//!
//! So `dispatched` never follows `accepted` (authorization first), nor a settled state but
//! `failed` (proven never started); nothing but notes follows `rejected` or `delivered`; an
//! `unknown` never lands on a settled state; and once `running` was recorded the outcome is never
//! `failed`.

use std::fmt;

use crate::state::State;

/// Why a transition is legal: the part of the contract it carries out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A new execution is recorded `accepted` with its row.
    Accept,
    /// Authorization decides once, after acceptance.
    Authorize,
    /// The first dispatch, only once authorized.
    Dispatch,
    /// Dispatched again under the same ID: the marker proved the start guard never crossed
    /// (recovery's "absent, same epoch"), or an idempotent retry of an `unknown`.
    Redispatch,
    /// The host's started record was seen (again, after a reconnect or an `unknown`).
    Start,
    /// Settled, or given up, before a byte of the dispatch left: nothing was sent.
    NeverSent,
    /// What the host (or its silence) proved after the dispatch. `failed` only while no start
    /// was recorded.
    Outcome,
    /// A reviewer's decision about an `interrupted` execution (`cairn resolve`).
    Review,
    /// `failed` proved the command never started: an explicit retry may authorize and send it
    /// again under the same ID (`cairn batch resume`); the host's start guard still decides.
    Retry,
    /// The caller now holds the result.
    Deliver,
}

use State::*;

/// Every legal transition: `(from, to, rule)`; `None` is an execution with no state yet.
pub const TRANSITIONS: &[(Option<State>, State, Rule)] = &[
    (None, Accepted, Rule::Accept),
    (Some(Accepted), Authorized, Rule::Authorize),
    (Some(Accepted), Rejected, Rule::Authorize),
    (Some(Authorized), Dispatched, Rule::Dispatch),
    (Some(Dispatched), Dispatched, Rule::Redispatch),
    (Some(Unknown), Dispatched, Rule::Redispatch),
    (Some(Dispatched), Running, Rule::Start),
    (Some(Running), Running, Rule::Start),
    (Some(Unknown), Running, Rule::Start),
    (Some(Accepted), Failed, Rule::NeverSent),
    (Some(Accepted), Cancelled, Rule::NeverSent),
    (Some(Accepted), Unknown, Rule::NeverSent),
    (Some(Authorized), Failed, Rule::NeverSent),
    (Some(Authorized), Cancelled, Rule::NeverSent),
    (Some(Authorized), Unknown, Rule::NeverSent),
    (Some(Dispatched), Completed, Rule::Outcome),
    (Some(Dispatched), Cancelled, Rule::Outcome),
    (Some(Dispatched), Interrupted, Rule::Outcome),
    (Some(Dispatched), Unknown, Rule::Outcome),
    (Some(Dispatched), Failed, Rule::Outcome),
    (Some(Running), Completed, Rule::Outcome),
    (Some(Running), Cancelled, Rule::Outcome),
    (Some(Running), Interrupted, Rule::Outcome),
    (Some(Running), Unknown, Rule::Outcome),
    (Some(Unknown), Completed, Rule::Outcome),
    (Some(Unknown), Cancelled, Rule::Outcome),
    (Some(Unknown), Interrupted, Rule::Outcome),
    (Some(Unknown), Unknown, Rule::Outcome),
    (Some(Unknown), Failed, Rule::Outcome),
    (Some(Interrupted), Completed, Rule::Review),
    (Some(Interrupted), Failed, Rule::Review),
    (Some(Failed), Authorized, Rule::Retry),
    (Some(Failed), Rejected, Rule::Retry),
    (Some(Failed), Dispatched, Rule::Retry),
    (Some(Completed), Delivered, Rule::Deliver),
    (Some(Cancelled), Delivered, Rule::Deliver),
];

/// A transition the lifecycle does not allow from the state recorded at the time of the append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Illegal {
    /// The state the journal held (`None`: no state yet).
    pub from: Option<State>,
    /// The state the append asked for.
    pub to: State,
}

impl fmt::Display for Illegal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.from {
            Some(from) => write!(
                f,
                "the lifecycle does not allow {} after {from}: the execution stays {from}",
                self.to
            ),
            None => write!(f, "the lifecycle does not allow {} first", self.to),
        }
    }
}

/// The rule that allows `from → to`, if any.
pub fn rule(from: Option<State>, to: State) -> Option<Rule> {
    TRANSITIONS
        .iter()
        .find(|(f, t, _)| *f == from && *t == to)
        .map(|(_, _, r)| *r)
}

/// Whether the journal accepts an event moving an execution at `from` to `to` (`None`: a note,
/// always accepted); the state after it.
pub fn check(from: Option<State>, to: Option<State>) -> Result<Option<State>, Illegal> {
    match to {
        None => Ok(from),
        Some(to) => match rule(from, to) {
            Some(_) => Ok(Some(to)),
            None => Err(Illegal { from, to }),
        },
    }
}

/// Check a sequence of events appended in one transaction, in order, from `from`; the state
/// after the last.
pub fn check_all(
    from: Option<State>,
    to: impl IntoIterator<Item = Option<State>>,
) -> Result<Option<State>, Illegal> {
    to.into_iter().try_fold(from, check)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn froms() -> impl Iterator<Item = Option<State>> {
        std::iter::once(None).chain(State::ALL.into_iter().map(Some))
    }

    /// What the contract says of `from → to`, written out from docs/DESIGN.md's words rather
    /// than from the table: the table must agree on every pair.
    fn contract(from: Option<State>, to: State) -> bool {
        let Some(from) = from else {
            // an execution starts accepted, and nothing else starts one
            return to == Accepted;
        };
        if to == Accepted {
            return false;
        }
        match from {
            // nothing but notes after a settled state, except: the result is delivered, a
            // reviewer decides an interrupted one, and a failed one (proven never started) may
            // be retried
            Completed | Cancelled => to == Delivered,
            Interrupted => matches!(to, Completed | Failed),
            Failed => matches!(to, Authorized | Rejected | Dispatched),
            Rejected | Delivered => false,
            // authorization decides once; dispatched only from authorized
            Accepted => matches!(to, Authorized | Rejected | Failed | Cancelled | Unknown),
            Authorized => matches!(to, Dispatched | Failed | Cancelled | Unknown),
            // after the dispatch: never back to before it, and once started never `failed`
            Dispatched | Unknown => !matches!(to, Authorized | Rejected | Delivered),
            Running => !matches!(to, Authorized | Rejected | Delivered | Dispatched | Failed),
        }
    }

    #[test]
    fn every_pair_of_states_is_legal_exactly_as_the_contract_says() {
        let mut rows = 0;
        let mut legal = 0;
        for from in froms() {
            for to in State::ALL {
                let ok = rule(from, to).is_some();
                assert_eq!(ok, contract(from, to), "{from:?} -> {to}");
                assert_eq!(check(from, Some(to)).is_ok(), ok);
                rows += 1;
                legal += usize::from(ok);
            }
        }
        assert_eq!(rows, 12 * 11);
        assert_eq!(legal, TRANSITIONS.len());
    }

    #[test]
    fn the_table_names_each_transition_once() {
        for (i, (f, t, _)) in TRANSITIONS.iter().enumerate() {
            for (g, u, _) in &TRANSITIONS[i + 1..] {
                assert!((f, t) != (g, u), "{f:?} -> {t} twice");
            }
        }
    }

    /// The windows of issue 35, as the journal now decides them.
    #[test]
    fn no_dispatch_after_cancelled_and_no_unknown_over_a_settled_state() {
        for settled in State::ALL.into_iter().filter(|s| s.is_settled()) {
            assert!(check(Some(settled), Some(Unknown)).is_err(), "{settled}");
            assert!(check(Some(settled), Some(Running)).is_err(), "{settled}");
        }
        assert!(check(Some(Cancelled), Some(Dispatched)).is_err());
        assert!(check(Some(Cancelled), Some(Authorized)).is_err());
        assert!(check(Some(Accepted), Some(Dispatched)).is_err());
        assert!(check(Some(Running), Some(Failed)).is_err());
        assert!(check(Some(Delivered), Some(Delivered)).is_err());
    }

    #[test]
    fn notes_are_accepted_after_any_state() {
        for from in froms() {
            assert_eq!(check(from, None), Ok(from));
        }
    }

    #[test]
    fn a_batch_is_checked_in_order_and_refused_at_its_first_illegal_event() {
        let ok = check_all(Some(Accepted), [Some(Authorized), None, Some(Dispatched)]);
        assert_eq!(ok, Ok(Some(Dispatched)));
        let refused = check_all(Some(Cancelled), [Some(Authorized), Some(Dispatched)]);
        assert_eq!(
            refused,
            Err(Illegal {
                from: Some(Cancelled),
                to: Authorized
            })
        );
        assert_eq!(
            refused.unwrap_err().to_string(),
            "the lifecycle does not allow authorized after cancelled: the execution stays cancelled"
        );
    }
}
