//! Who may dispatch: the registries the executor consults before a call of this process sends
//! (or drives towards sending) an execution. The decision itself, whether to drive, wait, take
//! over, leave it as it is or report it held, is the core's admission table
//! ([`crate::admission::route`]: [`Ask::Drive`] in [`Executor::own_or_wait`], [`Ask::Redrive`]
//! in [`may_redrive`], [`Ask::Matched`] in the admission room); this room gathers the facts it
//! is asked on (the owner and whether it lives, the redrives, a detached dispatch), holds the
//! registries, and does what the table answered (the guards, the takeover, the wait).
//!
//! Every registry that takes part, and why each exists:
//! - [`owner`]'s `DRIVING` map ([`owner::claim`]): the executions this process is taking
//!   towards their dispatch, counted per call, from before their acceptance. Between
//!   `accepted` and `dispatched` only the owner may send an execution; while it lives, "never
//!   dispatched" is no conclusion. This map is how this process knows which of its own
//!   acceptances are still in flight (another process asks the owner's PID instead:
//!   [`owner::may_still_dispatch`]).
//! - [`drivers()`] ([`Driving`]): on a shared journal, the calls of this process driving one
//!   execution: the owner's calls beside each other (`shared`), or one call alone (`sole`:
//!   the recovery after a takeover, or the owner's sweep picking up an execution none of its
//!   calls drives any more). One call recovers and the others wait for its result instead of
//!   recording it twice (the table's [`Owner::HereBusy`]); the sweep never drives beside a
//!   live call ([`drive_undriven`] checks both this registry and `DRIVING` under one lock).
//! - [`gate`]'s task-local [`gate::Gate`]: one front request's dispatch boundary. A caller
//!   gone before the first `dispatched` is committed means nothing is sent; one gone after
//!   finds the execution dispatched, never killed by a transport event.
//! - The journal's replica ownership (lease, epoch, takeover), read through
//!   [`Journal::ownership`]: which replica of a shared journal owns an execution. It lives in
//!   the journal backends (the PostgreSQL backend's own map of what this replica owns is
//!   theirs, not this room's); [`Executor::own_or_wait`] and [`Executor::live_owner`] are
//!   where it meets the two registries above and becomes the table's [`Owner`].
//! - [`may_redrive`]: the facts the owner's sweep is routed on (its redrives, a detached
//!   dispatch); the bound, [`MAX_REDRIVES`], is the table's.

pub mod gate;
pub mod owner;

use std::time::{Duration, Instant};

use crate::admission::{self, Ask, Class, Facts, Owner, Recorded, Route};
use crate::event::EventKind;
use crate::id::ExecutionId;
use crate::journal::Journal;
use crate::machine::Machine;
use crate::state::State;

use super::*;

/// How many times the owner's sweep picks up one execution that none of its calls drives
/// (`Executor::redrive_owned`): one whose recovery keeps failing is then left as it is (the
/// admission table's bound).
pub const MAX_REDRIVES: usize = admission::MAX_REDRIVES;

/// Whether the owner's sweep may pick up `id` when no call drives it ([`Ask::Redrive`]): its
/// state and how many times it was picked up before, or `None` to leave it alone: settled or
/// `unknown` (a call concluded it), detached (its callers attach to it or poll it), or picked
/// up [`MAX_REDRIVES`] times already (said once here; `cairn recover` finishes it).
pub(crate) fn may_redrive(
    j: &Journal,
    id: &ExecutionId,
) -> Result<Option<(State, usize)>, crate::journal::JournalError> {
    let Some(status) = j.status(id)? else {
        return Ok(None);
    };
    let facts = Facts {
        recorded: Recorded::At(status.state),
        // (the sweep owns it; the class is not asked)
        class: Class::RemoteCommand,
        owner: Owner::Here,
        redrives: 0,
        detached: false,
    };
    let facts = redrive_facts(j, id, facts)?;
    Ok((admission::route(Ask::Redrive, &facts) == Route::Drive)
        .then_some((status.state, facts.redrives)))
}

/// `facts` with what the owner's sweep decides on besides the state ([`Ask::Redrive`]): how
/// many times it picked `id` up (`redrive` events), and whether its latest dispatch was
/// detached. The events are read only when the state alone would not leave it alone; one
/// picked up too often is said here.
fn redrive_facts(
    j: &Journal,
    id: &ExecutionId,
    mut facts: Facts,
) -> Result<Facts, crate::journal::JournalError> {
    if admission::route(Ask::Redrive, &facts) != Route::Drive {
        return Ok(facts);
    }
    let events = j.events(id)?;
    facts.detached = events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::Dispatched)
        .is_some_and(|e| e.evidence["detach"] == true);
    facts.redrives = events
        .iter()
        .filter(|e| e.kind == EventKind::Redrive)
        .count();
    if !facts.detached && admission::route(Ask::Redrive, &facts) != Route::Drive {
        if let Some(state) = facts.recorded.state() {
            tracing::warn!(
                "cairn: {id} ({state}): no call of its owner drives it, and its owner picked it \
                 up {MAX_REDRIVES} times already; left as it is (cairn recover finishes it)"
            );
        }
    }
    Ok(facts)
}

/// [`Ask::Drive`]'s facts of an execution nobody owns: a journal not shared by replicas, no
/// ownership row, or one settled. Nothing else is read then (the table drives it whatever is
/// recorded).
fn unowned() -> Facts {
    Facts {
        recorded: Recorded::Stateless,
        class: Class::RemoteCommand,
        owner: Owner::Nobody,
        redrives: 0,
        detached: false,
    }
}

/// Whether a caller may drive an execution of a shared journal (see `own_or_wait`).
pub(super) enum Drive {
    /// Go ahead; with the guard when this replica owns it (this call drives it then).
    Go(Option<Driving>),
    /// Taken over too often: leave it for review.
    Review,
    /// A live replica (`replica`, process `client`, lease epoch `epoch`) owns it and it stayed
    /// unsettled for the caller's whole reconnect window: report it as held by that owner,
    /// what the journal holds, concluding nothing ([`Step::Held`]).
    Held {
        replica: String,
        client: String,
        epoch: i64,
    },
}

/// The calls of this process driving one execution of a shared journal: how many drive it
/// beside each other (the owner's own calls), and whether one drives it alone (the recovery
/// after a takeover, or the owner picking up an execution none of its calls drove any more).
#[derive(Default)]
struct Drivers {
    shared: usize,
    sole: bool,
}

/// Executions this process drives (see [`Drivers`]): one call recovers an execution after a
/// takeover and the others wait for its result instead of recording it twice, and the owner's
/// sweep never drives an execution beside a live call of this process.
fn drivers() -> std::sync::MutexGuard<'static, std::collections::HashMap<String, Drivers>> {
    static S: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, Drivers>>> =
        std::sync::OnceLock::new();
    S.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// This call drives `id` (alone, or beside other calls of the owner) until dropped.
#[must_use = "the drive ends when it is dropped"]
pub(crate) struct Driving {
    id: String,
    sole: bool,
}

impl Drop for Driving {
    fn drop(&mut self) {
        let mut d = drivers();
        if let Some(e) = d.get_mut(&self.id) {
            if self.sole {
                e.sole = false;
            } else {
                e.shared = e.shared.saturating_sub(1);
            }
            if !e.sole && e.shared == 0 {
                d.remove(&self.id);
            }
        }
    }
}

/// Become the one call of this process that drives `id` after its takeover; `None` when
/// another call does.
pub(crate) fn drive_taken(id: &ExecutionId) -> Option<Driving> {
    let mut d = drivers();
    let e = d.entry(id.as_str().to_owned()).or_default();
    if e.sole {
        return None;
    }
    e.sole = true;
    Some(Driving {
        id: id.as_str().to_owned(),
        sole: true,
    })
}

/// Drive `id`, which this replica owns from its own acceptance, beside any other call of its
/// own that does; `None` while one call drives it alone (the owner's sweep picked it up).
fn drive_own(id: &ExecutionId) -> Option<Driving> {
    let mut d = drivers();
    let e = d.entry(id.as_str().to_owned()).or_default();
    if e.sole {
        return None;
    }
    e.shared += 1;
    Some(Driving {
        id: id.as_str().to_owned(),
        sole: false,
    })
}

/// Whether a call of this process drives `id`, or is taking it towards its dispatch
/// ([`crate::owner::claim`], from before its acceptance).
pub(crate) fn driven_here(id: &ExecutionId) -> bool {
    driven_in(&drivers(), id)
}

/// [`driven_here`], under the lock already taken.
fn driven_in(d: &std::collections::HashMap<String, Drivers>, id: &ExecutionId) -> bool {
    d.contains_key(id.as_str()) || crate::owner::claimed_here(id.as_str())
}

/// Become the one call of this process that drives `id`, an execution this replica owns, when
/// no call of this process drives it or is taking it towards its dispatch (checked under the
/// same lock every driving call registers under); `None` otherwise.
pub(crate) fn drive_undriven(id: &ExecutionId) -> Option<Driving> {
    let mut d = drivers();
    if driven_in(&d, id) {
        return None;
    }
    d.insert(
        id.as_str().to_owned(),
        Drivers {
            shared: 0,
            sole: true,
        },
    );
    Some(Driving {
        id: id.as_str().to_owned(),
        sole: true,
    })
}

impl Executor {
    /// The owner of `id` (`pid@host`) when it is accepted, not dispatched, and that owner may
    /// still send it (see [`crate::owner`]).
    pub(super) fn owner_may_dispatch(&self, id: &ExecutionId) -> Result<Option<String>, ExecError> {
        let Some(rec) = self.journal.execution(id)? else {
            return Ok(None);
        };
        let events = self.journal.events(id)?;
        self.live_owner(id, &rec.client, &events)
    }

    /// The process that may still dispatch `id` if it is accepted and not dispatched. On a
    /// shared journal that is its owning replica while its lease is current, and nobody once
    /// this replica took it over (the old owner's appends, its `dispatched` among them, are
    /// refused by the fence). Elsewhere, see [`crate::owner`].
    pub(super) fn live_owner(
        &self,
        id: &ExecutionId,
        accepted_by: &str,
        events: &[crate::journal::Event],
    ) -> Result<Option<String>, ExecError> {
        if let Some(o) = self.journal.ownership(id)? {
            if !o.mine {
                return Ok(o.live.then_some(o.client));
            }
            if self.journal.taken_over_here(id) {
                return Ok(None);
            }
        }
        let owner = crate::owner::owner_of(accepted_by, events);
        Ok(crate::owner::may_still_dispatch(id.as_str(), owner).then(|| owner.to_owned()))
    }

    /// `id`'s owner's lease expired: take it over (then the caller reads its ownership again
    /// and drives it as its new owner). `Some(Drive::Review)` when it was taken over too often.
    async fn take_over_expired(&mut self, id: &ExecutionId) -> Result<Option<Drive>, ExecError> {
        for (_, t) in self.journal.take_over(Some(id), 1)? {
            match t {
                crate::journal::TakeOver::Taken { from, epoch } => {
                    tracing::info!(
                        "cairn: {id}: the lease of its owner {from} expired; this replica \
                         took it over (epoch {epoch}) and recovers it"
                    );
                }
                crate::journal::TakeOver::Exhausted => {
                    tracing::warn!(
                        "cairn: {id} was taken over {} times already; left for review",
                        crate::journal::MAX_TAKEOVERS
                    );
                    return Ok(Some(Drive::Review));
                }
                // Settled, or taken over a moment ago by this process's own sweep
                // (which drives it then): read again rather than drive it beside that.
                crate::journal::TakeOver::NotNeeded => {}
                // Another replica is taking it over right now: let it commit.
                crate::journal::TakeOver::Held => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
            }
        }
        Ok(None)
    }

    /// On a shared journal an execution is driven by its owner. Before driving `id` (attach,
    /// recover, dispatch again), the admission table decides ([`Ask::Drive`]): go ahead when
    /// nobody owns it, this replica owns it from its own acceptance (unless its sweep picked
    /// it up, see [`Executor::redrive_owned`]: then wait for that), or it is settled; when its
    /// owner's lease expired, take it over (a `takeover` event, the epoch bumped: the old owner
    /// is fenced) and drive it as its new owner; while a live replica owns it, or another call
    /// of this process drives it after a takeover, wait until it settles (or that lease
    /// expires): woken by the notification of its settling append, reading the journal again
    /// without one every poll interval and when the lease would expire (docs/REPLICAS.md:
    /// notifications are hints). [`Drive::Review`] when it was taken over
    /// [`crate::journal::MAX_TAKEOVERS`] times already: left for review, not driven again.
    pub(super) async fn own_or_wait(&mut self, id: &ExecutionId) -> Result<Drive, ExecError> {
        // Made before the first read, so that a settling notified after it wakes the wait.
        let Some(mut watch) = self.journal.watch(id) else {
            // Not shared by replicas: nobody owns it.
            return self.drive_routed(id, &unowned(), Route::Drive);
        };
        let mut said = false;
        // Waiting on a live replica's lease is bounded by this call's reconnect window: past
        // it the caller gets what the journal holds, as held by that owner.
        let mut until: Option<Instant> = None;
        loop {
            let o = self.journal.ownership(id)?;
            let mut f = self.drive_facts(id, o.as_ref())?;
            let mut route = admission::route(Ask::Drive { window_over: false }, &f);
            if route == Route::Drive && f.owner == Owner::Here {
                route = match self.drive_routed(id, &f, route) {
                    Ok(Drive::Go(None)) => {
                        // another call of this replica recovers it (after a takeover, or the
                        // owner's sweep picked it up): wait for its result
                        f.owner = Owner::HereBusy;
                        admission::route(Ask::Drive { window_over: false }, &f)
                    }
                    d => return d,
                };
            }
            let (Some(o), Route::Wait) = (o, route) else {
                if route == Route::TakeOver {
                    if let Some(d) = self.take_over_expired(id).await? {
                        return Ok(d);
                    }
                    continue;
                }
                return self.drive_routed(id, &f, route);
            };
            if !said {
                tracing::info!(
                    "cairn: {id} is driven by replica {} (lease epoch {}); waiting until it \
                     settles or its lease expires",
                    o.replica,
                    o.epoch
                );
                said = true;
            }
            // Another replica's lease: read again when it would expire, if nothing comes first,
            // and give up waiting at the end of the reconnect window.
            let within = match f.owner {
                Owner::Live => {
                    let now = Instant::now();
                    let mut end = *until.get_or_insert(now + self.patience.reconnect_for);
                    if now >= end {
                        // A run its owner drives, or would pick up once undriven
                        // ([`Ask::Redrive`]), ends with a result worth waiting for, as on one
                        // gateway: wait another window. Only one the owner leaves alone is
                        // answered as held at the end of the window.
                        let f = redrive_facts(&self.journal, id, f)?;
                        match admission::route(Ask::Drive { window_over: true }, &f) {
                            Route::Wait => {
                                end = now + self.patience.reconnect_for;
                                until = Some(end);
                            }
                            Route::HeldByAnother => return Ok(self.held(id, o)),
                            other => return self.drive_routed(id, &f, other),
                        }
                    }
                    Duration::from_millis(o.lease_left_ms.max(0) as u64 + 50).min(end - now)
                }
                _ => crate::journal::poll_every(),
            };
            match watch.wait(within).await {
                crate::journal::Woken::Notified => {
                    tracing::debug!("cairn: {id}: woken by the notification of its settling")
                }
                crate::journal::Woken::Listening => tracing::debug!(
                    "cairn: {id}: woken by the listener listening again; reading the journal"
                ),
                crate::journal::Woken::Timeout => {}
            }
        }
    }

    /// What [`Ask::Drive`] is asked about `id` given its ownership row `o`: nobody owns it
    /// without a row or once the row settled (its state is not read then); otherwise its state,
    /// and whether its owner is this replica ([`Owner::Here`]), another that lives
    /// ([`Owner::Live`]), or one whose lease expired ([`Owner::Dead`]).
    fn drive_facts(
        &self,
        id: &ExecutionId,
        o: Option<&crate::journal::Ownership>,
    ) -> Result<Facts, ExecError> {
        let Some(o) = o.filter(|o| !o.settled) else {
            return Ok(unowned());
        };
        let recorded = match self.journal.status(id)? {
            Some(s) => Recorded::At(s.state),
            None => Recorded::Stateless,
        };
        let owner = match (o.mine, o.live) {
            (true, _) => Owner::Here,
            (false, true) => Owner::Live,
            (false, false) => Owner::Dead,
        };
        Ok(Facts {
            recorded,
            owner,
            ..unowned()
        })
    }

    /// What [`Executor::own_or_wait`] answers for `route`, a route that ends its wait:
    /// [`Route::Drive`] goes ahead, with the guard when this replica owns it (this call drives
    /// it then; `Go(None)` when another call of this process drives it alone, and the caller
    /// asks again as [`Owner::HereBusy`]). The guard is taken only after the table said so:
    /// taking it is a side effect.
    fn drive_routed(&self, id: &ExecutionId, f: &Facts, route: Route) -> Result<Drive, ExecError> {
        match route {
            Route::Drive if f.owner == Owner::Here => {
                let g = if self.journal.taken_over_here(id) {
                    drive_taken(id)
                } else {
                    drive_own(id)
                };
                Ok(Drive::Go(g))
            }
            Route::Drive | Route::Settled => Ok(Drive::Go(None)),
            other => Err(ExecError::Internal(format!(
                "the admission table routed a drive of {id} ({f:?}) to {other:?}"
            ))),
        }
    }

    /// [`Route::HeldByAnother`]: `o`, a live replica, still holds `id` at the end of this
    /// call's reconnect window.
    fn held(&self, id: &ExecutionId, o: crate::journal::Ownership) -> Drive {
        tracing::info!(
            "cairn: {id} is still owned by live replica {} (lease epoch {}) and not settled \
             after this call's reconnect window ({:?}); answering what the journal holds, \
             nothing concluded",
            o.replica,
            o.epoch,
            self.patience.reconnect_for
        );
        Drive::Held {
            replica: o.replica,
            client: o.client,
            epoch: o.epoch,
        }
    }

    /// The answer of a call that may not drive `id` ([`Executor::own_or_wait`] said so):
    /// left for review, or held by its live owner. Nothing is written.
    pub(super) fn not_driven(&mut self, id: &ExecutionId, d: Drive) -> Result<Outcome, ExecError> {
        let (replica, client, epoch) = match d {
            Drive::Held {
                replica,
                client,
                epoch,
            } => (replica, client, epoch),
            _ => return self.review_outcome(id),
        };
        let run = self.load(id)?;
        let mut o = self.outcome_from_journal(&run)?;
        o.reason = Some(format!(
            "{}; held by its owner, replica {replica} (lease epoch {epoch}), which is alive: it \
             did not settle within this call's reconnect window ({:?}); nothing is concluded: \
             attach to it again, or send the call to that replica (its owner drives it)",
            o.state, self.patience.reconnect_for
        ));
        o.held_by = Some(client);
        Ok(o)
    }

    /// `run` is held by a live owner: wait (within the reconnect window) until the owner
    /// dispatches it, settles it, or is gone ([`Ask::AwaitOwner`] says when to stop); then
    /// `run` is what the journal says by then.
    pub(super) async fn wait_for_owner(&mut self, run: &mut Run) -> Result<(), ExecError> {
        let id = run.rec.id.clone();
        let deadline = Instant::now() + self.patience.reconnect_for;
        let mut said = false;
        loop {
            let ask = Ask::AwaitOwner {
                wait_over: Instant::now() >= deadline,
            };
            match admission::route(ask, &self.await_owner_facts(&id, ask)?) {
                Route::Wait => {}
                Route::Attach => break,
                other => {
                    return Err(ExecError::Internal(format!(
                        "the admission table routed the wait for the owner of {id} to {other:?}"
                    )))
                }
            }
            if !said {
                tracing::info!(
                    "cairn: {id} is accepted by a live process that has not dispatched it yet; \
                     waiting for it (up to {:?})",
                    self.patience.reconnect_for
                );
                said = true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (out_off, err_off) = (run.out_off, run.err_off);
        *run = self.load(&id)?;
        run.out_off = out_off;
        run.err_off = err_off;
        Ok(())
    }

    /// What [`Ask::AwaitOwner`] (`ask`) is asked about `id`: its state, and its owner only
    /// while that could make the drive wait ([`Owner::Live`] when one may still dispatch it).
    fn await_owner_facts(&self, id: &ExecutionId, ask: Ask) -> Result<Facts, ExecError> {
        let recorded = match self.journal.status(id)? {
            Some(s) => Recorded::At(s.state),
            None => Recorded::Stateless,
        };
        let mut facts = Facts {
            recorded,
            ..unowned()
        };
        let if_owned = Facts {
            owner: Owner::Live,
            ..facts
        };
        if admission::route(ask, &if_owned) == Route::Wait && self.owner_may_dispatch(id)?.is_some()
        {
            facts.owner = Owner::Live;
        }
        Ok(facts)
    }

    /// The outcome of an execution a live owner may still dispatch: the journal's state, the
    /// owner, and why nothing is concluded. Nothing is written.
    pub(super) fn held_outcome(&self, run: &Run) -> Result<Outcome, ExecError> {
        let owner = self.owner_may_dispatch(&run.rec.id)?;
        let mut o = self.outcome_from_journal(run)?;
        let reason = Machine::held_reason();
        o.reason = Some(format!(
            "{reason} (owner: {})",
            owner.as_deref().unwrap_or("gone since")
        ));
        o.held_by = owner.or_else(|| Some(run.rec.client.clone()));
        Ok(o)
    }
}
