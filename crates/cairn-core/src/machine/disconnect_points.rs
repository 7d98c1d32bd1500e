//! Every disconnect point of a run, without a network.
//!
//! A fresh `cairn run` (it waits for the outcome and streams output) is driven step by step by
//! a scripted driver that does what `cairn::executor` does: it carries out the machine's notes
//! before the step they came with (barrier notes durable in a journal of its own), makes the
//! `dispatched` event durable before it feeds [`Event::Dispatched`], calls
//! [`Machine::start_seen`] for a started record as it streams, and holds `running` until the
//! reply carries the outcome or `cairn::executor`'s hold time is up.
//!
//! At each point of [`POINTS`] two faults are tried:
//! - the connection is lost there: the same drive notices it where the driver would (a connect
//!   that fails, an exec that breaks), reaches the host again, and is given each answer the host
//!   (or the journal, or the request's gate) can give next: [`AFTER_LOSS`];
//! - the client is killed there: what the journal holds at that point is all a new process has;
//!   it becomes the [`Prior`] of a new machine, in `recover` mode and in `attach` mode, given
//!   each answer: [`AFTER_KILL`].
//!
//! A detached run (`cairn run --detach`: it returns once the start is durable on the host) has
//! its own table, [`DETACHED_POINTS`]: the points of a run up to the start record (a detached
//! dispatch streams nothing after it), and [`Detached`], where its reply is over and the client
//! has returned. A connection lost there is driven on detached, through [`AFTER_LOSS_DETACHED`];
//! a client killed there, and the `attach`, `status` (what `recover` does) or `recover` run
//! later, read the journal as after any kill: [`AFTER_KILL`].
//!
//! Each combination must end as its row says, and every step of every drive is checked for the
//! invariants: no dispatch once the drive saw the start guard crossed; bytes leave only right
//! after their `dispatched` event is durable; `completed` only from a finish record; `failed`
//! never once the host showed the guard crossed (to this drive or to the one killed before it).

use std::time::Instant;

use super::tests::{answer, connected, failed, ms, patience, ATTACH, KEY, RUN};
use super::*;
use crate::event::EventKind;
use crate::recovery::Liveness::{self, *};

/// A key another host presents.
const OTHER: &str = "SHA256:other";

/// The steps of a fresh `cairn run`, in protocol order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Point {
    /// The drive has begun: its first connect is out (the key is pinned since `accepted`).
    BeforeConnect,
    /// The first connect failed, transiently: waiting to try again.
    ConnectFailedTransient,
    /// The first connect failed for good: the drive settles `failed` (not recorded yet).
    ConnectFailedPermanent,
    /// Connected, presenting the key pinned at `accepted`; the dispatch step is out.
    ConnectedPinned,
    /// Connected with no key pinned yet: the first one seen is pinned (in memory; it goes into
    /// the `dispatched` event).
    ConnectedUnpinned,
    /// Connected to a host presenting another key than the pinned one, before any dispatch:
    /// the drive settles `failed`, nothing was sent (not recorded yet).
    ConnectedKeyChanged,
    /// The journal read again and the request's gate crossed; `dispatched` not yet durable.
    /// (The machine is where it is at `ConnectedPinned`: only the driver has moved.)
    BeforeDispatchedDurable,
    /// `dispatched` is durable; no byte of the dispatch has left.
    DispatchedNothingSent,
    /// The dispatch's bytes are sent; no reply line has come back.
    SentNoReply,
    /// The guard's verdict `started` came back; the started record line not yet.
    VerdictOnly,
    /// The started record came back; `running` is held (not durable yet: it waits a moment for
    /// the outcome to share its transaction).
    StartedRunningHeld,
    /// Output flowing; `running` is durable.
    MidStream,
    /// The reply ended without a finish record (the supervisor alive): waiting to look again.
    EndedWithoutFinish,
    /// Lost mid-stream, reached again with the pinned key; the watch has not answered yet.
    ReconnectedPinned,
    /// The finish record line came back; the reply is not over (`running` durable).
    FinishSeen,
    /// The same for a command so short that `running` is still held.
    FinishSeenRunningHeld,
    /// The reply is over with its finish record: the result is collected (`completed` not
    /// recorded yet).
    Collecting,
    /// A detached run only: the reply to its dispatch is over with the started record; the
    /// drive is done, `running` durable, and `cairn run --detach` has returned.
    Detached,
}

/// What the connection lost at a point comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    /// Nothing was sent: reach the host again and dispatch.
    Redial,
    /// Reach the host again and ask it; the drive has not seen the start guard crossed.
    Ask,
    /// Reach the host again and ask it; the drive has seen the start guard crossed.
    AskCrossed,
    /// The drive is over already, with this: the host is not asked.
    Over(Ends),
}

/// What the journal holds at a point (all that a new process has after a kill there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // read in the tables as "at <state>"
enum Holds {
    /// `accepted`, `authorized`: never dispatched.
    AtAuthorized,
    /// `dispatched` (and no `running`).
    AtDispatched,
    /// `running`.
    AtRunning,
}

/// The drive a new process starts after the client was killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum New {
    /// `cairn recover` (detached, no output).
    Recover,
    /// `cairn attach` (waits, streams).
    Attach,
}

/// What comes next, from the host, the journal or the request's gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Says {
    /// Nothing: the drive ends without asking.
    NotAsked,
    // Reaching the host again:
    /// A host presenting another key than the pinned one.
    OtherKey,
    /// A connect error that will not go away.
    Permanent,
    /// Unreachable for the whole reconnect window.
    WindowOut,
    // Before a fresh dispatch:
    /// The journal, read again, shows the execution settled by another process.
    SettledMeanwhile,
    /// The request's gate refuses (its caller is gone).
    GateRefused,
    // The reply to a dispatch:
    /// `verdict started`, the started record, the output, the finish record.
    Ran,
    /// `verdict exists`, with this command's started record.
    Exists,
    /// `verdict exists`, with another command's started record.
    ExistsOther,
    /// `verdict refused`: the host refused before its start guard.
    Refused,
    // The reply to a watch (the probe):
    /// The probe did not get an answer.
    Unreachable,
    /// No started record, the epoch the dispatch was bound to.
    AbsentSame,
    /// No started record, another epoch.
    AbsentOther,
    /// A started record, no finish record: the supervisor's liveness, and whether the epoch is
    /// the same.
    Started(Liveness, bool),
    /// A finish record.
    Finished,
    /// "Finished", without the record.
    FinishedNoRecord,
    /// Something cairn cannot read (another protocol version …).
    Unreadable,
}

/// How a drive ends, or the decision it is left at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ends {
    Failed,
    Unknown,
    Interrupted,
    /// The finish record is recorded: `completed`.
    Complete,
    /// Running on the host: a detached drive is done.
    Running,
    /// The supervisor is alive: look again after a pause (streaming on).
    LookAgain,
    /// Nothing decided (no answer): try again after a pause.
    RetryLater,
    /// The marker absent, same epoch, guard never crossed: dispatched again under the same ID
    /// (the drive is followed up to its bytes leaving).
    DispatchAgain,
    /// The start guard was crossed by an earlier attempt: watched, never started again (the
    /// drive is followed up to its watch).
    WatchAgain,
    /// Settled elsewhere before anything was sent: nothing is sent.
    Withheld,
}

use Ends::*;
use Holds::*;
use Loss::*;
use New::*;
use Point::*;
use Says::*;

/// Every disconnect point, what a lost connection there comes to, and what the journal holds
/// there. (A loss right after connecting shows when the dispatch is sent, which is after its
/// `dispatched` event is durable: hence `Ask` for the points before `dispatched`.)
#[rustfmt::skip]
const POINTS: &[(Point, Loss, Holds)] = &[
    (BeforeConnect,           Redial,         AtAuthorized),
    (ConnectFailedTransient,  Redial,         AtAuthorized),
    (ConnectFailedPermanent,  Over(Failed),   AtAuthorized),
    (ConnectedPinned,         Ask,            AtAuthorized),
    (ConnectedUnpinned,       Ask,            AtAuthorized),
    (ConnectedKeyChanged,     Over(Failed),   AtAuthorized),
    (BeforeDispatchedDurable, Ask,            AtAuthorized),
    (DispatchedNothingSent,   Ask,            AtDispatched),
    (SentNoReply,             Ask,            AtDispatched),
    (VerdictOnly,             AskCrossed,     AtDispatched),
    (StartedRunningHeld,      AskCrossed,     AtDispatched),
    (MidStream,               AskCrossed,     AtRunning),
    (EndedWithoutFinish,      AskCrossed,     AtRunning),
    (ReconnectedPinned,       AskCrossed,     AtRunning),
    (FinishSeen,              AskCrossed,     AtRunning),
    (FinishSeenRunningHeld,   AskCrossed,     AtDispatched),
    (Collecting,              Over(Complete), AtRunning),
];

/// The points of a detached run: a dispatch that does not attach, so the host streams nothing
/// after the started record and the drive is done when its reply is over. Up to the start
/// record each point is the foreground run's, with what a loss there comes to and what the
/// journal holds; the points of streaming and collecting do not exist for it.
#[rustfmt::skip]
const DETACHED_POINTS: &[(Point, Loss, Holds)] = &[
    (BeforeConnect,           Redial,         AtAuthorized),
    (ConnectFailedTransient,  Redial,         AtAuthorized),
    (ConnectFailedPermanent,  Over(Failed),   AtAuthorized),
    (ConnectedPinned,         Ask,            AtAuthorized),
    (ConnectedUnpinned,       Ask,            AtAuthorized),
    (ConnectedKeyChanged,     Over(Failed),   AtAuthorized),
    (BeforeDispatchedDurable, Ask,            AtAuthorized),
    (DispatchedNothingSent,   Ask,            AtDispatched),
    (SentNoReply,             Ask,            AtDispatched),
    (VerdictOnly,             AskCrossed,     AtDispatched),
    (StartedRunningHeld,      AskCrossed,     AtDispatched),
    (Detached,                Over(Running),  AtRunning),
];

/// The foreground points a detached run does not have: they stream output or collect it.
const STREAMING_POINTS: &[Point] = &[
    MidStream,
    EndedWithoutFinish,
    ReconnectedPinned,
    FinishSeen,
    FinishSeenRunningHeld,
    Collecting,
];

/// The connection lost, then each answer: how the drive (`cairn run`, waiting) ends.
#[rustfmt::skip]
const AFTER_LOSS: &[(Loss, Says, Ends)] = &[
    // Nothing was sent yet.
    (Redial,     OtherKey,                 Failed),
    (Redial,     Permanent,                Failed),
    (Redial,     WindowOut,                Failed),
    (Redial,     SettledMeanwhile,         Withheld),
    (Redial,     GateRefused,              Failed),
    (Redial,     Ran,                      Complete),
    (Redial,     Exists,                   WatchAgain),
    (Redial,     ExistsOther,              Unknown),
    (Redial,     Refused,                  Failed),
    // Dispatched; the guard not seen crossed.
    (Ask,        OtherKey,                 Unknown),
    (Ask,        Permanent,                Unknown),
    (Ask,        WindowOut,                Unknown),
    (Ask,        Unreachable,              RetryLater),
    (Ask,        AbsentSame,               DispatchAgain),
    (Ask,        AbsentOther,              Unknown),
    (Ask,        Started(Alive, true),     LookAgain),
    (Ask,        Started(Dead, true),      Interrupted),
    (Ask,        Started(Rebooted, true),  Interrupted),
    (Ask,        Started(Alive, false),    Unknown),
    (Ask,        Started(Dead, false),     Unknown),
    (Ask,        Started(Rebooted, false), Unknown),
    (Ask,        Finished,                 Complete),
    (Ask,        FinishedNoRecord,         Unknown),
    (Ask,        Unreadable,               Unknown),
    // The guard seen crossed: a marker gone now is never a reason to send it again.
    (AskCrossed, OtherKey,                 Unknown),
    (AskCrossed, Permanent,                Unknown),
    (AskCrossed, WindowOut,                Unknown),
    (AskCrossed, Unreachable,              RetryLater),
    (AskCrossed, AbsentSame,               Unknown),
    (AskCrossed, AbsentOther,              Unknown),
    (AskCrossed, Started(Alive, true),     LookAgain),
    (AskCrossed, Started(Dead, true),      Interrupted),
    (AskCrossed, Started(Rebooted, true),  Interrupted),
    (AskCrossed, Started(Alive, false),    Unknown),
    (AskCrossed, Started(Dead, false),     Unknown),
    (AskCrossed, Started(Rebooted, false), Unknown),
    (AskCrossed, Finished,                 Complete),
    (AskCrossed, FinishedNoRecord,         Unknown),
    (AskCrossed, Unreadable,               Unknown),
];

/// The connection lost, then each answer: how a detached drive (`cairn run --detach`) ends. As
/// [`AFTER_LOSS`], except that a command found running is where it stops (`Running` in place
/// of looking again), and a dispatch that starts it is answered by its started record alone.
#[rustfmt::skip]
const AFTER_LOSS_DETACHED: &[(Loss, Says, Ends)] = &[
    // Nothing was sent yet.
    (Redial,     OtherKey,                 Failed),
    (Redial,     Permanent,                Failed),
    (Redial,     WindowOut,                Failed),
    (Redial,     SettledMeanwhile,         Withheld),
    (Redial,     GateRefused,              Failed),
    (Redial,     Ran,                      Running),
    (Redial,     Exists,                   WatchAgain),
    (Redial,     ExistsOther,              Unknown),
    (Redial,     Refused,                  Failed),
    // Dispatched; the guard not seen crossed.
    (Ask,        OtherKey,                 Unknown),
    (Ask,        Permanent,                Unknown),
    (Ask,        WindowOut,                Unknown),
    (Ask,        Unreachable,              RetryLater),
    (Ask,        AbsentSame,               DispatchAgain),
    (Ask,        AbsentOther,              Unknown),
    (Ask,        Started(Alive, true),     Running),
    (Ask,        Started(Dead, true),      Interrupted),
    (Ask,        Started(Rebooted, true),  Interrupted),
    (Ask,        Started(Alive, false),    Unknown),
    (Ask,        Started(Dead, false),     Unknown),
    (Ask,        Started(Rebooted, false), Unknown),
    (Ask,        Finished,                 Complete),
    (Ask,        FinishedNoRecord,         Unknown),
    (Ask,        Unreadable,               Unknown),
    // The guard seen crossed: a marker gone now is never a reason to send it again.
    (AskCrossed, OtherKey,                 Unknown),
    (AskCrossed, Permanent,                Unknown),
    (AskCrossed, WindowOut,                Unknown),
    (AskCrossed, Unreachable,              RetryLater),
    (AskCrossed, AbsentSame,               Unknown),
    (AskCrossed, AbsentOther,              Unknown),
    (AskCrossed, Started(Alive, true),     Running),
    (AskCrossed, Started(Dead, true),      Interrupted),
    (AskCrossed, Started(Rebooted, true),  Interrupted),
    (AskCrossed, Started(Alive, false),    Unknown),
    (AskCrossed, Started(Dead, false),     Unknown),
    (AskCrossed, Started(Rebooted, false), Unknown),
    (AskCrossed, Finished,                 Complete),
    (AskCrossed, FinishedNoRecord,         Unknown),
    (AskCrossed, Unreadable,               Unknown),
];

/// The client killed, then a new process in each mode, then each answer: how it ends. (What
/// the killed drive saw and did not record is gone: with `dispatched` and no `running`, a
/// marker absent under the same epoch is sent again, and the host's start guard is what
/// keeps that to one run.)
#[rustfmt::skip]
const AFTER_KILL: &[(Holds, New, Says, Ends)] = &[
    // Never dispatched: no byte left, nothing to ask.
    (AtAuthorized, Recover, NotAsked,                 Failed),
    (AtAuthorized, Attach,  NotAsked,                 Failed),
    // Dispatched, no `running` on record.
    (AtDispatched, Recover, OtherKey,                 Unknown),
    (AtDispatched, Recover, Permanent,                Unknown),
    (AtDispatched, Recover, WindowOut,                Unknown),
    (AtDispatched, Recover, Unreachable,              RetryLater),
    (AtDispatched, Recover, AbsentSame,               DispatchAgain),
    (AtDispatched, Recover, AbsentOther,              Unknown),
    (AtDispatched, Recover, Started(Alive, true),     Running),
    (AtDispatched, Recover, Started(Dead, true),      Interrupted),
    (AtDispatched, Recover, Started(Rebooted, true),  Interrupted),
    (AtDispatched, Recover, Started(Alive, false),    Unknown),
    (AtDispatched, Recover, Started(Dead, false),     Unknown),
    (AtDispatched, Recover, Started(Rebooted, false), Unknown),
    (AtDispatched, Recover, Finished,                 Complete),
    (AtDispatched, Recover, FinishedNoRecord,         Unknown),
    (AtDispatched, Recover, Unreadable,               Unknown),
    (AtDispatched, Attach,  OtherKey,                 Unknown),
    (AtDispatched, Attach,  Permanent,                Unknown),
    (AtDispatched, Attach,  WindowOut,                Unknown),
    (AtDispatched, Attach,  Unreachable,              RetryLater),
    (AtDispatched, Attach,  AbsentSame,               DispatchAgain),
    (AtDispatched, Attach,  AbsentOther,              Unknown),
    (AtDispatched, Attach,  Started(Alive, true),     LookAgain),
    (AtDispatched, Attach,  Started(Dead, true),      Interrupted),
    (AtDispatched, Attach,  Started(Rebooted, true),  Interrupted),
    (AtDispatched, Attach,  Started(Alive, false),    Unknown),
    (AtDispatched, Attach,  Started(Dead, false),     Unknown),
    (AtDispatched, Attach,  Started(Rebooted, false), Unknown),
    (AtDispatched, Attach,  Finished,                 Complete),
    (AtDispatched, Attach,  FinishedNoRecord,         Unknown),
    (AtDispatched, Attach,  Unreadable,               Unknown),
    // `running` on record: a marker gone now is unknown.
    (AtRunning,    Recover, OtherKey,                 Unknown),
    (AtRunning,    Recover, Permanent,                Unknown),
    (AtRunning,    Recover, WindowOut,                Unknown),
    (AtRunning,    Recover, Unreachable,              RetryLater),
    (AtRunning,    Recover, AbsentSame,               Unknown),
    (AtRunning,    Recover, AbsentOther,              Unknown),
    (AtRunning,    Recover, Started(Alive, true),     Running),
    (AtRunning,    Recover, Started(Dead, true),      Interrupted),
    (AtRunning,    Recover, Started(Rebooted, true),  Interrupted),
    (AtRunning,    Recover, Started(Alive, false),    Unknown),
    (AtRunning,    Recover, Started(Dead, false),     Unknown),
    (AtRunning,    Recover, Started(Rebooted, false), Unknown),
    (AtRunning,    Recover, Finished,                 Complete),
    (AtRunning,    Recover, FinishedNoRecord,         Unknown),
    (AtRunning,    Recover, Unreadable,               Unknown),
    (AtRunning,    Attach,  OtherKey,                 Unknown),
    (AtRunning,    Attach,  Permanent,                Unknown),
    (AtRunning,    Attach,  WindowOut,                Unknown),
    (AtRunning,    Attach,  Unreachable,              RetryLater),
    (AtRunning,    Attach,  AbsentSame,               Unknown),
    (AtRunning,    Attach,  AbsentOther,              Unknown),
    (AtRunning,    Attach,  Started(Alive, true),     LookAgain),
    (AtRunning,    Attach,  Started(Dead, true),      Interrupted),
    (AtRunning,    Attach,  Started(Rebooted, true),  Interrupted),
    (AtRunning,    Attach,  Started(Alive, false),    Unknown),
    (AtRunning,    Attach,  Started(Dead, false),     Unknown),
    (AtRunning,    Attach,  Started(Rebooted, false), Unknown),
    (AtRunning,    Attach,  Finished,                 Complete),
    (AtRunning,    Attach,  FinishedNoRecord,         Unknown),
    (AtRunning,    Attach,  Unreadable,               Unknown),
];

/// The answers that can come when reaching the host again.
const REACH: &[Says] = &[OtherKey, Permanent, WindowOut];
/// Before and to a fresh dispatch.
const TO_DISPATCH: &[Says] = &[
    SettledMeanwhile,
    GateRefused,
    Ran,
    Exists,
    ExistsOther,
    Refused,
];
/// To a watch.
const TO_WATCH: &[Says] = &[
    Unreachable,
    AbsentSame,
    AbsentOther,
    Started(Alive, true),
    Started(Dead, true),
    Started(Rebooted, true),
    Started(Alive, false),
    Started(Dead, false),
    Started(Rebooted, false),
    Finished,
    FinishedNoRecord,
    Unreadable,
];

/// The answers that apply where the next exec is a dispatch (`dispatch`) or a watch.
fn applicable(dispatch: bool) -> Vec<Says> {
    let next = if dispatch { TO_DISPATCH } else { TO_WATCH };
    REACH.iter().chain(next).copied().collect()
}

/// `cairn run --detach`: a dispatch that returns once the command is known to be running.
const RUN_DETACHED: Mode = Mode {
    detach: true,
    ..RUN
};

/// The scripted driver of one drive, with the journal it keeps.
struct Drive {
    m: Machine,
    /// The drive stops once the command is known to be running (its dispatch does not attach).
    detach: bool,
    step: Step,
    now: Instant,
    /// The key the execution is pinned to (the driver's `host_key`).
    pinned: Option<String>,
    /// The journal's durable events: kinds, and the states they moved it to.
    journal: Vec<(EventKind, Option<State>)>,
    /// Events recorded but not durable yet (they share the next event's transaction).
    held: Vec<(EventKind, Option<State>)>,
    /// The key the last `dispatched` event holds.
    dispatched_key: Option<String>,
    /// This drive saw the start guard crossed.
    crossed: bool,
    /// Some drive of this execution saw it crossed (carried over a kill).
    ever_crossed: bool,
    /// How many times a dispatch's bytes left.
    sends: usize,
    /// The bytes of the current dispatch left.
    sent: bool,
    /// What the reply in flight has shown so far.
    partial: Answer,
    /// The last reply was over (not broken) with a finish record.
    last_finish: bool,
    /// Every note carried out, in order.
    notes: Vec<Note>,
}

/// A reply in flight that has shown nothing yet.
fn nothing_yet() -> Answer {
    let mut a = answer(Probe::Unreadable(
        "the reply ended before its last line".into(),
    ));
    a.received = (0, 0);
    a
}

impl Drive {
    fn new(
        prior: Prior,
        mode: Mode,
        pinned: Option<&str>,
        journal: Vec<(EventKind, Option<State>)>,
    ) -> Drive {
        let now = Instant::now();
        let mut m = Machine::new(prior);
        let step = m.start(mode, &patience(), now);
        let mut d = Drive {
            m,
            detach: mode.detach,
            step: Step::Report,
            now,
            pinned: pinned.map(str::to_owned),
            journal,
            held: Vec::new(),
            dispatched_key: None,
            crossed: prior == Prior::Started,
            ever_crossed: prior == Prior::Started,
            sends: 0,
            sent: false,
            partial: nothing_yet(),
            last_finish: false,
            notes: Vec::new(),
        };
        d.took(step);
        d
    }

    /// A fresh `cairn run` in `mode` (waiting, or detached): accepted and authorized (the host
    /// key pinned at `accepted`, or not).
    fn fresh(mode: Mode, pinned: Option<&str>) -> Drive {
        let journal = vec![
            (EventKind::Accepted, Some(State::Accepted)),
            (EventKind::Authorized, Some(State::Authorized)),
        ];
        Drive::new(Prior::NotDispatched, mode, pinned, journal)
    }

    /// What the journal holds (durable events only).
    fn holds(&self) -> Holds {
        let states: Vec<State> = self.journal.iter().filter_map(|e| e.1).collect();
        match states.last() {
            Some(State::Running) => AtRunning,
            Some(State::Dispatched) => AtDispatched,
            Some(State::Authorized) => AtAuthorized,
            other => panic!("a journal at {other:?}"),
        }
    }

    /// The client is killed: a new process reads the journal and drives the execution in `new`.
    fn killed(&self, new: New) -> Drive {
        let states: Vec<State> = self.journal.iter().filter_map(|e| e.1).collect();
        let current = *states.last().unwrap();
        let before_unknown = states.iter().rev().nth(1).copied();
        // (its owner is dead: never `Held`)
        let prior = Prior::from_journal(current, before_unknown);
        let mode = match new {
            Recover => Mode::RECOVER,
            Attach => ATTACH,
        };
        if prior != Prior::NotDispatched {
            assert_eq!(
                self.dispatched_key.as_deref(),
                Some(KEY),
                "the key the dispatch was pinned to"
            );
        }
        let mut d = Drive::new(prior, mode, Some(KEY), self.journal.clone());
        d.ever_crossed = self.ever_crossed || d.ever_crossed;
        d
    }

    fn flush(&mut self) {
        self.journal.append(&mut self.held);
    }

    /// Append an event, in one transaction with those held.
    fn record(&mut self, kind: EventKind, state: Option<State>) {
        self.held.push((kind, state));
        self.flush();
    }

    /// The machine returned `step`: carry out its notes, then check the step.
    fn took(&mut self, step: Step) {
        while let Some(n) = self.m.poll_note() {
            match &n {
                Note::Lost(_) => self.held.push((EventKind::ConnectionLost, None)),
                Note::GuardExists => self.held.push((EventKind::GuardExists, None)),
                Note::Redispatch => self.held.push((EventKind::Probe, None)),
                Note::Reconnected { .. } => self.held.push((EventKind::Reconnected, None)),
                Note::Pin(k) => self.pinned = Some(k.clone()),
                Note::Collecting => {}
            }
            // As the executor does: a barrier is durable before the next step; the others
            // may wait for a later event's transaction. (The checks below and in `reply`
            // find a barrier that is not one.)
            if n.is_barrier() {
                self.flush();
            }
            self.notes.push(n);
        }
        let prev = std::mem::replace(&mut self.step, step);
        let ctx = format!("{prev:?} → {:?}; journal {:?}", self.step, self.journal);
        match &self.step {
            Step::Dispatch { fresh } => {
                assert!(
                    !self.crossed,
                    "a dispatch after the guard was seen crossed: {ctx}"
                );
                assert!(
                    self.pinned.is_some(),
                    "a dispatch without a pinned key: {ctx}"
                );
                if !fresh {
                    // The probe that decided it is on record before the dispatch.
                    assert_eq!(self.journal.last().unwrap().0, EventKind::Probe, "{ctx}");
                }
            }
            Step::Send => {
                assert!(matches!(prev, Step::Dispatch { .. }), "{ctx}");
                assert_eq!(
                    self.journal.last().unwrap().0,
                    EventKind::Dispatched,
                    "{ctx}"
                );
            }
            Step::Complete { .. } => {
                assert!(self.last_finish, "completed without a finish record: {ctx}")
            }
            Step::Settle {
                state: State::Failed,
                ..
            } => {
                assert!(
                    !self.crossed && !self.ever_crossed,
                    "failed once started: {ctx}"
                )
            }
            Step::Settle {
                state: State::Completed,
                ..
            } => panic!("completed by conclusion: {ctx}"),
            _ => {}
        }
    }

    fn handle(&mut self, event: Event) {
        let step = self.m.handle(self.now, event);
        self.took(step);
    }

    /// The time of a wait has come.
    fn timer(&mut self) {
        let Step::Wait { until, .. } = self.step else {
            panic!("no wait: {:?}", self.step)
        };
        self.now = until;
        self.handle(Event::Timer);
    }

    /// Carry out a `Dispatch` step: the `dispatched` event made durable, then fed.
    fn dispatch(&mut self) {
        assert!(
            matches!(self.step, Step::Dispatch { .. }),
            "{:?}",
            self.step
        );
        self.record(EventKind::Dispatched, Some(State::Dispatched));
        self.dispatched_key.clone_from(&self.pinned);
        self.sent = false;
        self.partial = nothing_yet();
        self.handle(Event::Dispatched);
    }

    /// The dispatch's bytes leave.
    fn send(&mut self) {
        assert_eq!(self.step, Step::Send);
        // Each dispatched event lets one sending of the bytes out, right after it.
        assert!(!self.sent, "bytes sent twice for one dispatched event");
        assert_eq!(self.journal.last().unwrap().0, EventKind::Dispatched);
        self.sends += 1;
        self.sent = true;
    }

    /// The started record of this command streams (the driver's `on_line`).
    fn start_line(&mut self) {
        self.partial.start_matches = Some(true);
        if self.m.start_seen(true) {
            self.held.push((EventKind::Running, Some(State::Running)));
        }
        self.crossed = true;
        self.ever_crossed = true;
    }

    /// The exec of a `Send` or `Watch` is over with `a`.
    fn reply(&mut self, a: Answer) {
        assert!(
            matches!(self.step, Step::Send | Step::Watch { .. }),
            "{:?}",
            self.step
        );
        if let Some(ours) = a.start_matches {
            if ours {
                self.start_line();
            } else {
                self.m.start_seen(false);
            }
        }
        if a.finish.is_some() || matches!(a.verdict.as_deref(), Some("started" | "exists")) {
            self.crossed = true;
            self.ever_crossed = true;
        }
        self.last_finish = a.broken.is_none() && a.finish.is_some();
        // Held events wait for the outcome only when this reply carries it.
        if !self.last_finish {
            self.flush();
        }
        let broken = a.broken.is_some();
        self.partial = nothing_yet();
        self.handle(Event::Replied(a));
        if broken {
            assert_eq!(self.journal.last().unwrap().0, EventKind::ConnectionLost);
        }
    }

    /// The reply in flight breaks.
    fn broken(&mut self) {
        let mut a = self.partial.clone();
        a.broken = Some("connection reset".into());
        self.reply(a);
    }

    /// The connection is lost here; the driver notices it where it would.
    fn lose(&mut self) {
        match self.step.clone() {
            // the (next) connect attempt fails
            Step::Connect { .. } => self.handle(failed(true)),
            Step::Wait { .. } => {
                self.timer();
                self.handle(failed(true));
            }
            // noticed when the dispatch is sent: its exec breaks
            Step::Dispatch { .. } => {
                self.dispatch();
                self.broken();
            }
            Step::Send | Step::Watch { .. } => self.broken(),
            s if s.is_final() => {}
            s => panic!("a loss at {s:?}"),
        }
    }

    /// Carry the drive from where it is through `says` to its end, or to the decision it is left at.
    fn answered(&mut self, says: Says) -> Ends {
        while let Step::Wait { .. } = self.step {
            self.timer();
        }
        if self.step.is_final() {
            assert_eq!(
                says, NotAsked,
                "the drive ended without asking: {:?}",
                self.step
            );
            return self.ends();
        }
        assert_ne!(says, NotAsked, "the drive asks: {:?}", self.step);
        assert!(matches!(self.step, Step::Connect { .. }), "{:?}", self.step);
        match says {
            OtherKey => self.handle(Event::Connected {
                presented: OTHER.into(),
                pinned: self.pinned.clone(),
            }),
            Permanent => self.handle(failed(false)),
            WindowOut => {
                self.handle(failed(true));
                while let Step::Wait { .. } = self.step {
                    self.timer();
                    let Step::Connect { within: Some(left) } = self.step else {
                        panic!("after a reconnect pause: {:?}", self.step)
                    };
                    self.now += left;
                    self.handle(failed(true));
                }
            }
            _ => {
                self.handle(connected(self.pinned.as_deref()));
                match self.step {
                    Step::Dispatch { fresh: true } => match says {
                        SettledMeanwhile => self.handle(Event::SettledElsewhere),
                        GateRefused => {
                            self.handle(Event::DispatchRefused("its caller is gone".into()))
                        }
                        _ => {
                            self.dispatch();
                            self.send();
                            self.reply(dispatch_reply(says, self.detach));
                        }
                    },
                    Step::Watch { .. } => self.reply(watch_reply(says)),
                    ref s => panic!("after reaching the host again: {s:?}"),
                }
            }
        }
        self.ends()
    }

    /// How the drive ended, or the decision it was left at (followed through a dispatch again
    /// up to its bytes, and through a watch again up to the watch).
    fn ends(&mut self) -> Ends {
        match self.step.clone() {
            Step::Settle {
                state: State::Failed,
                ..
            } => Failed,
            Step::Settle {
                state: State::Unknown,
                ..
            } => Unknown,
            Step::Settle {
                state: State::Interrupted,
                ..
            } => Interrupted,
            Step::Complete { .. } => Complete,
            Step::Running { .. } => Running,
            Step::Withhold => Withheld,
            Step::Wait {
                why: Wait::Look, ..
            } => LookAgain,
            Step::Wait {
                why: Wait::Retry(_),
                ..
            } => RetryLater,
            Step::Connect { .. } if self.notes.last() == Some(&Note::Redispatch) => {
                self.handle(connected(self.pinned.as_deref()));
                assert_eq!(self.step, Step::Dispatch { fresh: false });
                self.dispatch();
                self.send();
                DispatchAgain
            }
            Step::Connect { .. } if self.notes.last() == Some(&Note::GuardExists) => {
                assert_eq!(self.journal.last().unwrap().0, EventKind::GuardExists);
                self.handle(connected(self.pinned.as_deref()));
                assert!(matches!(self.step, Step::Watch { .. }), "{:?}", self.step);
                WatchAgain
            }
            s => panic!("a drive left at {s:?}"),
        }
    }
}

/// The reply to a dispatch that says `says` (`detach`: a dispatch that does not attach, whose
/// reply ends with the started record).
fn dispatch_reply(says: Says, detach: bool) -> Answer {
    let neither = || Probe::Unreadable("reply had neither a started record nor 'absent'".into());
    let mut a = nothing_yet();
    match says {
        Ran if detach => {
            a.verdict = Some("started".into());
            a.start_matches = Some(true);
        }
        Ran => {
            a = answer(Probe::Finished);
            a.verdict = Some("started".into());
        }
        Exists => {
            a.verdict = Some("exists".into());
            a.start_matches = Some(true);
            a.probe = neither();
        }
        ExistsOther => {
            a.verdict = Some("exists".into());
            a.start_matches = Some(false);
            a.probe = Probe::Unreadable(
                "the host's started record for this ID is for another command".into(),
            );
        }
        Refused => {
            a.verdict = Some("refused".into());
            a.probe = neither();
        }
        s => panic!("{s:?} is no answer to a dispatch"),
    }
    a
}

/// The reply to a watch that says `says`.
fn watch_reply(says: Says) -> Answer {
    match says {
        Unreachable => answer(Probe::Unreachable),
        AbsentSame => answer(Probe::Absent { same_epoch: true }),
        AbsentOther => answer(Probe::Absent { same_epoch: false }),
        Started(liveness, same_epoch) => answer(Probe::Started {
            liveness,
            same_epoch,
        }),
        Finished => answer(Probe::Finished),
        FinishedNoRecord => {
            let mut a = answer(Probe::Finished);
            a.finish = None;
            a
        }
        Unreadable => answer(Probe::Unreadable(
            "unsupported started record version '9'".into(),
        )),
        s => panic!("{s:?} is no answer to a watch"),
    }
}

/// A fresh `cairn run` brought to `point` by a host that answers as it should.
fn at(point: Point) -> Drive {
    assert_ne!(point, Detached, "a point of a detached run");
    reach(RUN, point)
}

/// A fresh `cairn run --detach` brought to `point` by a host that answers as it should.
fn at_detached(point: Point) -> Drive {
    assert!(
        !STREAMING_POINTS.contains(&point),
        "{point:?}: not a point of a detached run"
    );
    reach(RUN_DETACHED, point)
}

/// A fresh run in `mode` brought to `point` by a host that answers as it should.
// Long: one run walked through the protocol's points in order, each returning where it stops.
fn reach(mode: Mode, point: Point) -> Drive {
    if point == ConnectedUnpinned {
        let mut d = Drive::fresh(mode, None);
        d.handle(connected(None));
        assert_eq!(d.notes, vec![Note::Pin(KEY.into())]);
        assert_eq!(d.step, Step::Dispatch { fresh: true });
        return d;
    }
    // (`execute` pins the key the host presented when the execution was accepted)
    let mut d = Drive::fresh(mode, Some(KEY));
    match point {
        BeforeConnect => return d,
        ConnectFailedTransient => {
            d.handle(failed(true));
            return d;
        }
        ConnectFailedPermanent => {
            d.handle(failed(false));
            return d;
        }
        ConnectedKeyChanged => {
            d.handle(Event::Connected {
                presented: OTHER.into(),
                pinned: Some(KEY.into()),
            });
            return d;
        }
        _ => {}
    }
    d.handle(connected(Some(KEY)));
    assert_eq!(d.step, Step::Dispatch { fresh: true });
    if matches!(point, ConnectedPinned | BeforeDispatchedDurable) {
        return d;
    }
    d.dispatch();
    if point == DispatchedNothingSent {
        return d;
    }
    d.send();
    if point == SentNoReply {
        return d;
    }
    d.partial.verdict = Some("started".into());
    d.crossed = true;
    d.ever_crossed = true;
    if point == VerdictOnly {
        return d;
    }
    d.start_line();
    if point == StartedRunningHeld && d.detach {
        return d;
    }
    if point == Detached {
        // the detached dispatch's reply ends with its started record: no output, no finish
        let a = d.partial.clone();
        d.reply(a);
        assert_eq!(d.step, Step::Running { recovered: false });
        return d;
    }
    d.partial.received = (2, 0);
    match point {
        StartedRunningHeld => return d,
        FinishSeenRunningHeld => {
            d.partial.finish = Some((5, 0));
            d.partial.received = (5, 0);
            return d;
        }
        _ => {}
    }
    // (the hold time is up while output streams)
    d.flush();
    match point {
        MidStream => {}
        FinishSeen => {
            d.partial.finish = Some((5, 0));
            d.partial.received = (5, 0);
        }
        Collecting => {
            let mut a = d.partial.clone();
            a.finish = Some((5, 0));
            a.received = (5, 0);
            a.probe = Probe::Finished;
            d.reply(a);
            assert_eq!(d.step, Step::Complete { recovered: false });
        }
        EndedWithoutFinish => {
            let mut a = d.partial.clone();
            a.probe = Probe::Started {
                liveness: Alive,
                same_epoch: true,
            };
            d.reply(a);
            assert!(
                matches!(
                    d.step,
                    Step::Wait {
                        why: Wait::Look,
                        ..
                    }
                ),
                "{:?}",
                d.step
            );
        }
        ReconnectedPinned => {
            d.broken();
            d.handle(connected(Some(KEY)));
            assert_eq!(d.step, Step::Watch { wait: true });
        }
        p => unreachable!("{p:?}"),
    }
    d
}

/// Each point of `points` × (lost there, killed there then `recover`, killed there then
/// `attach`) × every answer ends as its row says (`after_loss` for a loss, [`AFTER_KILL`] for a
/// kill), keeping the invariants at every step; `at` brings a fresh run to a point. Returns how
/// many combinations were driven.
// Long: one loop over the points, its two faults in order, each with the checks of its rows.
fn drive_every_fault(
    points: &[(Point, Loss, Holds)],
    after_loss: &[(Loss, Says, Ends)],
    at: fn(Point) -> Drive,
) -> usize {
    let mut combinations = 0;
    for &(point, loss, holds) in points {
        // (a) the connection lost there
        let start = at(point);
        assert_eq!(start.holds(), holds, "what the journal holds at {point:?}");
        match loss {
            Over(end) => {
                let mut d = at(point);
                d.lose();
                assert_eq!(d.answered(NotAsked), end, "{point:?}, lost");
                assert_eq!(
                    d.sends, start.sends,
                    "{point:?}: nothing sent after the loss"
                );
                combinations += 1;
            }
            _ => {
                for &(_, says, end) in after_loss.iter().filter(|r| r.0 == loss) {
                    let mut d = at(point);
                    d.lose();
                    let dispatched = d.journal.iter().any(|e| e.0 == EventKind::Dispatched);
                    assert_eq!(
                        dispatched,
                        loss != Redial,
                        "{point:?}: dispatched when the loss shows"
                    );
                    assert_eq!(
                        d.crossed,
                        loss == AskCrossed,
                        "{point:?}: the guard seen crossed"
                    );
                    let got = d.answered(says);
                    assert_eq!(got, end, "{point:?}, lost, then {says:?}: {:?}", d.step);
                    // At most one dispatch crossed the guard: once it was seen, none followed.
                    if loss == AskCrossed {
                        assert_eq!(d.sends, 1, "{point:?}, lost, then {says:?}");
                    }
                    combinations += 1;
                }
            }
        }
        // (b) the client killed there
        for new in [Recover, Attach] {
            for &(_, _, says, end) in AFTER_KILL.iter().filter(|r| r.0 == holds && r.1 == new) {
                let mut d = start.killed(new);
                let got = d.answered(says);
                assert_eq!(
                    got, end,
                    "{point:?}, killed, {new:?}, then {says:?}: {:?}",
                    d.step
                );
                combinations += 1;
            }
        }
    }
    combinations
}

/// Every point × (lost there, killed there then `recover`, killed there then `attach`) × every
/// answer ends as its row says, keeping the invariants at every step.
#[test]
fn every_disconnect_point_fault_and_answer_ends_as_tabled() {
    assert_eq!(drive_every_fault(POINTS, AFTER_LOSS, at), 515);
}

/// The same for `cairn run --detach`: every point of a detached run, lost there (driven on,
/// detached) or killed there (then `recover`, which is what `status` predicts, or `attach`, run
/// later), ends as its row says, keeping the same invariants. At [`Detached`] the client has
/// returned with the command running and one dispatch sent; what comes later is a kill's.
#[test]
fn every_detached_disconnect_point_fault_and_answer_ends_as_tabled() {
    let d = at_detached(Detached);
    assert_eq!(d.step, Step::Running { recovered: false });
    assert_eq!(d.sends, 1);
    let kinds: Vec<&str> = d.journal.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(kinds, ["accepted", "authorized", "dispatched", "running"]);
    assert_eq!(
        drive_every_fault(DETACHED_POINTS, AFTER_LOSS_DETACHED, at_detached),
        290
    );
}

/// The tables leave nothing out: each point once, and for each point and fault every answer
/// that can come next exactly once (those of a dispatch where nothing was sent yet, those of a
/// watch afterwards), and those cover every probe answer the recovery table distinguishes.
#[test]
fn the_tables_name_every_answer_once_at_every_point() {
    for (i, row) in POINTS.iter().enumerate() {
        assert!(
            !POINTS[..i].iter().any(|r| r.0 == row.0),
            "{:?} twice",
            row.0
        );
    }
    assert_eq!(POINTS.len(), 17);
    let sorted = |mut v: Vec<Says>| {
        v.sort_by_key(|s| format!("{s:?}"));
        v
    };
    for (loss, dispatch) in [(Redial, true), (Ask, false), (AskCrossed, false)] {
        let rows: Vec<Says> = AFTER_LOSS
            .iter()
            .filter(|r| r.0 == loss)
            .map(|r| r.1)
            .collect();
        assert_eq!(sorted(rows), sorted(applicable(dispatch)), "{loss:?}");
    }
    assert_eq!(
        AFTER_LOSS.len(),
        applicable(true).len() + 2 * applicable(false).len()
    );
    for new in [Recover, Attach] {
        let rows = |h: Holds| -> Vec<Says> {
            AFTER_KILL
                .iter()
                .filter(|r| r.0 == h && r.1 == new)
                .map(|r| r.2)
                .collect()
        };
        assert_eq!(rows(AtAuthorized), vec![NotAsked]);
        assert_eq!(sorted(rows(AtDispatched)), sorted(applicable(false)));
        assert_eq!(sorted(rows(AtRunning)), sorted(applicable(false)));
    }
    assert_eq!(AFTER_KILL.len(), 2 * (1 + 2 * applicable(false).len()));
    for probe in crate::recovery::tests::all_probes() {
        let says = match probe {
            Probe::Unreachable => Unreachable,
            Probe::Absent { same_epoch: true } => AbsentSame,
            Probe::Absent { same_epoch: false } => AbsentOther,
            Probe::Started {
                liveness,
                same_epoch,
            } => Started(liveness, same_epoch),
            Probe::Finished => Finished,
            Probe::Unreadable(_) => Unreadable,
        };
        assert!(TO_WATCH.contains(&says), "{probe:?}");
    }
}

/// The detached tables leave nothing out either: each point of a run up to its start record
/// once, with what a loss there comes to and what the journal holds as for a waiting run, then
/// [`Detached`]; for each fault every answer that can come next exactly once; each ending as the
/// waiting drive's, but where a detached one stops (a command found running, or started by its
/// dispatch); and every journal a detached run can leave has its rows after a kill.
#[test]
fn the_detached_tables_name_every_point_and_answer_once() {
    for (i, row) in DETACHED_POINTS.iter().enumerate() {
        assert!(
            !DETACHED_POINTS[..i].iter().any(|r| r.0 == row.0),
            "{:?} twice",
            row.0
        );
    }
    let shared: Vec<(Point, Loss, Holds)> = POINTS
        .iter()
        .filter(|r| !STREAMING_POINTS.contains(&r.0))
        .copied()
        .collect();
    assert_eq!(DETACHED_POINTS[..shared.len()], shared[..]);
    assert_eq!(
        DETACHED_POINTS[shared.len()..],
        [(Detached, Over(Running), AtRunning)]
    );
    assert!(!POINTS.iter().any(|r| r.0 == Detached));
    assert!(STREAMING_POINTS
        .iter()
        .all(|p| POINTS.iter().any(|r| r.0 == *p)));
    let sorted = |mut v: Vec<Says>| {
        v.sort_by_key(|s| format!("{s:?}"));
        v
    };
    for (loss, dispatch) in [(Redial, true), (Ask, false), (AskCrossed, false)] {
        let rows: Vec<Says> = AFTER_LOSS_DETACHED
            .iter()
            .filter(|r| r.0 == loss)
            .map(|r| r.1)
            .collect();
        assert_eq!(sorted(rows), sorted(applicable(dispatch)), "{loss:?}");
    }
    assert_eq!(AFTER_LOSS_DETACHED.len(), AFTER_LOSS.len());
    for &(loss, says, end) in AFTER_LOSS_DETACHED {
        let waiting = AFTER_LOSS
            .iter()
            .find(|r| r.0 == loss && r.1 == says)
            .unwrap()
            .2;
        let stops = matches!((waiting, says), (LookAgain, _) | (Complete, Ran));
        let want = if stops { Running } else { waiting };
        assert_eq!(end, want, "{loss:?}, then {says:?}");
    }
    for &(point, _, holds) in DETACHED_POINTS {
        for new in [Recover, Attach] {
            assert!(
                AFTER_KILL.iter().any(|r| r.0 == holds && r.1 == new),
                "{point:?}: killed, then {new:?}"
            );
        }
    }
}

/// The notes a later step relies on are barriers, and the machine queues each with the step
/// that relies on it: the loss (with its offsets) before the reconnect, the guard found crossed
/// before the watch, the probe before the dispatch it decided. The others are not.
#[test]
fn barrier_notes_are_durable_before_the_step_that_relies_on_them() {
    for (n, barrier) in [
        (Note::Lost("reset".into()), true),
        (Note::GuardExists, true),
        (Note::Redispatch, true),
        (Note::Pin(KEY.into()), false),
        (Note::Reconnected { after: ms(1) }, false),
        (Note::Collecting, false),
    ] {
        assert_eq!(n.is_barrier(), barrier, "{n:?}");
    }
    // Lost after the bytes left, the marker absent: each event durable before the next step.
    let mut d = at(SentNoReply);
    d.lose();
    assert_eq!(d.answered(AbsentSame), DispatchAgain);
    let kinds: Vec<&str> = d.journal.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "accepted",
            "authorized",
            "dispatched",
            "connection-lost",
            "reconnected",
            "probe",
            "dispatched"
        ]
    );
    assert_eq!(d.sends, 2);
    // A dispatch that finds the guard crossed by an earlier attempt watches it.
    let mut d = at(BeforeConnect);
    d.lose();
    assert_eq!(d.answered(Exists), WatchAgain);
    let kinds: Vec<&str> = d.journal.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["dispatched", "running", "guard-exists"]
    );
}
