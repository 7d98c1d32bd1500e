//! Group commit on PostgreSQL: appends and accepts from every handle of this process on one
//! database share transactions, so that many executions in flight pay for one commit (one WAL
//! flush, one round trip) between them instead of one each. The model is the SQLite file's
//! group commit (`journal/group.rs`); what differs is said here.
//!
//! Each [`Pg`] (one per database URL in this process) has one [`Group`]. Who leads which batch
//! is the leader queue shared with SQLite (`journal/leader_queue.rs`), here with up to
//! [`LEADERS`] leaders and [`MAX_BATCH`] requests a batch; what is this file's own is how a
//! batch is written (sorted by execution ID, one pipelined call on a pooled connection). A write
//! enqueues its request with a ticket. While fewer than [`LEADERS`] leaders are active and
//! requests are queued, a caller becomes a leader: it takes a pooled connection (before any
//! request: a leader waiting for a connection holds no one's request), then up to [`MAX_BATCH`]
//! queued requests, and writes them all with one call of `cairn_append_batch` inside an explicit
//! transaction (`BEGIN`, the call and `COMMIT` are pipelined: one round trip), publishes each
//! request's result and steps down. Everyone else waits on a condition variable for its ticket;
//! a waiter whose request another leader took may lead the next batch, so no caller leads for
//! ever under sustained load. Two leaders at once keep the server busy while the other batch
//! waits for its commit; the server shares a WAL flush among commits that arrive together.
//!
//! The guarantees are those of a lone append:
//!
//! - **Committed before returning.** A caller returns only once the transaction holding its
//!   request has committed (the `COMMIT`'s reply, not the call's rows), with the seq and hash
//!   stored, checked against the hash cairn computes itself.
//! - **The chain.** `cairn_append_batch` calls `cairn_append_as` once per event, in order, so
//!   each event reads and moves its execution's head inside the transaction; several events of
//!   one execution in one batch chain in the order they were submitted.
//! - **The fence.** Each append is fenced as a lone append is (`fence.rs`): an owner's by the
//!   lease epoch this process holds, anyone else's by the epoch it observed, read when the batch
//!   is written; a fenced request gets SQLSTATE CA001.
//! - **One request's failure is its own.** Each request runs in a block of its own with an
//!   exception handler (a savepoint): a request refused (fenced, an unknown execution, an ID
//!   already accepted) is rolled back alone and gets that error, its neighbours commit. If the
//!   call fails as a whole with the database's error (nothing was committed), each request is
//!   written again in a transaction of its own, each getting what its own attempt gives. A lost
//!   connection or a failed `COMMIT` is reported to every request of the batch and not retried:
//!   whether it committed is not known, and a retry could append twice.
//! - **No deadlock between batches.** A batch takes the row locks of its executions (owner row,
//!   chain head) in the order of their IDs (requests are sorted by execution ID, keeping each
//!   execution's own order), as every other batch does, so two batches (two leaders, or two
//!   replicas) sharing executions wait for each other but never in a cycle.
//!
//! - **Notified after the commit.** Right behind the batch's `COMMIT`, in the same pipeline (no
//!   round trip of its own), one statement notifies `cairn_events` of every execution an event
//!   of the batch settles, in a transaction of its own that the server runs only once the
//!   `COMMIT` has finished (`wake.rs`): the batch's own commit never holds PostgreSQL's notify
//!   lock. A request rolled back alone (fenced, say), or a batch that did not commit, may so be
//!   notified without being settled: a hint, which the waiter checks against the journal.
//!
//! A batch holds at most [`MAX_BATCH`] requests: each is a subtransaction, and past 64 in one
//! transaction the server's snapshots of it overflow to disk. A leader that panics publishes
//! "outcome unknown" to the requests it had taken and steps down (the queue's drop guard).

use tokio_postgres::types::ToSql;

use super::fence::Fence;
use super::{replica_id, Obj, Pg};
use crate::journal::leader_queue::{LeaderQueue, Limits, Prepared};
use crate::journal::{
    client_identity, now_rfc3339, ChainFields, Event, ExecutionRecord, GroupCommitStats,
    JournalError, Result,
};
use crate::state::State;

/// Version 6 of the schema: many requests in one call, each in a subtransaction of its own.
/// Per request: how many events it has (`p_counts`) and, for an accept, the execution record as
/// JSON (`p_records`; its row, chain head and owner row are inserted before its events). Per
/// event: execution, time, kind, state, evidence and the lease epoch it is fenced by (`NULL`:
/// not fenced). One row per committed event, in order, or one row with the error of a request
/// that was rolled back.
pub(in crate::journal) const MIGRATION: &str = "
CREATE FUNCTION cairn_append_batch(p_counts int[], p_records text[], p_replica text,
        p_client text, p_ids text[], p_ats text[], p_kinds text[], p_states text[],
        p_evidence text[], p_epochs bigint[],
        OUT o_request int, OUT o_seq bigint, OUT o_hash text, OUT o_prev text,
        OUT o_code text, OUT o_message text, OUT o_constraint text)
RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    r int;
    i int;
    e int := 0;
    failed boolean;
    seqs bigint[];
    hashes text[];
    prevs text[];
BEGIN
    FOR r IN 1 .. COALESCE(array_length(p_counts, 1), 0) LOOP
        seqs := '{}';
        hashes := '{}';
        prevs := '{}';
        failed := false;
        BEGIN
            IF p_records[r] IS NOT NULL THEN
                INSERT INTO executions
                    SELECT * FROM jsonb_populate_record(NULL::executions, p_records[r]::jsonb);
                INSERT INTO chain_heads (execution_id, seq, hash) VALUES (p_ids[e + 1], 0, '');
                INSERT INTO owners (execution_id, replica, epoch)
                    VALUES (p_ids[e + 1], p_replica, 1);
            END IF;
            FOR i IN e + 1 .. e + p_counts[r] LOOP
                SELECT a.o_seq, a.o_hash, a.o_prev INTO o_seq, o_hash, o_prev
                    FROM cairn_append_as(p_ids[i], p_ats[i], p_kinds[i], p_states[i],
                        p_evidence[i], p_client,
                        CASE WHEN p_epochs[i] IS NULL THEN NULL ELSE p_replica END,
                        p_epochs[i]) a;
                seqs := seqs || o_seq;
                hashes := hashes || o_hash;
                prevs := prevs || o_prev;
            END LOOP;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS o_code = RETURNED_SQLSTATE, o_message = MESSAGE_TEXT,
                o_constraint = CONSTRAINT_NAME;
            failed := true;
        END;
        o_request := r;
        IF failed THEN
            o_seq := NULL;
            o_hash := NULL;
            o_prev := NULL;
            RETURN NEXT;
        ELSE
            o_code := NULL;
            o_message := NULL;
            o_constraint := NULL;
            FOR i IN 1 .. COALESCE(array_length(seqs, 1), 0) LOOP
                o_seq := seqs[i];
                o_hash := hashes[i];
                o_prev := prevs[i];
                RETURN NEXT;
            END LOOP;
        END IF;
        e := e + p_counts[r];
    END LOOP;
END $$;
";

/// Most leaders writing a batch at once (each on its own pooled connection).
const LEADERS: usize = 2;

/// Most requests in one batch (see the module comment).
const MAX_BATCH: usize = 64;

/// One write a caller wants committed.
pub(super) enum Request {
    /// Events of one execution, in order (one for [`Journal::append`](crate::journal::Journal::append)).
    Append {
        id: String,
        events: Vec<(String, Option<State>, serde_json::Value)>,
    },
    /// The execution row (with its chain head and owner row) and its `accepted` event.
    Accept {
        rec: Box<ExecutionRecord>,
        evidence: serde_json::Value,
    },
}

impl Request {
    fn execution_id(&self) -> &str {
        match self {
            Request::Append { id, .. } => id,
            Request::Accept { rec, .. } => rec.id.as_str(),
        }
    }
}

/// The events a request committed, in order; or why it has none.
pub(super) type Outcome = Result<Vec<Event>>;

/// The group commit of one database in this process.
pub(super) struct Group {
    /// Who leads which batch (`journal/leader_queue.rs`): up to [`LEADERS`] at once, each
    /// batch at most [`MAX_BATCH`] requests.
    queue: LeaderQueue<Request, Outcome>,
}

impl Default for Group {
    fn default() -> Self {
        let limits = Limits {
            leaders: LEADERS,
            batch: MAX_BATCH,
        };
        Group {
            queue: LeaderQueue::new(limits, lost),
        }
    }
}

impl Group {
    pub(super) fn stats(&self) -> GroupCommitStats {
        self.queue.stats()
    }
}

/// The outcome of a request whose leader panicked.
fn lost() -> Outcome {
    Err(JournalError::Io {
        path: Default::default(),
        message: "the thread committing this write panicked, so whether it was committed is \
                  unknown; read the execution's events to find out"
            .into(),
    })
}

/// A copy of a PostgreSQL journal error, for each request of a batch that failed as one.
fn dup(e: &JournalError) -> JournalError {
    match e {
        JournalError::Postgres {
            location,
            message,
            code,
            constraint,
        } => JournalError::Postgres {
            location: location.clone(),
            message: message.clone(),
            code: code.clone(),
            constraint: constraint.clone(),
        },
        other => JournalError::Io {
            path: Default::default(),
            message: other.to_string(),
        },
    }
}

/// Why a batch has no outcomes of its own.
enum Failed {
    /// The call was refused as a whole: the transaction was rolled back, nothing committed.
    Rolled(JournalError),
    /// The connection or the commit failed: whether the batch committed is not known.
    Unknown(JournalError),
}

impl Pg {
    /// Commit `req` together with whatever else is queued; return once it is committed (or has
    /// failed).
    pub(super) fn submit(&self, req: Request) -> Outcome {
        // The connection is taken before the requests: a leader waiting for one holds no
        // one's request, and one that cannot get one fails only its own.
        self.group.queue.submit(
            req,
            || match self.block(self.client()) {
                Ok(conn) => Prepared::Ready(conn),
                Err(e) => Prepared::Failed(Err(e)),
            },
            |conn, reqs| self.write_sorted(conn, reqs),
        )
    }

    /// Write `reqs` as [`Self::write_batch`] does, in the lock order (by execution ID, each
    /// execution's requests in their own order); one outcome per request, in the order given.
    fn write_sorted(&self, conn: &Obj, reqs: Vec<Request>) -> Vec<Outcome> {
        let mut order: Vec<usize> = (0..reqs.len()).collect();
        order.sort_by(|&a, &b| reqs[a].execution_id().cmp(reqs[b].execution_id()));
        let mut slots: Vec<Option<Request>> = reqs.into_iter().map(Some).collect();
        let sorted: Vec<Request> = order.iter().filter_map(|&i| slots[i].take()).collect();
        let outcomes = self.block(async { Ok(self.write_batch(conn, &sorted).await) });
        let outcomes = outcomes.unwrap_or_else(|e| sorted.iter().map(|_| Err(dup(&e))).collect());
        let mut out: Vec<Option<Outcome>> = order.iter().map(|_| None).collect();
        for (&i, o) in order.iter().zip(outcomes) {
            out[i] = Some(o);
        }
        // A request without an outcome gets the lost one from the queue.
        out.into_iter().map_while(|o| o).collect()
    }

    /// Write `reqs` in one transaction, or, if the database refuses the call as a whole, one
    /// transaction each; one outcome per request, in order.
    async fn write_batch(&self, c: &Obj, reqs: &[Request]) -> Vec<Outcome> {
        let all: Vec<&Request> = reqs.iter().collect();
        match self.transaction(c, &all).await {
            Ok(out) => out,
            Err(Failed::Unknown(e)) => reqs.iter().map(|_| Err(dup(&e))).collect(),
            Err(Failed::Rolled(e)) if reqs.len() == 1 => vec![Err(e)],
            Err(Failed::Rolled(_)) => {
                let mut out = Vec::with_capacity(reqs.len());
                for r in reqs {
                    out.push(match self.transaction(c, &[r]).await {
                        Ok(mut o) => o.remove(0),
                        Err(Failed::Rolled(e) | Failed::Unknown(e)) => Err(e),
                    });
                }
                out
            }
        }
    }

    /// One transaction holding `reqs`: `BEGIN`, one call of `cairn_append_batch` and `COMMIT`,
    /// pipelined.
    async fn transaction(
        &self,
        c: &Obj,
        reqs: &[&Request],
    ) -> std::result::Result<Vec<Outcome>, Failed> {
        if reqs.iter().any(|r| matches!(r, Request::Accept { .. })) {
            // The owner rows of accepts name this replica, whose row must exist.
            self.register().await.map_err(Failed::Unknown)?;
        }
        let call = Call::new(reqs);
        let stmt = c
            .prepare_cached(
                "SELECT o_request, o_seq, o_hash, o_prev, o_code, o_message, o_constraint
                 FROM cairn_append_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .await
            .map_err(|e| Failed::Unknown(self.err(e)))?;
        let params = call.params();
        // The executions this batch settles, notified right behind its COMMIT (`wake.rs`).
        let mut settling: Vec<&str> = call
            .ids
            .iter()
            .zip(&call.values)
            .filter(|(_, (state, _))| super::wake::notifies(*state))
            .map(|(id, _)| id.as_str())
            .collect();
        settling.sort_unstable();
        settling.dedup();
        let notify = match settling.is_empty() {
            true => None,
            false => match c.prepare_cached(super::wake::NOTIFY_SETTLED).await {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::debug!("cairn: journal {}: not notifying: {e}", self.location);
                    None
                }
            },
        };
        let notify_params: [&(dyn ToSql + Sync); 1] = [&settling];
        let notified = async {
            match &notify {
                Some(n) => c.query(n, &notify_params).await.map(|_| ()),
                None => Ok(()),
            }
        };
        let (begin, rows, commit, notified) = futures::join!(
            c.batch_execute("BEGIN"),
            c.query(&stmt, &params),
            c.batch_execute("COMMIT"),
            notified
        );
        if let Err(e) = notified {
            tracing::debug!(
                "cairn: journal {}: notifying settled executions: {e}",
                self.location
            );
        }
        begin.map_err(|e| Failed::Unknown(self.err(e)))?;
        let rows = rows.map_err(|e| match e.as_db_error() {
            // Refused by the database: the COMMIT after it rolled the transaction back.
            Some(_) if commit.is_ok() => Failed::Rolled(self.err(e)),
            _ => Failed::Unknown(self.err(e)),
        })?;
        commit.map_err(|e| Failed::Unknown(self.err(e)))?;
        let out = self.outcomes(&call, reqs, &rows);
        let events: usize = out.iter().map(|o| o.as_ref().map_or(0, Vec::len)).sum();
        self.group.queue.committed(events as u64);
        Ok(out)
    }

    /// Each request's outcome from the rows of its call: its events as stored (each hash checked
    /// against cairn's own), or the error that rolled it back.
    fn outcomes(
        &self,
        call: &Call<'_>,
        reqs: &[&Request],
        rows: &[tokio_postgres::Row],
    ) -> Vec<Outcome> {
        let mut out: Vec<Outcome> = reqs.iter().map(|_| Ok(Vec::new())).collect();
        for row in rows {
            let r = usize::try_from(row.get::<_, i32>(0) - 1).unwrap_or(usize::MAX);
            let Some(slot) = out.get_mut(r) else { continue };
            let Ok(events) = slot else { continue };
            if let Some(code) = row.get::<_, Option<String>>(4) {
                let e = JournalError::Postgres {
                    location: self.location.clone(),
                    message: row.get::<_, Option<String>>(5).unwrap_or_default(),
                    code: Some(code),
                    constraint: row.get::<_, Option<String>>(6).filter(|c| !c.is_empty()),
                };
                if e.is_fenced() {
                    let mine = call.mine.get(call.first[r]).copied().unwrap_or(false);
                    super::refused_by_fence(reqs[r].execution_id(), mine, &e);
                }
                *slot = Err(super::lifecycle_refusal(reqs[r].execution_id(), e));
                continue;
            }
            let k = call.first[r] + events.len();
            if k >= call.first[r] + call.counts[r] as usize {
                *slot = Err(self.fail(format!(
                    "the database returned more events than were appended to {}",
                    reqs[r].execution_id()
                )));
                continue;
            }
            *slot = self.stored(call, k, row).map(|ev| {
                events.push(ev);
                std::mem::take(events)
            });
        }
        for (r, o) in out.iter_mut().enumerate() {
            if matches!(o, Ok(evs) if evs.len() != call.counts[r] as usize) {
                *o = Err(self.fail(format!(
                    "the database returned no outcome for every event appended to {}",
                    reqs[r].execution_id()
                )));
            }
        }
        out
    }

    /// Event `k` of `call` as stored, per `row`: checked against the hash cairn computes.
    fn stored(&self, call: &Call<'_>, k: usize, row: &tokio_postgres::Row) -> Result<Event> {
        let (seq, hash, prev_hash): (i64, String, String) = (row.get(1), row.get(2), row.get(3));
        let id = &call.ids[k];
        let client = client_identity();
        let f = ChainFields {
            prev_hash: &prev_hash,
            seq,
            execution_id: id,
            at: &call.ats[k],
            kind: &call.kinds[k],
            state: call.states[k].unwrap_or(""),
            evidence: &call.evidence[k],
            client,
        };
        self.checked_event(&f, hash, call.values[k].0, call.values[k].1.clone())
    }
}

/// The arguments of one `cairn_append_batch` call (see [`MIGRATION`]).
struct Call<'a> {
    counts: Vec<i32>,
    /// Index of each request's first event.
    first: Vec<usize>,
    records: Vec<Option<String>>,
    ids: Vec<String>,
    ats: Vec<String>,
    kinds: Vec<String>,
    states: Vec<Option<&'static str>>,
    evidence: Vec<String>,
    epochs: Vec<Option<i64>>,
    /// Per event: an owner's append (fenced by replica and epoch), or anyone else's (by the
    /// epoch observed).
    mine: Vec<bool>,
    values: Vec<(Option<State>, &'a serde_json::Value)>,
    replica: &'static str,
    client: &'static str,
}

impl<'a> Call<'a> {
    fn new(reqs: &[&'a Request]) -> Self {
        let mut c = Call {
            counts: Vec::new(),
            first: Vec::new(),
            records: Vec::new(),
            ids: Vec::new(),
            ats: Vec::new(),
            kinds: Vec::new(),
            states: Vec::new(),
            evidence: Vec::new(),
            epochs: Vec::new(),
            mine: Vec::new(),
            values: Vec::new(),
            replica: replica_id(),
            client: client_identity(),
        };
        for r in reqs {
            c.first.push(c.ids.len());
            match r {
                Request::Append { id, events } => {
                    // An owner's append is fenced by the epoch it holds, anyone else's by the
                    // epoch it observed (`fence.rs`).
                    let fence = Fence::of(id);
                    c.counts.push(events.len() as i32);
                    c.records.push(None);
                    for (kind, state, evidence) in events {
                        c.event(id, kind, *state, evidence, fence);
                    }
                }
                Request::Accept { rec, evidence } => {
                    c.counts.push(1);
                    c.records.push(Some(record_json(rec)));
                    let id = rec.id.as_str();
                    // Its owner row is inserted in the same request, naming this replica at 1.
                    let fence = Fence::Owner(1);
                    c.event(id, "accepted", Some(State::Accepted), evidence, fence);
                }
            }
        }
        c
    }

    fn event(
        &mut self,
        id: &str,
        kind: &str,
        state: Option<State>,
        evidence: &'a serde_json::Value,
        fence: Fence,
    ) {
        let (replica, epoch) = fence.args();
        self.ids.push(id.to_owned());
        self.ats.push(now_rfc3339());
        self.kinds.push(kind.to_owned());
        self.states.push(state.map(|s| s.as_str()));
        self.evidence.push(evidence.to_string());
        self.epochs.push(epoch);
        self.mine.push(replica.is_some());
        self.values.push((state, evidence));
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 11] {
        [
            &self.counts,
            &self.records,
            &self.replica,
            &self.client,
            &self.ids,
            &self.ats,
            &self.kinds,
            &self.states,
            &self.evidence,
            &self.epochs,
            &self.mine,
        ]
    }
}

/// The `executions` row of an accept, as `jsonb_populate_record` reads it (the command as
/// `bytea`'s hex input).
fn record_json(rec: &ExecutionRecord) -> String {
    serde_json::json!({
        "id": rec.id.as_str(),
        "created_at": rec.created_at,
        "destination": rec.destination,
        "host": rec.host,
        "port": rec.port,
        "user": rec.user,
        "command": format!("\\x{}", hex::encode(&rec.command)),
        "command_digest": rec.command_digest,
        "remote_dir": rec.remote_dir,
        "timeout_secs": rec.timeout_secs,
        "client": rec.client,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::ExecutionId;
    use crate::journal::test_postgres;
    use crate::journal::tests::rec;
    use crate::journal::{accepted_evidence, Journal, Store};
    use std::path::Path;

    fn note(id: &str, n: u32) -> Request {
        Request::Append {
            id: id.to_owned(),
            events: vec![("note".into(), None, serde_json::json!({ "n": n }))],
        }
    }

    fn pg_of(j: &Journal) -> &Pg {
        match &j.store {
            Store::Postgres(pg) => pg,
            Store::Sqlite(_) => unreachable!("a postgres:// journal"),
        }
    }

    /// One batch written by hand (as a leader writes it): a fenced request, a request to an
    /// unknown execution and an accept of an ID already accepted each get their own error;
    /// everything else commits in one transaction, several events of one execution chained in
    /// the order submitted, with the seq and hash stored returned to each caller, and the
    /// journal verifies.
    // Long: one scenario, its phases in order.
    #[test]
    fn a_fenced_request_fails_alone_and_its_neighbours_commit_in_one_transaction() {
        let Some(server) = test_postgres::server("pg_group_fenced") else {
            return;
        };
        let url = server.database("group_fenced");
        let db = url.rsplit('/').next().unwrap().to_owned();
        let mut j = Journal::open(Path::new(&url)).unwrap();
        for id in ["gb-mine", "gb-fenced"] {
            let r = rec(id);
            j.accept(&r, accepted_evidence(&r)).unwrap();
        }
        let psql = |sql: &str| server.psql(&db, sql).unwrap();
        psql(
            "INSERT INTO replicas (id, client, lease_ms) VALUES ('other/r', '9@elsewhere', 60000)",
        );
        psql("UPDATE owners SET replica = 'other/r', epoch = 2 WHERE execution_id = 'gb-fenced'");
        let pg = pg_of(&j);
        let before = pg.group_commit_stats();
        // One record: two would differ in their creation time.
        let new_rec = rec("gb-new");
        let reqs = vec![
            note("gb-mine", 1),
            note("gb-fenced", 2),
            Request::Accept {
                rec: Box::new(new_rec.clone()),
                evidence: accepted_evidence(&new_rec),
            },
            note("gb-missing", 3),
            Request::Append {
                id: "gb-mine".into(),
                events: vec![
                    (
                        "authorized".into(),
                        Some(State::Authorized),
                        serde_json::json!({"n": 4}),
                    ),
                    (
                        "dispatched".into(),
                        Some(State::Dispatched),
                        serde_json::json!({"n": 5}),
                    ),
                ],
            },
            Request::Accept {
                rec: Box::new(rec("gb-mine")),
                evidence: serde_json::json!({}),
            },
            note("gb-new", 6),
            note("gb-mine", 7),
        ];
        let out = pg.block(async {
            let c = pg.client().await?;
            Ok(pg.write_batch(&c, &reqs).await)
        });
        let out = out.unwrap();
        let ok: Vec<bool> = out.iter().map(Result::is_ok).collect();
        assert_eq!(ok, [true, false, true, false, true, false, true, true]);
        let fenced = out[1].as_ref().unwrap_err();
        assert!(fenced.is_fenced(), "{fenced}");
        assert!(!out[3].as_ref().unwrap_err().is_fenced());
        match out[5].as_ref().unwrap_err() {
            JournalError::Postgres { constraint, .. } => {
                assert_eq!(constraint.as_deref(), Some("executions_pkey"))
            }
            e => panic!("{e}"),
        }
        let after = pg.group_commit_stats();
        assert_eq!(
            after.transactions - before.transactions,
            1,
            "one transaction"
        );
        assert_eq!(after.events - before.events, 6);

        let mine = ExecutionId::parse("gb-mine").unwrap();
        let evs = j.events(&mine).unwrap();
        let ns: Vec<_> = evs[1..].iter().map(|e| e.evidence["n"].clone()).collect();
        assert_eq!(ns, [1, 4, 5, 7], "chained in the order submitted");
        let stored: Vec<(i64, String)> = evs[1..].iter().map(|e| (e.seq, e.hash.clone())).collect();
        let returned: Vec<(i64, String)> = [&out[0], &out[4], &out[7]]
            .into_iter()
            .flat_map(|o| o.as_ref().unwrap().iter().map(|e| (e.seq, e.hash.clone())))
            .collect();
        assert_eq!(returned, stored, "callers get the seq and hash stored");
        let fenced_id = ExecutionId::parse("gb-fenced").unwrap();
        assert_eq!(
            j.events(&fenced_id).unwrap().len(),
            1,
            "nothing written as the fenced owner"
        );
        let new = ExecutionId::parse("gb-new").unwrap();
        assert_eq!(j.execution(&new).unwrap().unwrap().command, b"echo hi");
        let kinds: Vec<_> = j
            .events(&new)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, ["accepted", "note"]);
        let o = j.ownership(&new).unwrap().unwrap();
        assert!(o.mine && o.epoch == 1, "{o:?}");
        let report = crate::audit::verify_postgres(&url, None).unwrap();
        assert!(report.ok(), "{:?}", report.findings);
        assert_eq!((report.events, report.executions), (8, 3));
    }

    /// Many threads, each with its own handle, accepting and appending at once: every event is
    /// committed exactly once (counted in the database), each execution's events in its own
    /// order, every one by group commit, and the journal verifies.
    #[test]
    fn concurrent_appends_from_many_threads_all_commit_exactly_once() {
        let Some(server) = test_postgres::server("pg_group_concurrent") else {
            return;
        };
        let url = server.database("group_concurrent");
        let db = url.rsplit('/').next().unwrap().to_owned();
        let (threads, per_thread, notes) = (16, 4, 5);
        // Held for the whole test, so that every thread's handle shares its group.
        let keep = Journal::open(Path::new(&url)).unwrap();
        let before = pg_of(&keep).group_commit_stats();
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let url = url.clone();
                std::thread::spawn(move || {
                    let mut j = Journal::open(Path::new(&url)).unwrap();
                    for x in 0..per_thread {
                        let id = ExecutionId::parse(&format!("gc-{t}-{x}")).unwrap();
                        let r = rec(id.as_str());
                        j.accept(&r, accepted_evidence(&r)).unwrap();
                        for n in 0..notes {
                            j.append(
                                &id,
                                crate::event::EventKind::Note,
                                None,
                                serde_json::json!({ "n": n }),
                            )
                            .unwrap();
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let count = |sql: &str| server.psql(&db, sql).unwrap().trim().to_owned();
        let execs = threads * per_thread;
        assert_eq!(count("SELECT count(*) FROM executions"), execs.to_string());
        assert_eq!(
            count("SELECT count(*) FROM events"),
            (execs * (1 + notes)).to_string()
        );
        assert_eq!(
            count("SELECT count(*) FROM (SELECT DISTINCT execution_id, evidence FROM events) d"),
            (execs * (1 + notes)).to_string(),
            "no event twice"
        );
        for t in 0..threads {
            let id = ExecutionId::parse(&format!("gc-{t}-0")).unwrap();
            let ns: Vec<_> = keep.events(&id).unwrap()[1..]
                .iter()
                .map(|e| e.evidence["n"].as_u64().unwrap())
                .collect();
            assert_eq!(ns, [0, 1, 2, 3, 4]);
        }
        let after = pg_of(&keep).group_commit_stats();
        assert_eq!(after.events - before.events, (execs * (1 + notes)) as u64);
        assert!(after.transactions - before.transactions <= after.events - before.events);
        let report = crate::audit::verify_postgres(&url, None).unwrap();
        assert!(report.ok(), "{:?}", report.findings);
        assert_eq!(report.events, execs * (1 + notes));
    }
}
