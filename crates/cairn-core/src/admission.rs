//! Admission: where a request for an execution that may already exist goes, as one pure
//! function ([`route`]).
//!
//! "Never run twice" is enforced where a request meets the journal: a new run whose intent
//! matches an earlier execution, a run under an execution ID the journal already holds,
//! `cairn attach`/`recover`/a redispatch on a journal shared by replicas, the owner's sweep, and
//! `cairn batch resume`. Each of those decided by hand in the `cairn` crate; this module is their
//! decisions transcribed into one table, from the facts the caller gathers (the journal's state,
//! the operation class, who owns the execution and whether it lives, its redrives) and what the
//! caller asked ([`Ask`]). Nothing here reads the journal, a clock or a process table: the
//! waiting, the takeover's compare-and-set and the probes stay with the caller, which asks again
//! after each.
//!
//! | ask | recorded | other facts | route | transcribed from |
//! |---|---|---|---|---|
//! | [`Ask::Resume`] | none | | [`Route::New`] | `fleet::resume` (`Mode::Fresh`) |
//! | | a row, no state | | [`Route::Attach`] | `fleet::resume` |
//! | | `accepted` | | [`Route::Authorize`] | `fleet::resume` |
//! | | `authorized` | | [`Route::Redispatch`] | `fleet::resume` |
//! | | `failed` | | [`Route::RetryNeverStarted`] | `fleet::resume` (`Mode::Retry`) |
//! | | `delivered` | | [`Route::Settled`] | `fleet::resume` |
//! | | any other state | | [`Route::Attach`] | `fleet::resume` |
//! | [`Ask::SameId`] | none | | [`Route::New`] | `Executor::execute` (`--id`) |
//! | | a row | same operation | [`Route::Attach`] | `Executor::execute` |
//! | | a row | another operation | [`Route::Conflict`] | `Executor::execute` |
//! | [`Ask::Run`] | does not hold the match | | [`Route::New`] | `choose_match` |
//! | | holds the match | | as [`Ask::Matched`] | `choose_match`, then `attach_matched` |
//! | [`Ask::Matched`] | `accepted`, `authorized`, `dispatched` | owner may dispatch, wait not over | [`Route::Wait`] | `attach_matched` |
//! | | `accepted`, `authorized` | | [`Route::Recover`] | `attach_matched` |
//! | | `failed` | | [`Route::New`] | `attach_matched` |
//! | | `interrupted` | | [`Route::Review`] | `attach_matched` |
//! | | `unknown` | class rule review / run again | [`Route::Review`] | `attach_matched` |
//! | | `unknown` | class rule probe | [`Route::Attach`] | `attach_matched` |
//! | | `unknown` | class rule retry same ID | [`Route::RetryUnderSameId`] | `attach_matched` |
//! | | any other | | [`Route::Attach`] | `attach_matched` |
//! | [`Ask::Drive`] | | [`Owner::Nobody`] | [`Route::Drive`] | `own_or_wait` |
//! | | settled | | [`Route::Settled`] | `own_or_wait` |
//! | | | [`Owner::Here`] | [`Route::Drive`] | `own_or_wait` (`drive_own`/`drive_taken`) |
//! | | | [`Owner::HereBusy`] | [`Route::Wait`] | `own_or_wait` |
//! | | | [`Owner::Dead`] | [`Route::TakeOver`] | `own_or_wait` |
//! | | | [`Owner::Live`], window not over | [`Route::Wait`] | `own_or_wait` |
//! | | | [`Owner::Live`], window over, [`Ask::Redrive`] would drive | [`Route::Wait`] | `own_or_wait` |
//! | | | [`Owner::Live`], window over, otherwise | [`Route::HeldByAnother`] | `own_or_wait` |
//! | [`Ask::Redrive`] | `accepted` … `running` | not detached, redrives under [`MAX_REDRIVES`] | [`Route::Drive`] | `may_redrive` |
//! | | anything else | | [`Route::LeaveAlone`] | `may_redrive` |
//! | [`Ask::Approve`] | `accepted` | owner may not dispatch, an intent recorded | [`Route::Authorize`] | `authorize_accepted` |
//! | | anything else | | [`Route::Attach`] | `authorize_accepted` |
//! | [`Ask::AwaitOwner`] | `accepted`, `authorized` | owner may dispatch, wait not over | [`Route::Wait`] | `wait_for_owner` |
//! | | anything else | | [`Route::Attach`] | `wait_for_owner` |
//!
//! So: a settled execution is never dispatched again except `failed` (proven never started),
//! and in this table only by `cairn batch resume` (`cairn resolve --retry` is the other way, a
//! reviewer's); an execution a live other owner holds is never driven here, and one accepted
//! by an owner that may still dispatch it is never authorized by another process;
//! an `unknown` or `interrupted` execution whose class cannot be run again goes to review; the
//! owner's sweep picks one execution up at most [`MAX_REDRIVES`] times.

use crate::state::State;

/// What the journal holds under the execution ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Recorded {
    /// No execution under this ID.
    Absent,
    /// The execution's row, and no event with a state yet.
    Stateless,
    /// The execution's current state.
    At(State),
}

impl Recorded {
    /// The state, if the journal holds one.
    pub fn state(self) -> Option<State> {
        match self {
            Recorded::At(s) => Some(s),
            Recorded::Absent | Recorded::Stateless => None,
        }
    }
}

/// The operation class of an execution, as the journal records it (`cairn::intent::OpClass`,
/// docs/DESIGN.md "Operation classes"); [`Class::Unrecognized`] for a recorded name this build
/// does not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    ReadOnly,
    Idempotent,
    Conditional,
    Irreversible,
    RemoteCommand,
    /// Damaged, or written by a newer build (it may be `irreversible`): the strictest rule.
    Unrecognized,
}

/// Unknown attempts of a read-only operation within its retention window that still start a
/// new execution (used under this name by `cairn::intent`); then review.
pub const READ_ONLY_RETRY_LIMIT: usize = 3;

/// What a matching request does when the earlier execution's outcome is `unknown`
/// (the class table of docs/DESIGN.md; `cairn::intent::AfterUnknown` is this type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AfterUnknown {
    /// Start a new execution (read-only, within limits).
    RunAgain,
    /// Drive the same execution again, re-dispatching under the same ID where the marker does
    /// not prove it finished or running (idempotent).
    RetrySameId,
    /// Probe the marker and follow the recovery table; otherwise stop for review.
    ProbeMarker,
    /// Touch nothing; show the review record.
    Review,
}

impl Class {
    pub const ALL: [Class; 6] = [
        Class::ReadOnly,
        Class::Idempotent,
        Class::Conditional,
        Class::Irreversible,
        Class::RemoteCommand,
        Class::Unrecognized,
    ];

    /// The class the journal recorded by name (`read-only`, or `read_only`, …).
    pub fn from_recorded(name: &str) -> Class {
        let known = [
            (Class::ReadOnly, "read-only"),
            (Class::Idempotent, "idempotent"),
            (Class::Conditional, "conditional"),
            (Class::Irreversible, "irreversible"),
            (Class::RemoteCommand, "remote-command"),
        ];
        known
            .iter()
            .find(|(_, n)| *n == name || n.replace('-', "_") == name)
            .map_or(Class::Unrecognized, |(c, _)| *c)
    }

    /// The class rule after an `unknown` outcome, `unknown_attempts` unknown or interrupted
    /// executions of the same intent in its window (`OpClass::after_unknown` and
    /// `after_unknown_recorded`).
    pub fn after_unknown(self, unknown_attempts: usize) -> AfterUnknown {
        match self {
            Class::ReadOnly if unknown_attempts < READ_ONLY_RETRY_LIMIT => AfterUnknown::RunAgain,
            Class::ReadOnly => AfterUnknown::Review,
            Class::Idempotent => AfterUnknown::RetrySameId,
            Class::Conditional | Class::RemoteCommand => AfterUnknown::ProbeMarker,
            Class::Irreversible | Class::Unrecognized => AfterUnknown::Review,
        }
    }
}

/// Who owns the execution and whether that owner lives, as the caller found it.
///
/// For [`Ask::Drive`] this is the ownership row of a journal shared by replicas (the owner
/// replica and its lease), [`Owner::Nobody`] on a journal that is not shared. For
/// [`Ask::Matched`], [`Ask::Run`], [`Ask::Approve`] and [`Ask::AwaitOwner`] it is the process
/// that may still dispatch an execution not yet dispatched (`Executor::live_owner`: the owning
/// replica while its lease is current, else the accepting or resuming process): [`Owner::Live`]
/// when there is one, [`Owner::Nobody`] otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// No owner is recorded (a journal that is not shared, a settled execution).
    Nobody,
    /// This process (replica) owns it and no other call of it drives it alone.
    Here,
    /// This process owns it and another call of it drives it alone or is taking it towards its
    /// dispatch (after a takeover, the owner's sweep, an `owner::claim`).
    HereBusy,
    /// Another process or replica owns it and lives (its lease is current, its PID exists, or
    /// it is on another machine).
    Live,
    /// Its owner is gone (its lease expired, its PID is gone).
    Dead,
}

impl Owner {
    pub const ALL: [Owner; 5] = [
        Owner::Nobody,
        Owner::Here,
        Owner::HereBusy,
        Owner::Live,
        Owner::Dead,
    ];

    /// Whether the owner may still dispatch it (`Executor::owner_may_dispatch` is `Some`).
    pub fn may_dispatch(self) -> bool {
        matches!(self, Owner::HereBusy | Owner::Live)
    }
}

/// How many times the owner's sweep picks up one execution that none of its calls drives
/// (`Executor::redrive_owned`): one whose recovery keeps failing is then left as it is
/// (the executor's claims room asks [`route`] with [`Ask::Redrive`]).
pub const MAX_REDRIVES: usize = 3;

/// What the journal and the caller know of the execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Facts {
    pub recorded: Recorded,
    pub class: Class,
    pub owner: Owner,
    /// `redrive` events recorded for it.
    pub redrives: usize,
    /// Its latest dispatch was detached (`--detach`): its callers attach to it or poll it.
    pub detached: bool,
}

/// What the caller asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ask {
    /// A new run whose intent (fingerprint, actor, scope) matches this earlier execution
    /// (`choose_match`, then `attach_matched` with the same state). `unsettled_matches`: how
    /// many executions of that intent are `unknown` or `interrupted`; `owner_wait_over`: see
    /// [`Ask::Matched`].
    Run {
        unsettled_matches: usize,
        owner_wait_over: bool,
    },
    /// A new run matched this execution already (`attach_matched`, with the state read after
    /// the match). `owner_wait_over`: the wait for an owner that may still dispatch it is over
    /// (its deadline passed).
    Matched { owner_wait_over: bool },
    /// A run under an execution ID the caller chose (`cairn run --id`, `Executor::execute`);
    /// `same_operation`: the recorded command, host, port and user are the requested ones.
    SameId { same_operation: bool },
    /// Drive it: `cairn attach`, `recover`, a redispatch (`own_or_wait`). `window_over`: this
    /// call's reconnect window of waiting for a live owner is over.
    Drive { window_over: bool },
    /// The owner's sweep, about an execution this replica owns that no call drives
    /// (`may_redrive`).
    Redrive,
    /// `cairn batch resume`, about one member (`fleet::resume`).
    Resume,
    /// Authorize and dispatch an execution left `accepted` (`Executor::authorize_accepted`,
    /// which [`Ask::Resume`]'s [`Route::Authorize`] calls). `has_intent`: the journal holds its
    /// intent (without one the host was never identified, and nothing can be asked).
    Approve { has_intent: bool },
    /// A drive found the execution not yet dispatched by a process that may still dispatch it
    /// (`Executor::wait_for_owner`): wait for that owner, or go on. `wait_over`: this call's
    /// reconnect window of waiting is over.
    AwaitOwner { wait_over: bool },
}

/// Where the request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// Accept and dispatch a new execution (under the requested ID, if any).
    New,
    /// Accepted, never authorized: ask the approver now, then dispatch under its own ID
    /// (`Executor::authorize_accepted`).
    Authorize,
    /// Authorized, never dispatched: dispatch under its own ID; the start guard decides
    /// (`Executor::redispatch`).
    Redispatch,
    /// `failed` (proven never started): dispatch again under its own ID
    /// (`Executor::retry_never_started`).
    RetryNeverStarted,
    /// An idempotent `unknown`: attach (probe the marker); while it stays `unknown` and no live
    /// owner holds it, record `retry_same_id` and dispatch it again under the same ID.
    RetryUnderSameId,
    /// Attach: the recovery table decides (reattach, collect, dispatch again only what provably
    /// never started, or conclude for review). For [`Ask::Matched`], one left `unknown` and not
    /// held by a live owner then shows the review record; for [`Ask::AwaitOwner`], stop waiting:
    /// the drive that asked goes on from what the journal holds then.
    Attach,
    /// Never dispatched, and nobody will send it (or waiting for that was given up): recover it
    /// (`failed` when its owner is gone); a matched request then accepts anew if it is `failed`.
    Recover,
    /// Touch nothing; show the review record.
    Review,
    /// Wait for its owner (ask again when it moved, or after a while).
    Wait,
    /// Its owner's lease expired: take it over (fenced, bounded by the journal) and ask again.
    TakeOver,
    /// This call drives it.
    Drive,
    /// A live owner holds it past this call's window: answer what the journal holds, as held by
    /// that owner; nothing is concluded.
    HeldByAnother,
    /// Settled: report the journal's outcome.
    Settled,
    /// Leave it alone (the owner's sweep does not pick it up).
    LeaveAlone,
    /// The ID names another operation: refuse.
    Conflict,
}

/// Whether an earlier execution in `state` holds the match of a new request of its intent
/// (`choose_match`): one not settled, one with a result not yet delivered, or one `unknown` or
/// `interrupted` unless its class lets a new execution run (read-only, within limits).
pub fn holds_match(state: State, class: Class, unsettled_matches: usize) -> bool {
    match state {
        State::Accepted
        | State::Authorized
        | State::Dispatched
        | State::Running
        | State::Completed
        | State::Cancelled => true,
        State::Unknown | State::Interrupted => {
            class.after_unknown(unsettled_matches) != AfterUnknown::RunAgain
        }
        State::Failed | State::Rejected | State::Delivered => false,
    }
}

/// The admission table (see the module's documentation). Pure: same inputs, same answer.
pub fn route(ask: Ask, f: &Facts) -> Route {
    match ask {
        Ask::Resume => resume(f.recorded),
        Ask::SameId { same_operation } => match (f.recorded, same_operation) {
            (Recorded::Absent, _) => Route::New,
            (_, true) => Route::Attach,
            (_, false) => Route::Conflict,
        },
        Ask::Run {
            unsettled_matches,
            owner_wait_over,
        } => match f.recorded {
            Recorded::At(s) if holds_match(s, f.class, unsettled_matches) => {
                matched(f, owner_wait_over)
            }
            _ => Route::New,
        },
        Ask::Matched { owner_wait_over } => matched(f, owner_wait_over),
        Ask::Drive { window_over } => drive(f, window_over),
        Ask::Redrive => redrive(f),
        Ask::Approve { has_intent } => approve(f, has_intent),
        Ask::AwaitOwner { wait_over } => await_owner(f, wait_over),
    }
}

/// `Executor::authorize_accepted`: only an execution still `accepted`, that no owner may still
/// dispatch (it would be authorized twice), and whose intent the journal holds is asked for now;
/// anything else is attached to (the recovery table decides).
fn approve(f: &Facts, has_intent: bool) -> Route {
    match f.recorded {
        Recorded::At(State::Accepted) if !f.owner.may_dispatch() && has_intent => Route::Authorize,
        _ => Route::Attach,
    }
}

/// `Executor::wait_for_owner`: wait while the execution is not yet dispatched and its owner may
/// still dispatch it, within the window; then the drive goes on.
fn await_owner(f: &Facts, wait_over: bool) -> Route {
    let pending = matches!(
        f.recorded.state(),
        Some(State::Accepted | State::Authorized)
    );
    if pending && f.owner.may_dispatch() && !wait_over {
        Route::Wait
    } else {
        Route::Attach
    }
}

/// `fleet::resume`: the member's state alone picks the mode; the executor's call for it checks
/// the owner (`authorize_accepted` asks [`Ask::Approve`], which attaches to one a live owner
/// holds; `redispatch` and `attach` go through `own_or_wait`).
fn resume(recorded: Recorded) -> Route {
    match recorded {
        Recorded::Absent => Route::New,
        Recorded::At(State::Delivered) => Route::Settled,
        Recorded::At(State::Accepted) => Route::Authorize,
        Recorded::At(State::Authorized) => Route::Redispatch,
        Recorded::At(State::Failed) => Route::RetryNeverStarted,
        Recorded::Stateless | Recorded::At(_) => Route::Attach,
    }
}

/// `Executor::attach_matched`. A candidate always has a state; without one (not reached) the
/// request is new when nothing is recorded and attaches otherwise.
fn matched(f: &Facts, owner_wait_over: bool) -> Route {
    let state = match f.recorded {
        Recorded::Absent => return Route::New,
        Recorded::Stateless => return Route::Attach,
        Recorded::At(s) => s,
    };
    let pending = matches!(
        state,
        State::Accepted | State::Authorized | State::Dispatched
    );
    if pending && f.owner.may_dispatch() && !owner_wait_over {
        return Route::Wait;
    }
    match state {
        State::Accepted | State::Authorized => Route::Recover,
        State::Failed => Route::New,
        State::Interrupted => Route::Review,
        // (`attach_matched` asks the class rule with no earlier unknown attempts)
        State::Unknown => match f.class.after_unknown(0) {
            AfterUnknown::Review | AfterUnknown::RunAgain => Route::Review,
            AfterUnknown::ProbeMarker => Route::Attach,
            AfterUnknown::RetrySameId => Route::RetryUnderSameId,
        },
        State::Dispatched
        | State::Running
        | State::Completed
        | State::Cancelled
        | State::Rejected
        | State::Delivered => Route::Attach,
    }
}

/// `Executor::own_or_wait`: on a journal shared by replicas an execution is driven by its owner.
fn drive(f: &Facts, window_over: bool) -> Route {
    if f.owner == Owner::Nobody {
        return Route::Drive;
    }
    if f.recorded.state().is_some_and(State::is_settled) {
        return Route::Settled;
    }
    match f.owner {
        Owner::Nobody | Owner::Here => Route::Drive,
        Owner::HereBusy => Route::Wait,
        Owner::Dead => Route::TakeOver,
        // A run its owner drives, or would pick up once undriven, ends with a result worth
        // waiting for: another window. Only one its owner leaves alone is answered as held.
        Owner::Live if !window_over || redrive(f) == Route::Drive => Route::Wait,
        Owner::Live => Route::HeldByAnother,
    }
}

/// `may_redrive`: the owner's sweep picks up what is not settled, not `unknown` (a call
/// concluded it), not detached, and picked up fewer than [`MAX_REDRIVES`] times.
fn redrive(f: &Facts) -> Route {
    let live = matches!(
        f.recorded.state(),
        Some(State::Accepted | State::Authorized | State::Dispatched | State::Running)
    );
    if live && !f.detached && f.redrives < MAX_REDRIVES {
        Route::Drive
    } else {
        Route::LeaveAlone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use State::*;

    fn recordeds() -> impl Iterator<Item = Recorded> + Clone {
        [Recorded::Absent, Recorded::Stateless]
            .into_iter()
            .chain(State::ALL.into_iter().map(Recorded::At))
    }

    /// Every combination of facts the table distinguishes (redrives around the bound).
    fn all_facts() -> Vec<Facts> {
        let mut v = Vec::new();
        for recorded in recordeds() {
            for class in Class::ALL {
                for owner in Owner::ALL {
                    for redrives in 0..=MAX_REDRIVES + 1 {
                        for detached in [false, true] {
                            v.push(Facts {
                                recorded,
                                class,
                                owner,
                                redrives,
                                detached,
                            });
                        }
                    }
                }
            }
        }
        v
    }

    fn all_asks() -> Vec<Ask> {
        let mut v = vec![Ask::Redrive, Ask::Resume];
        for b in [false, true] {
            v.push(Ask::Approve { has_intent: b });
            v.push(Ask::AwaitOwner { wait_over: b });
            v.push(Ask::Matched { owner_wait_over: b });
            v.push(Ask::SameId { same_operation: b });
            v.push(Ask::Drive { window_over: b });
            for unsettled_matches in 0..=READ_ONLY_RETRY_LIMIT + 1 {
                v.push(Ask::Run {
                    unsettled_matches,
                    owner_wait_over: b,
                });
            }
        }
        v
    }

    /// The executor's and the fleet's own code, transcribed statement by statement in their
    /// order (not as the table is written): the table must agree on every combination.
    // Long: one arm per ask, each a caller's code transcribed in its own order; split up, the
    // copy would no longer read as the code it checks.
    fn as_the_code_does(ask: Ask, f: &Facts) -> Route {
        let state = f.recorded.state();
        // may_redrive
        let may_redrive = || {
            let Some(s) = state else { return false };
            if !matches!(s, Accepted | Authorized | Dispatched | Running) {
                return false;
            }
            if f.detached {
                return false;
            }
            f.redrives < MAX_REDRIVES
        };
        match ask {
            // fleet::resume
            Ask::Resume => match state {
                None if f.recorded == Recorded::Absent => Route::New,
                Some(Delivered) => Route::Settled,
                Some(Accepted) => Route::Authorize,
                Some(Authorized) => Route::Redispatch,
                Some(Failed) => Route::RetryNeverStarted,
                _ => Route::Attach,
            },
            // Executor::execute with `--id`
            Ask::SameId { same_operation } => {
                if f.recorded != Recorded::Absent {
                    if !same_operation {
                        return Route::Conflict;
                    }
                    return Route::Attach;
                }
                Route::New
            }
            // choose_match, then attach_matched
            Ask::Run {
                unsettled_matches,
                owner_wait_over,
            } => {
                let Some(s) = state else { return Route::New };
                let holds = match s {
                    Failed | Rejected | Delivered => false,
                    Unknown | Interrupted => {
                        f.class.after_unknown(unsettled_matches) != AfterUnknown::RunAgain
                    }
                    _ => true,
                };
                if !holds {
                    return Route::New;
                }
                as_the_code_does(Ask::Matched { owner_wait_over }, f)
            }
            // attach_matched
            Ask::Matched { owner_wait_over } => {
                let Some(state) = state else {
                    return if f.recorded == Recorded::Absent {
                        Route::New
                    } else {
                        Route::Attach
                    };
                };
                if matches!(state, Accepted | Authorized | Dispatched)
                    && !owner_wait_over
                    && matches!(f.owner, Owner::HereBusy | Owner::Live)
                {
                    return Route::Wait;
                }
                if matches!(state, Accepted | Authorized) {
                    return Route::Recover;
                }
                if state == Failed {
                    return Route::New;
                }
                match state {
                    Interrupted => Route::Review,
                    Unknown => match f.class.after_unknown(0) {
                        AfterUnknown::Review | AfterUnknown::RunAgain => Route::Review,
                        AfterUnknown::ProbeMarker => Route::Attach,
                        AfterUnknown::RetrySameId => Route::RetryUnderSameId,
                    },
                    _ => Route::Attach,
                }
            }
            // own_or_wait
            Ask::Drive { window_over } => {
                if f.owner == Owner::Nobody {
                    return Route::Drive;
                }
                // (`own_or_wait` says "go ahead": the drive then reports the journal's outcome)
                if state.is_some_and(|s| s.is_settled()) {
                    return Route::Settled;
                }
                if matches!(f.owner, Owner::Here | Owner::HereBusy) {
                    return if f.owner == Owner::Here {
                        Route::Drive
                    } else {
                        Route::Wait
                    };
                } else if f.owner == Owner::Dead {
                    return Route::TakeOver;
                }
                if window_over && !may_redrive() {
                    return Route::HeldByAnother;
                }
                Route::Wait
            }
            Ask::Redrive => {
                if may_redrive() {
                    Route::Drive
                } else {
                    Route::LeaveAlone
                }
            }
            // authorize_accepted
            Ask::Approve { has_intent } => {
                if state != Some(Accepted) || matches!(f.owner, Owner::HereBusy | Owner::Live) {
                    return Route::Attach;
                }
                if !has_intent {
                    // accepted without an intent: the host was never identified
                    return Route::Attach;
                }
                Route::Authorize
            }
            // wait_for_owner: `while now < deadline { if !pending || no owner { break } wait }`
            Ask::AwaitOwner { wait_over } => {
                if wait_over {
                    return Route::Attach;
                }
                let pending = matches!(state, Some(Accepted | Authorized));
                if !pending || !matches!(f.owner, Owner::HereBusy | Owner::Live) {
                    return Route::Attach;
                }
                Route::Wait
            }
        }
    }

    #[test]
    fn every_combination_routes_as_the_code_does() {
        let mut rows = 0;
        for ask in all_asks() {
            for f in all_facts() {
                assert_eq!(route(ask, &f), as_the_code_does(ask, &f), "{ask:?} {f:?}");
                rows += 1;
            }
        }
        assert_eq!(rows, all_asks().len() * 13 * 6 * 5 * 5 * 2);
    }

    /// The fleet's router looks at the recorded state alone.
    #[test]
    fn resume_routes_by_the_recorded_state_alone() {
        for f in all_facts() {
            let bare = Facts {
                class: Class::RemoteCommand,
                owner: Owner::Nobody,
                redrives: 0,
                detached: false,
                ..f
            };
            assert_eq!(route(Ask::Resume, &f), route(Ask::Resume, &bare), "{f:?}");
        }
        let want = [
            (Recorded::Absent, Route::New),
            (Recorded::Stateless, Route::Attach),
            (Recorded::At(Accepted), Route::Authorize),
            (Recorded::At(Authorized), Route::Redispatch),
            (Recorded::At(Rejected), Route::Attach),
            (Recorded::At(Dispatched), Route::Attach),
            (Recorded::At(Running), Route::Attach),
            (Recorded::At(Completed), Route::Attach),
            (Recorded::At(Failed), Route::RetryNeverStarted),
            (Recorded::At(Interrupted), Route::Attach),
            (Recorded::At(Unknown), Route::Attach),
            (Recorded::At(Cancelled), Route::Attach),
            (Recorded::At(Delivered), Route::Settled),
        ];
        assert_eq!(want.len(), recordeds().count());
        for (recorded, r) in want {
            let f = Facts {
                recorded,
                class: Class::RemoteCommand,
                owner: Owner::Nobody,
                redrives: 0,
                detached: false,
            };
            assert_eq!(route(Ask::Resume, &f), r, "{recorded:?}");
        }
    }

    /// The routes that send the command (again): only what provably never left, or never
    /// started, or an idempotent `unknown` under its own ID.
    fn dispatches(r: Route) -> bool {
        matches!(
            r,
            Route::Redispatch | Route::RetryNeverStarted | Route::RetryUnderSameId
        )
    }

    #[test]
    fn a_settled_execution_is_never_dispatched_again_but_a_failed_one_by_resume() {
        for ask in all_asks() {
            for f in all_facts() {
                let Some(s) = f.recorded.state() else {
                    continue;
                };
                let r = route(ask, &f);
                if s.is_settled() && dispatches(r) {
                    assert_eq!((s, ask, r), (Failed, Ask::Resume, Route::RetryNeverStarted));
                }
                if s.is_settled() {
                    assert!(
                        !matches!(r, Route::Drive | Route::TakeOver | Route::Recover)
                            || f.owner == Owner::Nobody,
                        "{ask:?} {f:?} -> {r:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_execution_a_live_other_owner_holds_is_never_driven_here() {
        for window_over in [false, true] {
            for f in all_facts().into_iter().filter(|f| f.owner == Owner::Live) {
                let r = route(Ask::Drive { window_over }, &f);
                assert!(
                    matches!(r, Route::Wait | Route::HeldByAnother | Route::Settled),
                    "{f:?} -> {r:?}"
                );
            }
        }
        // a matched request waits for it while it may still be dispatched
        for s in [Accepted, Authorized, Dispatched] {
            for owner in [Owner::Live, Owner::HereBusy] {
                let f = Facts {
                    recorded: Recorded::At(s),
                    class: Class::RemoteCommand,
                    owner,
                    redrives: 0,
                    detached: false,
                };
                let r = route(
                    Ask::Matched {
                        owner_wait_over: false,
                    },
                    &f,
                );
                assert_eq!(r, Route::Wait, "{f:?}");
            }
        }
    }

    /// The promise of `authorize_accepted`: an accepted execution an owner may still dispatch
    /// (another live process, or another call of this one) is never authorized by this call,
    /// so never asked for and dispatched twice; nor one past `accepted`, nor one without an
    /// intent. Only the remaining case is.
    #[test]
    fn an_accepted_execution_an_owner_may_still_dispatch_is_never_authorized_twice() {
        for f in all_facts() {
            for has_intent in [false, true] {
                let r = route(Ask::Approve { has_intent }, &f);
                let only = f.recorded == Recorded::At(Accepted)
                    && matches!(f.owner, Owner::Nobody | Owner::Here | Owner::Dead)
                    && has_intent;
                assert_eq!(r == Route::Authorize, only, "{has_intent} {f:?} -> {r:?}");
                assert!(
                    matches!(r, Route::Authorize | Route::Attach),
                    "{f:?} -> {r:?}"
                );
            }
        }
        let accepted = |owner| Facts {
            recorded: Recorded::At(Accepted),
            class: Class::Irreversible,
            owner,
            redrives: 0,
            detached: false,
        };
        let approve = Ask::Approve { has_intent: true };
        assert_eq!(route(approve, &accepted(Owner::Live)), Route::Attach);
        assert_eq!(route(approve, &accepted(Owner::HereBusy)), Route::Attach);
        assert_eq!(route(approve, &accepted(Owner::Nobody)), Route::Authorize);
    }

    /// A drive waits for an owner only while that owner may still dispatch an execution it has
    /// not dispatched yet, and never past its window; then it goes on (a dispatched one is
    /// watched).
    #[test]
    fn a_drive_waits_for_an_owner_only_while_it_may_still_dispatch() {
        for f in all_facts() {
            let over = route(Ask::AwaitOwner { wait_over: true }, &f);
            assert_eq!(over, Route::Attach, "{f:?}");
            let r = route(Ask::AwaitOwner { wait_over: false }, &f);
            let waits = matches!(f.recorded.state(), Some(Accepted | Authorized))
                && matches!(f.owner, Owner::Live | Owner::HereBusy);
            assert_eq!(r == Route::Wait, waits, "{f:?} -> {r:?}");
            assert!(matches!(r, Route::Wait | Route::Attach), "{f:?} -> {r:?}");
        }
        let f = Facts {
            recorded: Recorded::At(Dispatched),
            class: Class::RemoteCommand,
            owner: Owner::Live,
            redrives: 0,
            detached: false,
        };
        assert_eq!(
            route(Ask::AwaitOwner { wait_over: false }, &f),
            Route::Attach
        );
    }

    #[test]
    fn an_irreversible_or_unrecognized_class_that_is_unknown_goes_to_review() {
        for class in [Class::Irreversible, Class::Unrecognized] {
            for owner in Owner::ALL {
                for b in [false, true] {
                    let f = Facts {
                        recorded: Recorded::At(Unknown),
                        class,
                        owner,
                        redrives: 0,
                        detached: false,
                    };
                    assert_eq!(
                        route(Ask::Matched { owner_wait_over: b }, &f),
                        Route::Review
                    );
                    for n in 0..=READ_ONLY_RETRY_LIMIT + 1 {
                        let ask = Ask::Run {
                            unsettled_matches: n,
                            owner_wait_over: b,
                        };
                        assert_eq!(route(ask, &f), Route::Review);
                    }
                }
            }
        }
        // interrupted goes to review whatever the class, once it holds the match
        for class in Class::ALL {
            let f = Facts {
                recorded: Recorded::At(Interrupted),
                class,
                owner: Owner::Nobody,
                redrives: 0,
                detached: false,
            };
            let r = route(
                Ask::Matched {
                    owner_wait_over: true,
                },
                &f,
            );
            assert_eq!(r, Route::Review, "{class:?}");
        }
    }

    #[test]
    fn a_read_only_unknown_runs_again_within_its_limit_then_goes_to_review() {
        let f = Facts {
            recorded: Recorded::At(Unknown),
            class: Class::ReadOnly,
            owner: Owner::Nobody,
            redrives: 0,
            detached: false,
        };
        for n in 0..=READ_ONLY_RETRY_LIMIT + 1 {
            let ask = Ask::Run {
                unsettled_matches: n,
                owner_wait_over: true,
            };
            let want = if n < READ_ONLY_RETRY_LIMIT {
                Route::New
            } else {
                Route::Review
            };
            assert_eq!(route(ask, &f), want, "{n}");
        }
    }

    #[test]
    fn redrive_is_bounded() {
        for f in all_facts() {
            if f.redrives >= MAX_REDRIVES || f.detached {
                assert_eq!(route(Ask::Redrive, &f), Route::LeaveAlone, "{f:?}");
            }
        }
        let f = |redrives| Facts {
            recorded: Recorded::At(Running),
            class: Class::RemoteCommand,
            owner: Owner::Here,
            redrives,
            detached: false,
        };
        assert_eq!(route(Ask::Redrive, &f(MAX_REDRIVES - 1)), Route::Drive);
        assert_eq!(route(Ask::Redrive, &f(MAX_REDRIVES)), Route::LeaveAlone);
        // past the bound, a live owner's execution is answered as held at the window's end
        let held = Facts {
            owner: Owner::Live,
            ..f(MAX_REDRIVES)
        };
        let ask = Ask::Drive { window_over: true };
        assert_eq!(route(ask, &held), Route::HeldByAnother);
        let waited = Facts {
            owner: Owner::Live,
            ..f(0)
        };
        assert_eq!(route(ask, &waited), Route::Wait);
    }

    #[test]
    fn unknown_is_left_to_the_call_that_concluded_it_by_the_sweep() {
        let f = Facts {
            recorded: Recorded::At(Unknown),
            class: Class::Idempotent,
            owner: Owner::Here,
            redrives: 0,
            detached: false,
        };
        assert_eq!(route(Ask::Redrive, &f), Route::LeaveAlone);
    }

    #[test]
    fn a_dead_owner_is_taken_over_and_a_busy_one_here_is_waited_for() {
        let f = |owner| Facts {
            recorded: Recorded::At(Dispatched),
            class: Class::RemoteCommand,
            owner,
            redrives: 0,
            detached: false,
        };
        let ask = Ask::Drive { window_over: true };
        assert_eq!(route(ask, &f(Owner::Dead)), Route::TakeOver);
        assert_eq!(route(ask, &f(Owner::HereBusy)), Route::Wait);
        assert_eq!(route(ask, &f(Owner::Here)), Route::Drive);
        assert_eq!(route(ask, &f(Owner::Nobody)), Route::Drive);
    }

    #[test]
    fn a_run_under_a_recorded_id_never_runs_twice() {
        for f in all_facts() {
            let same = route(
                Ask::SameId {
                    same_operation: true,
                },
                &f,
            );
            let other = route(
                Ask::SameId {
                    same_operation: false,
                },
                &f,
            );
            if f.recorded == Recorded::Absent {
                assert_eq!((same, other), (Route::New, Route::New));
            } else {
                assert_eq!((same, other), (Route::Attach, Route::Conflict));
            }
        }
    }

    #[test]
    fn a_match_is_held_until_the_outcome_is_delivered_or_proven_never_started() {
        for s in State::ALL {
            for class in Class::ALL {
                let held = holds_match(s, class, 0);
                let want = match s {
                    Failed | Rejected | Delivered => false,
                    Unknown | Interrupted => class != Class::ReadOnly,
                    _ => true,
                };
                assert_eq!(held, want, "{s} {class:?}");
            }
        }
    }

    #[test]
    fn recorded_class_names_parse_like_the_cli_and_unknown_names_are_strictest() {
        assert_eq!(Class::from_recorded("read-only"), Class::ReadOnly);
        assert_eq!(Class::from_recorded("read_only"), Class::ReadOnly);
        assert_eq!(Class::from_recorded("remote_command"), Class::RemoteCommand);
        assert_eq!(Class::from_recorded("irreversible"), Class::Irreversible);
        assert_eq!(Class::from_recorded("payment"), Class::Unrecognized);
        assert_eq!(Class::Unrecognized.after_unknown(0), AfterUnknown::Review);
    }
}
