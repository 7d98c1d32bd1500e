//! The fence on every append to a shared journal (docs/REPLICAS.md, "What the fence covers,
//! exactly").
//!
//! Every append carries a lease epoch, checked by `cairn_append_as` against the execution's
//! owners row, under that row's lock, in the statement that appends:
//!
//! - **An owner's append** (an execution this process accepted or took over) carries its
//!   replica and the epoch it holds the execution at: refused once another replica holds it.
//! - **Anyone else's append** (a caller's note on another replica's execution, a `cancel` run
//!   elsewhere, a `delivered`) carries the epoch this process last *observed* for the execution,
//!   read with its events or its ownership: the decision it appends was made on what it read
//!   then. Refused once the execution was taken over since (the epoch moved on): a decision
//!   made before a takeover is not appended after it. The refusal is SQLSTATE CA001, as an
//!   owner's; unlike an owner, such a process is not fenced out for good: reading the
//!   execution again observes the new epoch, and the decision made again on it is appended.
//! - **An append by a process that read nothing of the execution** carries no epoch: its
//!   statement itself is the read (the lifecycle check under the same locks).
//!
//! Every append locks the owners row before the chain head, as a takeover does, so appends and
//! takeovers never wait on each other in a cycle.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use super::{owned, replica_id};

/// Version 9 of the schema: `cairn_append_as` fences a non-owner's append by the epoch it
/// observed (`p_replica` NULL, `p_epoch` set), and `cairn_append_batch` says per event whether
/// it is an owner's (`p_mine`) instead of deriving it from the epoch being set.
pub(in crate::journal) const MIGRATION: &str = "
CREATE OR REPLACE FUNCTION cairn_append_as(p_id text, p_at text, p_kind text, p_state text,
                                p_evidence text, p_client text, p_replica text, p_epoch bigint,
                                OUT o_seq bigint, OUT o_hash text, OUT o_prev text)
LANGUAGE plpgsql AS $$
DECLARE
    cur_replica text;
    cur_epoch bigint;
    cur_state text;
BEGIN
    -- The owners row is locked before the chain head, by every append that reads or changes
    -- it (as by a takeover), so appends and takeovers never wait on each other in a cycle.
    IF p_replica IS NOT NULL THEN
        SELECT replica, epoch INTO cur_replica, cur_epoch FROM owners
            WHERE execution_id = p_id FOR UPDATE;
        IF NOT FOUND OR cur_replica <> p_replica OR cur_epoch <> p_epoch THEN
            RAISE EXCEPTION 'execution % was taken over by replica % (lease epoch %) after the lease of this replica (%, epoch %) expired: this replica no longer writes or dispatches it', p_id, COALESCE(cur_replica, '(none)'), COALESCE(cur_epoch, 0), p_replica, p_epoch
                USING ERRCODE = 'CA001';
        END IF;
    ELSIF p_epoch IS NOT NULL THEN
        -- Not the owner's: fenced by the epoch the appending process observed the execution at.
        SELECT replica, epoch INTO cur_replica, cur_epoch FROM owners
            WHERE execution_id = p_id FOR UPDATE;
        IF COALESCE(cur_epoch, 0) <> p_epoch THEN
            RAISE EXCEPTION 'execution % was taken over by replica % (lease epoch %) after this process read it at lease epoch %: what it decided on that read is not appended; read the execution again', p_id, COALESCE(cur_replica, '(none)'), COALESCE(cur_epoch, 0), p_epoch
                USING ERRCODE = 'CA001';
        END IF;
    ELSIF p_state IN ('rejected', 'completed', 'failed', 'interrupted', 'cancelled', 'delivered')
    THEN
        PERFORM 1 FROM owners WHERE execution_id = p_id FOR UPDATE;
    END IF;
    IF p_state IS NOT NULL THEN
        -- The compare of the compare-and-set: the state as of this lock, not as read earlier.
        SELECT state INTO cur_state FROM chain_heads WHERE execution_id = p_id FOR UPDATE;
        IF FOUND AND NOT EXISTS (SELECT 1 FROM lifecycle_transitions
                                 WHERE from_state = COALESCE(cur_state, '')
                                   AND to_state = p_state) THEN
            RAISE EXCEPTION 'lifecycle refuses % -> % for execution %',
                COALESCE(cur_state, ''), p_state, p_id
                USING ERRCODE = 'CA002';
        END IF;
    END IF;
    SELECT a.o_seq, a.o_hash, a.o_prev INTO o_seq, o_hash, o_prev
        FROM cairn_append(p_id, p_at, p_kind, p_state, p_evidence, p_client) a;
    IF p_state IS NOT NULL THEN
        UPDATE chain_heads SET state = p_state WHERE execution_id = p_id;
    END IF;
    IF p_state IN ('rejected', 'completed', 'failed', 'interrupted', 'cancelled', 'delivered')
    THEN
        UPDATE owners SET settled = true WHERE execution_id = p_id AND NOT settled;
    END IF;
END $$;

DROP FUNCTION cairn_append_batch(int[], text[], text, text, text[], text[], text[], text[],
                                 text[], bigint[]);
CREATE FUNCTION cairn_append_batch(p_counts int[], p_records text[], p_replica text,
        p_client text, p_ids text[], p_ats text[], p_kinds text[], p_states text[],
        p_evidence text[], p_epochs bigint[], p_mine boolean[],
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
                        CASE WHEN p_mine[i] THEN p_replica ELSE NULL END,
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

/// What one append is fenced by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fence {
    /// This process owns the execution at this epoch.
    Owner(i64),
    /// This process does not own it; it last observed it at this epoch (0: no owners row).
    Observed(i64),
    /// This process read nothing of it: the appending statement is its read.
    Unread,
}

impl Fence {
    /// The fence of an append to `id` by this process now.
    pub(super) fn of(id: &str) -> Fence {
        if let Some(h) = owned().get(id) {
            return Fence::Owner(h.epoch);
        }
        match observed().get(id) {
            Some(e) => Fence::Observed(*e),
            None => Fence::Unread,
        }
    }

    /// The `p_replica` and `p_epoch` arguments of `cairn_append_as`.
    pub(super) fn args(self) -> (Option<&'static str>, Option<i64>) {
        match self {
            Fence::Owner(e) => (Some(replica_id()), Some(e)),
            Fence::Observed(e) => (None, Some(e)),
            Fence::Unread => (None, None),
        }
    }

    /// Whether the append is an owner's (a refusal then fences this process out for good).
    pub(super) fn mine(self) -> bool {
        matches!(self, Fence::Owner(_))
    }
}

/// The lease epoch this process last observed for each execution it read (its events or its
/// ownership), the newest it saw.
fn observed() -> MutexGuard<'static, HashMap<String, i64>> {
    static OBSERVED: OnceLock<Mutex<HashMap<String, i64>>> = OnceLock::new();
    OBSERVED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// This process read `id` at lease `epoch` (0: no owners row). Observations only move forward:
/// a slower read of an older epoch does not move it back.
pub(super) fn observe(id: &str, epoch: i64) {
    let mut o = observed();
    let e = o.entry(id.to_owned()).or_insert(epoch);
    *e = (*e).max(epoch);
}
