//! What `cairn audit verify` reads from a PostgreSQL journal: every chained row, every record
//! and every stored chain head, in one read-only transaction (`REPEATABLE READ`, so the tables
//! are read at one instant while replicas go on appending), on a connection of its own that
//! migrates nothing and writes nothing.
//!
//! The checking is the parent module's (`audit/postgres.rs`); this only reads. Both live
//! under `audit/`: the PostgreSQL audit in one place.

use std::time::Duration;

use tokio_postgres::{IsolationLevel, NoTls};

use crate::audit::AuditError;
use crate::journal::{postgres_runtime as runtime, redact_url, SessionRecord, PG_SCHEMA_VERSION};

/// One entry of a hash chain as stored: an event (`id` is its execution) or a session entry
/// (`id` is its session; `state` and `client` are empty).
#[derive(Clone, Debug)]
pub(crate) struct ChainRow {
    pub seq: i64,
    pub id: String,
    pub at: String,
    pub kind: String,
    pub state: String,
    pub evidence: String,
    pub client: String,
    pub prev_hash: String,
    pub hash: String,
}

/// A stored chain head (`chain_heads`, `session_heads`).
#[derive(Clone, Debug)]
pub(crate) struct Head {
    pub id: String,
    pub seq: i64,
    pub hash: String,
}

/// An execution record: the fields its `accepted` event commits to, and the command.
#[derive(Clone, Debug)]
pub(crate) struct RecordRow {
    pub id: String,
    pub fields: serde_json::Value,
    pub command: Vec<u8>,
}

/// Everything verify reads, as of one instant.
pub(crate) struct Snapshot {
    /// The URL without its password.
    pub location: String,
    /// Ordered by seq.
    pub events: Vec<ChainRow>,
    /// Ordered by seq.
    pub session_events: Vec<ChainRow>,
    pub executions: Vec<RecordRow>,
    pub sessions: Vec<SessionRecord>,
    pub heads: Vec<Head>,
    pub session_heads: Vec<Head>,
    /// Ordered by number (none before schema version 3).
    pub checkpoints: Vec<CheckpointRow>,
}

/// A stored checkpoint (see `checkpoint.rs`).
#[derive(Clone, Debug)]
pub(crate) struct CheckpointRow {
    pub n: i64,
    pub at: String,
    pub by_client: String,
    pub prev_digest: String,
    pub body: String,
    pub digest: String,
    pub mac: String,
}

/// Read the journal at `url` for verification. Nothing is created, migrated or written; a
/// database that holds no cairn journal, or one newer than this binary, is an error.
pub(crate) fn snapshot(url: &str) -> Result<Snapshot, AuditError> {
    let location = redact_url(url);
    let _rt = runtime().enter();
    futures::executor::block_on(read(url, &location))
}

/// One read of every table, in one read-only `REPEATABLE READ` transaction.
async fn read(url: &str, location: &str) -> Result<Snapshot, AuditError> {
    let e = |err| pg_error(location, err);
    let mut client = connect(url, location).await?;
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(e)?;
    let schema_version = schema_version(&tx, location).await?;
    let events = chain_rows(
        &tx,
        "SELECT seq, execution_id, at, kind, COALESCE(state, ''), evidence, client,
                prev_hash, hash
         FROM events ORDER BY seq",
    )
    .await
    .map_err(e)?;
    let session_events = chain_rows(
        &tx,
        "SELECT seq, session_id, at, kind, '', evidence, '', prev_hash, hash
         FROM session_events ORDER BY seq",
    )
    .await
    .map_err(e)?;
    let executions = executions(&tx).await.map_err(e)?;
    let sessions = sessions(&tx).await.map_err(e)?;
    let heads = head_rows(
        &tx,
        "SELECT execution_id, seq, hash FROM chain_heads ORDER BY execution_id",
    )
    .await
    .map_err(e)?;
    let session_heads = head_rows(
        &tx,
        "SELECT session_id, seq, hash FROM session_heads ORDER BY session_id",
    )
    .await
    .map_err(e)?;
    let checkpoints = if schema_version >= 3 {
        checkpoints(&tx).await.map_err(e)?
    } else {
        Vec::new()
    };
    tx.commit().await.map_err(e)?;
    Ok(Snapshot {
        location: location.to_owned(),
        events,
        session_events,
        executions,
        sessions,
        heads,
        session_heads,
        checkpoints,
    })
}

type Tx<'a> = tokio_postgres::Transaction<'a>;
type PgResult<T> = Result<T, tokio_postgres::Error>;

/// A PostgreSQL error as verify reports it: the server's message when there is one.
fn pg_error(location: &str, e: tokio_postgres::Error) -> AuditError {
    let detail = match e.as_db_error() {
        Some(d) => d.message().to_owned(),
        None => e.to_string(),
    };
    AuditError::Postgres {
        location: location.to_owned(),
        detail,
    }
}

/// A connection of verify's own (10 s to connect unless the URL says otherwise).
async fn connect(url: &str, location: &str) -> Result<tokio_postgres::Client, AuditError> {
    let mut config: tokio_postgres::Config =
        url.parse()
            .map_err(|err: tokio_postgres::Error| AuditError::BadUrl {
                location: location.to_owned(),
                detail: err.to_string(),
            })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    config.application_name("cairn audit verify");
    let (client, conn) = config
        .connect(NoTls)
        .await
        .map_err(|err| pg_error(location, err))?;
    // The connection is driven by the journal runtime's threads; it ends with `client`.
    tokio::spawn(conn);
    Ok(client)
}

/// The schema version of the cairn journal in this database; an error when it holds none or
/// one newer than this binary knows.
async fn schema_version(tx: &Tx<'_>, location: &str) -> Result<i32, AuditError> {
    let e = |err| pg_error(location, err);
    let has_schema: bool = tx
        .query_one("SELECT to_regclass('cairn_schema') IS NOT NULL", &[])
        .await
        .map_err(e)?
        .get(0);
    if !has_schema {
        return Err(AuditError::NotReadable {
            location: location.to_owned(),
            detail: "this database holds no cairn journal (no cairn_schema table); nothing was \
                     read or changed"
                .to_owned(),
        });
    }
    let schema_version: i32 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM cairn_schema", &[])
        .await
        .map_err(e)?
        .get(0);
    if schema_version > PG_SCHEMA_VERSION {
        return Err(AuditError::NotReadable {
            location: location.to_owned(),
            detail: format!(
                "schema version {schema_version}, but this cairn knows up to \
                 {PG_SCHEMA_VERSION}: verify with a cairn as new as the replicas that wrote it"
            ),
        });
    }
    Ok(schema_version)
}

/// The rows of one hash chain (`query` selects the nine columns of a [`ChainRow`] in order).
async fn chain_rows(tx: &Tx<'_>, query: &str) -> PgResult<Vec<ChainRow>> {
    Ok(tx
        .query(query, &[])
        .await?
        .iter()
        .map(|r| ChainRow {
            seq: r.get(0),
            id: r.get(1),
            at: r.get(2),
            kind: r.get(3),
            state: r.get(4),
            evidence: r.get(5),
            client: r.get(6),
            prev_hash: r.get(7),
            hash: r.get(8),
        })
        .collect())
}

/// The stored chain heads (`query` selects id, seq, hash).
async fn head_rows(tx: &Tx<'_>, query: &str) -> PgResult<Vec<Head>> {
    Ok(tx
        .query(query, &[])
        .await?
        .iter()
        .map(|r| Head {
            id: r.get(0),
            seq: r.get(1),
            hash: r.get(2),
        })
        .collect())
}

/// The execution records, with the fields their `accepted` events commit to.
async fn executions(tx: &Tx<'_>) -> PgResult<Vec<RecordRow>> {
    Ok(tx
        .query(
            "SELECT id, destination, host, port, \"user\", command, command_digest, remote_dir,
                    timeout_secs, created_at, client
             FROM executions ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|r| RecordRow {
            id: r.get(0),
            fields: serde_json::json!({
                "destination": r.get::<_, String>(1),
                "host": r.get::<_, String>(2),
                "port": i64::from(r.get::<_, i32>(3)),
                "user": r.get::<_, String>(4),
                "command_digest": r.get::<_, String>(6),
                "remote_dir": r.get::<_, String>(7),
                "timeout_secs": r.get::<_, i64>(8),
                "created_at": r.get::<_, String>(9),
                "client": r.get::<_, String>(10),
            }),
            command: r.get(5),
        })
        .collect())
}

/// The session records.
async fn sessions(tx: &Tx<'_>) -> PgResult<Vec<SessionRecord>> {
    Ok(tx
        .query(
            "SELECT id, kind, actor, pid, client, started_at, detail FROM sessions ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(SessionRecord::from_pg_row)
        .collect())
}

/// The checkpoints (schema version 3 and later).
async fn checkpoints(tx: &Tx<'_>) -> PgResult<Vec<CheckpointRow>> {
    Ok(tx
        .query(
            "SELECT n, at, by_client, prev_digest, body, digest, mac FROM checkpoints ORDER BY n",
            &[],
        )
        .await?
        .iter()
        .map(|r| CheckpointRow {
            n: r.get(0),
            at: r.get(1),
            by_client: r.get(2),
            prev_digest: r.get(3),
            body: r.get(4),
            digest: r.get(5),
            mac: r.get(6),
        })
        .collect())
}
