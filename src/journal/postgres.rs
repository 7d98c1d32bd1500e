//! The PostgreSQL backend (`--journal postgres://…`): one journal shared by gateway replicas.
//!
//! Same records and the same rules as the SQLite file, in a schema of its own:
//!
//! - **Append-only events.** Triggers refuse `UPDATE`, `DELETE` and `TRUNCATE` on `events` and
//!   `session_events`, and `UPDATE` on an accepted execution or a started session, whatever the
//!   role's grants (docs/REPLICAS.md gives a role that holds only the grants it needs).
//! - **A chain per execution.** Each event's hash chains it to the execution's previous event
//!   (the execution's head is a row of `chain_heads`, locked for the append), so replicas writing
//!   different executions never queue on one hot row. `seq` is one sequence over all events:
//!   increasing, not gapless (a rolled-back append uses a number). Session entries chain per
//!   session (a session is one process: one replica).
//! - **One execution per intent across replicas.** Intent matching and acceptance are one
//!   atomic statement on `intent_keys` (primary key: fingerprint, actor, scope):
//!   `INSERT … ON CONFLICT … DO UPDATE … WHERE <expired> RETURNING`. The replica whose row it is
//!   accepts; every other one finds the key held, with the row locked by that same statement, and
//!   chooses among the live candidates under the lock, exactly as the SQLite file does under
//!   `BEGIN IMMEDIATE`. Windows are measured in database time, not replica clocks.
//! - **Group commit.** Appends and accepts from every handle of this process on one database
//!   share transactions (`postgres/group.rs`): many executions in flight pay one commit between
//!   them, each request still fenced, chained and refused on its own.
//! - **Versioned migrations** applied on first use, under an advisory lock (replicas starting
//!   together migrate once); a database whose schema is newer than this binary is refused.
//!
//! How the synchronous journal API drives an asynchronous client: the executor calls the
//! journal synchronously from async code (as it does with SQLite, whose commits block the
//! calling thread for their fsync). The connections (tokio-postgres, pooled by
//! deadpool-postgres) live on a small runtime of the journal's own; each operation enters that
//! runtime's context and blocks the calling thread on its future with
//! `futures::executor::block_on`, which, unlike `Runtime::block_on` or the sync `postgres` crate,
//! does not panic inside another tokio runtime. The caller's thread waits on channels only; all
//! socket I/O is driven by the journal runtime's threads, so a caller on a single-threaded
//! runtime cannot starve its own query.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use super::{
    chain_hash, client_identity, now_rfc3339, redact_url, status_from_states, AcceptOrMatch,
    Candidate, ChainFields, Event, ExecutionRecord, IntentColumns, JournalError, JournalMetrics,
    Result,
};
use crate::epoch::{Announced, HostPlace};
use crate::event::EventKind;
use crate::evidence::Evidence;
use crate::id::ExecutionId;
use crate::state::State;
use fence::Fence;

mod backend;
pub(crate) mod checkpoint;
mod fence;
mod group;
mod http;
mod ownership;
pub(super) mod schema;
mod sessions;
pub(crate) mod wake;

use ownership::{fenced_here, own, owned, refused_by_fence};
pub use ownership::{lease_for, replica_id, set_lease_for, Ownership, TakeOver, MAX_TAKEOVERS};
pub use schema::PG_SCHEMA_VERSION;

/// The SQLSTATE of an append refused by the ownership fence.
pub(super) const FENCED: &str = "CA001";

/// The SQLSTATE of an append the lifecycle refused (see [`schema::MIGRATION_8`]).
pub(super) const REFUSED: &str = "CA002";

/// A refusal of the lifecycle by `cairn_append_as` as the typed error
/// ([`JournalError::Refused`]); any other error as it is.
pub(super) fn lifecycle_refusal(id: &str, e: JournalError) -> JournalError {
    let JournalError::Postgres {
        location,
        message,
        code: Some(code),
        ..
    } = &e
    else {
        return e;
    };
    if code != REFUSED {
        return e;
    }
    let parsed = message
        .strip_prefix("lifecycle refuses ")
        .and_then(|m| m.split_once(" -> "))
        .and_then(|(from, rest)| {
            let to = rest.split_once(" for execution ").map_or(rest, |(t, _)| t);
            let from = match from {
                "" => None,
                f => Some(f.parse::<State>().ok()?),
            };
            Some(crate::lifecycle::Illegal {
                from,
                to: to.parse::<State>().ok()?,
            })
        });
    match parsed {
        Some(refused) => JournalError::Refused {
            location: location.clone(),
            id: id.to_owned(),
            refused,
            conditional: false,
        },
        None => e,
    }
}

/// How long an operation waits for a connection to a database that does not accept one.
const RECONNECT_FOR: Duration = Duration::from_secs(20);

/// Database time in milliseconds since the Unix epoch (the clock every replica shares).
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Whether a journal location names a PostgreSQL database (pure, in the core).
pub use crate::location::is_postgres_url;

/// The journal runtime: two threads that drive every PostgreSQL connection of this process.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cairn-journal-pg")
            .enable_all()
            .build()
            .expect("start the journal's PostgreSQL runtime")
    })
}

/// One database: its pool, shared by every handle on the same URL in this process.
pub(super) struct Pg {
    pool: Pool,
    /// The URL with any password replaced, for messages.
    location: String,
    /// Itself, for the heartbeat task (which ends when the last handle is dropped).
    me: Weak<Pg>,
    /// Whether this process's replica row exists and its heartbeat runs.
    registered: tokio::sync::OnceCell<()>,
    /// How to connect, for the listener's connection of its own (see `wake.rs`).
    config: tokio_postgres::Config,
    /// Appends and accepts of every handle on this database, committed in batches.
    group: group::Group,
}

/// The store for `url`: the live one of this process, else a new pool with the schema checked
/// (and migrated) once.
pub(super) fn open(url: &str) -> Result<Arc<Pg>> {
    type Registry = Mutex<HashMap<String, Weak<Pg>>>;
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    let mut reg = REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(pg) = reg.get(url).and_then(Weak::upgrade) {
        return Ok(pg);
    }
    reg.retain(|_, g| g.strong_count() > 0);
    let location = redact_url(url);
    let bad = |message: String| JournalError::Postgres {
        location: location.clone(),
        message,
        code: None,
        constraint: None,
    };
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| bad(format!("not a usable PostgreSQL URL: {e}")))?;
    let mut config = config;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    if config.get_application_name().is_none() {
        config.application_name("cairn");
    }
    let mgr = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = {
        let _rt = runtime().enter();
        Pool::builder(mgr)
            .max_size(16)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(15)))
            .build()
            .map_err(|e| bad(e.to_string()))?
    };
    let pg = Arc::new_cyclic(|me| Pg {
        pool,
        location,
        me: me.clone(),
        registered: tokio::sync::OnceCell::new(),
        config,
        group: group::Group::default(),
    });
    pg.migrate()?;
    reg.insert(url.to_owned(), Arc::downgrade(&pg));
    Ok(pg)
}

type Obj = deadpool_postgres::Object;

type Tx<'a> = deadpool_postgres::Transaction<'a>;

impl Pg {
    pub(super) fn location(&self) -> &str {
        &self.location
    }

    fn err(&self, e: tokio_postgres::Error) -> JournalError {
        let db = e.as_db_error();
        let message = match db {
            Some(d) => d.message().to_owned(),
            None => e.to_string(),
        };
        JournalError::Postgres {
            location: self.location.clone(),
            message,
            code: db.map(|d| d.code().code().to_owned()),
            constraint: db.and_then(|d| d.constraint()).map(str::to_owned),
        }
    }

    fn fail(&self, message: impl Into<String>) -> JournalError {
        JournalError::Postgres {
            location: self.location.clone(),
            message: message.into(),
            code: None,
            constraint: None,
        }
    }

    /// Run one operation to its end on the calling thread (see the module comment).
    fn block<T>(&self, fut: impl Future<Output = Result<T>>) -> Result<T> {
        let _rt = runtime().enter();
        futures::executor::block_on(fut)
    }

    /// A pooled connection. Connections the server closed (a restart) are dropped by the pool
    /// and replaced; while the server does not accept new ones, keep trying for up to
    /// [`RECONNECT_FOR`]: nothing was sent yet, so waiting is safe, and a restart of the database
    /// is then a pause for the callers rather than a failed call.
    async fn client(&self) -> Result<Obj> {
        let t0 = std::time::Instant::now();
        let mut wait = Duration::from_millis(50);
        loop {
            let e = match self.pool.get().await {
                Ok(c) => return Ok(c),
                Err(e) => e,
            };
            if t0.elapsed() + wait > RECONNECT_FOR {
                return Err(match e {
                    deadpool_postgres::PoolError::Backend(e) => self.err(e),
                    other => self.fail(format!("no connection to the database: {other}")),
                });
            }
            if wait == Duration::from_millis(50) {
                tracing::warn!(
                    "cairn: journal {}: no connection ({e}); trying again for up to {}s",
                    self.location,
                    RECONNECT_FOR.as_secs()
                );
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }

    /// Append one event to execution `id`'s chain on `c` (inside a transaction or alone): one
    /// call of `cairn_append`, which holds the head row's lock until commit, so appends to one
    /// execution are serialised, numbered in chain order, and never fork its chain.
    async fn append_in(
        &self,
        c: &impl GenericClient,
        id: &str,
        kind: &str,
        state: Option<State>,
        evidence: &serde_json::Value,
    ) -> Result<Event> {
        self.append_as(c, id, kind, state, evidence, Fence::of(id))
            .await
    }

    /// [`Pg::append_in`] fenced by `fence` (see `postgres/fence.rs`): an owner's append by the
    /// epoch it holds, anyone else's by the epoch it observed. A refused owner is fenced out.
    async fn append_as(
        &self,
        c: &impl GenericClient,
        id: &str,
        kind: &str,
        state: Option<State>,
        evidence: &serde_json::Value,
        fence: Fence,
    ) -> Result<Event> {
        if !fence.mine() {
            // A process fenced out of `id` appends nothing more to it, note or not, until it
            // owns it again (an owner's fence here is a takeover's or an accept's own).
            self.not_fenced_out(id)?;
        }
        let at = now_rfc3339();
        let evidence_text = evidence.to_string();
        let client = client_identity();
        let st = state.map(|s| s.as_str());
        let (replica, epoch) = fence.args();
        let sql = "SELECT o_seq, o_hash, o_prev \
                   FROM cairn_append_as($1, $2, $3, $4, $5, $6, $7, $8)";
        let stmt = c.prepare_cached(sql).await.map_err(|e| self.err(e))?;
        let row = c
            .query_one(
                &stmt,
                &[
                    &id,
                    &at,
                    &kind,
                    &st,
                    &evidence_text,
                    &client,
                    &replica,
                    &epoch,
                ],
            )
            .await
            .map_err(|e| {
                let e = self.err(e);
                if e.is_fenced() {
                    refused_by_fence(id, fence.mine(), &e);
                }
                lifecycle_refusal(id, e)
            })?;
        let (seq, hash, prev_hash): (i64, String, String) = (row.get(0), row.get(1), row.get(2));
        let f = ChainFields {
            prev_hash: &prev_hash,
            seq,
            execution_id: id,
            at: &at,
            kind,
            state: st.unwrap_or(""),
            evidence: &evidence_text,
            client,
        };
        self.checked_event(&f, hash, state, evidence.clone())
    }

    /// The event the database stored with `hash`, once checked against the hash cairn computes
    /// over the same fields: a database whose append function is not the one this cairn
    /// installed is refused, not trusted.
    pub(super) fn checked_event(
        &self,
        f: &ChainFields<'_>,
        hash: String,
        state: Option<State>,
        evidence: serde_json::Value,
    ) -> Result<Event> {
        let ours = chain_hash(f);
        if ours != hash {
            return Err(self.fail(format!(
                "the database hashed event {} of {} as {hash}, cairn as {ours}: \
                 its cairn_append function is not the one this cairn installed",
                f.seq, f.execution_id
            )));
        }
        Ok(Event {
            seq: f.seq,
            execution_id: f.execution_id.to_owned(),
            at: f.at.to_owned(),
            kind: EventKind::parse(f.kind),
            state,
            evidence,
            client: f.client.to_owned(),
            hash,
        })
    }

    async fn insert_accepted(
        &self,
        tx: &Tx<'_>,
        rec: &ExecutionRecord,
        cols: Option<&IntentColumns>,
        evidence: &serde_json::Value,
    ) -> Result<Event> {
        self.register().await?;
        let intent = cols.map(|c| c.intent.to_string());
        let replica = replica_id();
        let params: [&(dyn ToSql + Sync); 20] = [
            &rec.id.as_str(),
            &rec.created_at,
            &rec.destination,
            &rec.host,
            &i32::from(rec.port),
            &rec.user,
            &rec.command,
            &rec.command_digest,
            &rec.remote_dir,
            &(rec.timeout_secs as i64),
            &rec.client,
            &cols.map(|c| c.fingerprint.as_str()),
            &cols.map(|c| c.actor.as_str()),
            &cols.map(|c| c.scope.as_str()),
            &cols.map(|c| c.class.as_str()),
            &cols.map(|c| c.retention_secs as i64),
            &cols.map(|c| c.accepted_ms),
            &cols.and_then(|c| c.session_id.as_deref()),
            &intent,
            &replica,
        ];
        tx.execute(
            "WITH x AS (
                INSERT INTO executions (id, created_at, destination, host, port, \"user\",
                    command, command_digest, remote_dir, timeout_secs, client, fingerprint,
                    actor, scope, class, retention_secs, accepted_ms, session_id, intent)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                    $17, $18, $19)
                RETURNING id),
             h AS (INSERT INTO chain_heads (execution_id, seq, hash) SELECT id, 0, '' FROM x
                RETURNING execution_id)
             INSERT INTO owners (execution_id, replica, epoch) SELECT execution_id, $20, 1 FROM h",
            &params,
        )
        .await
        .map_err(|e| self.err(e))?;
        // Its owner row, just inserted, names this replica at epoch 1.
        let (id, fence) = (rec.id.as_str(), Fence::Owner(1));
        self.append_as(tx, id, "accepted", Some(State::Accepted), evidence, fence)
            .await
    }

    /// Accept `rec` (group-committed with other handles' writes): its row, chain head, owner
    /// row and `accepted` event in one transaction.
    pub(super) fn accept(
        &self,
        rec: &ExecutionRecord,
        evidence: &serde_json::Value,
    ) -> Result<Event> {
        let evs = self.submit(group::Request::Accept {
            rec: Box::new(rec.clone()),
            evidence: evidence.clone(),
        })?;
        own(&rec.id, 1, false);
        evs.into_iter()
            .next()
            .ok_or_else(|| self.fail("the accept returned no event"))
    }

    /// Append `events` to `id`'s chain, in order, in one transaction (group-committed with
    /// other handles' writes); the last as stored.
    pub(super) fn append_all(
        &self,
        id: &ExecutionId,
        events: &[(String, Option<State>, serde_json::Value)],
    ) -> Result<Option<Event>> {
        if events.is_empty() {
            return Ok(None);
        }
        self.not_fenced_out(id.as_str())?;
        let evs = self.submit(group::Request::Append {
            id: id.as_str().to_owned(),
            events: events.to_vec(),
        })?;
        Ok(evs.into_iter().last())
    }

    /// Refuse, here and as the database would (CA001), an append to an execution this process
    /// was fenced out of.
    fn not_fenced_out(&self, id: &str) -> Result<()> {
        if !fenced_here().contains(id) {
            return Ok(());
        }
        Err(JournalError::Postgres {
            location: self.location.clone(),
            message: format!(
                "execution {id} was taken over by another replica after the lease of this \
                 replica ({}) expired: this replica no longer writes or dispatches it",
                replica_id()
            ),
            code: Some(FENCED.to_owned()),
            constraint: None,
        })
    }

    /// Append `events` to `id`'s chain only while `id` holds one of the states `expect`: the
    /// owners row and the chain head are locked (in the order every append locks them), the
    /// head's state compared, and the events appended in that transaction. Not group-committed:
    /// for rare decisions (a `cancel` before the dispatch).
    pub(super) fn append_all_if(
        &self,
        id: &ExecutionId,
        expect: &[State],
        events: &[(String, Option<State>, serde_json::Value)],
    ) -> Result<Event> {
        let id = id.as_str();
        self.not_fenced_out(id)?;
        let out = self.block(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            tx.query_opt(
                "SELECT 1 FROM owners WHERE execution_id = $1 FOR UPDATE",
                &[&id],
            )
            .await
            .map_err(|e| self.err(e))?;
            let head = tx
                .query_opt(
                    "SELECT state FROM chain_heads WHERE execution_id = $1 FOR UPDATE",
                    &[&id],
                )
                .await
                .map_err(|e| self.err(e))?
                .ok_or_else(|| self.fail(format!("no execution {id} in this journal")))?;
            let now = head
                .get::<_, Option<String>>(0)
                .map(|s| s.parse::<State>().map_err(|e| self.fail(e)))
                .transpose()?;
            if !now.is_some_and(|s| expect.contains(&s)) {
                let to = events.iter().find_map(|e| e.1).unwrap_or(State::Accepted);
                return Err(JournalError::Refused {
                    location: self.location.clone(),
                    id: id.to_owned(),
                    refused: crate::lifecycle::Illegal { from: now, to },
                    conditional: true,
                });
            }
            let mut last = None;
            for (kind, state, evidence) in events {
                last = Some(self.append_in(&tx, id, kind, *state, evidence).await?);
            }
            tx.commit().await.map_err(|e| self.err(e))?;
            let settles = events.iter().any(|e| wake::notifies(e.1));
            if settles {
                if let Err(e) = c.execute(wake::NOTIFY_SETTLED, &[&vec![id]]).await {
                    tracing::debug!("cairn: journal {}: notifying {id}: {e}", self.location);
                }
            }
            Ok(last)
        })?;
        out.ok_or_else(|| self.fail(format!("no event to append to {id}")))
    }

    /// How many transactions and events group commit has written in this process.
    pub(super) fn group_commit_stats(&self) -> super::GroupCommitStats {
        self.group.stats()
    }

    pub(super) fn execution(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>> {
        self.block(async {
            let c = self.client().await?;
            let row = c
                .query_opt(
                    "SELECT id, created_at, destination, host, port, \"user\", command,
                            command_digest, remote_dir, timeout_secs, client
                     FROM executions WHERE id = $1",
                    &[&id.as_str()],
                )
                .await
                .map_err(|e| self.err(e))?;
            let Some(r) = row else { return Ok(None) };
            let corrupt = |message: String| JournalError::Corrupt {
                path: self.location.clone().into(),
                id: id.to_string(),
                message,
            };
            let port: i32 = r.get(4);
            let timeout: i64 = r.get(9);
            Ok(Some(ExecutionRecord {
                id: ExecutionId::parse(r.get::<_, &str>(0)).map_err(|e| corrupt(e.to_string()))?,
                created_at: r.get(1),
                destination: r.get(2),
                host: r.get(3),
                port: u16::try_from(port)
                    .map_err(|_| corrupt(format!("port {port} out of range")))?,
                user: r.get(5),
                command: r.get(6),
                command_digest: r.get(7),
                remote_dir: r.get(8),
                timeout_secs: u64::try_from(timeout)
                    .map_err(|_| corrupt(format!("timeout {timeout} out of range")))?,
                client: r.get(10),
            }))
        })
    }

    pub(super) fn events(&self, id: &ExecutionId) -> Result<Vec<Event>> {
        self.block(async {
            let c = self.client().await?;
            let rows = c
                .query(
                    "SELECT seq, execution_id, at, kind, state, evidence, hash, client,
                            COALESCE((SELECT epoch FROM owners WHERE execution_id = $1), 0)
                     FROM events WHERE execution_id = $1 ORDER BY seq",
                    &[&id.as_str()],
                )
                .await
                .map_err(|e| self.err(e))?;
            // The lease epoch these events were read at (one statement: one snapshot), which
            // this process's next decision on them is fenced by.
            if let Some(r) = rows.first() {
                fence::observe(id.as_str(), r.get(8));
            }
            let mut out = Vec::with_capacity(rows.len());
            for r in rows {
                let seq: i64 = r.get(0);
                let eid: String = r.get(1);
                let corrupt = |message: String| JournalError::Corrupt {
                    path: self.location.clone().into(),
                    id: eid.clone(),
                    message,
                };
                let state = match r.get::<_, Option<&str>>(4) {
                    Some(s) => Some(
                        s.parse::<State>()
                            .map_err(|e| corrupt(format!("event {seq}: {e}")))?,
                    ),
                    None => None,
                };
                let evidence = serde_json::from_str(r.get::<_, &str>(5))
                    .map_err(|e| corrupt(format!("event {seq}: evidence is not JSON: {e}")))?;
                out.push(Event {
                    seq,
                    execution_id: eid.clone(),
                    at: r.get(2),
                    kind: EventKind::parse(r.get(3)),
                    state,
                    evidence,
                    client: r.get(7),
                    hash: r.get(6),
                });
            }
            Ok(out)
        })
    }

    /// `id`'s status from its chain head (`heads.rs`), and the lease epoch it was read at
    /// (one statement), observed for the fence as a read of its events is.
    pub(super) fn status(&self, id: &ExecutionId) -> Result<Option<super::Status>> {
        let row = self.query_opt(
            "SELECT h.state,
                    CASE WHEN h.state = 'unknown' THEN
                        (SELECT v.state FROM events v
                         WHERE v.execution_id = $1 AND v.state IS NOT NULL
                           AND v.state <> 'unknown'
                         ORDER BY v.seq DESC LIMIT 1) END,
                    COALESCE((SELECT epoch FROM owners WHERE execution_id = $1), 0)
             FROM chain_heads h WHERE h.execution_id = $1",
            &[&id.as_str()],
        )?;
        let Some(r) = row else { return Ok(None) };
        fence::observe(id.as_str(), r.get(2));
        let Some(state) = r.get::<_, Option<&str>>(0) else {
            return Ok(None);
        };
        super::heads::status_of(&self.location, id, state, r.get(1)).map(Some)
    }

    /// Every execution ID, newest first.
    pub(super) fn execution_ids(&self) -> Result<Vec<String>> {
        self.block(async {
            let c = self.client().await?;
            let rows = c
                .query(
                    "SELECT id FROM executions ORDER BY created_at DESC, id DESC",
                    &[],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    pub(super) fn cursor(&self, id: &ExecutionId) -> Result<(u64, u64)> {
        self.block(async {
            let c = self.client().await?;
            let r = c
                .query_opt(
                    "SELECT out_off, err_off FROM cursors WHERE execution_id = $1",
                    &[&id.as_str()],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(r.map(|r| {
                (
                    r.get::<_, i64>(0).max(0) as u64,
                    r.get::<_, i64>(1).max(0) as u64,
                )
            })
            .unwrap_or((0, 0)))
        })
    }

    /// A cursor is progress, not evidence: written without waiting for the WAL flush
    /// (`synchronous_commit = off` for this transaction), like SQLite's `synchronous=NORMAL`.
    pub(super) fn set_cursor(&self, id: &ExecutionId, out_off: u64, err_off: u64) -> Result<()> {
        self.block(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            tx.batch_execute("SET LOCAL synchronous_commit = off")
                .await
                .map_err(|e| self.err(e))?;
            tx.execute(
                "INSERT INTO cursors (execution_id, out_off, err_off) VALUES ($1, $2, $3)
                 ON CONFLICT (execution_id) DO UPDATE SET out_off = $2, err_off = $3",
                &[&id.as_str(), &(out_off as i64), &(err_off as i64)],
            )
            .await
            .map_err(|e| self.err(e))?;
            tx.commit().await.map_err(|e| self.err(e))
        })
    }

    pub(super) fn prune_cursors(&self) -> Result<usize> {
        self.exec(
            "DELETE FROM cursors WHERE execution_id IN
               (SELECT execution_id FROM events WHERE state = 'delivered')",
            &[],
        )
        .map(|n| n as usize)
    }

    /// One statement on a pooled connection: the rows it touched.
    fn exec(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        self.block(async {
            let c = self.client().await?;
            c.execute(sql, params).await.map_err(|e| self.err(e))
        })
    }

    fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<tokio_postgres::Row>> {
        self.block(async {
            let c = self.client().await?;
            c.query(sql, params).await.map_err(|e| self.err(e))
        })
    }

    fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>> {
        self.block(async {
            let c = self.client().await?;
            c.query_opt(sql, params).await.map_err(|e| self.err(e))
        })
    }

    /// Intent matching's check-and-insert (see the module comment). `legacy` fingerprints
    /// (`cairn-intent-v1`) are never looked for: no PostgreSQL journal holds executions
    /// accepted before the intent record held the destination.
    pub(super) fn accept_or_match(
        &self,
        rec: &ExecutionRecord,
        cols: &IntentColumns,
        evidence: &serde_json::Value,
        match_evidence: &serde_json::Value,
        choose: impl FnOnce(&[Candidate]) -> Option<usize>,
    ) -> Result<AcceptOrMatch> {
        self.block(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            let retention_ms = (cols.retention_secs as i64).saturating_mul(1000);
            let key: [&(dyn ToSql + Sync); 3] = [&cols.fingerprint, &cols.actor, &cols.scope];
            // The one atomic statement: take the key if it is free or expired; otherwise the
            // statement locks the live holder's row, so the rest of this transaction decides
            // alone among the replicas asking for the same intent.
            let won = tx
                .query_opt(
                    &format!(
                        "INSERT INTO intent_keys AS k (fingerprint, actor, scope, execution_id,
                                                       expires_ms)
                         VALUES ($1, $2, $3, $4, {DB_NOW_MS} + $5)
                         ON CONFLICT (fingerprint, actor, scope) DO UPDATE
                            SET execution_id = excluded.execution_id,
                                expires_ms = excluded.expires_ms
                            WHERE k.expires_ms <= {DB_NOW_MS}
                         RETURNING execution_id"
                    ),
                    &[key[0], key[1], key[2], &rec.id.as_str(), &retention_ms],
                )
                .await
                .map_err(|e| self.err(e))?
                .is_some();
            if !won {
                let (cands, epochs) = self.candidates(&tx, cols).await?;
                if let Some(i) = choose(&cands).filter(|i| *i < cands.len()) {
                    let mut cands = cands;
                    let cand = cands.swap_remove(i);
                    // The match was decided on the candidate as read at `epochs[i]`, in this
                    // transaction but not under its owners row's lock: a takeover since refuses
                    // it (CA001), and the caller's retry decides again.
                    let id = cand.id.as_str();
                    fence::observe(id, epochs[i]);
                    let fence = match Fence::of(id) {
                        owner @ Fence::Owner(_) => owner,
                        _ => Fence::Observed(epochs[i]),
                    };
                    self.append_as(&tx, id, "intent-matched", None, match_evidence, fence)
                        .await?;
                    tx.commit().await.map_err(|e| self.err(e))?;
                    return Ok(AcceptOrMatch::Matched(cand));
                }
                // Nothing to attach to (failed, delivered …): this execution holds the key now.
                tx.execute(
                    &format!(
                        "UPDATE intent_keys SET execution_id = $4, expires_ms = {DB_NOW_MS} + $5
                         WHERE fingerprint = $1 AND actor = $2 AND scope = $3"
                    ),
                    &[key[0], key[1], key[2], &rec.id.as_str(), &retention_ms],
                )
                .await
                .map_err(|e| self.err(e))?;
            }
            let ev = self.insert_accepted(&tx, rec, Some(cols), evidence).await?;
            tx.commit().await.map_err(|e| self.err(e))?;
            own(&rec.id, 1, false);
            Ok(AcceptOrMatch::Accepted(ev))
        })
    }

    /// Earlier executions with this intent still inside their window (database time), newest
    /// first, with their status, and the lease epoch each was read at.
    async fn candidates(
        &self,
        tx: &Tx<'_>,
        cols: &IntentColumns,
    ) -> Result<(Vec<Candidate>, Vec<i64>)> {
        let rows = tx
            .query(
                &format!(
                    "SELECT x.id, x.class, x.accepted_ms, x.retention_secs,
                        ARRAY(SELECT v.state FROM events v
                              WHERE v.execution_id = x.id AND v.state IS NOT NULL
                              ORDER BY v.seq),
                        COALESCE((SELECT o.epoch FROM owners o WHERE o.execution_id = x.id), 0)
                     FROM executions x
                     WHERE x.fingerprint = $1 AND x.actor = $2 AND x.scope = $3
                       AND x.accepted_ms + x.retention_secs * 1000 > {DB_NOW_MS}
                     ORDER BY x.accepted_ms DESC, x.id DESC"
                ),
                &[&cols.fingerprint, &cols.actor, &cols.scope],
            )
            .await
            .map_err(|e| self.err(e))?;
        let (mut out, mut epochs) = (Vec::new(), Vec::new());
        for r in rows {
            let states: Vec<State> = r
                .get::<_, Vec<String>>(4)
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect();
            let Some(status) = status_from_states(&states) else {
                continue;
            };
            let Ok(id) = ExecutionId::parse(r.get::<_, &str>(0)) else {
                continue;
            };
            out.push(Candidate {
                id,
                class: r.get::<_, Option<String>>(1).unwrap_or_default(),
                accepted_ms: r.get::<_, Option<i64>>(2).unwrap_or_default(),
                retention_secs: r.get::<_, Option<i64>>(3).unwrap_or_default().max(0) as u64,
                status,
            });
            epochs.push(r.get::<_, i64>(5));
        }
        Ok((out, epochs))
    }

    pub(super) fn intent_of(&self, id: &ExecutionId) -> Result<Option<IntentColumns>> {
        let row = self.query_opt(
            "SELECT fingerprint, actor, scope, class, retention_secs, accepted_ms, session_id,
                    intent FROM executions WHERE id = $1 AND fingerprint IS NOT NULL",
            &[&id.as_str()],
        )?;
        Ok(row.map(|r| IntentColumns {
            fingerprint: r.get(0),
            actor: r.get::<_, Option<String>>(1).unwrap_or_default(),
            scope: r.get::<_, Option<String>>(2).unwrap_or_default(),
            class: r.get::<_, Option<String>>(3).unwrap_or_default(),
            retention_secs: r.get::<_, Option<i64>>(4).unwrap_or_default().max(0) as u64,
            accepted_ms: r.get::<_, Option<i64>>(5).unwrap_or_default(),
            session_id: r.get(6),
            intent: r
                .get::<_, Option<&str>>(7)
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or_default(),
        }))
    }

    pub(super) fn executions_of_session(&self, session: &str) -> Result<Vec<String>> {
        Ok(self
            .query(
                "SELECT id FROM executions WHERE session_id = $1 ORDER BY accepted_ms, id",
                &[&session],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    pub(super) fn host_epoch_at(&self, place: &HostPlace) -> Result<Option<String>> {
        Ok(self
            .query_opt(
                "SELECT epoch FROM host_places
                 WHERE destination = $1 AND host_key = $2 AND remote_dir = $3",
                &[&place.destination, &place.host_key, &place.remote_dir],
            )?
            .map(|r| r.get(0)))
    }

    /// As on SQLite (`hosts::observe_in`, written once): the bookkeeping and the events it
    /// teaches in one transaction. The place's key is locked first (an advisory lock on its
    /// hash), so two replicas learning about one host key at once do not both announce the
    /// same change.
    pub(super) fn observe_host_epoch(
        &self,
        id: &ExecutionId,
        place: &HostPlace,
        epoch: &str,
    ) -> Result<Announced> {
        self.block(async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            let lock_key = format!("{}\n{}", place.host_key, place.remote_dir);
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                &[&lock_key],
            )
            .await
            .map_err(|e| self.err(e))?;
            let mut book = PgBook { pg: self, tx: &tx };
            let (a, _) = super::hosts::observe_in(&mut book, id, place, epoch).await?;
            tx.commit().await.map_err(|e| self.err(e))?;
            Ok(a)
        })
    }

    pub(super) fn last_event_seq(&self) -> Result<i64> {
        Ok(self
            .query_opt("SELECT COALESCE(MAX(seq), 0)::bigint FROM events", &[])?
            .map(|r| r.get(0))
            .unwrap_or(0))
    }

    pub(super) fn metrics(&self) -> Result<JournalMetrics> {
        self.block(async {
            let c = self.client().await?;
            let e = |e| self.err(e);
            let by_state = c
                .query(
                    "SELECT st, COUNT(*) FROM (
                        SELECT (SELECT v.state FROM events v
                                WHERE v.execution_id = x.id AND v.state IS NOT NULL
                                ORDER BY v.seq DESC LIMIT 1) AS st
                        FROM executions x) s
                     WHERE st IS NOT NULL GROUP BY st ORDER BY st",
                    &[],
                )
                .await
                .map_err(e)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let mut m = JournalMetrics {
                by_state,
                ..JournalMetrics::default()
            };
            m.dispatch_latencies = c
                .query(
                    "SELECT EXTRACT(EPOCH FROM (d.at::timestamptz - a.at::timestamptz))::float8
                     FROM events a JOIN events d
                       ON d.seq = (SELECT MIN(seq) FROM events
                                   WHERE execution_id = a.execution_id AND kind = 'dispatched')
                     WHERE a.kind = 'accepted'",
                    &[],
                )
                .await
                .map_err(e)?
                .iter()
                .filter_map(|r| r.get::<_, Option<f64>>(0))
                .map(|s| s.max(0.0))
                .collect();
            let counts = c
                .query(
                    "SELECT kind, COUNT(*) FROM events
                     WHERE kind IN ('intent-matched', 'request-reused', 'delivery-abandoned',
                                    'takeover', 'redrive')
                     GROUP BY kind",
                    &[],
                )
                .await
                .map_err(e)?;
            for r in counts {
                let n = r.get::<_, i64>(1).max(0) as u64;
                match r.get::<_, &str>(0) {
                    "intent-matched" => m.attached_by_intent = n,
                    "request-reused" => m.attached_by_id = n,
                    "takeover" => m.takeovers = n,
                    "redrive" => m.redrives = n,
                    _ => m.delivery_abandoned = n,
                }
            }
            m.reconnects = c
                .query_one(
                    "SELECT COALESCE(SUM(CASE
                        WHEN jsonb_typeof((evidence::jsonb) -> 'reconnects') = 'number'
                        THEN ((evidence::jsonb) ->> 'reconnects')::numeric ELSE 0 END), 0)::bigint
                     FROM events WHERE state IS NOT NULL",
                    &[],
                )
                .await
                .map_err(e)?
                .get::<_, i64>(0)
                .max(0) as u64;
            Ok(m)
        })
    }

    /// A wake-up for `id`'s settling (see `wake.rs`).
    pub(super) fn watch(&self, id: &ExecutionId) -> wake::Watch {
        wake::watch(self, id.as_str())
    }

    /// Run SQL as this journal's role (tests: what the role may and may not do).
    #[cfg(test)]
    pub(super) fn raw_execute(&self, sql: &str) -> Result<u64> {
        self.exec(sql, &[])
    }
}

/// The PostgreSQL book of the host bookkeeping (`hosts.rs`): one transaction, under the
/// advisory lock of the place's host key.
struct PgBook<'a> {
    pg: &'a Pg,
    tx: &'a Tx<'a>,
}

impl super::hosts::HostBook for PgBook<'_> {
    async fn last_epoch(&mut self, place: &HostPlace) -> Result<Option<String>> {
        let row = self
            .tx
            .query_opt(
                "SELECT epoch FROM host_places
                 WHERE destination = $1 AND host_key = $2 AND remote_dir = $3",
                &[&place.destination, &place.host_key, &place.remote_dir],
            )
            .await
            .map_err(|e| self.pg.err(e))?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn same_key(&mut self, place: &HostPlace) -> Result<Vec<(String, String)>> {
        let rows = self
            .tx
            .query(
                "SELECT destination, epoch FROM host_places
                 WHERE host_key = $1 AND remote_dir = $2 AND destination != $3
                 ORDER BY destination",
                &[&place.host_key, &place.remote_dir, &place.destination],
            )
            .await
            .map_err(|e| self.pg.err(e))?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn said(&mut self, place: &HostPlace) -> Result<BTreeSet<String>> {
        let rows = self
            .tx
            .query(
                "SELECT CASE WHEN destination_a = $3 THEN destination_b ELSE destination_a END
                 FROM host_key_shared
                 WHERE host_key = $1 AND remote_dir = $2
                   AND (destination_a = $3 OR destination_b = $3)",
                &[&place.host_key, &place.remote_dir, &place.destination],
            )
            .await
            .map_err(|e| self.pg.err(e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn store(&mut self, place: &HostPlace, epoch: &str, now: &str) -> Result<()> {
        self.tx
            .execute(
                "INSERT INTO host_places (destination, host_key, remote_dir, epoch, seen_at)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (destination, host_key, remote_dir)
                    DO UPDATE SET epoch = $4, seen_at = $5",
                &[
                    &place.destination,
                    &place.host_key,
                    &place.remote_dir,
                    &epoch,
                    &now,
                ],
            )
            .await
            .map(|_| ())
            .map_err(|e| self.pg.err(e))
    }

    async fn mark_shared(&mut self, place: &HostPlace, x: &str, y: &str, now: &str) -> Result<()> {
        self.tx
            .execute(
                "INSERT INTO host_key_shared
                    (host_key, remote_dir, destination_a, destination_b, said_at)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[&place.host_key, &place.remote_dir, &x, &y, &now],
            )
            .await
            .map(|_| ())
            .map_err(|e| self.pg.err(e))
    }

    async fn note(&mut self, id: &ExecutionId, ev: &Evidence<'_>) -> Result<Event> {
        let (kind, value) = (ev.kind(), ev.to_value());
        self.pg
            .append_in(self.tx, id.as_str(), kind.as_str(), None, &value)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::schema::MIGRATION_8;
    use super::*;

    /// The database's copy of the lifecycle (written by migration 8) is the core's table, row
    /// for row: a change to one without the other fails here (and needs a new migration).
    #[test]
    fn the_databases_copy_of_the_lifecycle_is_the_cores_table() {
        let rows: &str = MIGRATION_8
            .split("VALUES")
            .nth(1)
            .and_then(|v| v.split(';').next())
            .unwrap();
        let copy: Vec<(String, String)> = rows
            .split("),")
            .map(|r| {
                let r = r.trim().trim_start_matches('(').trim_end_matches(')');
                let (f, t) = r.split_once(", ").unwrap();
                (
                    f.trim_matches('\'').to_owned(),
                    t.trim_matches('\'').to_owned(),
                )
            })
            .collect();
        let core: Vec<(String, String)> = crate::lifecycle::TRANSITIONS
            .iter()
            .map(|(f, t, _)| {
                (
                    f.map_or("", State::as_str).to_owned(),
                    t.as_str().to_owned(),
                )
            })
            .collect();
        assert_eq!(copy, core);
    }

    #[test]
    fn a_refusal_of_the_lifecycle_reads_back_typed() {
        let e = JournalError::Postgres {
            location: "postgres://db".into(),
            message: "lifecycle refuses cancelled -> authorized for execution ex_1".into(),
            code: Some(REFUSED.into()),
            constraint: None,
        };
        let e = lifecycle_refusal("ex_1", e);
        assert_eq!(
            e.refused(),
            Some(crate::lifecycle::Illegal {
                from: Some(State::Cancelled),
                to: State::Authorized
            })
        );
        let first = JournalError::Postgres {
            location: "postgres://db".into(),
            message: "lifecycle refuses  -> running for execution ex_1".into(),
            code: Some(REFUSED.into()),
            constraint: None,
        };
        assert_eq!(
            lifecycle_refusal("ex_1", first).refused().unwrap().from,
            None
        );
    }
}
