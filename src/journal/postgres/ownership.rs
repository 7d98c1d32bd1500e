//! Ownership across replicas: this process's replica identity and lease (its heartbeat), the
//! executions it owns or was fenced out of, and taking over an execution whose owner's lease
//! expired.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use super::fence::{self, Fence};
use super::{runtime, Obj, Pg};
use crate::evidence::Evidence;
use crate::id::ExecutionId;
use crate::journal::{client_identity, JournalError, Result};

/// How long a replica's lease lasts without a heartbeat, in milliseconds (`--lease-for`).
static LEASE_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(15_000);

/// Set how long this process's lease as a replica lasts; it heartbeats every third of it.
pub fn set_lease_for(d: Duration) {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(300);
    LEASE_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

/// How long this process's lease as a replica lasts.
pub fn lease_for() -> Duration {
    Duration::from_millis(LEASE_MS.load(std::sync::atomic::Ordering::Relaxed))
}

fn lease_ms() -> i64 {
    i64::try_from(LEASE_MS.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(i64::MAX)
}

/// How many times one execution is taken over at most: a replica that crashes on it (or
/// makes its new owner crash) leaves it for review after that, instead of a recovery storm.
pub const MAX_TAKEOVERS: i32 = 3;

/// This process as a replica: its client identity and a random part, so that a PID reused
/// after a restart is another replica, never the one that held the lease before.
pub fn replica_id() -> &'static str {
    static R: OnceLock<String> = OnceLock::new();
    R.get_or_init(|| {
        let nonce = ExecutionId::generate();
        let tail = nonce.as_str();
        let tail = &tail[tail.len().saturating_sub(12)..];
        format!("{}/{tail}", client_identity())
    })
}

/// The executions this process owns (it accepted or took them over), with the lease epoch it
/// holds each at: its appends to them are fenced by that epoch.
pub(super) fn owned() -> std::sync::MutexGuard<'static, HashMap<String, Held>> {
    static OWNED: OnceLock<Mutex<HashMap<String, Held>>> = OnceLock::new();
    OWNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn own(id: &ExecutionId, epoch: i64, taken_over: bool) {
    fenced_here().remove(id.as_str());
    owned().insert(id.as_str().to_owned(), Held { epoch, taken_over });
}

/// The executions this process was fenced out of (an append of its own refused with CA001,
/// another replica owns them at a later epoch): it appends nothing more to them, owner's write
/// or not, until it owns one again (a takeover of its own).
pub(super) fn fenced_here() -> std::sync::MutexGuard<'static, std::collections::HashSet<String>> {
    static FENCED: OnceLock<Mutex<std::collections::HashSet<String>>> = OnceLock::new();
    FENCED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// This process lost `id` to another replica: it forgets its ownership and appends nothing more.
pub(in crate::journal) fn fence_out(id: &str) {
    owned().remove(id);
    fenced_here().insert(id.to_owned());
}

/// An append to `id` was refused by the fence (CA001): an owner is fenced out for good; anyone
/// else keeps its stale observation, so its next append is refused too until it reads `id`
/// again.
pub(in crate::journal) fn refused_by_fence(id: &str, mine: bool, e: &JournalError) {
    if mine {
        fence_out(id);
        tracing::warn!("cairn: {e}");
    } else {
        tracing::info!("cairn: {e}");
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) epoch: i64,
    /// Taken over from another replica (whose `accepted` it can no longer dispatch).
    pub(super) taken_over: bool,
}

/// Who owns an execution on a shared journal.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Ownership {
    /// The owning replica (`pid@host/nonce`) and its process (`pid@host`).
    pub replica: String,
    pub client: String,
    pub epoch: i64,
    /// How many times it was taken over from a replica whose lease expired.
    pub takeovers: i32,
    /// Its ownership ended with the execution settling.
    pub settled: bool,
    /// The owner's lease is current (database time).
    pub live: bool,
    /// How long the owner's lease lasts yet without a heartbeat (database time; 0 once expired).
    pub lease_left_ms: i64,
    /// This process is the owner.
    pub mine: bool,
}

/// What a takeover attempt found.
#[derive(Clone, Debug)]
pub enum TakeOver {
    /// This replica owns it now, from `from` (the replica whose lease expired), at `epoch`.
    Taken { from: String, epoch: i64 },
    /// The owner's lease is current, or another replica is taking it over right now.
    Held,
    /// It was taken over [`MAX_TAKEOVERS`] times already: left for review.
    Exhausted,
    /// Nothing to take: no owner row, settled, or this replica's already.
    NotNeeded,
}

/// Upsert this process's replica row with the database's time and the current lease.
async fn heartbeat(c: &Obj) -> std::result::Result<u64, tokio_postgres::Error> {
    c.execute(
        "INSERT INTO replicas (id, client, lease_ms) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), lease_ms = excluded.lease_ms",
        &[&replica_id(), &client_identity(), &lease_ms()],
    )
    .await
}

impl Pg {
    /// Make this process's replica row and start its heartbeat (once per process and
    /// database): before it owns anything, so that its lease exists from its first accept.
    pub(super) async fn register(&self) -> Result<()> {
        self.registered
            .get_or_try_init(|| async {
                let c = self.client().await?;
                heartbeat(&c).await.map_err(|e| self.err(e))?;
                let me = self.me.clone();
                runtime().spawn(async move {
                    loop {
                        let every = Duration::from_millis((lease_ms() / 3).max(100) as u64);
                        tokio::time::sleep(every).await;
                        let Some(pg) = me.upgrade() else { return };
                        let beat = match pg.pool.get().await {
                            Ok(c) => heartbeat(&c).await.map_err(|e| pg.err(e)),
                            Err(e) => Err(pg.fail(format!("no connection to the database: {e}"))),
                        };
                        if let Err(e) = beat {
                            tracing::warn!(
                                "cairn: replica {} missed a heartbeat: {e}; past its lease, \
                                 another replica may take its executions over",
                                replica_id()
                            );
                        }
                    }
                });
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Who owns `id`, judged in database time.
    pub(in crate::journal) fn ownership(&self, id: &ExecutionId) -> Result<Option<Ownership>> {
        let rows = self.query(
            "SELECT o.replica, r.client, o.epoch, o.takeovers, o.settled,
                    r.heartbeat_at + r.lease_ms * interval '1 millisecond' >= now(),
                    GREATEST(0, extract(epoch FROM r.heartbeat_at
                        + r.lease_ms * interval '1 millisecond' - now()) * 1000)::bigint
             FROM owners o JOIN replicas r ON r.id = o.replica WHERE o.execution_id = $1",
            &[&id.as_str()],
        )?;
        Ok(rows.first().map(|r| {
            let replica: String = r.get(0);
            fence::observe(id.as_str(), r.get(2));
            Ownership {
                mine: replica == replica_id(),
                replica,
                client: r.get(1),
                epoch: r.get(2),
                takeovers: r.get(3),
                settled: r.get(4),
                live: r.get(5),
                lease_left_ms: r.get(6),
            }
        }))
    }

    /// Every execution's takeover count (those never taken over are left out).
    pub(in crate::journal) fn takeover_counts(&self) -> Result<HashMap<String, i32>> {
        Ok(self
            .query(
                "SELECT execution_id, takeovers FROM owners WHERE takeovers > 0",
                &[],
            )?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }

    /// The executions this replica owns that are not settled, by ID.
    pub(in crate::journal) fn owned_unsettled(&self) -> Result<Vec<ExecutionId>> {
        Ok(self
            .query(
                "SELECT execution_id FROM owners WHERE replica = $1 AND NOT settled
                 ORDER BY execution_id",
                &[&replica_id()],
            )?
            .iter()
            .filter_map(|r| ExecutionId::parse(r.get::<_, &str>(0)).ok())
            .collect())
    }

    /// Whether this process took `id` over from a replica whose lease expired (that replica
    /// can no longer append to it, so it can no longer dispatch it).
    pub(in crate::journal) fn taken_over_here(&self, id: &ExecutionId) -> bool {
        owned().get(id.as_str()).is_some_and(|h| h.taken_over)
    }

    /// Take over executions whose owner's lease expired: `id` alone, or up to `limit` of them.
    /// Each is locked `FOR UPDATE SKIP LOCKED` (two replicas sweeping at once take different
    /// ones), its epoch bumped and its takeover count raised, and a `takeover` event naming the
    /// old and new owner appended, all in one transaction, so the old owner's next append is
    /// refused by the fence. Returns what was taken; `id` alone also says why not.
    pub(in crate::journal) fn take_over(
        &self,
        id: Option<&ExecutionId>,
        limit: i64,
    ) -> Result<Vec<(ExecutionId, TakeOver)>> {
        let mut out = self.block(async {
            self.register().await?;
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            let me = replica_id();
            let one = id.map(|i| i.as_str());
            let rows = tx
                .query(
                    "SELECT o.execution_id, o.replica, r.client, o.epoch, o.takeovers, r.lease_ms
                     FROM owners o JOIN replicas r ON r.id = o.replica
                     WHERE NOT o.settled AND o.replica <> $1
                       AND r.heartbeat_at + r.lease_ms * interval '1 millisecond' < now()
                       AND ($2::text IS NULL OR o.execution_id = $2)
                       AND ($2::text IS NOT NULL OR o.takeovers < $4)
                     ORDER BY o.execution_id LIMIT $3
                     FOR UPDATE OF o SKIP LOCKED",
                    &[&me, &one, &limit, &MAX_TAKEOVERS],
                )
                .await
                .map_err(|e| self.err(e))?;
            let mut taken = Vec::new();
            let mut said = Vec::new();
            for r in rows {
                let xid: String = r.get(0);
                let (from, from_client): (String, String) = (r.get(1), r.get(2));
                let (epoch, takeovers, lease): (i64, i32, i64) = (r.get(3), r.get(4), r.get(5));
                let Ok(xid) = ExecutionId::parse(&xid) else {
                    continue;
                };
                if takeovers >= MAX_TAKEOVERS {
                    said.push((xid, TakeOver::Exhausted));
                    continue;
                }
                tx.execute(
                    "UPDATE owners SET replica = $2, epoch = $3, takeovers = $4
                     WHERE execution_id = $1",
                    &[&xid.as_str(), &me, &(epoch + 1), &(takeovers + 1)],
                )
                .await
                .map_err(|e| self.err(e))?;
                let evidence = Evidence::Takeover {
                    from: &from,
                    from_client: &from_client,
                    to: me,
                    to_client: client_identity(),
                    epoch: epoch + 1,
                    takeover: takeovers + 1,
                    max_takeovers: MAX_TAKEOVERS,
                    lease_ms: lease,
                    reason: (),
                };
                // Whatever this process held of it before is over (the row is locked here).
                owned().remove(xid.as_str());
                let (kind, state, evidence) = evidence.into_event();
                // Its owner now, in this transaction (the row says so already).
                let fence = Fence::Owner(epoch + 1);
                self.append_as(&tx, xid.as_str(), kind.as_str(), state, &evidence, fence)
                    .await?;
                taken.push((xid, from, epoch + 1));
            }
            tx.commit().await.map_err(|e| self.err(e))?;
            for (xid, _, epoch) in &taken {
                own(xid, *epoch, true);
            }
            Ok(taken
                .into_iter()
                .map(|(xid, from, epoch)| (xid, TakeOver::Taken { from, epoch }))
                .chain(said)
                .collect::<Vec<_>>())
        })?;
        if let (Some(id), true) = (id, out.is_empty()) {
            let why = match self.ownership(id)? {
                Some(o) if !o.settled && !o.mine => TakeOver::Held,
                _ => TakeOver::NotNeeded,
            };
            out.push((id.clone(), why));
        }
        Ok(out)
    }
}
