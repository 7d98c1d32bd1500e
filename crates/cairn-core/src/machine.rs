//! One drive of an execution (dispatch or probe, stream, reconnect, decide again) as a state
//! machine without I/O.
//!
//! The machine does no I/O and reads no clock. Its driver, `cairn::executor`, connects, execs,
//! writes the journal and sleeps; it feeds in what happened as an [`Event`] together with the
//! time `now`, and carries out the [`Step`] that comes back, after the [`Note`]s the machine
//! queued (journal notes and log lines that go before the step). A wait is
//! [`Step::Wait`]`{ until }`: the driver sleeps until then and feeds [`Event::Timer`].
//!
//! Every final decision of a drive is made here, and only here: what the marker says is
//! [`crate::recovery::decide`]'s table, which this module is the only caller of during a drive;
//! the rest are the decisions around it: a connect error that will not go away, a reconnect
//! window used up, a host presenting another key than the one pinned, a start guard crossed by
//! another command, a dispatch the host (or the request's gate) refused, "finished" without a
//! finish record, and the pause between reconnect attempts. `cairn status` asks the same
//! machine what `recover` would do, so the two cannot disagree.
//!
//! ```text
//!   start ──► Connect ──Connected──► Dispatch ──Dispatched──► Send ──Replied──┐
//!               ▲   └─ConnectFailed─► Wait ─Timer─┐      └──► Watch ─Replied──┤
//!               └─────────────────────────────────┴──────── (decide) ◄────────┘
//!                                          Settle / Complete / Running / Report
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::recovery::{decide, window_left, Action, Backoff, Prior, Probe};
use crate::state::State;

/// How persistently to work towards an outcome.
#[derive(Clone, Debug)]
pub struct Patience {
    /// After the connection is lost, how long to keep trying to reach the host again.
    pub reconnect_for: Duration,
    /// Pause between reconnect attempts during the first `fast_for` of an outage; after that
    /// it doubles up to `backoff_max`. A blip usually ends within seconds, and a failed attempt
    /// while the link is down is cheap (a refused or reset TCP connect), so polling often at
    /// first puts the time from "link back" to "outcome known" close to one connect + one exec.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    pub fast_for: Duration,
}

impl Default for Patience {
    fn default() -> Self {
        Patience {
            reconnect_for: Duration::from_secs(300),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            fast_for: Duration::from_secs(10),
        }
    }
}

/// A reconnect attempt during an outage is never given less than this, even when the window
/// has less left (a connect needs a round trip or two to succeed at all).
pub const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// What a drive is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    /// Start with a dispatch (a fresh run, or a re-dispatch) instead of a probe.
    pub dispatch_first: bool,
    /// Stop as soon as the command is known to be running.
    pub detach: bool,
    /// Stream output bytes to the caller (off for recover, cancel, status).
    pub live: bool,
}

impl Mode {
    /// `cairn recover` without `--wait` (and what `cairn status` predicts).
    pub const RECOVER: Mode = Mode {
        dispatch_first: false,
        detach: true,
        live: false,
    };
}

/// What one reply (one exec: a dispatch, or a watch that is both probe and reattach stream)
/// said, reduced to what the decisions need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The stream broke (connection lost) before its last line.
    pub broken: Option<String>,
    /// The start guard's verdict, for a dispatch: `started`, `exists`, or a refusal.
    pub verdict: Option<String>,
    /// Errors the host reported.
    pub errors: Vec<String>,
    /// Whether the started record in the reply is for this execution's command (`None`: the
    /// reply had no started record).
    pub start_matches: Option<bool>,
    /// The output sizes of the finish record in the reply, if it had one.
    pub finish: Option<(u64, u64)>,
    /// The host removed the output (gc); only the records remain.
    pub output_gone: bool,
    /// The stdout and stderr bytes received so far.
    pub received: (u64, u64),
    /// The reply as the recovery table's input.
    pub probe: Probe,
}

/// What happened, fed to [`Machine::handle`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A connection to the host is up; it presented the host key `presented`, and `pinned` is
    /// the one the execution was dispatched to (if any yet).
    Connected {
        presented: String,
        pinned: Option<String>,
    },
    /// Connecting failed. `transient`: it may succeed if tried again (refused, reset, timed
    /// out), as opposed to an authentication or host key failure.
    ConnectFailed { transient: bool, error: String },
    /// The time of a [`Step::Wait`] has come.
    Timer,
    /// The journal refused the `dispatched` event: another process settled the execution (a
    /// `cancel`) before this one's append, which the journal checks in the append itself.
    SettledElsewhere,
    /// Before a fresh dispatch: the request's gate refused it (its caller is gone).
    DispatchRefused(String),
    /// The `dispatched` event is durable: bytes may leave now.
    Dispatched,
    /// The exec of a [`Step::Send`] or [`Step::Watch`] is over.
    Replied(Answer),
}

/// Why a wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The host is unreachable; try again after `pause`.
    Reconnect { pause: Duration, error: String },
    /// A watch ended while the supervisor is alive: look again, without spinning.
    Look,
    /// The recovery table decided nothing yet.
    Retry(String),
}

/// The evidence behind a settled outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// In these words.
    Said(String),
    /// The recovery table's reason: the driver adds what the host's reply showed.
    Table(String),
    /// The host presented another key than the one the execution is pinned to.
    HostKeyChanged { pinned: String, presented: String },
}

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A live process owns the undispatched execution: wait (within the reconnect window) until
    /// it dispatches, settles or is gone, reload the journal, then [`Machine::owner_waited`].
    WaitForOwner,
    /// Report the execution as held by its live owner; nothing is concluded.
    Held,
    /// Already settled: report what the journal holds (and replay stored output if asked).
    Settled,
    /// Connect to the host; give the attempt at most `within` (`None`: no limit of its own).
    Connect { within: Option<Duration> },
    /// Sleep until `until`, then feed [`Event::Timer`].
    Wait { until: Instant, why: Wait },
    /// Dispatch. `fresh`: never dispatched before, so first cross the request's gate (feed
    /// [`Event::DispatchRefused`]). Then make the `dispatched` event durable and feed
    /// [`Event::Dispatched`], or [`Event::SettledElsewhere`] when the journal refused it.
    Dispatch { fresh: bool },
    /// Send the dispatch bytes, stream the reply, feed [`Event::Replied`].
    Send,
    /// Exec a watch (the probe, and the reattach stream when `wait`), feed [`Event::Replied`].
    Watch { wait: bool },
    /// Done: the command is running on the host (a detached drive).
    Running { recovered: bool },
    /// Done: record the finish record of the last reply.
    Complete { recovered: bool },
    /// Done: record `state` with this evidence.
    Settle { state: State, why: Why },
    /// Done: another process settled it before it was sent; record that nothing was sent.
    Withhold,
    /// Done: report what the journal holds.
    Report,
}

impl Step {
    /// Whether the drive is over with this step.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Step::Held
                | Step::Settled
                | Step::Running { .. }
                | Step::Complete { .. }
                | Step::Settle { .. }
                | Step::Withhold
                | Step::Report
        )
    }
}

/// Journal notes and log lines that go before the next step, in order.
///
/// The driver carries out every note the machine queued before it carries out the step that
/// came with them. Those for which [`Note::is_barrier`] holds are journal events the driver
/// makes durable before that step (a later step, or a recovery after a crash there, relies on
/// them); the others may be held to share a later event's transaction (`reconnected`), live in
/// memory ([`Note::Pin`]: the key goes into the next `dispatched` event) or are log lines. The
/// barrier before any byte of a dispatch leaves is a step of its own: [`Step::Dispatch`], whose
/// `dispatched` event the driver makes durable before it feeds [`Event::Dispatched`], the only
/// event that leads to [`Step::Send`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// Reached the host again after an outage of `after`.
    Reconnected { after: Duration },
    /// The first host key seen for this execution: pin it.
    Pin(String),
    /// The connection broke mid-reply: record it and drop the connection.
    Lost(String),
    /// The start guard was crossed by an earlier attempt: record it (watch it, never start
    /// another).
    GuardExists,
    /// The marker is absent and the guard was never crossed: record the probe, dispatch again
    /// under the same ID.
    Redispatch,
    /// The command finished; its stored result is collected.
    Collecting,
}

impl Note {
    /// Whether the driver makes this note durable in the journal before it carries out the next
    /// step: a lost connection (with the offsets streamed so far), a start guard found crossed,
    /// and the probe that decided a dispatch again (recorded before that dispatch).
    pub fn is_barrier(&self) -> bool {
        matches!(self, Note::Lost(_) | Note::GuardExists | Note::Redispatch)
    }
}

/// One drive of one execution.
#[derive(Clone, Debug)]
pub struct Machine {
    prior: Prior,
    mode: Mode,
    patience: Patience,
    backoff: Backoff,
    /// Since when the host has been unreachable (`None`: it is not).
    lost_since: Option<Instant>,
    next_dispatch: bool,
    /// The outcome was learned after a reconnect or by recovery, not on the first stream.
    recovered: bool,
    short_reads: u32,
    /// The host showed the start guard crossed for this execution: never dispatch again.
    guard_crossed: bool,
    /// A `Wait` is out; `Some(true)`: a reconnect pause.
    waiting: Option<bool>,
    notes: VecDeque<Note>,
}

/// A finish record that says more was written than received is fetched again at most this
/// often (then the result is recorded with what there is).
const SHORT_READS: u32 = 3;

impl Machine {
    /// A machine for an execution the journal puts at `prior`.
    pub fn new(prior: Prior) -> Machine {
        let patience = Patience::default();
        Machine {
            prior,
            mode: Mode::RECOVER,
            backoff: Backoff::new(
                patience.backoff_min,
                patience.backoff_max,
                patience.fast_for,
            ),
            patience,
            lost_since: None,
            next_dispatch: false,
            recovered: false,
            short_reads: 0,
            guard_crossed: false,
            waiting: None,
            notes: VecDeque::new(),
        }
    }

    /// What the journal says (as the drive has moved it on).
    pub fn prior(&self) -> Prior {
        self.prior
    }

    /// Set what the journal says, outside a drive (a re-dispatch the caller decided, an
    /// outcome recorded).
    pub fn set_prior(&mut self, prior: Prior) {
        self.prior = prior;
    }

    /// Begin a drive in `mode` with `patience`; returns the first step.
    pub fn start(&mut self, mode: Mode, patience: &Patience, _now: Instant) -> Step {
        self.mode = mode;
        self.patience = patience.clone();
        self.backoff = Backoff::new(
            patience.backoff_min,
            patience.backoff_max,
            patience.fast_for,
        );
        self.lost_since = None;
        self.next_dispatch = mode.dispatch_first;
        self.recovered = !mode.dispatch_first;
        self.short_reads = 0;
        self.waiting = None;
        self.notes.clear();
        if self.prior == Prior::Held && !mode.dispatch_first {
            return if mode.detach {
                Step::Held
            } else {
                Step::WaitForOwner
            };
        }
        self.opening()
    }

    /// After [`Step::WaitForOwner`]: the journal, read again, puts the execution at `prior`.
    pub fn owner_waited(&mut self, prior: Prior) -> Step {
        self.prior = prior;
        if prior == Prior::Held {
            return Step::Held;
        }
        self.opening()
    }

    fn opening(&mut self) -> Step {
        if self.prior == Prior::Settled {
            return Step::Settled;
        }
        if self.prior == Prior::NotDispatched && !self.mode.dispatch_first {
            if let Action::Conclude { state, reason } = decide(self.prior, &Probe::Unreachable) {
                return Step::Settle {
                    state,
                    why: Why::Said(reason),
                };
            }
        }
        Step::Connect { within: None }
    }

    /// The next note to carry out before the step last returned.
    pub fn poll_note(&mut self) -> Option<Note> {
        self.notes.pop_front()
    }

    /// A started record for this execution's ID was streamed; `ours`: it is for this
    /// execution's command. Returns whether that is news: the driver records `running`.
    pub fn start_seen(&mut self, ours: bool) -> bool {
        if !ours {
            return false;
        }
        self.guard_crossed = true;
        if matches!(self.prior, Prior::Dispatched | Prior::NotDispatched) {
            self.prior = Prior::Started;
            return true;
        }
        false
    }

    /// What the reason of an unreachable host is while a live owner holds the execution.
    pub fn held_reason() -> String {
        match decide(Prior::Held, &Probe::Unreachable) {
            Action::Retry { reason } => reason,
            _ => String::new(),
        }
    }

    /// Feed one event at `now`; returns the next step.
    pub fn handle(&mut self, now: Instant, event: Event) -> Step {
        match event {
            Event::Connected { presented, pinned } => self.connected(now, presented, pinned),
            Event::ConnectFailed { transient, error } => self.connect_failed(now, transient, error),
            Event::Timer => match self.waiting.take() {
                Some(true) => {
                    if let Some(since) = self.lost_since {
                        self.backoff
                            .after_pause(now.saturating_duration_since(since));
                    }
                    self.connect(now)
                }
                _ => self.connect(now),
            },
            Event::SettledElsewhere => {
                self.prior = Prior::Settled;
                Step::Withhold
            }
            Event::DispatchRefused(why) => Step::Settle {
                state: State::Failed,
                why: Why::Said(why),
            },
            Event::Dispatched => {
                if self.prior == Prior::NotDispatched {
                    self.prior = Prior::Dispatched;
                }
                Step::Send
            }
            Event::Replied(answer) => self.replied(now, answer),
        }
    }

    fn connect(&self, now: Instant) -> Step {
        Step::Connect {
            within: self.lost_since.map(|since| {
                window_left(
                    self.patience.reconnect_for,
                    now.saturating_duration_since(since),
                )
                .unwrap_or_default()
                .max(MIN_ATTEMPT)
            }),
        }
    }

    fn connected(&mut self, now: Instant, presented: String, pinned: Option<String>) -> Step {
        if let Some(since) = self.lost_since.take() {
            self.notes.push_back(Note::Reconnected {
                after: now.saturating_duration_since(since),
            });
        }
        // The host must be the one this execution was dispatched to. Before the `dispatched`
        // event no byte was sent, so another host behind the name is proof it never started
        // (as the driver concludes when its connect refuses the key itself); after it, what
        // the pinned host did is not known.
        match pinned {
            Some(pinned) if pinned != presented => {
                let state = if self.prior == Prior::NotDispatched {
                    State::Failed
                } else {
                    State::Unknown
                };
                return Step::Settle {
                    state,
                    why: Why::HostKeyChanged { pinned, presented },
                };
            }
            None => self.notes.push_back(Note::Pin(presented)),
            _ => {}
        }
        if self.next_dispatch {
            Step::Dispatch {
                fresh: self.prior == Prior::NotDispatched,
            }
        } else {
            Step::Watch {
                wait: !self.mode.detach,
            }
        }
    }

    fn connect_failed(&mut self, now: Instant, transient: bool, error: String) -> Step {
        if !transient {
            let state = if self.prior == Prior::NotDispatched {
                State::Failed
            } else {
                State::Unknown
            };
            return Step::Settle {
                state,
                why: Why::Said(format!(
                    "cannot reach the host to learn the outcome: {error}"
                )),
            };
        }
        let since = *self.lost_since.get_or_insert(now);
        let lost_for = now.saturating_duration_since(since);
        if window_left(self.patience.reconnect_for, lost_for).is_none() {
            // Before the `dispatched` event no byte was sent: that is proof it never started,
            // as for an error that will not go away (and what `recover` concludes from the
            // same journal).
            if self.prior == Prior::NotDispatched {
                return Step::Settle {
                    state: State::Failed,
                    why: Why::Said(format!(
                        "never dispatched: the host was unreachable for {lost_for:?} \
                         (last error: {error}) before any byte of the command was sent"
                    )),
                };
            }
            return Step::Settle {
                state: State::Unknown,
                why: Why::Said(format!(
                    "host unreachable for {lost_for:?} (last error: {error}); the outcome is unknown"
                )),
            };
        }
        let pause = self.backoff.pause();
        self.waiting = Some(true);
        Step::Wait {
            until: now + pause,
            why: Wait::Reconnect { pause, error },
        }
    }

    fn replied(&mut self, now: Instant, mut a: Answer) -> Step {
        self.next_dispatch = false;
        // What the reply showed before it ended (or broke) is evidence either way: a start
        // guard verdict, a started record of this command or a finish record each say the
        // guard was crossed, and then this drive never dispatches again.
        if a.start_matches == Some(true)
            || a.finish.is_some()
            || matches!(a.verdict.as_deref(), Some("started" | "exists"))
        {
            self.guard_crossed = true;
        }
        if let Some(why) = a.broken.take() {
            // Lost mid-reply. Whatever was streamed is kept; ask the host again.
            self.notes.push_back(Note::Lost(why));
            self.lost_since.get_or_insert(now);
            self.recovered = true;
            return self.connect(now);
        }
        self.backoff.reset();

        if let Some(v) = a.verdict.as_deref() {
            if let Some(step) = self.verdict(now, v, &a) {
                return step;
            }
        }
        self.probed(now, a)
    }

    /// A dispatch's start guard verdict `v`: the step it decides, or `None` when the probe
    /// decides (started, and the drive waits for the outcome).
    fn verdict(&mut self, now: Instant, v: &str, a: &Answer) -> Option<Step> {
        match v {
            "started" => {
                self.guard_crossed = true;
                self.mode
                    .detach
                    .then_some(Step::Running { recovered: false })
            }
            "exists" => {
                // An earlier attempt crossed the guard: watch it, never start another.
                self.guard_crossed = true;
                self.notes.push_back(Note::GuardExists);
                if a.start_matches != Some(true) {
                    return Some(Step::Settle {
                        state: State::Unknown,
                        why: Why::Said(
                            "the start guard for this ID was crossed by a different command on the host"
                                .into(),
                        ),
                    });
                }
                Some(self.connect(now))
            }
            _ if self.guard_crossed => Some(Step::Settle {
                state: State::Unknown,
                why: Why::Said(format!(
                    "the host refused the dispatch ({v}), yet it showed the start guard \
                     crossed for this command"
                )),
            }),
            _ => {
                let why = if a.errors.is_empty() {
                    format!("the host refused the dispatch ({v})")
                } else {
                    format!("the host refused the dispatch: {}", a.errors.join("; "))
                };
                Some(Step::Settle {
                    state: State::Failed,
                    why: Why::Said(format!("never started: {why}")),
                })
            }
        }
    }

    /// The recovery table's action for the reply's probe, carried out.
    fn probed(&mut self, now: Instant, a: Answer) -> Step {
        match decide(self.prior, &a.probe) {
            Action::Dispatch if self.guard_crossed => Step::Settle {
                state: State::Unknown,
                why: Why::Table(
                    "the host showed the start guard crossed earlier, but its marker is absent now"
                        .into(),
                ),
            },
            Action::Dispatch => {
                self.notes.push_back(Note::Redispatch);
                self.next_dispatch = true;
                self.connect(now)
            }
            Action::Reattach if self.mode.detach => Step::Running {
                recovered: self.recovered,
            },
            Action::Reattach => {
                self.waiting = Some(false);
                Step::Wait {
                    until: now + self.patience.backoff_min,
                    why: Wait::Look,
                }
            }
            Action::Collect => {
                let Some((out, err)) = a.finish else {
                    return Step::Settle {
                        state: State::Unknown,
                        why: Why::Said("probe said finished without a record".into()),
                    };
                };
                self.notes.push_back(Note::Collecting);
                if self.mode.live
                    && !a.output_gone
                    && self.short_reads < SHORT_READS
                    && (a.received.0 < out || a.received.1 < err)
                {
                    // The finish record says there is more than we were sent: fetch it.
                    self.short_reads += 1;
                    return self.connect(now);
                }
                Step::Complete {
                    recovered: self.recovered,
                }
            }
            Action::Conclude { state, reason } => Step::Settle {
                state,
                why: Why::Table(reason),
            },
            Action::Retry { reason } => {
                self.waiting = Some(false);
                Step::Wait {
                    until: now + self.backoff.pause(),
                    why: Wait::Retry(reason),
                }
            }
            Action::Nothing => Step::Report,
        }
    }
}

#[cfg(test)]
mod disconnect_points;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recovery::Liveness::*;

    pub(super) const KEY: &str = "SHA256:key";

    pub(super) fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    pub(super) fn patience() -> Patience {
        Patience {
            reconnect_for: ms(2_000),
            backoff_min: ms(100),
            backoff_max: ms(400),
            fast_for: ms(500),
        }
    }

    pub(super) const ATTACH: Mode = Mode {
        dispatch_first: false,
        detach: false,
        live: true,
    };
    pub(super) const RUN: Mode = Mode {
        dispatch_first: true,
        detach: false,
        live: true,
    };

    use crate::recovery::tests::all_probes;

    /// A complete, unbroken reply saying `probe` (a finish record when it says finished).
    pub(super) fn answer(probe: Probe) -> Answer {
        let finished = probe == Probe::Finished;
        let started = matches!(probe, Probe::Started { .. });
        Answer {
            broken: None,
            verdict: None,
            errors: Vec::new(),
            start_matches: (started || finished).then_some(true),
            finish: finished.then_some((5, 0)),
            output_gone: false,
            received: (5, 0),
            probe,
        }
    }

    pub(super) fn connected(pinned: Option<&str>) -> Event {
        Event::Connected {
            presented: KEY.into(),
            pinned: pinned.map(str::to_owned),
        }
    }

    pub(super) fn failed(transient: bool) -> Event {
        Event::ConnectFailed {
            transient,
            error: "connection refused".into(),
        }
    }

    fn drain(m: &mut Machine) -> Vec<Note> {
        std::iter::from_fn(|| m.poll_note()).collect()
    }

    fn settled_as(s: &Step) -> Option<State> {
        match s {
            Step::Settle { state, .. } => Some(*state),
            _ => None,
        }
    }

    /// How the first connection of a drive goes: each kind of error, and the reconnect window.
    #[derive(Clone, Copy, Debug)]
    enum Conn {
        SameKey,
        FirstKey,
        OtherKey,
        Permanent,
        TransientWithinWindow,
        TransientWindowOut,
    }
    const CONNS: [Conn; 6] = [
        Conn::SameKey,
        Conn::FirstKey,
        Conn::OtherKey,
        Conn::Permanent,
        Conn::TransientWithinWindow,
        Conn::TransientWindowOut,
    ];

    /// Start a drive at `prior` in `mode`, connect as `conn`, and (if a watch is asked for)
    /// answer with `probe`; the step the machine ends on and the notes it queued.
    fn one(prior: Prior, mode: Mode, conn: Conn, reply: Option<Answer>) -> (Step, Vec<Note>) {
        let p = patience();
        let t0 = Instant::now();
        let mut m = Machine::new(prior);
        let mut notes = Vec::new();
        let first = m.start(mode, &p, t0);
        if first != (Step::Connect { within: None }) {
            return (first, notes);
        }
        let mut step = match conn {
            Conn::SameKey => m.handle(t0, connected(Some(KEY))),
            Conn::FirstKey => m.handle(t0, connected(None)),
            Conn::OtherKey => m.handle(t0, connected(Some("SHA256:other"))),
            Conn::Permanent => m.handle(t0, failed(false)),
            Conn::TransientWithinWindow => m.handle(t0, failed(true)),
            Conn::TransientWindowOut => {
                // Unreachable at t0, then tried until the window is used up.
                let mut now = t0;
                let mut s = m.handle(now, failed(true));
                while let Step::Wait { until, .. } = s {
                    now = until;
                    match m.handle(now, Event::Timer) {
                        Step::Connect { within } => {
                            now += within.unwrap_or_default();
                            s = m.handle(now, failed(true));
                        }
                        other => panic!("after a reconnect pause: {other:?}"),
                    }
                }
                s
            }
        };
        notes.extend(drain(&mut m));
        if let (Step::Watch { .. }, Some(a)) = (&step, reply) {
            step = m.handle(t0, Event::Replied(a));
            notes.extend(drain(&mut m));
        }
        (step, notes)
    }

    /// What a drive must do, written out as the table of docs/DESIGN.md plus the decisions
    /// around it, for `recover` (detached, no output) and `attach` (waits, streams).
    fn expected(prior: Prior, mode: Mode, conn: Conn, probe: &Probe) -> String {
        use Prior as P;
        match prior {
            P::Settled => return "settled".into(),
            P::Held if mode.detach => return "held".into(),
            P::Held => return "wait for owner".into(),
            P::NotDispatched => return "failed".into(),
            P::Dispatched | P::Started => {}
        }
        match conn {
            Conn::OtherKey | Conn::Permanent | Conn::TransientWindowOut => return "unknown".into(),
            Conn::TransientWithinWindow => return "reconnect later".into(),
            Conn::SameKey | Conn::FirstKey => {}
        }
        match probe {
            Probe::Unreachable => "retry later",
            Probe::Absent { same_epoch: true } if prior == P::Dispatched => "dispatch again",
            Probe::Absent { .. } | Probe::Unreadable(_) => "unknown",
            Probe::Started {
                same_epoch: false, ..
            } => "unknown",
            Probe::Started {
                liveness: Alive, ..
            } if mode.detach => "running",
            Probe::Started {
                liveness: Alive, ..
            } => "look again",
            Probe::Started { .. } => "interrupted",
            Probe::Finished => "complete",
        }
        .into()
    }

    fn observed(step: &Step, notes: &[Note]) -> String {
        match step {
            Step::Settled => "settled".into(),
            Step::Held => "held".into(),
            Step::WaitForOwner => "wait for owner".into(),
            Step::Settle { state, .. } => state.as_str().into(),
            Step::Wait {
                why: Wait::Reconnect { .. },
                ..
            } => "reconnect later".into(),
            Step::Wait {
                why: Wait::Retry(_),
                ..
            } => "retry later".into(),
            Step::Wait {
                why: Wait::Look, ..
            } => "look again".into(),
            Step::Connect { .. } if notes.contains(&Note::Redispatch) => "dispatch again".into(),
            Step::Running { .. } => "running".into(),
            Step::Complete { .. } => "complete".into(),
            other => format!("{other:?}"),
        }
    }

    /// Every (marker state × error kind × window) combination, for `recover` and `attach`.
    #[test]
    fn every_prior_connection_and_probe_leads_to_the_tabled_step() {
        let mut rows = 0;
        for mode in [Mode::RECOVER, ATTACH] {
            for prior in [
                Prior::NotDispatched,
                Prior::Held,
                Prior::Dispatched,
                Prior::Started,
                Prior::Settled,
            ] {
                for conn in CONNS {
                    for probe in all_probes() {
                        let (step, notes) = one(prior, mode, conn, Some(answer(probe.clone())));
                        assert_eq!(
                            observed(&step, &notes),
                            expected(prior, mode, conn, &probe),
                            "{mode:?} {prior:?} {conn:?} {probe:?}: {step:?} {notes:?}"
                        );
                        rows += 1;
                    }
                }
            }
        }
        assert_eq!(rows, 2 * 5 * 6 * 11);
    }

    #[test]
    fn a_changed_host_key_is_unknown_and_names_both_keys() {
        let (step, _) = one(Prior::Started, Mode::RECOVER, Conn::OtherKey, None);
        assert_eq!(
            step,
            Step::Settle {
                state: State::Unknown,
                why: Why::HostKeyChanged {
                    pinned: "SHA256:other".into(),
                    presented: KEY.into()
                }
            }
        );
    }

    #[test]
    fn a_changed_host_key_before_any_dispatch_is_failed_nothing_was_sent() {
        let mut m = Machine::new(Prior::NotDispatched);
        let t0 = Instant::now();
        assert!(matches!(
            m.start(RUN, &Patience::default(), t0),
            Step::Connect { .. }
        ));
        let step = m.handle(t0, connected(Some("SHA256:other")));
        assert_eq!(
            step,
            Step::Settle {
                state: State::Failed,
                why: Why::HostKeyChanged {
                    pinned: "SHA256:other".into(),
                    presented: KEY.into()
                }
            }
        );
    }

    #[test]
    fn the_first_key_seen_is_pinned_a_known_one_is_not_again() {
        let (_, notes) = one(Prior::Dispatched, Mode::RECOVER, Conn::FirstKey, None);
        assert_eq!(notes, vec![Note::Pin(KEY.into())]);
        let (_, notes) = one(Prior::Dispatched, Mode::RECOVER, Conn::SameKey, None);
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn a_permanent_connect_error_before_any_dispatch_is_failed_after_it_unknown() {
        let (step, _) = one(Prior::NotDispatched, RUN, Conn::Permanent, None);
        assert_eq!(settled_as(&step), Some(State::Failed));
        let (step, _) = one(Prior::Dispatched, RUN, Conn::Permanent, None);
        assert_eq!(settled_as(&step), Some(State::Unknown));
    }

    /// Unreachable for the whole reconnect window: before the `dispatched` event nothing was
    /// sent, which proves it never started (as `recover` concludes from the same journal);
    /// after it, the outcome is unknown.
    #[test]
    fn a_host_unreachable_for_the_whole_window_before_any_dispatch_is_failed() {
        let (step, _) = one(Prior::NotDispatched, RUN, Conn::TransientWindowOut, None);
        assert_eq!(settled_as(&step), Some(State::Failed), "{step:?}");
        let (step, _) = one(Prior::Dispatched, RUN, Conn::TransientWindowOut, None);
        assert_eq!(settled_as(&step), Some(State::Unknown), "{step:?}");
    }

    /// A dispatch reply that breaks right after the guard's verdict, before the started record
    /// line, has shown the guard crossed all the same: a marker found absent afterwards is
    /// `unknown`, never a second dispatch.
    #[test]
    fn a_verdict_that_arrived_before_a_break_counts_as_the_guard_crossed() {
        let t = Instant::now();
        let mut m = Machine::new(Prior::NotDispatched);
        m.start(RUN, &patience(), t);
        m.handle(t, connected(None));
        assert_eq!(m.handle(t, Event::Dispatched), Step::Send);
        for verdict in ["started", "exists"] {
            let mut m = m.clone();
            let mut a = answer(Probe::Unreadable("no hello line".into()));
            a.verdict = Some(verdict.into());
            a.broken = Some("reset".into());
            assert_eq!(
                m.handle(t, Event::Replied(a)),
                Step::Connect {
                    within: Some(ms(2_000))
                }
            );
            assert_eq!(
                m.handle(t, connected(Some(KEY))),
                Step::Watch { wait: true }
            );
            let s = m.handle(
                t,
                Event::Replied(answer(Probe::Absent { same_epoch: true })),
            );
            assert_eq!(settled_as(&s), Some(State::Unknown), "{verdict}: {s:?}");
        }
    }

    #[test]
    fn finished_without_a_finish_record_is_unknown() {
        let mut a = answer(Probe::Finished);
        a.finish = None;
        let (step, _) = one(Prior::Dispatched, ATTACH, Conn::SameKey, Some(a));
        assert_eq!(
            step,
            Step::Settle {
                state: State::Unknown,
                why: Why::Said("probe said finished without a record".into())
            }
        );
    }

    #[test]
    fn a_short_read_is_fetched_again_at_most_three_times_when_streaming() {
        let t = Instant::now();
        let mut m = Machine::new(Prior::Started);
        m.start(ATTACH, &patience(), t);
        let mut a = answer(Probe::Finished);
        a.received = (2, 0);
        for _ in 0..SHORT_READS {
            assert_eq!(
                m.handle(t, connected(Some(KEY))),
                Step::Watch { wait: true }
            );
            assert_eq!(
                m.handle(t, Event::Replied(a.clone())),
                Step::Connect { within: None }
            );
        }
        m.handle(t, connected(Some(KEY)));
        assert_eq!(
            m.handle(t, Event::Replied(a.clone())),
            Step::Complete { recovered: true }
        );
        // recover does not stream: it never asks for the bytes again.
        let (step, _) = one(Prior::Started, Mode::RECOVER, Conn::SameKey, Some(a));
        assert_eq!(step, Step::Complete { recovered: true });
    }

    /// A fresh dispatch: the journal and the gate first, then the `dispatched` event, and only
    /// then may bytes leave.
    #[test]
    fn a_dispatch_sends_only_after_its_dispatched_event_is_durable() {
        let t = Instant::now();
        let mut m = Machine::new(Prior::NotDispatched);
        assert_eq!(m.start(RUN, &patience(), t), Step::Connect { within: None });
        assert_eq!(m.handle(t, connected(None)), Step::Dispatch { fresh: true });
        assert_eq!(m.prior(), Prior::NotDispatched);
        assert_eq!(m.handle(t, Event::Dispatched), Step::Send);
        assert_eq!(m.prior(), Prior::Dispatched);

        let mut other = Machine::new(Prior::NotDispatched);
        other.start(RUN, &patience(), t);
        other.handle(t, connected(None));
        assert_eq!(other.handle(t, Event::SettledElsewhere), Step::Withhold);
        assert_eq!(other.prior(), Prior::Settled);

        let mut gone = Machine::new(Prior::NotDispatched);
        gone.start(RUN, &patience(), t);
        gone.handle(t, connected(None));
        assert_eq!(
            settled_as(&gone.handle(t, Event::DispatchRefused("caller gone".into()))),
            Some(State::Failed)
        );
    }

    fn dispatched(verdict: &str, start_matches: Option<bool>) -> (Step, Vec<Note>) {
        let t = Instant::now();
        let mut m = Machine::new(Prior::NotDispatched);
        m.start(
            Mode {
                detach: true,
                ..RUN
            },
            &patience(),
            t,
        );
        m.handle(t, connected(None));
        m.handle(t, Event::Dispatched);
        drain(&mut m);
        let mut a = answer(Probe::Absent { same_epoch: true });
        a.verdict = Some(verdict.into());
        a.start_matches = start_matches;
        let step = m.handle(t, Event::Replied(a));
        (step, drain(&mut m))
    }

    #[test]
    fn the_guard_verdicts_decide_a_dispatch() {
        assert_eq!(
            dispatched("started", Some(true)).0,
            Step::Running { recovered: false }
        );
        let (step, notes) = dispatched("exists", Some(true));
        assert_eq!(
            (step, notes),
            (Step::Connect { within: None }, vec![Note::GuardExists])
        );
        for other_command in [Some(false), None] {
            let (step, notes) = dispatched("exists", other_command);
            assert_eq!(settled_as(&step), Some(State::Unknown));
            assert_eq!(notes, vec![Note::GuardExists]);
        }
        let (step, _) = dispatched("refused", None);
        assert_eq!(
            step,
            Step::Settle {
                state: State::Failed,
                why: Why::Said("never started: the host refused the dispatch (refused)".into())
            }
        );
    }

    #[test]
    fn a_broken_reply_reconnects_within_what_is_left_of_the_window() {
        let t = Instant::now();
        let mut m = Machine::new(Prior::Started);
        m.start(ATTACH, &patience(), t);
        m.handle(t, connected(Some(KEY)));
        let mut a = answer(Probe::Started {
            liveness: Alive,
            same_epoch: true,
        });
        a.broken = Some("reset".into());
        assert_eq!(
            m.handle(t, Event::Replied(a)),
            Step::Connect {
                within: Some(ms(2_000))
            }
        );
        assert_eq!(drain(&mut m), vec![Note::Lost("reset".into())]);
        let s = m.handle(t + ms(1_950), failed(true));
        assert!(matches!(s, Step::Wait { .. }), "{s:?}");
        // Less than MIN_ATTEMPT left: an attempt still gets MIN_ATTEMPT.
        assert_eq!(
            m.handle(t + ms(2_050), Event::Timer),
            Step::Connect {
                within: Some(MIN_ATTEMPT)
            }
        );
        let s = m.handle(t + ms(2_150), failed(true));
        assert_eq!(settled_as(&s), Some(State::Unknown));
        // Reached again within the window: the outage is noted, and the drive goes on.
        let mut m = Machine::new(Prior::Started);
        m.start(ATTACH, &patience(), t);
        m.handle(t, failed(true));
        m.handle(t + ms(100), Event::Timer);
        assert_eq!(
            m.handle(t + ms(300), connected(Some(KEY))),
            Step::Watch { wait: true }
        );
        assert_eq!(drain(&mut m), vec![Note::Reconnected { after: ms(300) }]);
    }

    /// A small deterministic generator (xorshift64*), so a failing sequence is reproducible
    /// from its seed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
        fn pick<T: Clone>(&mut self, v: &[T]) -> T {
            v[self.below(v.len() as u64) as usize].clone()
        }
    }

    /// Random hosts and networks (answers that need not even be consistent with each other)
    /// against the machine, with a driver that obeys it. Whatever happens:
    /// - no dispatch once the host showed the start guard crossed;
    /// - bytes leave only right after the `dispatched` event;
    /// - never `completed` without a finish record, never `failed` once started;
    /// - no reconnect pause above its cap, and an outage ends in a conclusion no later than
    ///   the window plus one pause and one attempt after it began: never another wait.
    // Long: one property, its generator and the checks of every step beside it, in the order a
    // drive takes them.
    #[test]
    fn random_event_sequences_keep_the_invariants() {
        let p = patience();
        let liveness = [Alive, Dead, Rebooted];
        let priors = [
            Prior::NotDispatched,
            Prior::Held,
            Prior::Dispatched,
            Prior::Started,
            Prior::Settled,
        ];
        let modes = [
            Mode::RECOVER,
            ATTACH,
            RUN,
            Mode {
                detach: true,
                ..RUN
            },
        ];
        let mut ended = 0;
        for seed in 1..=3_000u64 {
            let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mode = r.pick(&modes);
            // (a drive starts with a dispatch only for what was never sent, or provably never
            // started: Executor::redispatch and `resolve --as retry` check that first)
            let prior = if mode.dispatch_first {
                r.pick(&[Prior::NotDispatched, Prior::Dispatched])
            } else {
                r.pick(&priors)
            };
            let mut m = Machine::new(prior);
            let mut now = Instant::now();
            let mut crossed = prior == Prior::Started;
            let mut lost_at: Option<Instant> = None;
            let mut last_finish = false;
            let mut step = m.start(mode, &p, now);
            let mut prev = Step::Report;
            let mut fed_dispatched = false;
            for _ in 0..200 {
                while let Some(n) = m.poll_note() {
                    if let Note::Reconnected { .. } = n {
                        lost_at = None;
                    }
                }
                let context = format!("seed {seed}, {prior:?} {mode:?}: {prev:?} → {step:?}");
                if let Step::Dispatch { .. } = step {
                    assert!(!crossed, "dispatch after the guard was crossed; {context}");
                }
                if step == Step::Send {
                    assert!(
                        fed_dispatched && matches!(prev, Step::Dispatch { .. }),
                        "bytes before the dispatched event; {context}"
                    );
                }
                if let Step::Wait {
                    why: Wait::Reconnect { pause, .. },
                    ..
                } = &step
                {
                    assert!(
                        *pause <= p.backoff_max && *pause >= p.backoff_min,
                        "{context}"
                    );
                }
                if step.is_final() {
                    match &step {
                        Step::Complete { .. } => assert!(last_finish, "{context}"),
                        Step::Settle {
                            state: State::Failed,
                            ..
                        } => assert!(!crossed, "failed once started; {context}"),
                        Step::Settle {
                            state: State::Completed,
                            ..
                        } => panic!("completed by conclusion; {context}"),
                        _ => {}
                    }
                    if let (Some(at), Step::Settle { .. }) = (lost_at, &step) {
                        let bound = p.reconnect_for + p.backoff_max + MIN_ATTEMPT;
                        assert!(now.duration_since(at) <= bound, "{context}");
                    }
                    ended += 1;
                    break;
                }
                let event = match &step {
                    Step::WaitForOwner => {
                        step = m.owner_waited(r.pick(&priors));
                        continue;
                    }
                    Step::Connect { within } => {
                        let limit = within.unwrap_or(ms(3_000));
                        let took = ms(r.below(limit.as_millis() as u64 + 1));
                        now += took;
                        if r.chance(40) && took < limit {
                            let pinned = if r.chance(5) {
                                Some("SHA256:other")
                            } else {
                                Some(KEY)
                            };
                            Event::Connected {
                                presented: KEY.into(),
                                pinned: pinned.map(str::to_owned),
                            }
                        } else {
                            lost_at.get_or_insert(now);
                            failed(!r.chance(3) || took >= limit)
                        }
                    }
                    Step::Wait { until, why } => {
                        if let (Wait::Reconnect { .. }, Some(at)) = (why, lost_at) {
                            assert!(
                                now.duration_since(at) < p.reconnect_for,
                                "a wait after the window; seed {seed}"
                            );
                        }
                        now = *until;
                        Event::Timer
                    }
                    Step::Dispatch { fresh: true } if r.chance(10) => Event::SettledElsewhere,
                    Step::Dispatch { fresh: true } if r.chance(10) => {
                        Event::DispatchRefused("gone".into())
                    }
                    Step::Dispatch { .. } => Event::Dispatched,
                    Step::Send | Step::Watch { .. } => {
                        // What the stream showed as it went (the driver's on_line).
                        if r.chance(30) {
                            let ours = r.chance(80);
                            m.start_seen(ours);
                            crossed |= ours;
                        }
                        let probe = match r.below(5) {
                            0 => Probe::Absent {
                                same_epoch: r.chance(80),
                            },
                            1 => Probe::Finished,
                            2 => Probe::Unreadable("x".into()),
                            _ => Probe::Started {
                                liveness: r.pick(&liveness),
                                same_epoch: r.chance(80),
                            },
                        };
                        let mut a = answer(probe);
                        if r.chance(20) {
                            a.finish = None;
                        }
                        a.start_matches = [None, Some(true), Some(false)][r.below(3) as usize];
                        if step == Step::Send {
                            a.verdict = Some(r.pick(&["started", "exists", "refused"]).into());
                        }
                        now += ms(r.below(50));
                        // (what arrived before a break is seen all the same)
                        crossed |= a.start_matches == Some(true)
                            || a.finish.is_some()
                            || matches!(a.verdict.as_deref(), Some("started" | "exists"));
                        if r.chance(25) {
                            a.broken = Some("reset".into());
                            lost_at.get_or_insert(now);
                            last_finish = false;
                        } else {
                            last_finish = a.finish.is_some();
                        }
                        Event::Replied(a)
                    }
                    s => panic!("not a step to act on: {s:?}"),
                };
                prev = step.clone();
                fed_dispatched = event == Event::Dispatched;
                step = m.handle(now, event);
            }
        }
        assert!(
            ended > 2_000,
            "only {ended} of 3000 sequences ended within 200 steps"
        );
    }
}
