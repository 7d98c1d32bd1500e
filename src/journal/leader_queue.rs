//! Group commit's leader queue, written once for both stores (the SQLite file's `group.rs` and
//! PostgreSQL's `postgres/group.rs`): who writes which requests, and how each caller gets its
//! own outcome back. How a batch is written is the store's (a closure given to
//! [`LeaderQueue::submit`]); the queue knows nothing of databases.
//!
//! A caller enqueues its request with a ticket. While fewer than [`Limits::leaders`] leaders are
//! active and requests are queued, a caller becomes a leader: it first prepares what it writes
//! with (a connection; taken **before** any request, so that a leader waiting for a connection
//! holds no one's request and a leader that cannot get one fails only its own), then takes up to
//! [`Limits::batch`] queued requests in their order, hands them to the store's writer, publishes
//! each request's outcome under its ticket and steps down. Everyone else waits on a condition
//! variable for its ticket; a waiter whose request another leader took may lead the next batch,
//! so no caller leads for ever under sustained load.
//!
//! The guarantees, whatever the store:
//!
//! - **Its own outcome, once.** A caller returns only once the outcome of its own request has
//!   been published (the store publishes one only once the request committed or failed), and
//!   it is the only one to collect it.
//! - **One request's failure is its own.** The writer gives each request its own outcome; a
//!   leader that cannot prepare fails its own request if no other leader took it, and leaves
//!   the rest queued for their owners.
//! - **No one waits for a lost leader.** A leader that panics (or whose writer returns too few
//!   outcomes) publishes the queue's "lost" outcome (outcome unknown: it may or may not have
//!   been committed) to each request it had taken, and steps down: a drop guard.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// How much batching a journal's group has done since it was created in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCommitStats {
    /// Transactions committed by group commit (batches, and requests retried alone).
    pub transactions: u64,
    /// Events committed by those transactions.
    pub events: u64,
}

/// How many leaders may write at once, and how many requests one batch may hold.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Most leaders writing a batch at once (at least 1).
    pub(super) leaders: usize,
    /// Most requests one leader takes (at least 1; `usize::MAX`: everything queued).
    pub(super) batch: usize,
}

struct Queue<R, O> {
    next_ticket: u64,
    /// Requests no leader has taken yet, in the order they were submitted.
    waiting: VecDeque<(u64, R)>,
    /// Leaders active: preparing, or holding requests whose outcomes are not yet published.
    leaders: usize,
    /// Outcomes not yet collected by their callers.
    done: HashMap<u64, O>,
}

/// What a would-be leader's preparation gives: what it writes with, or, failing that, the
/// outcome of its own request.
pub(super) enum Prepared<C, O> {
    Ready(C),
    Failed(O),
}

/// The leader queue of one group: requests `R` in, outcomes `O` out.
pub(super) struct LeaderQueue<R, O> {
    queue: Mutex<Queue<R, O>>,
    changed: Condvar,
    limits: Limits,
    /// The outcome of a request whose leader was lost (see the module comment).
    lost: fn() -> O,
    transactions: AtomicU64,
    events: AtomicU64,
}

impl<R, O> LeaderQueue<R, O> {
    /// An empty queue; `lost` makes the outcome of a request whose leader panicked.
    pub(super) fn new(limits: Limits, lost: fn() -> O) -> Self {
        assert!(limits.leaders >= 1 && limits.batch >= 1, "{limits:?}");
        LeaderQueue {
            queue: Mutex::new(Queue {
                next_ticket: 0,
                waiting: VecDeque::new(),
                leaders: 0,
                done: HashMap::new(),
            }),
            changed: Condvar::new(),
            limits,
            lost,
            transactions: AtomicU64::new(0),
            events: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue<R, O>> {
        // Nothing runs under this lock that could panic half-way through a change.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Count one committed transaction holding `events` events (for [`Self::stats`]).
    pub(super) fn committed(&self, events: u64) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.events.fetch_add(events, Ordering::Relaxed);
    }

    /// The transactions and events counted so far.
    pub(super) fn stats(&self) -> GroupCommitStats {
        GroupCommitStats {
            transactions: self.transactions.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
        }
    }

    /// Commit `req` together with whatever else is queued; return its own outcome once
    /// published. A caller that leads runs `prepare` (its failure is this request's outcome, if
    /// no other leader took the request meanwhile), then `write` with what `prepare` gave and
    /// the requests it took, in queue order; `write` returns one outcome per request, in the
    /// same order. What `prepare` gave is dropped after the outcomes are published.
    pub(super) fn submit<C>(
        &self,
        req: R,
        mut prepare: impl FnMut() -> Prepared<C, O>,
        mut write: impl FnMut(&mut C, Vec<R>) -> Vec<O>,
    ) -> O {
        let mut q = self.lock();
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.waiting.push_back((ticket, req));
        loop {
            if let Some(out) = q.done.remove(&ticket) {
                return out;
            }
            if q.leaders < self.limits.leaders && !q.waiting.is_empty() {
                q.leaders += 1;
                drop(q);
                let mut leading = Leading {
                    queue: self,
                    own: ticket,
                    tickets: Vec::new(),
                };
                let mut with = match prepare() {
                    Prepared::Ready(c) => c,
                    Prepared::Failed(failure) => {
                        // Without it this caller cannot lead: its own request fails if no
                        // leader took it, the rest stay queued for their owners.
                        if leading.give_up(ticket) {
                            return failure;
                        }
                        q = self.lock();
                        continue;
                    }
                };
                q = self.lock();
                let n = q.waiting.len().min(self.limits.batch);
                let (tickets, reqs): (Vec<u64>, Vec<R>) = q.waiting.drain(..n).unzip();
                drop(q);
                leading.tickets = tickets;
                if !reqs.is_empty() {
                    let outcomes = write(&mut with, reqs);
                    leading.publish(outcomes);
                } else {
                    // Other leaders took everything while this one prepared.
                    drop(leading);
                }
                drop(with);
                q = self.lock();
                continue;
            }
            q = self.changed.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A leader's duty to publish the outcomes of the requests it took and step down, done by
/// [`Leading::publish`] or, if the leader unwinds first, by its drop.
struct Leading<'a, R, O> {
    queue: &'a LeaderQueue<R, O>,
    /// The leader's own ticket: withdrawn if the leader unwinds, since no one will collect it.
    own: u64,
    /// Taken and not yet published.
    tickets: Vec<u64>,
}

impl<R, O> Leading<'_, R, O> {
    /// Publish the outcomes (in the order of the tickets; a ticket without one gets the lost
    /// outcome), step down and wake everyone.
    fn publish(mut self, outcomes: Vec<O>) {
        let mut outcomes = outcomes.into_iter();
        let mut q = self.queue.lock();
        for t in self.tickets.drain(..) {
            let o = outcomes.next().unwrap_or_else(self.queue.lost);
            q.done.insert(t, o);
        }
        drop(q);
        // Dropping `self` steps down.
    }

    /// Step down without leading: whether `ticket`'s request was still queued (and is now
    /// withdrawn, its owner returning on its own).
    fn give_up(self, ticket: u64) -> bool {
        let mut q = self.queue.lock();
        let before = q.waiting.len();
        q.waiting.retain(|(t, _)| *t != ticket);
        before > q.waiting.len()
        // Dropping `self` steps down.
    }
}

impl<R, O> Drop for Leading<'_, R, O> {
    fn drop(&mut self) {
        let mut q = self.queue.lock();
        for t in self.tickets.drain(..) {
            q.done.insert(t, (self.queue.lost)());
        }
        if std::thread::panicking() {
            q.done.remove(&self.own);
            q.waiting.retain(|(t, _)| *t != self.own);
        }
        q.leaders -= 1;
        drop(q);
        self.queue.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    /// A request of the test queues: (thread, n).
    type Req = (usize, usize);
    /// Outcomes of the test queues: the request echoed back, or lost.
    type Out = Result<Req, &'static str>;
    type Q = Arc<LeaderQueue<Req, Out>>;

    fn lost() -> Out {
        Err("lost")
    }

    fn queue(leaders: usize, batch: usize) -> Q {
        Arc::new(LeaderQueue::new(Limits { leaders, batch }, lost))
    }

    /// Run `f` on a thread of its own; its result (`Err` if it panicked) comes back through the
    /// receiver, so that a caller left waiting fails the test by timing out rather than hanging.
    fn spawn<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> mpsc::Receiver<std::thread::Result<T>> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        });
        rx
    }

    fn within<T>(rx: &mpsc::Receiver<std::thread::Result<T>>) -> std::thread::Result<T> {
        rx.recv_timeout(Duration::from_secs(30))
            .expect("a caller is still waiting for its outcome")
    }

    /// The leaders and batch sizes seen by the writers of one test.
    #[derive(Default)]
    struct Seen {
        leaders: AtomicUsize,
        most_leaders: AtomicUsize,
        biggest_batch: AtomicUsize,
        batches: AtomicUsize,
    }

    /// `threads` × `each` submits of `(thread, n)` on `q`, every writer echoing its requests
    /// after a short sleep (so that requests pile up); returns what each thread got, in order.
    fn run(q: &Q, seen: &Arc<Seen>, threads: usize, each: usize) -> Vec<Vec<Out>> {
        let rxs: Vec<_> = (0..threads)
            .map(|t| {
                let (q, seen) = (Arc::clone(q), Arc::clone(seen));
                spawn(move || {
                    (0..each)
                        .map(|n| {
                            q.submit(
                                (t, n),
                                || Prepared::Ready(()),
                                |_, reqs| {
                                    let now = seen.leaders.fetch_add(1, Ordering::SeqCst) + 1;
                                    seen.most_leaders.fetch_max(now, Ordering::SeqCst);
                                    seen.biggest_batch.fetch_max(reqs.len(), Ordering::SeqCst);
                                    seen.batches.fetch_add(1, Ordering::SeqCst);
                                    std::thread::sleep(Duration::from_millis(2));
                                    seen.leaders.fetch_sub(1, Ordering::SeqCst);
                                    reqs.into_iter().map(Ok).collect()
                                },
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        rxs.iter().map(|rx| within(rx).unwrap()).collect()
    }

    /// Each caller got its own request's outcome (never another's), one per submit, and the
    /// queue holds nothing uncollected.
    fn assert_each_own(q: &Q, got: &[Vec<Out>], each: usize) {
        for (t, outs) in got.iter().enumerate() {
            let want: Vec<Out> = (0..each).map(|n| Ok((t, n))).collect();
            assert_eq!(outs, &want, "thread {t}");
        }
        let g = q.lock();
        assert!(g.done.is_empty(), "every outcome was collected");
        assert!(g.waiting.is_empty() && g.leaders == 0);
    }

    #[test]
    fn every_caller_gets_its_own_outcome_once_and_requests_share_batches() {
        let (q, seen) = (queue(1, usize::MAX), Arc::new(Seen::default()));
        let got = run(&q, &seen, 8, 25);
        assert_each_own(&q, &got, 25);
        assert_eq!(seen.most_leaders.load(Ordering::SeqCst), 1);
        assert!(
            seen.batches.load(Ordering::SeqCst) < 8 * 25,
            "some requests were written together"
        );
    }

    #[test]
    fn never_more_leaders_than_the_limit_nor_a_batch_over_its_limit() {
        let (q, seen) = (queue(2, 3), Arc::new(Seen::default()));
        let got = run(&q, &seen, 8, 25);
        assert_each_own(&q, &got, 25);
        assert_eq!(seen.most_leaders.load(Ordering::SeqCst), 2, "two at once");
        assert_eq!(seen.biggest_batch.load(Ordering::SeqCst), 3);
    }

    /// A leader whose writer panics: each request it took gets the lost outcome and its caller
    /// returns; the queue keeps no leader and nothing of the leader's own; later callers
    /// complete.
    #[test]
    fn a_leader_that_panics_gives_its_batch_the_lost_outcome_and_the_rest_complete() {
        let q = queue(1, usize::MAX);
        let (entered_tx, entered_rx) = mpsc::channel();
        let release = Arc::new(std::sync::Barrier::new(2));
        let leader = {
            let (q, release) = (Arc::clone(&q), Arc::clone(&release));
            spawn(move || {
                q.submit(
                    (0, 0),
                    || Prepared::Ready(()),
                    |_, _| -> Vec<Out> {
                        entered_tx.send(()).unwrap();
                        release.wait();
                        panic!("test: the first leader panics mid-batch")
                    },
                )
            })
        };
        entered_rx.recv().unwrap();
        // Queued while the first leader writes; whichever leads the second batch takes both
        // and panics too, so the other gets the lost outcome.
        let queued: Vec<_> = (1..3)
            .map(|t| {
                let q = Arc::clone(&q);
                spawn(move || {
                    q.submit(
                        (t, 0),
                        || Prepared::Ready(()),
                        |_, _| -> Vec<Out> { panic!("test: the second leader panics") },
                    )
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while q.lock().waiting.len() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the two requests did not queue behind the one leader"
            );
            std::thread::yield_now();
        }
        release.wait();
        assert!(within(&leader).is_err(), "the leader's own thread unwinds");
        let outs: Vec<_> = queued.iter().map(within).collect();
        assert_eq!(outs.iter().filter(|o| o.is_err()).count(), 1, "one led");
        assert!(
            outs.iter().any(|o| matches!(o, Ok(Err("lost")))),
            "the other got the lost outcome"
        );
        let seen = Arc::new(Seen::default());
        let got = run(&q, &seen, 4, 10);
        assert_each_own(&q, &got, 10);
    }

    /// A writer returning too few outcomes: the requests it did not answer (here the caller's
    /// own) get the lost outcome rather than waiting for ever.
    #[test]
    fn taken_requests_without_an_outcome_get_the_lost_one() {
        let q = queue(1, usize::MAX);
        {
            let mut g = q.lock();
            g.next_ticket = 10;
            for t in 1..3 {
                g.waiting.push_back((t as u64, (t, 0)));
            }
        }
        let mine = {
            let q = Arc::clone(&q);
            spawn(move || q.submit((0, 0), || Prepared::Ready(()), |_, reqs| vec![Ok(reqs[0])]))
        };
        assert_eq!(within(&mine).unwrap(), Err("lost"));
        let mut g = q.lock();
        assert_eq!(g.done.remove(&1), Some(Ok((1, 0))));
        assert_eq!(g.done.remove(&2), Some(Err("lost")));
        assert!(g.done.is_empty() && g.leaders == 0);
    }

    #[test]
    fn a_leader_that_cannot_prepare_fails_only_its_own_request() {
        let q = queue(1, usize::MAX);
        q.lock().waiting.push_back((7, (1, 0)));
        q.lock().next_ticket = 10;
        let out = q.submit(
            (0, 0),
            || Prepared::Failed(Err("no connection")),
            |_: &mut (), _| unreachable!("nothing is written without what prepare gives"),
        );
        assert_eq!(out, Err("no connection"));
        let g = q.lock();
        let left: Vec<u64> = g.waiting.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            left,
            [7],
            "the others' requests stay queued for their owners"
        );
        assert!(g.done.is_empty() && g.leaders == 0);
    }
}
