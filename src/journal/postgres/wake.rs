//! Waking callers that wait on an execution another replica drives: LISTEN/NOTIFY as a hint,
//! polling as the guarantee.
//!
//! A caller attached on replica B to an execution owned by replica A waits until A settles it
//! (or A's lease expires). The journal is the only truth, so the caller reads it again now and
//! then; to learn *when* to read it, each process keeps one dedicated connection per database
//! that `LISTEN`s on `cairn_events`, and the process that appends an event settling an
//! execution notifies that channel with the execution's ID once the append has committed
//! ([`NOTIFY_SETTLED`]). The listener wakes the callers waiting on that ID, who read the
//! journal at once.
//!
//! Notifications are hints, never evidence: one can be lost (the listener's connection breaks,
//! the database restarts, the appending process stops between its commit and its notification,
//! a notification arrives before a caller started waiting), so a waiter still reads the journal
//! every [`poll_every`] without one, and correctness never depends on a notification arriving.
//! When the listener's connection breaks it connects again (backoff from 100 ms doubling up to
//! 5 s, for the life of the process) and, once it listens again, wakes *every* waiter: whatever
//! was notified while it was down is lost, so each of them reads the journal once more. A
//! connection that stops answering without breaking (a partition) is found by a ping every
//! 30 s.
//!
//! Only settling appends notify, and never from inside the appending transaction. PostgreSQL
//! serialises the commits of transactions that notify (a database-wide lock held until each
//! one's commit record is flushed), so a notifying append transaction would make every commit
//! wait for the one before it: schema version 5 did it with a trigger on `events`, and under
//! half the inserts/s at 32 clients went through (benches/RESULTS.md). Since version 7 the
//! group commit's leader sends one `pg_notify` per settled execution, in one statement of a
//! transaction of its own on the same connection, pipelined right behind the batch's `COMMIT`
//! (the server runs it once the commit is done), and without waiting for that small
//! transaction's own flush (a hint lost in a crash is lost either way).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, NoTls};

use super::{runtime, Pg};

/// Version 5 of the schema: a settling append notifies `cairn_events` with its execution's ID.
pub(in crate::journal) const MIGRATION: &str = "
CREATE FUNCTION cairn_notify_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('cairn_events', NEW.execution_id); RETURN NULL; END $$;
CREATE TRIGGER events_notify_settled AFTER INSERT ON events FOR EACH ROW
    WHEN (NEW.state IN ('rejected', 'completed', 'failed', 'interrupted', 'cancelled'))
    EXECUTE FUNCTION cairn_notify_settled();
";

/// Version 7 of the schema: the trigger of version 5 is gone; the process that appended a
/// settling event notifies after the commit ([`NOTIFY_SETTLED`]). A binary of version 6 or
/// older refuses a database at version 7, so no replica appends without notifying.
pub(in crate::journal) const MIGRATION_7: &str = "
DROP TRIGGER events_notify_settled ON events;
DROP FUNCTION cairn_notify_settled();
";

/// The channel settling appends notify.
const CHANNEL: &str = "cairn_events";

/// Whether an event moving an execution to `state` notifies its waiters (the states of the
/// trigger of version 5: `delivered` follows an outcome already notified).
pub(super) fn notifies(state: Option<crate::state::State>) -> bool {
    use crate::state::State::*;
    matches!(
        state,
        Some(Rejected | Completed | Failed | Interrupted | Cancelled)
    )
}

/// Notify `cairn_events` of each execution in `$1` (a text array), in the implicit
/// transaction of this one statement, with `synchronous_commit` off for it (`set_config`
/// local to the transaction, still in force when it commits), so that it holds the notify lock
/// for no WAL flush. The group commit sends it right behind a batch's `COMMIT`.
pub(super) const NOTIFY_SETTLED: &str = "SELECT pg_notify('cairn_events', id) \
     FROM set_config('synchronous_commit', 'off', true), unnest($1::text[]) AS id";

/// How long a waiter waits without a notification before it reads the journal anyway.
const POLL_EVERY: Duration = Duration::from_secs(1);

/// How often an idle listener checks that its connection still answers, and for how long.
const PING_EVERY: Duration = Duration::from_secs(30);
const PING_FOR: Duration = Duration::from_secs(10);

/// The listener's backoff between attempts to connect again.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// How long a waiter waits between reads of the journal when no notification wakes it. Tests
/// lengthen it (`CAIRN_TEST_WAIT_POLL_MS`) to show that a notification carried the wake-up.
pub fn poll_every() -> Duration {
    static P: OnceLock<Duration> = OnceLock::new();
    *P.get_or_init(|| {
        std::env::var("CAIRN_TEST_WAIT_POLL_MS")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_millis)
            .unwrap_or(POLL_EVERY)
    })
}

/// Whether this process listens at all (tests turn it off with `CAIRN_TEST_LISTEN=off` to show
/// that polling alone delivers).
fn listening_enabled() -> bool {
    std::env::var("CAIRN_TEST_LISTEN").map_or(true, |v| v != "off")
}

/// The `application_name` of this process's listener connections (`pg_stat_activity` shows
/// which process each belongs to).
pub fn listener_name() -> String {
    format!("cairn-listen {}", std::process::id())
}

/// What woke a waiter: counters that only grow, one per cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Wakes {
    notified: u64,
    listening: u64,
}

/// Why [`Watch::wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woken {
    /// A settling append of this execution was notified.
    Notified,
    /// The listener (re)started listening: notifications may have been lost before.
    Listening,
    /// Nothing came within the poll interval (or the wait's own limit).
    Timeout,
}

/// Everyone waiting, by execution ID, in one process for one database.
#[derive(Default)]
struct Waiters {
    by_id: Mutex<HashMap<String, watch::Sender<Wakes>>>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<Wakes>>> {
        self.by_id.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn notified(&self, id: &str) {
        if let Some(tx) = self.lock().get(id) {
            tx.send_modify(|w| w.notified += 1);
        }
    }

    /// Wake every waiter; how many executions had one.
    fn all_listening(&self) -> usize {
        let by_id = self.lock();
        for tx in by_id.values() {
            tx.send_modify(|w| w.listening += 1);
        }
        by_id.len()
    }
}

/// One caller's wake-up for one execution: made before its first read of the journal, so that
/// nothing notified after that read is missed.
pub struct Watch {
    id: String,
    rx: watch::Receiver<Wakes>,
    seen: Wakes,
    waiters: Arc<Waiters>,
}

impl Watch {
    /// Wait until this execution's settling append is notified, the listener starts listening
    /// again, or `within` (at most [`poll_every`]) passes; whichever came since the last call.
    pub async fn wait(&mut self, within: Duration) -> Woken {
        let within = within.min(poll_every());
        let _ = tokio::time::timeout(within, self.rx.changed()).await;
        let now = *self.rx.borrow_and_update();
        let was = std::mem::replace(&mut self.seen, now);
        if now.notified != was.notified {
            Woken::Notified
        } else if now.listening != was.listening {
            Woken::Listening
        } else {
            Woken::Timeout
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut by_id = self.waiters.lock();
        // our own receiver still counts: the last one out removes the entry
        if by_id
            .get(&self.id)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            by_id.remove(&self.id);
        }
    }
}

/// A wake-up for `id` on `pg`'s database; starts this process's listener for it on first use.
pub(super) fn watch(pg: &Pg, id: &str) -> Watch {
    let waiters = listener(pg);
    let rx = waiters
        .lock()
        .entry(id.to_owned())
        .or_insert_with(|| watch::channel(Wakes::default()).0)
        .subscribe();
    let seen = *rx.borrow();
    Watch {
        id: id.to_owned(),
        rx,
        seen,
        waiters,
    }
}

/// The waiters of `pg`'s database, with its listener started (once per database and process;
/// it runs for the rest of the process).
fn listener(pg: &Pg) -> Arc<Waiters> {
    static LISTENERS: OnceLock<Mutex<HashMap<String, Arc<Waiters>>>> = OnceLock::new();
    let mut all = LISTENERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(w) = all.get(pg.location()) {
        return w.clone();
    }
    let waiters = Arc::new(Waiters::default());
    all.insert(pg.location().to_owned(), waiters.clone());
    if listening_enabled() {
        let mut config = pg.config.clone();
        config.application_name(listener_name());
        let (w, location) = (waiters.clone(), pg.location().to_owned());
        runtime().spawn(listen_forever(config, location, w));
    } else {
        tracing::info!(
            "cairn: journal {}: not listening for notifications (CAIRN_TEST_LISTEN=off): \
             waiters read the journal every {:?}",
            pg.location(),
            poll_every()
        );
    }
    waiters
}

/// How one connection of the listener ended.
enum Ended {
    /// It never listened (connect or `LISTEN` failed).
    NoConnection(String),
    /// It listened, then broke.
    Broke(String),
}

async fn listen_forever(config: tokio_postgres::Config, location: String, waiters: Arc<Waiters>) {
    let mut retry = RETRY_FIRST;
    let mut listened_before = false;
    let mut said_down = false;
    loop {
        let ended = listen_once(&config, &location, &waiters, listened_before).await;
        match ended {
            Ended::Broke(why) => {
                listened_before = true;
                retry = RETRY_FIRST;
                said_down = true;
                tracing::warn!(
                    "cairn: journal {location}: the connection that listens for settled \
                     executions broke ({why}); connecting again (waiters read the journal every \
                     {:?} meanwhile)",
                    poll_every()
                );
            }
            Ended::NoConnection(why) => {
                if !said_down {
                    tracing::warn!(
                        "cairn: journal {location}: cannot listen for settled executions \
                         ({why}); trying again (waiters read the journal every {:?} meanwhile)",
                        poll_every()
                    );
                    said_down = true;
                }
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(RETRY_MAX);
    }
}

/// Connect, `LISTEN`, wake every waiter, then hand each notification to its waiters until the
/// connection breaks or stops answering pings.
async fn listen_once(
    config: &tokio_postgres::Config,
    location: &str,
    waiters: &Arc<Waiters>,
    again: bool,
) -> Ended {
    let (client, mut conn) = match config.connect(NoTls).await {
        Ok(c) => c,
        Err(e) => return Ended::NoConnection(e.to_string()),
    };
    let w = waiters.clone();
    let mut drive = tokio::spawn(async move {
        let mut msgs = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(m) = msgs.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) if n.channel() == CHANNEL => {
                    w.notified(n.payload())
                }
                Ok(_) => {}
                Err(e) => return e.to_string(),
            }
        }
        "the server closed the connection".to_owned()
    });
    if let Err(e) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
        drive.abort();
        return Ended::NoConnection(e.to_string());
    }
    // Whatever was notified before this connection listened is lost: everyone reads again.
    let woke = waiters.all_listening();
    if again {
        tracing::info!(
            "cairn: journal {location}: listening for settled executions again; woke {woke} \
             waiter(s) to read the journal"
        );
    }
    loop {
        tokio::select! {
            r = &mut drive => {
                return Ended::Broke(r.unwrap_or_else(|e| e.to_string()));
            }
            _ = tokio::time::sleep(PING_EVERY) => {
                let why = match tokio::time::timeout(PING_FOR, client.batch_execute("SELECT 1")).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no answer to a ping within {PING_FOR:?}"),
                };
                drive.abort();
                return Ended::Broke(why);
            }
        }
    }
}
