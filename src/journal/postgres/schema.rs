//! The PostgreSQL journal's schema: each version's DDL and the migration that applies them on
//! first use, under an advisory lock. Migrations are applied by version: a released one's text
//! never changes; a change to the schema is a new version.

use super::{checkpoint, fence, group, wake, Pg};
use crate::journal::{client_identity, JournalError, Result};

/// The newest schema version this binary knows (the last of `MIGRATIONS`).
pub const PG_SCHEMA_VERSION: i32 = 9;

/// Each version's DDL, applied in order in one transaction each.
pub(in crate::journal) const MIGRATIONS: &[(i32, &str)] = &[
    (1, MIGRATION_1),
    (2, MIGRATION_2),
    (3, checkpoint::MIGRATION),
    (4, MIGRATION_4),
    (5, wake::MIGRATION),
    (6, group::MIGRATION),
    (7, wake::MIGRATION_7),
    (8, MIGRATION_8),
    (9, fence::MIGRATION),
];

const MIGRATION_1: &str = "
CREATE FUNCTION cairn_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'insufficient_privilege'; END $$;

CREATE TABLE executions (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    destination TEXT NOT NULL,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    \"user\" TEXT NOT NULL,
    command BYTEA NOT NULL,
    command_digest TEXT NOT NULL,
    remote_dir TEXT NOT NULL,
    timeout_secs BIGINT NOT NULL,
    client TEXT NOT NULL,
    fingerprint TEXT,
    actor TEXT,
    scope TEXT,
    class TEXT,
    retention_secs BIGINT,
    accepted_ms BIGINT,
    session_id TEXT,
    intent TEXT
);
CREATE INDEX executions_by_intent ON executions(fingerprint, actor, scope, accepted_ms);
CREATE INDEX executions_by_session ON executions(session_id);
CREATE TRIGGER executions_fixed BEFORE UPDATE OR DELETE ON executions
    FOR EACH ROW EXECUTE FUNCTION cairn_refuse('an execution record is fixed once accepted');

-- The head of each execution's hash chain (locked by an append).
CREATE TABLE chain_heads (
    execution_id TEXT PRIMARY KEY REFERENCES executions(id),
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL
);

CREATE SEQUENCE event_seq;
CREATE TABLE events (
    seq BIGINT PRIMARY KEY,
    execution_id TEXT NOT NULL REFERENCES executions(id),
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    state TEXT,
    evidence TEXT NOT NULL,
    client TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX events_by_execution ON events(execution_id, seq);
CREATE INDEX events_by_kind ON events(kind, seq);
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION cairn_refuse('journal events are append-only');
CREATE TRIGGER events_append_only_t BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION cairn_refuse('journal events are append-only');

-- Which execution holds an intent, until when (database time, ms since the Unix epoch).
CREATE TABLE intent_keys (
    fingerprint TEXT NOT NULL,
    actor TEXT NOT NULL,
    scope TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    expires_ms BIGINT NOT NULL,
    PRIMARY KEY (fingerprint, actor, scope)
);

CREATE TABLE cursors (
    execution_id TEXT PRIMARY KEY REFERENCES executions(id),
    out_off BIGINT NOT NULL,
    err_off BIGINT NOT NULL
);

CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    pid BIGINT NOT NULL,
    client TEXT NOT NULL,
    started_at TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE TRIGGER sessions_fixed BEFORE UPDATE OR DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION cairn_refuse('a session record is fixed once started');
CREATE TABLE session_heads (
    session_id TEXT PRIMARY KEY REFERENCES sessions(id),
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL
);
CREATE SEQUENCE session_event_seq;
CREATE TABLE session_events (
    seq BIGINT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    evidence TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE INDEX session_events_by_session ON session_events(session_id, seq);
CREATE TRIGGER session_events_append_only BEFORE UPDATE OR DELETE ON session_events
    FOR EACH ROW EXECUTE FUNCTION cairn_refuse('session events are append-only');
CREATE TRIGGER session_events_append_only_t BEFORE TRUNCATE ON session_events
    FOR EACH STATEMENT EXECUTE FUNCTION cairn_refuse('session events are append-only');

CREATE TABLE batches (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    command BYTEA NOT NULL,
    options TEXT NOT NULL,
    client TEXT NOT NULL
);
CREATE TABLE batch_members (
    batch_id TEXT NOT NULL REFERENCES batches(id),
    position BIGINT NOT NULL,
    destination TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    PRIMARY KEY (batch_id, position)
);

CREATE TABLE host_places (
    destination TEXT NOT NULL,
    host_key TEXT NOT NULL,
    remote_dir TEXT NOT NULL,
    epoch TEXT NOT NULL,
    seen_at TEXT NOT NULL,
    PRIMARY KEY (destination, host_key, remote_dir)
);
CREATE INDEX host_places_by_key ON host_places(host_key, remote_dir);
CREATE TABLE host_key_shared (
    host_key TEXT NOT NULL,
    remote_dir TEXT NOT NULL,
    destination_a TEXT NOT NULL,
    destination_b TEXT NOT NULL,
    said_at TEXT NOT NULL,
    PRIMARY KEY (host_key, remote_dir, destination_a, destination_b)
);

CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    actor TEXT NOT NULL,
    scope_prefix TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT,
    expires_ms BIGINT,
    revoked_at TEXT
);
CREATE TABLE http_sessions (
    id TEXT PRIMARY KEY,
    actor TEXT,
    created_at TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    state TEXT
);
CREATE TABLE http_events (
    seq BIGSERIAL PRIMARY KEY,
    stream_id TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    retry_ms BIGINT,
    message TEXT
);
CREATE INDEX http_events_by_stream ON http_events(stream_id, seq);
CREATE TABLE http_streams (
    stream_id TEXT PRIMARY KEY,
    session_id TEXT,
    actor TEXT NOT NULL,
    request TEXT NOT NULL,
    opened_ms BIGINT NOT NULL
);
";

/// Version 2: an append is one call. `cairn_append` locks the execution's chain head, draws the
/// number, hashes the event exactly as [`chain_hash`] does (the same tag and length-prefixed
/// fields; the caller checks the hash it gets back against its own), inserts it and moves the
/// head: one round trip instead of four, so 32 executions in flight are not bound by latency.
const MIGRATION_2: &str = "
CREATE FUNCTION cairn_field(t text) RETURNS bytea LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT int8send(octet_length(convert_to(t, 'UTF8'))::bigint) || convert_to(t, 'UTF8')
$$;
CREATE FUNCTION cairn_append(p_id text, p_at text, p_kind text, p_state text, p_evidence text,
                             p_client text, OUT o_seq bigint, OUT o_hash text, OUT o_prev text)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT hash INTO o_prev FROM chain_heads WHERE execution_id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no execution % in this journal', p_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    o_seq := nextval('event_seq');
    o_hash := encode(sha256(convert_to('cairn-event-v1', 'UTF8')
        || cairn_field(o_prev) || cairn_field(o_seq::text) || cairn_field(p_id)
        || cairn_field(p_at) || cairn_field(p_kind) || cairn_field(COALESCE(p_state, ''))
        || cairn_field(p_evidence) || cairn_field(p_client)), 'hex');
    INSERT INTO events (seq, execution_id, at, kind, state, evidence, client, prev_hash, hash)
        VALUES (o_seq, p_id, p_at, p_kind, p_state, p_evidence, p_client, o_prev, o_hash);
    UPDATE chain_heads SET seq = o_seq, hash = o_hash WHERE execution_id = p_id;
END $$;
";

/// Version 4: ownership with leases. Each replica that owns executions heartbeats its row of
/// `replicas` in database time; each execution it accepted (or took over) has a row of `owners`
/// naming it with a lease epoch. `cairn_append_as` is `cairn_append` fenced by that row: an
/// owner's append checks, in the same statement and under the row's lock, that it still holds
/// the execution at its epoch, so a replica whose lease expired and whose executions were taken
/// over cannot append as their owner any more (SQLSTATE CA001). An append that settles the
/// execution closes its ownership, so nothing settled is ever taken over.
const MIGRATION_4: &str = "
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    client TEXT NOT NULL,
    lease_ms BIGINT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE TABLE owners (
    execution_id TEXT PRIMARY KEY REFERENCES executions(id),
    replica TEXT NOT NULL REFERENCES replicas(id),
    epoch BIGINT NOT NULL,
    takeovers INTEGER NOT NULL DEFAULT 0,
    settled BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX owners_open ON owners(replica) WHERE NOT settled;

CREATE FUNCTION cairn_append_as(p_id text, p_at text, p_kind text, p_state text,
                                p_evidence text, p_client text, p_replica text, p_epoch bigint,
                                OUT o_seq bigint, OUT o_hash text, OUT o_prev text)
LANGUAGE plpgsql AS $$
DECLARE
    cur_replica text;
    cur_epoch bigint;
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
    ELSIF p_state IN ('rejected', 'completed', 'failed', 'interrupted', 'cancelled', 'delivered')
    THEN
        PERFORM 1 FROM owners WHERE execution_id = p_id FOR UPDATE;
    END IF;
    SELECT a.o_seq, a.o_hash, a.o_prev INTO o_seq, o_hash, o_prev
        FROM cairn_append(p_id, p_at, p_kind, p_state, p_evidence, p_client) a;
    IF p_state IN ('rejected', 'completed', 'failed', 'interrupted', 'cancelled', 'delivered')
    THEN
        UPDATE owners SET settled = true WHERE execution_id = p_id AND NOT settled;
    END IF;
END $$;
";

/// Version 8: the journal enforces the lifecycle. `lifecycle_transitions` is a copy of
/// `crate::lifecycle::TRANSITIONS` (`''` for no state yet; a unit test holds the two equal);
/// each chain head keeps its execution's current state (filled here from the events, as
/// [`status_from_states`] derives it); `cairn_append_as` checks a transition against the table
/// from that state under the head's row lock, in the statement that appends it, and refuses
/// an illegal one with SQLSTATE CA002 ([`REFUSED`]). The owners row is still locked first.
pub(super) const MIGRATION_8: &str = "
CREATE TABLE lifecycle_transitions (
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO lifecycle_transitions (from_state, to_state) VALUES
    ('', 'accepted'),
    ('accepted', 'authorized'),
    ('accepted', 'rejected'),
    ('authorized', 'dispatched'),
    ('dispatched', 'dispatched'),
    ('unknown', 'dispatched'),
    ('dispatched', 'running'),
    ('running', 'running'),
    ('unknown', 'running'),
    ('accepted', 'failed'),
    ('accepted', 'cancelled'),
    ('accepted', 'unknown'),
    ('authorized', 'failed'),
    ('authorized', 'cancelled'),
    ('authorized', 'unknown'),
    ('dispatched', 'completed'),
    ('dispatched', 'cancelled'),
    ('dispatched', 'interrupted'),
    ('dispatched', 'unknown'),
    ('dispatched', 'failed'),
    ('running', 'completed'),
    ('running', 'cancelled'),
    ('running', 'interrupted'),
    ('running', 'unknown'),
    ('unknown', 'completed'),
    ('unknown', 'cancelled'),
    ('unknown', 'interrupted'),
    ('unknown', 'unknown'),
    ('unknown', 'failed'),
    ('interrupted', 'completed'),
    ('interrupted', 'failed'),
    ('failed', 'authorized'),
    ('failed', 'rejected'),
    ('failed', 'dispatched'),
    ('completed', 'delivered'),
    ('cancelled', 'delivered');

ALTER TABLE chain_heads ADD COLUMN state TEXT;
UPDATE chain_heads h SET state = s.state FROM (
    SELECT l.execution_id,
        CASE WHEN l.state NOT IN ('rejected', 'completed', 'failed', 'interrupted', 'cancelled',
                                  'delivered')
              AND EXISTS (SELECT 1 FROM events u WHERE u.execution_id = l.execution_id
                          AND u.state = 'unknown' AND u.seq > l.seq)
             THEN 'unknown' ELSE l.state END AS state
    FROM (SELECT DISTINCT ON (execution_id) execution_id, seq, state FROM events
          WHERE state IS NOT NULL AND state <> 'unknown'
          ORDER BY execution_id, seq DESC) l
) s WHERE h.execution_id = s.execution_id;

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
";

impl Pg {
    pub(super) fn migrate(&self) -> Result<()> {
        self.block(async {
            // No waiting here: a journal that cannot be reached when it is opened is a
            // configuration to fix, said at once.
            let mut c = self.pool.get().await.map_err(|e| match e {
                deadpool_postgres::PoolError::Backend(e) => self.err(e),
                other => self.fail(format!("no connection to the database: {other}")),
            })?;
            let tx = c.transaction().await.map_err(|e| self.err(e))?;
            // Replicas starting together: one migrates, the others wait and find it done.
            tx.batch_execute(
                "SELECT pg_advisory_xact_lock(7306928318543210001);
                 CREATE TABLE IF NOT EXISTS cairn_schema (
                    version INTEGER PRIMARY KEY,
                    applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                    by_client TEXT NOT NULL
                 );",
            )
            .await
            .map_err(|e| self.err(e))?;
            let found: i32 = tx
                .query_one("SELECT COALESCE(MAX(version), 0) FROM cairn_schema", &[])
                .await
                .map_err(|e| self.err(e))?
                .get(0);
            if found > PG_SCHEMA_VERSION {
                return Err(JournalError::PgVersion {
                    location: self.location.clone(),
                    found,
                    supported: PG_SCHEMA_VERSION,
                });
            }
            for (v, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
                tx.batch_execute(sql).await.map_err(|e| self.err(e))?;
                tx.execute(
                    "INSERT INTO cairn_schema (version, by_client) VALUES ($1, $2)",
                    &[v, &client_identity()],
                )
                .await
                .map_err(|e| self.err(e))?;
            }
            tx.commit().await.map_err(|e| self.err(e))
        })
    }
}
