//! The local journal: SQLite (WAL, `synchronous=FULL`), one row per execution and an append-only
//! stream of events per execution.
//!
//! Every lifecycle transition is an event, appended (never updated: triggers refuse UPDATE and
//! DELETE on `events`) with a timestamp and the evidence behind it as JSON. An append commits,
//! and so reaches the disk, before the caller acts on it: the `dispatched` event is durable before
//! a byte of the dispatch leaves this machine.
//!
//! Each event also carries `hash = SHA-256(prev_hash, seq, execution_id, at, kind, state,
//! evidence)`, chaining it to the one before, so that a later audit can detect edits.
//!
//! Two cairn processes may share one journal: WAL allows concurrent readers, appends take the
//! write lock with `BEGIN IMMEDIATE` and wait (polling finely, up to a minute) rather than fail.
//!
//! Within one process, `append` and `accept` from every handle on the same file are
//! group-committed (`journal/group.rs`): concurrent callers share one transaction and one fsync,
//! and each still returns only once its own event is committed. Who leads which batch is written
//! once for both stores (`journal/leader_queue.rs`), as are the session chains
//! (`journal/sessions.rs`) and the host epochs (`journal/hosts.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use crate::event::EventKind;
use crate::evidence::Evidence;
use crate::id::ExecutionId;
use crate::lifecycle::Illegal;
use crate::state::State;

const SCHEMA_VERSION: i64 = 1;

pub mod anchor;
mod backend;
mod batch;
#[cfg(test)]
#[path = "../tests/it/support/postgres.rs"]
pub(crate) mod test_postgres;
pub use batch::{BatchMember, BatchRecord};
mod group;
mod heads;
pub use heads::next_status;
#[cfg(test)]
mod golden;
mod hosts;
mod http;
mod leader_queue;
pub use leader_queue::GroupCommitStats;
mod postgres;
mod sessions;
mod sqlite;
use backend::Backend;
pub use http::{JournalMetrics, StoredEvent, StreamRecord, TokenRecord};
pub(crate) use postgres::checkpoint as postgres_checkpoint;
pub use postgres::checkpoint::SealKeyError;
pub(crate) use postgres::runtime as postgres_runtime;
pub use postgres::wake::{listener_name, poll_every, Watch, Woken};
pub use postgres::{
    is_postgres_url, lease_for, replica_id, set_lease_for, Ownership, TakeOver, MAX_TAKEOVERS,
    PG_SCHEMA_VERSION,
};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    #[error("journal {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("journal {path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error(
        "journal {path} has schema version {found}; this cairn understands version {SCHEMA_VERSION}. \
         Use a matching cairn, or point --journal elsewhere"
    )]
    Version { path: PathBuf, found: i64 },
    #[error(
        "journal '{location}' looks like a {scheme}:// URL, but this build of cairn keeps its journal \
         in a SQLite file or in PostgreSQL (postgres://…) only; nothing was created. Give a file \
         path (--journal FILE or CAIRN_JOURNAL), a postgres:// URL, or a file name without '://'"
    )]
    Unsupported { location: String, scheme: String },
    /// A PostgreSQL journal's error (the URL shown without its password).
    #[error("journal {location}: {message}")]
    Postgres {
        location: String,
        message: String,
        /// The SQLSTATE, when the server gave one.
        code: Option<String>,
        /// The constraint the statement violated, when the server named one.
        constraint: Option<String>,
    },
    #[error(
        "journal {location} has schema version {found}; this cairn understands versions up to \
         {supported}. Use a newer cairn, or point --journal elsewhere"
    )]
    PgVersion {
        location: String,
        found: i32,
        supported: i32,
    },
    #[error("journal {path}: execution {id} has a corrupt row: {message}")]
    Corrupt {
        path: PathBuf,
        id: String,
        message: String,
    },
    /// The journal refused a transition the lifecycle does not allow from the state recorded
    /// when the append was made (`crate::lifecycle`), or one made on the condition of a state the
    /// execution had left ([`Journal::append_all_if`]). Nothing of that append was written; the
    /// recorded state stands.
    #[error("journal {location}: execution {id}: {}", refusal_text(.refused, *.conditional))]
    Refused {
        location: String,
        id: String,
        refused: Illegal,
        /// Refused because the append was made on the condition of another state, not because
        /// the lifecycle forbids the transition itself.
        conditional: bool,
    },
}

type Result<T> = std::result::Result<T, JournalError>;

impl JournalError {
    /// The transition the journal refused, and the state it held then (see
    /// [`JournalError::Refused`]).
    pub fn refused(&self) -> Option<Illegal> {
        match self {
            JournalError::Refused { refused, .. } => Some(*refused),
            _ => None,
        }
    }

    /// Whether this is an append refused by the ownership fence of a shared journal: this
    /// replica's lease expired and another replica took the execution over.
    pub fn is_fenced(&self) -> bool {
        matches!(self, JournalError::Postgres { code: Some(c), .. } if c == postgres::FENCED)
    }

    /// Whether this is an `accept` that lost the race for its execution ID: another process
    /// accepted an execution under the same ID between our look-up and our insert.
    pub fn is_duplicate_id(&self) -> bool {
        match self {
            JournalError::Sqlite {
                source: rusqlite::Error::SqliteFailure(e, Some(m)),
                ..
            } => e.code == rusqlite::ErrorCode::ConstraintViolation && m.contains("executions.id"),
            JournalError::Postgres {
                code, constraint, ..
            } => {
                code.as_deref() == Some("23505") && constraint.as_deref() == Some("executions_pkey")
            }
            _ => false,
        }
    }
}

fn refusal_text(refused: &Illegal, conditional: bool) -> String {
    match (conditional, refused.from) {
        (true, Some(from)) => format!(
            "{} refused: it was appended on the condition that the execution had not moved on, \
             and it is {from} now",
            refused.to
        ),
        _ => refused.to_string(),
    }
}

/// What identifies an execution's intent; fixed when it is accepted.
#[derive(Clone, Debug, Serialize)]
pub struct ExecutionRecord {
    pub id: ExecutionId,
    pub created_at: String,
    /// The destination as the caller wrote it (`db-1`, `root@10.0.0.5`).
    pub destination: String,
    /// Resolved address, port and account.
    pub host: String,
    pub port: u16,
    pub user: String,
    /// The command bytes as sent to the host's shell.
    #[serde(skip)]
    pub command: Vec<u8>,
    /// SHA-256 of the command bytes, hex.
    pub command_digest: String,
    /// Marker home on the host.
    pub remote_dir: String,
    /// Host-enforced timeout in seconds, 0 = none.
    pub timeout_secs: u64,
    /// Process that accepted the execution (`pid@hostname`).
    pub client: String,
}

impl ExecutionRecord {
    /// The command for people: lossy UTF-8.
    pub fn command_display(&self) -> String {
        String::from_utf8_lossy(&self.command).into_owned()
    }
}

/// One journal event.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    pub seq: i64,
    pub execution_id: String,
    pub at: String,
    pub kind: EventKind,
    pub state: Option<State>,
    pub evidence: serde_json::Value,
    /// The process that appended it (`pid@hostname`).
    pub client: String,
    pub hash: String,
}

/// One event to append: its kind, the state it moves the execution to (if any), its evidence.
pub type NewEvent = (EventKind, Option<State>, serde_json::Value);

/// Current state of an execution, as derived from its events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub state: State,
    /// For `unknown`: the last state before it (what was known before knowledge was lost).
    pub before_unknown: Option<State>,
}

/// A handle on the journal. Its methods are the same whichever store keeps it; the store is a
/// `Backend` chosen by the location given to [`Journal::open`].
pub struct Journal {
    path: PathBuf,
    store: Store,
}

/// Where a journal is kept. Every public method of [`Journal`] asks its [`Backend`] (through
/// [`Journal::backend`], the one place that tells the stores apart), so callers (the executor,
/// the fronts, audit) never know which store they write to.
enum Store {
    /// A SQLite file on this machine (the default).
    Sqlite(sqlite::Sqlite),
    /// A PostgreSQL database, shared by every replica that names it (`postgres://…`).
    Postgres(std::sync::Arc<postgres::Pg>),
}

/// Current UTC time as RFC 3339 with milliseconds.
pub fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339_from_unix(now.as_secs() as i64, now.subsec_millis())
}

/// Format seconds since the Unix epoch as RFC 3339 UTC.
pub fn rfc3339_from_unix(secs: i64, millis: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if mo <= 2 { y + 1 } else { y };
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

impl Journal {
    /// The default journal path: `$CAIRN_JOURNAL`, else `$XDG_STATE_HOME/cairn/journal.db`,
    /// else `~/.local/state/cairn/journal.db`.
    pub fn default_path() -> PathBuf {
        if let Some(p) = std::env::var_os("CAIRN_JOURNAL").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        let base = std::env::var_os("XDG_STATE_HOME")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .unwrap_or_else(|| PathBuf::from("."));
        base.join("cairn").join("journal.db")
    }

    /// Open (creating if needed) the journal at `path`: a SQLite file, or the PostgreSQL
    /// database a `postgres://` URL names (its schema created or migrated on first use).
    pub fn open(path: &Path) -> Result<Journal> {
        if let Some(url) = path.to_str().filter(|p| is_postgres_url(p)) {
            return Ok(Journal {
                path: path.to_owned(),
                store: Store::Postgres(postgres::open(url)?),
            });
        }
        refuse_url(path)?;
        let io = |message: String| JournalError::Io {
            path: path.to_owned(),
            message,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| io(format!("cannot create directory {}: {e}", dir.display())))?;
                set_mode(dir, 0o700);
            }
            refuse_shared_dir(dir).map_err(io)?;
        }
        let mut identity = file_identity(path);
        let fresh = identity.is_none() && !path.exists();
        let anchor = anchor::Anchor::for_journal(path);
        let group = group::group_for(path, &anchor.path);
        let file = sqlite::Sqlite {
            path: path.to_owned(),
            group: std::sync::Arc::clone(&group),
            anchor,
        };
        let j = |file| Journal {
            path: path.to_owned(),
            store: Store::Sqlite(file),
        };
        // Another handle of this process checked this very file's schema: nothing to do, and
        // no connection to open (operations lease the pool's).
        if !fresh && group.checked(identity) {
            return Ok(j(file));
        }
        if fresh {
            // Opening the first connection creates the file.
            group.retarget(None);
            drop(file.conn()?);
            set_mode(path, 0o600);
            identity = file_identity(path);
        }
        group.retarget(identity);
        // Several processes opening a new journal at once can be told "database is locked"
        // at once (SQLite does not wait for the switch to WAL or a schema change in every
        // case; seen about once in 300 concurrent first opens). Creating the schema is
        // idempotent, so try again, briefly and boundedly, before giving up.
        let mut tries = 0u64;
        loop {
            match file.init() {
                Err(JournalError::Sqlite { source, .. }) if is_busy(&source) && tries < 40 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(5 * tries.min(20)));
                }
                r => break r?,
            }
        }
        group.mark_checked(identity);
        Ok(j(file))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where this journal is, fit for a message or a log line: a database URL without its
    /// password (a `user:secret@` part or a `password=` parameter).
    pub fn location(&self) -> String {
        redact_url(&self.path.to_string_lossy())
    }

    /// The SQLite backend's state; an error on another backend (its callers are the SQLite
    /// implementations of the public methods, which other backends never reach).
    fn file(&self) -> Result<&sqlite::Sqlite> {
        match &self.store {
            Store::Sqlite(f) => Ok(f),
            Store::Postgres(pg) => Err(JournalError::Io {
                path: pg.location().into(),
                message: "a SQLite operation was asked of a PostgreSQL journal".into(),
            }),
        }
    }

    /// A SQLite connection for one operation (see [`group::Lease`]).
    #[cfg(test)]
    fn conn(&self) -> Result<group::Lease<'_>> {
        self.file()?.conn()
    }

    /// The store this journal is kept in: the one place that tells them apart.
    fn backend(&self) -> &dyn Backend {
        match &self.store {
            Store::Sqlite(s) => s,
            Store::Postgres(pg) => &**pg,
        }
    }

    /// SQLite connections this process has opened to this journal file (all handles count):
    /// as many as operations ran at once, not one per handle.
    pub fn connections_opened(&self) -> u64 {
        self.file().map_or(0, |f| f.group.connections_opened())
    }

    /// PostgreSQL: write a sealed checkpoint over every chain head that changed since the last
    /// one, under the seal key at `key` (see `journal/postgres/checkpoint.rs`); its number, or
    /// `None` when nothing changed. A SQLite file needs none: its anchor moves with each commit.
    pub fn seal(&self, key: &Path) -> Result<Option<i64>> {
        match &self.store {
            Store::Postgres(pg) => {
                let key = postgres::checkpoint::read_key(key).map_err(|e| JournalError::Io {
                    path: key.to_owned(),
                    message: e.to_string(),
                })?;
                pg.seal(&key)
            }
            Store::Sqlite(_) => Err(JournalError::Io {
                path: self.path.clone(),
                message: "a SQLite journal is anchored after every commit (<journal>.anchor); \
                          only a PostgreSQL journal is sealed by checkpoints"
                    .into(),
            }),
        }
    }

    /// PostgreSQL, in a replica: seal checkpoints every `CAIRN_SEAL_INTERVAL` seconds for the
    /// rest of this process when `CAIRN_SEAL_KEY` names the seal key (once per database, however
    /// often it is called). Nothing otherwise, and nothing for a SQLite file (its anchor moves
    /// with each commit).
    pub fn seal_periodically_from_env(&self) {
        if let Store::Postgres(pg) = &self.store {
            postgres::checkpoint::seal_from_env(pg);
        }
    }

    /// Executions, newest first, with their current state.
    pub fn list(&self) -> Result<Vec<(ExecutionRecord, Status)>> {
        let ids = self.backend().execution_ids()?;
        let mut out = Vec::new();
        for raw in ids {
            let id = ExecutionId::parse(&raw).map_err(|e| JournalError::Corrupt {
                path: self.path.clone(),
                id: raw.clone(),
                message: e.to_string(),
            })?;
            if let (Some(rec), Some(st)) = (self.execution(&id)?, self.status(&id)?) {
                out.push((rec, st));
            }
        }
        Ok(out)
    }
}

/// What an execution was accepted for, beyond its [`ExecutionRecord`]: the intent fingerprint
/// and what scopes it (docs/DESIGN.md, intent matching). Fixed once accepted, like the record.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct IntentColumns {
    /// HMAC-SHA256 of the canonical operation record, hex ([`crate::intent`]).
    pub fingerprint: String,
    pub actor: String,
    pub scope: String,
    /// Operation class (`remote-command`, …).
    pub class: String,
    /// How long a matching request attaches to this execution, from `accepted_ms`.
    pub retention_secs: u64,
    /// Acceptance time, milliseconds since the Unix epoch.
    pub accepted_ms: i64,
    /// The session (client process, gateway run) that created it.
    pub session_id: Option<String>,
    /// The canonical operation record for people (no secret values: only names).
    pub intent: serde_json::Value,
}

/// An earlier execution with the same fingerprint, actor and scope, still inside its window.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub id: ExecutionId,
    pub class: String,
    pub accepted_ms: i64,
    pub retention_secs: u64,
    /// Current state and, for `unknown`, the state before it.
    pub status: Status,
}

/// An execution accepted before the intent record held the destination (`cairn-intent-v1`)
/// matches by its old fingerprint, and only on the destination it was dispatched to.
#[derive(Clone, Copy, Debug)]
pub struct LegacyIntent<'a> {
    /// The request's `cairn-intent-v1` fingerprint.
    pub fingerprint: &'a str,
    /// The request's resolved HostName and port.
    pub host: &'a str,
    pub port: u16,
}

/// The answer of [`Journal::accept_or_match`].
#[derive(Clone, Debug)]
pub enum AcceptOrMatch {
    /// No earlier execution matched: the new one was accepted (its `accepted` event).
    Accepted(Event),
    /// This earlier execution matched; the new record was not inserted. The `intent-matched`
    /// event was appended to it in the same transaction.
    Matched(Candidate),
}

/// A journal location that looks like a URL (`postgres://…`, `sqlite://…`, `file://…`) is
/// refused before anything touches the file system: taken as a path, it would silently create
/// a directory named `postgres:` in the working directory.
pub fn refuse_url(path: &Path) -> Result<()> {
    let text = path.to_string_lossy();
    let Some((scheme, _)) = text.split_once("://") else {
        return Ok(());
    };
    let looks_like_scheme = !scheme.is_empty()
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !looks_like_scheme {
        return Ok(());
    }
    Err(JournalError::Unsupported {
        location: redact_url(&text),
        scheme: scheme.to_owned(),
    })
}

/// The URL with any password (`user:secret@`) replaced, so that an error never repeats it.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let shown = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_owned()
            };
            redact_query(&format!("{scheme}://{shown}@{host}{tail}"))
        }
        None => redact_query(url),
    }
}

/// A `password=` query parameter of a URL, replaced.
fn redact_query(url: &str) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect();
    format!("{base}?{}", query.join("&"))
}

fn pg_missing_event(pg: &postgres::Pg) -> JournalError {
    JournalError::Io {
        path: pg.location().into(),
        message: "an append returned no event".into(),
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Journal {
    /// Intent matching's check-and-insert, in one `BEGIN IMMEDIATE` transaction: find the
    /// earlier executions with the same fingerprint, actor and scope whose retention window
    /// has not passed (newest first), let `choose` pick one to attach to, and either append
    /// `intent-matched` (with `match_evidence`) to it or insert `rec` with its `accepted`
    /// event. Two identical requests racing (threads or processes) produce one execution: the
    /// second waits for the first's transaction and then sees its row.
    pub fn accept_or_match(
        &mut self,
        rec: &ExecutionRecord,
        cols: &IntentColumns,
        evidence: serde_json::Value,
        match_evidence: serde_json::Value,
        choose: impl FnOnce(&[Candidate]) -> Option<usize>,
    ) -> Result<AcceptOrMatch> {
        self.accept_or_match_with(rec, cols, None, evidence, match_evidence, choose)
    }

    /// [`Journal::accept_or_match`], also matching executions accepted under the earlier
    /// fingerprint `legacy` (on the same destination only).
    pub fn accept_or_match_with(
        &mut self,
        rec: &ExecutionRecord,
        cols: &IntentColumns,
        legacy: Option<LegacyIntent<'_>>,
        evidence: serde_json::Value,
        match_evidence: serde_json::Value,
        choose: impl FnOnce(&[Candidate]) -> Option<usize>,
    ) -> Result<AcceptOrMatch> {
        self.backend().accept_or_match_with(
            rec,
            cols,
            legacy,
            evidence,
            match_evidence,
            Box::new(choose),
        )
    }

    /// The intent an execution was accepted with (`None` for one accepted without).
    pub fn intent_of(&self, id: &ExecutionId) -> Result<Option<IntentColumns>> {
        self.backend().intent_of(id)
    }

    /// Executions created by a session.
    pub fn executions_of_session(&self, session: &str) -> Result<Vec<String>> {
        self.backend().executions_of_session(session)
    }

    /// Record the start of a session (a CLI process, a `serve` or `mcp` run).
    pub fn start_session(&mut self, s: &SessionRecord) -> Result<()> {
        self.backend().start_session(s)
    }

    /// Append a session entry from its typed evidence (its kind follows from it).
    pub fn session_evidence(
        &mut self,
        session: &str,
        evidence: crate::evidence::SessionEvidence<'_>,
    ) -> Result<()> {
        self.session_event(session, evidence.kind(), evidence.to_value())
    }

    /// Append a session event (`ended`, `request` …).
    pub fn session_event(
        &mut self,
        session: &str,
        kind: &str,
        evidence: serde_json::Value,
    ) -> Result<()> {
        self.backend().session_event(session, kind, evidence)
    }

    /// Every session, newest first, with its end (the `ended` event) and execution count.
    pub fn sessions(&self) -> Result<Vec<SessionView>> {
        self.backend().sessions()
    }
}

/// Which client process, gateway run or actor existed (docs/DESIGN.md: the sessions journal).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SessionRecord {
    /// `se_` + UUIDv7.
    pub id: String,
    /// `cli`, `serve`, `mcp`.
    pub kind: String,
    pub actor: String,
    pub pid: i64,
    /// `pid@hostname`.
    pub client: String,
    pub started_at: String,
    /// Free-form facts (the gateway's name, the command line …).
    pub detail: serde_json::Value,
}

impl SessionRecord {
    /// A session row selected as `id, kind, actor, pid, client, started_at, detail` (in that
    /// order, from column 0).
    pub fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRecord> {
        Ok(SessionRecord {
            id: r.get(0)?,
            kind: r.get(1)?,
            actor: r.get(2)?,
            pid: r.get(3)?,
            client: r.get(4)?,
            started_at: r.get(5)?,
            detail: serde_json::from_str(&r.get::<_, String>(6)?).unwrap_or_default(),
        })
    }

    /// The same session row read from PostgreSQL (the journal's `sessions()` and `audit verify`).
    pub(crate) fn from_pg_row(r: &tokio_postgres::Row) -> SessionRecord {
        SessionRecord {
            id: r.get(0),
            kind: r.get(1),
            actor: r.get(2),
            pid: r.get(3),
            client: r.get(4),
            started_at: r.get(5),
            detail: serde_json::from_str(r.get::<_, &str>(6)).unwrap_or_default(),
        }
    }
}

/// A session with what its events say.
#[derive(Clone, Debug, Serialize)]
pub struct SessionView {
    #[serde(flatten)]
    pub record: SessionRecord,
    /// `None` while running, or when the process died without saying so.
    pub ended_at: Option<String>,
    pub executions: u64,
}

/// A new SQLite connection to the journal at `path`, set up as every operation expects: wait up
/// to [`BUSY_WAIT`] for another writer ([`wait_while_busy`]), every commit flushed
/// (`synchronous=FULL`), foreign keys enforced.
fn connect(path: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open(path)?;
    c.busy_handler(Some(wait_while_busy))?;
    c.execute_batch("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")?;
    Ok(c)
}

/// How long one statement waits for another connection's lock before "database is locked".
const BUSY_WAIT: Duration = Duration::from_secs(60);

thread_local! {
    /// When this thread's statement first found the journal locked (the busy handler runs on
    /// the thread that runs the statement; its count starts at 0 for each wait).
    static BUSY_SINCE: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// The busy handler of every journal connection: poll for the lock every 1–8 ms, with jitter,
/// for up to [`BUSY_WAIT`].
///
/// SQLite's own busy timeout sleeps 1, 2, 5, … ms and then 100 ms between tries. With many
/// processes committing (each commit an fsync of tens of milliseconds on a busy disk), a waiter
/// that looks only every 100 ms keeps arriving while someone else holds the lock and can starve
/// for the whole timeout, although the lock was free many times in between. Short, jittered
/// polls take their turn when it comes.
fn wait_while_busy(count: i32) -> bool {
    let now = std::time::Instant::now();
    let since = BUSY_SINCE.with(|b| {
        if count == 0 || b.get().is_none() {
            b.set(Some(now));
        }
        b.get().unwrap_or(now)
    });
    match busy_pause(count, now.duration_since(since), rand::random()) {
        Some(pause) => {
            std::thread::sleep(pause);
            true
        }
        None => false,
    }
}

/// The pause before try `count` + 1 of a statement that has waited `waited` for the lock, or
/// `None` once it has waited [`BUSY_WAIT`]: 1 ms growing to 8 ms over the first 70 tries, plus
/// up to 1 ms of jitter taken from `random`.
fn busy_pause(count: i32, waited: Duration, random: u64) -> Option<Duration> {
    if waited >= BUSY_WAIT {
        return None;
    }
    let base = 1 + (count.clamp(0, 70) as u64) / 10;
    Some(Duration::from_micros(base * 1000 + random % 1000))
}

/// The journal file's (device, inode), to tell a file replaced at the same path from the one a
/// handle of this process already checked.
#[cfg(unix)]
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_identity(_: &Path) -> Option<(u64, u64)> {
    None
}

/// SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Move `anchor` to a committed event; a failure is logged, never returned (see
/// [`Journal::anchor_to`]).
fn advance_anchor(anchor: &anchor::Anchor, ev: &Event) {
    if let Err(e) = anchor.advance(ev.seq, &ev.hash) {
        tracing::warn!("cairn: journal anchor not updated: {e}");
    }
}

/// How many times an append of evidence that nothing else would redo (a session's end, a
/// delivery, an abandoned stream) is tried before it is reported lost.
pub const EVIDENCE_ATTEMPTS: u32 = 3;

static EVIDENCE_LOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Evidence appends given up after [`EVIDENCE_ATTEMPTS`] in this process (`/metrics`:
/// `cairn_evidence_lost_total`).
pub fn evidence_lost() -> u64 {
    EVIDENCE_LOST.load(std::sync::atomic::Ordering::Relaxed)
}

/// Append evidence that nothing else would redo, with `append` (which opens the journal as it
/// needs; a refusal of the lifecycle is its answer to give as `Ok`): tried up to
/// [`EVIDENCE_ATTEMPTS`] times, pausing 50 ms, then 200 ms; then reported: an error line naming
/// `what` and the cause, and [`evidence_lost`] counts it. Returns the last attempt's result.
pub fn append_evidence_retrying<T, E>(
    what: &str,
    mut append: impl FnMut() -> std::result::Result<T, E>,
) -> std::result::Result<T, E>
where
    E: From<JournalError> + std::fmt::Display,
{
    let mut pause = Duration::from_millis(50);
    let mut attempt = 1;
    loop {
        let failed = if crate::failpoint::fails("evidence-append") {
            E::from(JournalError::Io {
                path: PathBuf::new(),
                message: "the append failed (test)".into(),
            })
        } else {
            match append() {
                Ok(v) => return Ok(v),
                Err(e) => e,
            }
        };
        if attempt >= EVIDENCE_ATTEMPTS {
            EVIDENCE_LOST.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!(
                "cairn: evidence lost: {what} could not be recorded after {attempt} attempts: \
                 {failed}"
            );
            return Err(failed);
        }
        tracing::warn!("cairn: recording {what} (attempt {attempt}): {failed}; trying again");
        std::thread::sleep(pause);
        pause *= 4;
        attempt += 1;
    }
}

/// Status from a sequence of transition states (see [`status_from_events`]).
pub fn status_from_states(states: &[State]) -> Option<Status> {
    let mut state: Option<State> = None;
    let mut before_unknown = None;
    for &s in states {
        if s == State::Unknown {
            // A settled outcome stands: an `unknown` after it comes from a process that could
            // not reach the host (a `recover` that loaded the execution while it was open and
            // lost the race with the client that settled it), which is no evidence against it.
            if state.is_some_and(State::is_settled) {
                continue;
            }
            if let Some(prev) = state.filter(|p| *p != State::Unknown) {
                before_unknown = Some(prev);
            }
        }
        state = Some(s);
    }
    state.map(|state| Status {
        state,
        before_unknown: if state == State::Unknown {
            before_unknown
        } else {
            None
        },
    })
}

/// The evidence of an `accepted` event: every field of the execution record, so that the hash
/// chain commits to the record (the command by its SHA-256).
pub fn accepted_evidence(rec: &ExecutionRecord) -> serde_json::Value {
    serde_json::json!({
        "destination": rec.destination,
        "host": rec.host,
        "port": rec.port,
        "user": rec.user,
        "command_digest": rec.command_digest,
        "command_len": rec.command.len(),
        "remote_dir": rec.remote_dir,
        "timeout_secs": rec.timeout_secs,
        "created_at": rec.created_at,
        "client": rec.client,
    })
}

/// The state `id` holds inside the caller's transaction, as [`status_from_states`] derives it
/// (what the lifecycle check compares against), from at most two reads of the index on
/// `(execution_id, seq)`: the last transition; when it is `unknown`, the last one before the
/// `unknown`s (a settled state there stands: journals written before the lifecycle was enforced
/// may hold an `unknown` after it). A state name this build does not know fails the append
/// rather than being skipped.
fn state_in(tx: &rusqlite::Transaction<'_>, id: &str) -> rusqlite::Result<Option<State>> {
    let parse = |name: String| {
        name.parse::<State>().map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, e.into())
        })
    };
    let last: Option<String> = tx
        .prepare_cached(
            "SELECT state FROM events WHERE execution_id = ?1 AND state IS NOT NULL
             ORDER BY seq DESC LIMIT 1",
        )?
        .query_row([id], |r| r.get(0))
        .optional()?;
    let Some(last) = last.map(parse).transpose()? else {
        return Ok(None);
    };
    if last != State::Unknown {
        return Ok(Some(last));
    }
    let before: Option<String> = tx
        .prepare_cached(
            "SELECT state FROM events WHERE execution_id = ?1 AND state IS NOT NULL
             AND state <> 'unknown' ORDER BY seq DESC LIMIT 1",
        )?
        .query_row([id], |r| r.get(0))
        .optional()?;
    Ok(match before.map(parse).transpose()? {
        Some(s) if s.is_settled() => Some(s),
        _ => Some(State::Unknown),
    })
}

/// Derive the current status from an execution's events.
pub fn status_from_events(events: &[Event]) -> Option<Status> {
    let states: Vec<State> = events.iter().filter_map(|e| e.state).collect();
    status_from_states(&states)
}

/// Insert an execution record (with its intent columns, when it has an intent) and its
/// `accepted` event, inside the caller's transaction.
fn insert_accepted(
    tx: &rusqlite::Transaction<'_>,
    rec: &ExecutionRecord,
    cols: Option<&IntentColumns>,
    evidence: &serde_json::Value,
) -> rusqlite::Result<Event> {
    tx.execute(
        "INSERT INTO executions (id, created_at, destination, host, port, user, command,
            command_digest, remote_dir, timeout_secs, client, fingerprint, actor, scope,
            class, retention_secs, accepted_ms, session_id, intent)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
            ?17, ?18, ?19)",
        params![
            rec.id.as_str(),
            rec.created_at,
            rec.destination,
            rec.host,
            rec.port,
            rec.user,
            rec.command,
            rec.command_digest,
            rec.remote_dir,
            rec.timeout_secs as i64,
            rec.client,
            cols.map(|c| &c.fingerprint),
            cols.map(|c| &c.actor),
            cols.map(|c| &c.scope),
            cols.map(|c| &c.class),
            cols.map(|c| c.retention_secs as i64),
            cols.map(|c| c.accepted_ms),
            cols.and_then(|c| c.session_id.as_ref()),
            cols.map(|c| c.intent.to_string()),
        ],
    )?;
    append_in(
        tx,
        rec.id.as_str(),
        "accepted",
        Some(State::Accepted),
        evidence,
    )
}

fn append_in(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    kind: &str,
    state: Option<State>,
    evidence: &serde_json::Value,
) -> rusqlite::Result<Event> {
    let (last_seq, prev_hash): (i64, String) = tx
        .query_row(
            "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
        .unwrap_or((0, String::new()));
    let seq = last_seq + 1;
    let at = now_rfc3339();
    let evidence_text = evidence.to_string();
    let state_text = state.map(|s| s.as_str()).unwrap_or("");
    let client = client_identity();
    let hash = chain_hash(&ChainFields {
        prev_hash: &prev_hash,
        seq,
        execution_id: id,
        at: &at,
        kind,
        state: state_text,
        evidence: &evidence_text,
        client,
    });
    tx.prepare_cached(
        "INSERT INTO events (seq, execution_id, at, kind, state, evidence, client, prev_hash, hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        seq,
        id,
        at,
        kind,
        state.map(|s| s.as_str()),
        evidence_text,
        client,
        prev_hash,
        hash
    ])?;
    Ok(Event {
        seq,
        execution_id: id.to_owned(),
        at,
        kind: EventKind::parse(kind),
        state,
        evidence: evidence.clone(),
        client: client.to_owned(),
        hash,
    })
}

/// Every field an event's chain hash commits to, as stored.
#[derive(Clone, Copy, Debug)]
pub struct ChainFields<'a> {
    pub prev_hash: &'a str,
    pub seq: i64,
    pub execution_id: &'a str,
    pub at: &'a str,
    pub kind: &'a str,
    /// The state name, or "" for a note.
    pub state: &'a str,
    pub evidence: &'a str,
    pub client: &'a str,
}

/// The chain hash of one event: SHA-256 over a version tag and the length-prefixed fields, so
/// that no two different events encode the same way.
pub fn chain_hash(f: &ChainFields<'_>) -> String {
    tagged_hash(b"cairn-event-v1", f)
}

/// The chain hash of one entry of the sessions journal: the same encoding under its own tag
/// (`execution_id` holds the session ID; `state` and `client` are empty), so that an entry of one
/// chain can never pass for an entry of the other.
pub fn session_chain_hash(f: &ChainFields<'_>) -> String {
    tagged_hash(b"cairn-session-v1", f)
}

fn tagged_hash(tag: &[u8], f: &ChainFields<'_>) -> String {
    let mut h = Sha256::new();
    let seq = f.seq.to_string();
    h.update(tag);
    for field in [
        f.prev_hash,
        &seq,
        f.execution_id,
        f.at,
        f.kind,
        f.state,
        f.evidence,
        f.client,
    ] {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field.as_bytes());
    }
    hex::encode(h.finalize())
}

/// The evidence of a session's `started` entry: every field of the session record, so that the
/// sessions chain commits to the record.
pub fn session_started_evidence(s: &SessionRecord) -> String {
    serde_json::json!({
        "kind": s.kind,
        "actor": s.actor,
        "pid": s.pid,
        "client": s.client,
        "started_at": s.started_at,
        "detail": s.detail,
    })
    .to_string()
}

/// Which process appended an event: `pid@hostname`, fixed for the life of the process.
pub fn client_identity() -> &'static str {
    static C: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "localhost".into());
        format!("{}@{}", std::process::id(), host)
    })
}

/// A journal in a directory others can write to can be replaced under our feet.
#[cfg(unix)]
fn refuse_shared_dir(dir: &Path) -> std::result::Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir)
        .map_err(|e| format!("cannot inspect directory {}: {e}", dir.display()))?
        .permissions()
        .mode();
    if mode & 0o002 != 0 {
        return Err(format!(
            "the journal directory {} is writable by others (mode {:o}), so anyone could replace \
             or delete the journal. Fix it with `chmod o-w {}`, or choose a private directory \
             with --journal",
            dir.display(),
            mode & 0o7777,
            dir.display()
        ));
    }
    Ok(())
}
#[cfg(not(unix))]
fn refuse_shared_dir(_: &Path) -> std::result::Result<(), String> {
    Ok(())
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}
#[cfg(not(unix))]
fn set_mode(_: &Path, _: u32) {}

impl Journal {
    /// Run one SQL statement as the journal's own connection (tests: what the journal's role
    /// may and may not do).
    #[cfg(test)]
    pub(crate) fn raw_execute(&self, sql: &str) -> Result<u64> {
        self.backend().raw_execute(sql)
    }

    /// Record a new execution and its `accepted` event in one transaction (group-committed with
    /// other handles' writes, like [`Journal::append`]). Fails if the ID already exists.
    pub fn accept(&mut self, rec: &ExecutionRecord, evidence: serde_json::Value) -> Result<Event> {
        self.backend().accept(rec, evidence)
    }

    /// Append an event; `state` is `Some` for a lifecycle transition, `None` for a note
    /// (a reconnect, a probe result, a delivery of part of the output …).
    ///
    /// Returns once the event is committed, with its seq and hash as stored. Appends from every
    /// handle on this journal in this process are group-committed: concurrent callers share one
    /// transaction and one fsync (see `journal/group.rs`).
    pub fn append(
        &mut self,
        id: &ExecutionId,
        kind: EventKind,
        state: Option<State>,
        evidence: serde_json::Value,
    ) -> Result<Event> {
        self.backend().append(id, kind.as_str(), state, evidence)
    }

    /// Append one event from its typed evidence: its kind and state follow from it (see
    /// [`Journal::append`]).
    pub fn append_evidence(&mut self, id: &ExecutionId, evidence: Evidence<'_>) -> Result<Event> {
        let (kind, state, value) = evidence.into_event();
        self.append(id, kind, state, value)
    }

    /// Append several events of one execution, in order, in one transaction (group-committed
    /// like [`Journal::append`]); returns the last as stored. For events that need not be
    /// durable on their own before the next one (the executor's held events).
    pub fn append_all(&mut self, id: &ExecutionId, events: Vec<NewEvent>) -> Result<Option<Event>> {
        self.backend().append_all(id, named(events))
    }

    /// [`Journal::append_all`] on a condition: written only while `id` holds one of the states
    /// `expect`, checked in the same transaction as the append (else
    /// [`JournalError::Refused`], with the state it holds, and nothing written). For a decision
    /// that is only true of those states (`cancelled` before a dispatch: nothing was sent).
    pub fn append_all_if(
        &mut self,
        id: &ExecutionId,
        expect: &[State],
        events: Vec<NewEvent>,
    ) -> Result<Event> {
        self.backend().append_all_if(id, expect, named(events))
    }

    /// How many transactions and events group commit has written to this journal in this
    /// process (every handle on the file counts).
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        self.backend().group_commit_stats()
    }

    pub fn execution(&self, id: &ExecutionId) -> Result<Option<ExecutionRecord>> {
        self.backend().execution(id)
    }

    pub fn events(&self, id: &ExecutionId) -> Result<Vec<Event>> {
        self.backend().events(id)
    }

    /// The current state: the state of the last transition event, as [`status_from_events`]
    /// derives it, read in one lookup of the state kept with the execution (`journal/heads.rs`),
    /// not by replaying its events.
    pub fn status(&self, id: &ExecutionId) -> Result<Option<Status>> {
        self.backend().status(id)
    }

    /// How far the caller has been given `id`'s stdout and stderr.
    pub fn cursor(&self, id: &ExecutionId) -> Result<(u64, u64)> {
        self.backend().cursor(id)
    }

    /// Record how far the caller has been given `id`'s output.
    ///
    /// A cursor is progress, not evidence: it is written without an fsync of its own
    /// (`synchronous=NORMAL` for this one statement) and reaches the disk with the next commit
    /// or checkpoint. A power loss can take back the last few updates (a process crash cannot),
    /// and a reattach then asks the host again from an earlier offset.
    pub fn set_cursor(&self, id: &ExecutionId, out_off: u64, err_off: u64) -> Result<()> {
        self.backend().set_cursor(id, out_off, err_off)
    }

    /// Forget the output cursors of delivered executions (progress, not evidence).
    pub fn prune_cursors(&self) -> Result<usize> {
        self.backend().prune_cursors()
    }

    /// Who owns `id` on a shared (PostgreSQL) journal; `None` on a SQLite file, where
    /// `exec::claims::owner` decides by process liveness.
    pub fn ownership(&self, id: &ExecutionId) -> Result<Option<Ownership>> {
        self.backend().ownership(id)
    }

    /// Take over `id` (or, with `None`, up to `limit` executions) from replicas whose lease
    /// expired; see docs/REPLICAS.md. Nothing to do on a SQLite file.
    pub fn take_over(
        &mut self,
        id: Option<&ExecutionId>,
        limit: i64,
    ) -> Result<Vec<(ExecutionId, TakeOver)>> {
        self.backend().take_over(id, limit)
    }

    /// The executions this replica owns that are not settled (shared journals; none
    /// elsewhere).
    pub fn owned_unsettled(&self) -> Result<Vec<ExecutionId>> {
        self.backend().owned_unsettled()
    }

    /// How many times each execution was taken over (shared journals; none elsewhere).
    pub fn takeover_counts(&self) -> Result<std::collections::HashMap<String, i32>> {
        self.backend().takeover_counts()
    }

    /// Whether this process took `id` over from a replica whose lease expired.
    pub fn taken_over_here(&self, id: &ExecutionId) -> bool {
        self.backend().taken_over_here(id)
    }

    /// On a shared journal, a wake-up for a caller waiting until `id` settles on another
    /// replica (or another call of this process): woken when a settling append of `id` is
    /// notified, or when this process's listener starts listening again after its connection
    /// broke; a hint only, to read the journal sooner (docs/REPLICAS.md). `None` on a SQLite
    /// file. Make it before the first read of the journal that the wait depends on.
    pub fn watch(&self, id: &ExecutionId) -> Option<Watch> {
        self.backend().watch(id)
    }

    /// Whether this journal is shared by replicas (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        self.backend().is_shared()
    }
}

/// Events as the stores keep them: a kind as its name.
fn named(events: Vec<NewEvent>) -> Vec<backend::Named> {
    events
        .into_iter()
        .map(|(k, s, e)| (k.as_str().to_owned(), s, e))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// The chain hash of an event commits to its kind's name exactly as journals written before
    /// kinds were typed hold it (the value is pinned: the
    /// name or the encoding changing would change it).
    #[test]
    fn a_typed_kind_hashes_as_the_name_it_always_had() {
        let kind = EventKind::Dispatched;
        let f = ChainFields {
            prev_hash: "",
            seq: 7,
            execution_id: "golden-1",
            at: "2026-12-02T06:00:00.000Z",
            kind: kind.as_str(),
            state: "dispatched",
            evidence: r#"{"attempt":1}"#,
            client: "42@host",
        };
        assert_eq!(
            chain_hash(&f),
            "f73b0284d0da830bfccfb00bb101b327625827b84e67a628ba843d1d836de580"
        );
    }

    #[test]
    fn url_looking_locations_are_refused_without_their_password() {
        for ok in [
            "journal.db",
            "/var/lib/cairn/j.db",
            "./a:b/j.db",
            "1x://y",
            "://y",
        ] {
            assert!(refuse_url(Path::new(ok)).is_ok(), "{ok}");
        }
        let e = refuse_url(Path::new("postgres://ops:pw@db:5432/cairn"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'postgres://ops:***@db:5432/cairn'"), "{e}");
        assert!(!e.contains("pw@"), "{e}");
        assert_eq!(
            redact_url("postgres://ops@db/cairn?sslmode=require&password=pw"),
            "postgres://ops@db/cairn?sslmode=require&password=***"
        );
        assert_eq!(redact_url("/var/lib/cairn/j.db"), "/var/lib/cairn/j.db");
        let e = refuse_url(Path::new("postgresql+tls://db/cairn")).unwrap_err();
        assert!(e.to_string().contains("postgresql+tls:// URL"), "{e}");
    }

    #[test]
    fn a_busy_journal_is_polled_finely_and_given_up_only_after_the_wait() {
        for count in [0, 1, 9, 10, 69, 70, 1_000, i32::MAX] {
            for seed in [0, 7, u64::MAX] {
                let p = busy_pause(count, Duration::from_secs(59), seed).expect("still waiting");
                assert!(p >= Duration::from_millis(1), "{count}: {p:?}");
                assert!(p < Duration::from_millis(9), "{count}: {p:?}");
            }
        }
        assert!(busy_pause(-1, Duration::ZERO, 0).is_some());
        assert_eq!(busy_pause(5, BUSY_WAIT, 0), None);
        assert_eq!(busy_pause(0, BUSY_WAIT + Duration::from_secs(1), 0), None);
        // the jitter differs between waiters (processes and instants)
        let pauses: std::collections::BTreeSet<_> = (0..32u64)
            .map(|s| busy_pause(3, Duration::ZERO, s << 32))
            .collect();
        assert!(pauses.len() > 8, "{pauses:?}");
    }

    #[test]
    fn writers_on_their_own_connections_all_get_the_lock_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("busy.db");
        {
            let c = connect(&path).unwrap();
            let _: String = c
                .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
                .unwrap();
            c.execute_batch("CREATE TABLE t (k INTEGER, n INTEGER)")
                .unwrap();
        }
        // one connection holds the write lock far longer than SQLite's first polls
        let holder = connect(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let (threads, each) = (6, 25);
        let workers: Vec<_> = (0..threads)
            .map(|k| {
                let path = path.clone();
                std::thread::spawn(move || -> rusqlite::Result<()> {
                    let c = connect(&path)?;
                    for n in 0..each {
                        c.execute_batch("BEGIN IMMEDIATE")?;
                        c.execute("INSERT INTO t VALUES (?1, ?2)", params![k, n])?;
                        std::thread::sleep(Duration::from_millis(2));
                        c.execute_batch("COMMIT")?;
                    }
                    Ok(())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1200));
        holder.execute_batch("COMMIT").unwrap();
        for w in workers {
            w.join().unwrap().expect("every writer waits for its turn");
        }
        let c = connect(&path).unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, threads * each);
    }

    /// Move `id` through `states`, one append each, as the lifecycle allows.
    pub(crate) fn walk(j: &mut Journal, id: &ExecutionId, states: &[State]) {
        for &s in states {
            j.append(id, EventKind::of_state(s), Some(s), serde_json::json!({}))
                .unwrap();
        }
    }

    pub(crate) fn rec(id: &str) -> ExecutionRecord {
        ExecutionRecord {
            id: ExecutionId::parse(id).unwrap(),
            created_at: now_rfc3339(),
            destination: "db-1".into(),
            host: "127.0.0.1".into(),
            port: 22,
            user: "ops".into(),
            command: b"echo hi".to_vec(),
            command_digest: hex::encode(Sha256::digest(b"echo hi")),
            remote_dir: ".cairn".into(),
            timeout_secs: 0,
            client: "1@test".into(),
        }
    }

    #[test]
    fn events_are_append_only_and_chained() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends("events_are_append_only_and_chained", dir.path()) {
            let mut j = Journal::open(&path).unwrap();
            let r = rec("a1");
            let e1 = j.accept(&r, serde_json::json!({})).unwrap();
            let e2 = j
                .append(
                    &r.id,
                    EventKind::Authorized,
                    Some(State::Authorized),
                    serde_json::json!({"x": 1}),
                )
                .unwrap();
            assert_eq!(e1.seq + 1, e2.seq);
            let evs = j.events(&r.id).unwrap();
            assert_eq!(evs.len(), 2);
            assert!(
                j.raw_execute("UPDATE events SET kind = 'x' WHERE seq = 1")
                    .is_err(),
                "{backend}"
            );
            assert!(j.raw_execute("DELETE FROM events").is_err(), "{backend}");
            assert!(j.accept(&r, serde_json::json!({})).is_err(), "duplicate ID");
            let st = j.status(&r.id).unwrap().unwrap();
            assert_eq!(st.state, State::Authorized);
            let _ = backend;
        }
    }

    #[test]
    fn append_all_writes_events_in_order_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends(
            "append_all_writes_events_in_order_in_one_transaction",
            dir.path(),
        ) {
            let mut j = Journal::open(&path).unwrap();
            let r = rec("a9");
            j.accept(&r, serde_json::json!({})).unwrap();
            let before = j.group_commit_stats();
            let last = j
                .append_all(
                    &r.id,
                    vec![
                        (
                            "authorized".into(),
                            Some(State::Authorized),
                            serde_json::json!({}),
                        ),
                        (
                            "dispatched".into(),
                            Some(State::Dispatched),
                            serde_json::json!({}),
                        ),
                        (
                            "running".into(),
                            Some(State::Running),
                            serde_json::json!({}),
                        ),
                    ],
                )
                .unwrap()
                .unwrap();
            if backend == "sqlite" {
                let after = j.group_commit_stats();
                assert_eq!(after.transactions - before.transactions, 1);
                assert_eq!(after.events - before.events, 3);
            }
            let kinds: Vec<String> = j
                .events(&r.id)
                .unwrap()
                .into_iter()
                .map(|e| e.kind.to_string())
                .collect();
            assert_eq!(kinds, ["accepted", "authorized", "dispatched", "running"]);
            assert_eq!(last.kind, "running");
            assert_eq!(j.status(&r.id).unwrap().unwrap().state, State::Running);
            assert!(j.append_all(&r.id, Vec::new()).unwrap().is_none());
            // An unknown execution: nothing of it is written.
            let ghost = ExecutionId::parse("ghost").unwrap();
            assert!(j
                .append_all(
                    &ghost,
                    vec![(
                        "running".into(),
                        Some(State::Running),
                        serde_json::json!({})
                    )]
                )
                .is_err());
            assert!(j.events(&ghost).unwrap().is_empty());
            let _ = backend;
        }
    }

    #[test]
    fn an_execution_accepted_under_the_v1_fingerprint_matches_only_on_its_destination() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(&dir.path().join("j.db")).unwrap();
        let cols = |fp: &str| IntentColumns {
            fingerprint: fp.into(),
            actor: "local:ops".into(),
            scope: "default".into(),
            class: "remote-command".into(),
            retention_secs: 3600,
            accepted_ms: now_ms(),
            session_id: None,
            intent: serde_json::json!({}),
        };
        let old = rec("v1-old");
        let any = |_: &[Candidate]| Some(0);
        let first = j
            .accept_or_match(
                &old,
                &cols("fp-v1"),
                serde_json::json!({}),
                serde_json::json!({}),
                any,
            )
            .unwrap();
        assert!(matches!(first, AcceptOrMatch::Accepted(_)));
        let legacy = |host: &'static str| LegacyIntent {
            fingerprint: "fp-v1",
            host,
            port: 22,
        };
        // a clone with the same key (same v1 fingerprint) at another address: a new execution
        let clone = j
            .accept_or_match_with(
                &rec("v2-clone"),
                &cols("fp-v2-clone"),
                Some(legacy("10.0.0.6")),
                serde_json::json!({}),
                serde_json::json!({}),
                any,
            )
            .unwrap();
        assert!(matches!(clone, AcceptOrMatch::Accepted(_)));
        // the same destination: the retry attaches to the execution accepted before v2
        let retry = j
            .accept_or_match_with(
                &rec("v2-retry"),
                &cols("fp-v2"),
                Some(legacy("127.0.0.1")),
                serde_json::json!({}),
                serde_json::json!({}),
                any,
            )
            .unwrap();
        match retry {
            AcceptOrMatch::Matched(c) => assert_eq!(c.id.as_str(), "v1-old"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unknown_after_a_settled_outcome_is_refused_and_one_already_held_does_not_unsettle_it() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends("an_unknown_after_a_settled_outcome_is_refused", dir.path())
        {
            let mut j = Journal::open(&path).unwrap();
            for (id, settled) in [
                ("s1", State::Completed),
                ("s2", State::Delivered),
                ("s3", State::Interrupted),
                ("s4", State::Failed),
            ] {
                let r = rec(id);
                j.accept(&r, serde_json::json!({})).unwrap();
                let path: &[State] = match settled {
                    State::Delivered => &[State::Completed, State::Delivered],
                    s => std::slice::from_ref(match s {
                        State::Completed => &State::Completed,
                        State::Interrupted => &State::Interrupted,
                        _ => &State::Failed,
                    }),
                };
                let mut states = vec![State::Authorized, State::Dispatched];
                if settled != State::Failed {
                    states.push(State::Running);
                }
                states.extend_from_slice(path);
                for s in states {
                    j.append(
                        &r.id,
                        EventKind::of_state(s),
                        Some(s),
                        serde_json::json!({}),
                    )
                    .unwrap();
                }
                let events = j.events(&r.id).unwrap().len();
                let e = j
                    .append(
                        &r.id,
                        EventKind::Unknown,
                        Some(State::Unknown),
                        serde_json::json!({}),
                    )
                    .unwrap_err();
                assert_eq!(
                    e.refused(),
                    Some(Illegal {
                        from: Some(settled),
                        to: State::Unknown
                    }),
                    "{backend} {id}: {e}"
                );
                assert_eq!(j.events(&r.id).unwrap().len(), events, "{backend} {id}");
                let st = j.status(&r.id).unwrap().unwrap();
                assert_eq!(st.state, settled, "{backend} {id}");
                // a note is still taken
                j.append(&r.id, EventKind::Note, None, serde_json::json!({}))
                    .unwrap();
            }
        }
        // A journal written before the lifecycle was enforced may hold an `unknown` after a
        // settled outcome: it reads as the settled outcome.
        for settled in [
            State::Completed,
            State::Delivered,
            State::Interrupted,
            State::Failed,
        ] {
            let st =
                status_from_states(&[State::Accepted, State::Dispatched, settled, State::Unknown])
                    .unwrap();
            assert_eq!(st.state, settled);
            assert_eq!(st.before_unknown, None);
        }
        let st = status_from_states(&[State::Running, State::Unknown, State::Completed]).unwrap();
        assert_eq!(st.state, State::Completed);
    }

    /// The window of issue 35: a `cancel` records `cancelled` while the owner, between its
    /// decision and its append, is about to append `authorized` and `dispatched`. Whichever
    /// commits second is refused in its own transaction, with nothing of it written; never
    /// both. Raced for real on both backends, a bounded number of rounds.
    #[test]
    fn a_dispatch_and_a_cancel_racing_never_both_commit() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends("a_dispatch_and_a_cancel_racing", dir.path()) {
            let mut j = Journal::open(&path).unwrap();
            let (mut dispatched, mut cancelled) = (0, 0);
            for round in 0..40 {
                let r = rec(&format!("race{round}"));
                j.accept(&r, serde_json::json!({})).unwrap();
                let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
                let owner = {
                    let (path, id, barrier) = (path.clone(), r.id.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let mut j = Journal::open(&path).unwrap();
                        barrier.wait();
                        j.append_all(
                            &id,
                            vec![
                                (EventKind::Authorized, Some(State::Authorized), json!({})),
                                (EventKind::Dispatched, Some(State::Dispatched), json!({})),
                            ],
                        )
                    })
                };
                let mut c = Journal::open(&path).unwrap();
                barrier.wait();
                let cancel = c.append_all_if(
                    &r.id,
                    &[State::Accepted, State::Authorized],
                    vec![(EventKind::Cancelled, Some(State::Cancelled), json!({}))],
                );
                let owner = owner.join().unwrap();
                let states: Vec<State> = j
                    .events(&r.id)
                    .unwrap()
                    .iter()
                    .filter_map(|e| e.state)
                    .collect();
                match (&owner, &cancel) {
                    (Ok(_), Err(e)) => {
                        assert_eq!(
                            e.refused().map(|i| i.from),
                            Some(Some(State::Dispatched)),
                            "{backend}: {e}"
                        );
                        assert_eq!(
                            states,
                            [State::Accepted, State::Authorized, State::Dispatched],
                            "{backend}"
                        );
                        dispatched += 1;
                    }
                    (Err(e), Ok(_)) => {
                        assert_eq!(
                            e.refused(),
                            Some(Illegal {
                                from: Some(State::Cancelled),
                                to: State::Authorized
                            }),
                            "{backend}: {e}"
                        );
                        assert_eq!(states, [State::Accepted, State::Cancelled], "{backend}");
                        cancelled += 1;
                    }
                    other => panic!("{backend} round {round}: {other:?}"),
                }
            }
            assert_eq!(dispatched + cancelled, 40, "{backend}");
        }
    }

    /// The state the lifecycle check reads (two indexed reads) is the state `status` derives
    /// from the whole history, for every history of up to three transitions after `accepted`,
    /// lawful or not (journals written before the check may hold any).
    #[test]
    fn the_state_the_check_reads_is_the_state_status_derives() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.db")).unwrap();
        let mut c = j.conn().unwrap();
        let tx = c.transaction().unwrap();
        let mut histories: Vec<Vec<State>> = vec![vec![]];
        for _ in 0..3 {
            let longer: Vec<Vec<State>> = histories
                .iter()
                .filter(|h| h.len() == histories.last().unwrap().len())
                .flat_map(|h| {
                    State::ALL.into_iter().map(move |s| {
                        let mut h = h.clone();
                        h.push(s);
                        h
                    })
                })
                .collect();
            histories.extend(longer);
        }
        assert_eq!(histories.len(), 1 + 11 + 121 + 1331);
        for (n, h) in histories.iter().enumerate() {
            let r = rec(&format!("h{n}"));
            insert_accepted(&tx, &r, None, &json!({})).unwrap();
            for s in h {
                append_in(&tx, r.id.as_str(), s.as_str(), Some(*s), &json!({})).unwrap();
            }
            let mut all = vec![State::Accepted];
            all.extend(h);
            assert_eq!(
                state_in(&tx, r.id.as_str()).unwrap(),
                status_from_states(&all).map(|s| s.state),
                "{all:?}"
            );
        }
    }

    /// A conditional append is refused when the execution left the states it was made for, and
    /// a transition the lifecycle forbids is refused whatever the condition; both typed, both
    /// leaving the journal as it was.
    #[test]
    fn a_conditional_append_is_refused_once_the_state_moved_on() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends("a_conditional_append_is_refused", dir.path()) {
            let mut j = Journal::open(&path).unwrap();
            let r = rec("cond1");
            j.accept(&r, serde_json::json!({})).unwrap();
            walk(&mut j, &r.id, &[State::Authorized, State::Dispatched]);
            let cancel = || vec![(EventKind::Cancelled, Some(State::Cancelled), json!({}))];
            let e = j
                .append_all_if(&r.id, &[State::Accepted, State::Authorized], cancel())
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    JournalError::Refused {
                        conditional: true,
                        ..
                    }
                ),
                "{backend}: {e}"
            );
            assert_eq!(e.refused().unwrap().from, Some(State::Dispatched));
            assert!(e.to_string().contains("it is dispatched now"), "{e}");
            assert_eq!(j.events(&r.id).unwrap().len(), 3, "{backend}");
            // the condition met: written, in one transaction
            let ev = j
                .append_all_if(&r.id, &[State::Dispatched], cancel())
                .unwrap();
            assert_eq!(ev.state, Some(State::Cancelled));
            // met, but the lifecycle refuses: nothing after cancelled but delivered and notes
            let e = j
                .append_all_if(
                    &r.id,
                    &[State::Cancelled],
                    vec![(EventKind::Running, Some(State::Running), json!({}))],
                )
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    JournalError::Refused {
                        conditional: false,
                        ..
                    }
                ),
                "{backend}: {e}"
            );
            assert_eq!(j.status(&r.id).unwrap().unwrap().state, State::Cancelled);
            // an execution the journal does not have is refused too
            let ghost = ExecutionId::parse("ghost").unwrap();
            assert!(j
                .append_all_if(&ghost, &[State::Accepted], cancel())
                .is_err());
        }
    }

    #[test]
    fn status_remembers_what_was_known_before_unknown() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in
            backends("status_remembers_what_was_known_before_unknown", dir.path())
        {
            let mut j = Journal::open(&path).unwrap();
            let r = rec("a2");
            j.accept(&r, serde_json::json!({})).unwrap();
            for s in [
                State::Authorized,
                State::Dispatched,
                State::Running,
                State::Unknown,
            ] {
                j.append(
                    &r.id,
                    EventKind::of_state(s),
                    Some(s),
                    serde_json::json!({}),
                )
                .unwrap();
            }
            let st = j.status(&r.id).unwrap().unwrap();
            assert_eq!(st.state, State::Unknown);
            assert_eq!(st.before_unknown, Some(State::Running));
            let _ = backend;
        }
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339_from_unix(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_from_unix(1_796_036_400, 5),
            "2026-11-30T11:00:00.005Z"
        );
        assert_eq!(
            rfc3339_from_unix(951_782_400, 0),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn a_thousand_handles_share_a_few_connections() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut handles: Vec<Journal> = (0..1000).map(|_| Journal::open(&path).unwrap()).collect();
        let r = rec("a1");
        let id = r.id.clone();
        handles[0].accept(&r, serde_json::json!({})).unwrap();
        for j in handles.iter_mut().take(50) {
            j.append(&id, EventKind::Note, None, serde_json::json!({}))
                .unwrap();
            assert!(j.status(&id).unwrap().is_some());
        }
        // One connection served every handle, one operation at a time.
        assert_eq!(handles[999].connections_opened(), 1);
        assert_eq!(handles[999].events(&id).unwrap().len(), 51);
    }

    #[test]
    fn a_journal_replaced_at_the_same_path_is_opened_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut a = Journal::open(&path).unwrap();
        a.accept(&rec("a1"), serde_json::json!({})).unwrap();
        // Replace the file while a handle (and its pooled connection) is alive.
        std::fs::remove_file(&path).unwrap();
        let _ = std::fs::remove_file(path.with_extension("db-wal"));
        let _ = std::fs::remove_file(path.with_extension("db-shm"));
        let b = Journal::open(&path).unwrap();
        assert!(
            b.list().unwrap().is_empty(),
            "a new handle must see the new, empty file"
        );
        assert!(
            a.list().unwrap().is_empty(),
            "so must the old handle's next operation"
        );
    }

    #[test]
    fn two_handles_append_concurrently_without_losing_events() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends(
            "two_handles_append_concurrently_without_losing_events",
            dir.path(),
        ) {
            let mut j = Journal::open(&path).unwrap();
            let r = rec("c1");
            j.accept(&r, serde_json::json!({})).unwrap();
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let path = path.clone();
                    let id = r.id.clone();
                    std::thread::spawn(move || {
                        let mut j = Journal::open(&path).unwrap();
                        for _ in 0..50 {
                            j.append(&id, EventKind::Note, None, serde_json::json!({}))
                                .unwrap();
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let evs = j.events(&r.id).unwrap();
            assert_eq!(evs.len(), 101);
            for w in evs.windows(2) {
                // SQLite numbers without gaps; PostgreSQL's sequence only increases (an append
                // that waited for another one's lock draws a second number).
                match backend {
                    "sqlite" => assert_eq!(w[0].seq + 1, w[1].seq),
                    _ => assert!(
                        w[0].seq < w[1].seq,
                        "{backend}: {} then {}",
                        w[0].seq,
                        w[1].seq
                    ),
                }
            }
        }
    }

    /// `threads` handles on one journal, each accepting its own execution and appending `per`
    /// events to it (every `bad_every`-th to an execution that does not exist), all started
    /// together; returns a handle open all along (so its group's counts cover everything), the
    /// path, the IDs and each thread's results.
    fn concurrent_appends(
        dir: &Path,
        threads: usize,
        per: usize,
        bad_every: Option<usize>,
    ) -> (Journal, PathBuf, Vec<ExecutionId>, Vec<Vec<Result<Event>>>) {
        let path = dir.join("j.db");
        let j = Journal::open(&path).unwrap();
        let ids: Vec<ExecutionId> = (0..threads)
            .map(|t| ExecutionId::parse(&format!("ex_g{t}")).unwrap())
            .collect();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads));
        let handles: Vec<_> = ids
            .iter()
            .cloned()
            .map(|id| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    // every thread reaches the barrier, whatever its open gave
                    let opened = Journal::open(&path);
                    barrier.wait();
                    let mut j = opened.unwrap();
                    let r = rec(id.as_str());
                    j.accept(&r, accepted_evidence(&r)).unwrap();
                    let missing = ExecutionId::parse(&format!("{id}_missing")).unwrap();
                    (0..per)
                        .map(|i| {
                            let bad = bad_every.is_some_and(|n| i % n == n - 1);
                            let target = if bad { &missing } else { &id };
                            // (a transition the lifecycle allows again and again)
                            let st = if i % 2 == 0 {
                                Some(State::Unknown)
                            } else {
                                None
                            };
                            j.append(target, EventKind::Step, st, serde_json::json!({ "i": i }))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let results = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (j, path, ids, results)
    }

    #[test]
    fn concurrent_handles_are_group_committed_with_every_event_once_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (threads, per) = (16, 25);
        let (j, path, ids, results) = concurrent_appends(dir.path(), threads, per, None);
        let mut seqs = Vec::new();
        for (id, res) in ids.iter().zip(results) {
            let evs = j.events(id).unwrap();
            assert_eq!(evs.len(), per + 1, "{id}: accepted + {per} appends");
            let is: Vec<_> = evs[1..].iter().map(|e| e.evidence["i"].clone()).collect();
            let want: Vec<serde_json::Value> = (0..per).map(|i| i.into()).collect();
            assert_eq!(is, want, "{id}: one thread's events stay in its order");
            for (got, stored) in res.into_iter().zip(&evs[1..]) {
                let got = got.unwrap();
                assert_eq!((got.seq, &got.hash), (stored.seq, &stored.hash));
            }
            seqs.extend(evs.iter().map(|e| e.seq));
        }
        seqs.sort_unstable();
        let all: Vec<i64> = (1..=(threads * (per + 1)) as i64).collect();
        assert_eq!(seqs, all, "every event exactly once, no gaps");

        let report =
            crate::audit::verify(&path, &crate::audit::Anchor::for_journal(&path)).unwrap();
        assert!(report.ok(), "{:?}", report.findings);
        assert_eq!(report.anchored_seq, Some(report.head_seq));
        assert_eq!(report.unanchored, 0);

        let stats = j.group_commit_stats();
        assert_eq!(stats.events, (threads * (per + 1)) as u64);
        assert!(
            stats.transactions < stats.events,
            "group commit must batch: {stats:?}"
        );
    }

    #[test]
    fn a_failing_append_among_concurrent_ones_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (threads, per, bad_every) = (8, 20, 4);
        let (j, path, ids, results) = concurrent_appends(dir.path(), threads, per, Some(bad_every));
        for (id, res) in ids.iter().zip(results) {
            for (i, r) in res.iter().enumerate() {
                let bad = i % bad_every == bad_every - 1;
                assert_eq!(r.is_err(), bad, "{id} append {i}: {r:?}");
            }
            let is: Vec<_> = j.events(id).unwrap()[1..]
                .iter()
                .map(|e| e.evidence["i"].as_u64().unwrap() as usize)
                .collect();
            let want: Vec<usize> = (0..per)
                .filter(|i| i % bad_every != bad_every - 1)
                .collect();
            assert_eq!(is, want);
        }
        let report =
            crate::audit::verify(&path, &crate::audit::Anchor::for_journal(&path)).unwrap();
        assert!(report.ok(), "{:?}", report.findings);
        assert_eq!(report.anchored_seq, Some(report.head_seq));
    }

    #[test]
    fn a_leader_that_panics_leaves_no_one_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let mut j = Journal::open(&path).unwrap();
        let r = rec("ex_p");
        j.accept(&r, serde_json::json!({})).unwrap();
        let (p, id) = (path.clone(), r.id.clone());
        let panicked = std::thread::spawn(move || {
            let mut j = Journal::open(&p).unwrap();
            let _ = j.append(
                &id,
                group::tests::PANIC_KIND.into(),
                None,
                serde_json::json!({}),
            );
        })
        .join();
        assert!(panicked.is_err(), "the leader thread panicked");
        // The group has no leader left behind: other handles (and threads) still commit.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (p, id) = (path.clone(), r.id.clone());
                std::thread::spawn(move || {
                    let mut j = Journal::open(&p).unwrap();
                    j.append(&id, EventKind::Note, None, serde_json::json!({}))
                        .unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        j.append(&r.id, EventKind::Note, None, serde_json::json!({}))
            .unwrap();
        assert_eq!(j.events(&r.id).unwrap().len(), 6);
    }

    /// Where the journal suite runs each backend-neutral test: a SQLite file in `dir`, and a
    /// fresh database on the test PostgreSQL server (see `test_postgres`; without PostgreSQL,
    /// loudly skipped outside CI, a failure in CI).
    pub(crate) fn backends(test: &str, dir: &Path) -> Vec<(&'static str, PathBuf)> {
        let mut v = vec![("sqlite", dir.join("j.db"))];
        if let Some(server) = super::test_postgres::server(test) {
            v.push(("postgres", PathBuf::from(server.database(test))));
        }
        v
    }

    fn intent(fp: &str, retention_secs: u64) -> IntentColumns {
        IntentColumns {
            fingerprint: fp.into(),
            actor: "agent:a".into(),
            scope: "default".into(),
            class: "remote-command".into(),
            retention_secs,
            accepted_ms: now_ms(),
            session_id: None,
            intent: serde_json::json!({"op": fp}),
        }
    }

    // Long: one scenario, its phases in order.
    #[test]
    fn intent_matching_attaches_within_the_window_and_accepts_when_nothing_fits() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends("intent_matching_window", dir.path()) {
            let mut j = Journal::open(&path).unwrap();
            let any = |c: &[Candidate]| (!c.is_empty()).then_some(0);
            let ask = |j: &mut Journal,
                       id: &str,
                       fp: &str,
                       ret: u64,
                       choose: &dyn Fn(&[Candidate]) -> Option<usize>| {
                j.accept_or_match(
                    &rec(id),
                    &intent(fp, ret),
                    accepted_evidence(&rec(id)),
                    serde_json::json!({"by": id}),
                    choose,
                )
                .unwrap()
            };
            assert!(matches!(
                ask(&mut j, "m1", "fp", 3600, &any),
                AcceptOrMatch::Accepted(_)
            ));
            match ask(&mut j, "m2", "fp", 3600, &any) {
                AcceptOrMatch::Matched(c) => {
                    assert_eq!(c.id.as_str(), "m1", "{backend}");
                    assert_eq!(c.status.state, State::Accepted, "{backend}");
                    assert_eq!(c.class, "remote-command", "{backend}");
                }
                other => panic!("{backend}: {other:?}"),
            }
            assert!(j
                .execution(&ExecutionId::parse("m2").unwrap())
                .unwrap()
                .is_none());
            let kinds: Vec<String> = j
                .events(&ExecutionId::parse("m1").unwrap())
                .unwrap()
                .into_iter()
                .map(|e| e.kind.to_string())
                .collect();
            assert_eq!(kinds, ["accepted", "intent-matched"], "{backend}");
            // The caller declines every candidate (a failed one, say): a new execution.
            let none = |_: &[Candidate]| None;
            assert!(matches!(
                ask(&mut j, "m3", "fp", 3600, &none),
                AcceptOrMatch::Accepted(_)
            ));
            // Both are candidates now, newest first.
            let seen = std::cell::RefCell::new(Vec::new());
            let look = |c: &[Candidate]| {
                *seen.borrow_mut() = c.iter().map(|c| c.id.to_string()).collect();
                None
            };
            ask(&mut j, "m4", "fp", 3600, &look);
            assert_eq!(*seen.borrow(), ["m3", "m1"], "{backend}");
            // Another actor, another scope or another fingerprint never matches.
            let mut other = intent("fp", 3600);
            other.actor = "agent:b".into();
            let r = j
                .accept_or_match(
                    &rec("m5"),
                    &other,
                    serde_json::json!({}),
                    serde_json::json!({}),
                    any,
                )
                .unwrap();
            assert!(matches!(r, AcceptOrMatch::Accepted(_)), "{backend}");
            // A window of 0 s has passed at once: nothing to attach to.
            assert!(matches!(
                ask(&mut j, "w1", "fp0", 0, &any),
                AcceptOrMatch::Accepted(_)
            ));
            assert!(matches!(
                ask(&mut j, "w2", "fp0", 0, &any),
                AcceptOrMatch::Accepted(_)
            ));
            let cols = j
                .intent_of(&ExecutionId::parse("m1").unwrap())
                .unwrap()
                .unwrap();
            assert_eq!(cols.fingerprint, "fp");
            assert_eq!(cols.intent, serde_json::json!({"op": "fp"}), "{backend}");
            assert!(j
                .intent_of(&ExecutionId::parse("ghost").unwrap())
                .unwrap()
                .is_none());
        }
    }

    #[test]
    fn identical_requests_racing_on_many_handles_make_one_execution() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends("identical_requests_racing", dir.path()) {
            drop(Journal::open(&path).unwrap());
            let n = 8;
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
            let threads: Vec<_> = (0..n)
                .map(|i| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let mut j = Journal::open(&path).unwrap();
                        barrier.wait();
                        let id = format!("race{i}");
                        j.accept_or_match(
                            &rec(&id),
                            &intent("same", 3600),
                            serde_json::json!({}),
                            serde_json::json!({}),
                            |c: &[Candidate]| (!c.is_empty()).then_some(0),
                        )
                        .unwrap()
                    })
                })
                .collect();
            let outcomes: Vec<AcceptOrMatch> =
                threads.into_iter().map(|t| t.join().unwrap()).collect();
            let accepted = outcomes
                .iter()
                .filter(|o| matches!(o, AcceptOrMatch::Accepted(_)))
                .count();
            assert_eq!(accepted, 1, "{backend}: {outcomes:?}");
            let j = Journal::open(&path).unwrap();
            assert_eq!(j.list().unwrap().len(), 1, "{backend}");
            let winner = &j.list().unwrap()[0].0.id;
            for o in &outcomes {
                if let AcceptOrMatch::Matched(c) = o {
                    assert_eq!(&c.id, winner, "{backend}");
                }
            }
            assert_eq!(
                j.events(winner).unwrap().len(),
                n,
                "{backend}: accepted + {} matched",
                n - 1
            );
        }
    }

    // Long: one scenario, its phases in order.
    #[test]
    fn sessions_batches_tokens_and_cursors_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends("sessions_batches_tokens", dir.path()) {
            let mut j = Journal::open(&path).unwrap();
            let s = SessionRecord {
                id: "se_1".into(),
                kind: "serve".into(),
                actor: "local:ops".into(),
                pid: 42,
                client: "42@test".into(),
                started_at: now_rfc3339(),
                detail: serde_json::json!({"name": "gw"}),
            };
            j.start_session(&s).unwrap();
            assert!(
                j.start_session(&s).is_err(),
                "{backend}: a session starts once"
            );
            let mut r = rec("b1");
            let cols = IntentColumns {
                session_id: Some("se_1".into()),
                ..intent("sfp", 60)
            };
            j.accept_or_match(
                &r,
                &cols,
                serde_json::json!({}),
                serde_json::json!({}),
                |_| None,
            )
            .unwrap();
            j.session_event("se_1", "ended", serde_json::json!({"why": "test"}))
                .unwrap();
            assert!(j
                .session_event("se_none", "ended", serde_json::json!({}))
                .is_err());
            let v = j.sessions().unwrap();
            assert_eq!(v.len(), 1, "{backend}");
            assert_eq!(v[0].record, s, "{backend}");
            assert!(v[0].ended_at.is_some(), "{backend}");
            assert_eq!(v[0].executions, 1, "{backend}");
            assert_eq!(
                j.executions_of_session("se_1").unwrap(),
                ["b1"],
                "{backend}"
            );

            r.id = ExecutionId::parse("b2").unwrap();
            let members = vec![
                ("h1".to_string(), r.id.clone()),
                ("h2".into(), ExecutionId::parse("b3").unwrap()),
            ];
            j.create_batch(
                "ba_1",
                b"uptime",
                &serde_json::json!({"parallel": 2}),
                &members,
            )
            .unwrap();
            assert!(j
                .create_batch("ba_1", b"x", &serde_json::json!({}), &[])
                .is_err());
            let b = j.batch("ba_1").unwrap().unwrap();
            assert_eq!(b.command, b"uptime", "{backend}");
            assert_eq!(b.options["parallel"], 2, "{backend}");
            let got: Vec<(i64, &str, &str)> = b
                .members
                .iter()
                .map(|m| (m.position, m.destination.as_str(), m.execution_id.as_str()))
                .collect();
            assert_eq!(got, [(0, "h1", "b2"), (1, "h2", "b3")], "{backend}");
            assert_eq!(j.batch_ids().unwrap(), ["ba_1"], "{backend}");
            assert!(j.batch("nope").unwrap().is_none());

            let t = TokenRecord {
                id: "tk_1".into(),
                hash: "ab".repeat(32),
                actor: "agent:a".into(),
                scope_prefix: Some("t-".into()),
                created_at: now_rfc3339(),
                expires_at: None,
                expires_ms: None,
                revoked_at: None,
            };
            j.add_token(&t).unwrap();
            assert!(j.add_token(&t).is_err(), "{backend}: one token per ID");
            let got = j.token_by_hash(&t.hash).unwrap().unwrap();
            assert_eq!(
                (got.id.as_str(), got.scope_prefix.as_deref()),
                ("tk_1", Some("t-"))
            );
            assert!(j.token_by_hash("cd").unwrap().is_none());
            assert!(j.revoke_token("tk_1").unwrap(), "{backend}");
            assert!(!j.revoke_token("tk_1").unwrap(), "{backend}: revoked once");
            assert!(j.tokens().unwrap()[0].revoked_at.is_some(), "{backend}");

            let id = ExecutionId::parse("b1").unwrap();
            assert_eq!(j.cursor(&id).unwrap(), (0, 0));
            j.set_cursor(&id, 10, 3).unwrap();
            j.set_cursor(&id, 12, 3).unwrap();
            assert_eq!(j.cursor(&id).unwrap(), (12, 3), "{backend}");
            walk(
                &mut j,
                &id,
                &[State::Authorized, State::Dispatched, State::Completed],
            );
            j.append(
                &id,
                EventKind::Delivered,
                Some(State::Delivered),
                serde_json::json!({}),
            )
            .unwrap();
            assert_eq!(j.prune_cursors().unwrap(), 1, "{backend}");
            assert_eq!(j.cursor(&id).unwrap(), (0, 0), "{backend}");

            let seq = j.store_http_event("st1", None, Some("{}")).unwrap();
            j.record_http_stream(&StreamRecord {
                stream_id: "st1".into(),
                session_id: None,
                actor: "agent:a".into(),
                request: "{}".into(),
            })
            .unwrap();
            assert_eq!(j.http_events_after("st1", 0).unwrap()[0].seq, seq);
            assert_eq!(j.http_stream("st1").unwrap().unwrap().actor, "agent:a");
            j.bind_http_session("hs", "agent:a").unwrap();
            j.bind_http_session("hs", "agent:b").unwrap();
            j.store_http_session("hs", "{\"v\":1}").unwrap();
            assert_eq!(
                j.http_session("hs").unwrap(),
                Some((Some("agent:a".into()), Some("{\"v\":1}".into()))),
                "{backend}: bound once"
            );
            j.delete_http_session("hs").unwrap();
            assert!(j.http_session("hs").unwrap().is_none());
            j.append(
                &id,
                EventKind::Correlation,
                None,
                serde_json::json!({"correlation_id": "c-1"}),
            )
            .unwrap();
            assert_eq!(
                j.execution_by_correlation("c-1").unwrap().as_deref(),
                Some("b1")
            );
            let last = j.last_event_seq().unwrap();
            assert!(j
                .execution_by_correlation_after("c-1", last)
                .unwrap()
                .is_none());
            let m = j.metrics().unwrap();
            assert_eq!(m.by_state, [("delivered".to_string(), 1)], "{backend}");
        }
    }

    #[test]
    fn a_second_accept_of_one_id_is_told_apart_as_a_lost_race() {
        let dir = tempfile::tempdir().unwrap();
        for (backend, path) in backends("duplicate_id", dir.path()) {
            let mut j = Journal::open(&path).unwrap();
            j.accept(&rec("d1"), serde_json::json!({})).unwrap();
            let e = j.accept(&rec("d1"), serde_json::json!({})).unwrap_err();
            assert!(e.is_duplicate_id(), "{backend}: {e}");
            let e = j
                .append(
                    &ExecutionId::parse("d2").unwrap(),
                    EventKind::Note,
                    None,
                    serde_json::json!({}),
                )
                .unwrap_err();
            assert!(!e.is_duplicate_id(), "{backend}: {e}");
        }
    }

    // Long: one scenario, its phases in order.
    #[test]
    fn a_postgres_journal_migrates_once_and_refuses_a_newer_schema() {
        let Some(server) = test_postgres::server("postgres_schema") else {
            return;
        };
        let url = server.database("schema");
        let db = url.rsplit('/').next().unwrap().to_owned();
        // Replicas starting together: one migration.
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let url = url.clone();
                std::thread::spawn(move || Journal::open(Path::new(&url)).map(|_| ()))
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        assert_eq!(
            server
                .psql(
                    &db,
                    "SELECT string_agg(version::text, ',') FROM cairn_schema"
                )
                .unwrap()
                .trim(),
            (1..=PG_SCHEMA_VERSION)
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(","),
            "every migration applied once"
        );
        server
            .psql(
                &db,
                "INSERT INTO cairn_schema (version, by_client) VALUES (99, 'later')",
            )
            .unwrap();
        let e = Journal::open(Path::new(&url))
            .err()
            .expect("a newer schema is refused");
        let text = e.to_string();
        assert!(
            text.contains("schema version 99")
                && text.contains(&format!("up to {PG_SCHEMA_VERSION}")),
            "{text}"
        );
        // What the role cannot do to evidence, whatever it is granted.
        server
            .psql(&db, "DELETE FROM cairn_schema WHERE version = 99")
            .unwrap();
        let mut j = Journal::open(Path::new(&url)).unwrap();
        j.accept(&rec("p1"), serde_json::json!({})).unwrap();
        for sql in [
            "UPDATE events SET kind = 'x'",
            "DELETE FROM events",
            "TRUNCATE events",
            "UPDATE executions SET host = 'elsewhere'",
        ] {
            let e = j.raw_execute(sql).unwrap_err().to_string();
            assert!(
                e.contains("append-only") || e.contains("fixed once accepted"),
                "{sql}: {e}"
            );
        }
        // A database left at version 1 is brought to the current version on first use, and
        // what it held is still read and chained on.
        let old_url = server.database("schema_v1");
        let old_db = old_url.rsplit('/').next().unwrap().to_owned();
        let (_, v1) = postgres::schema::MIGRATIONS[0];
        server
            .psql(
                &old_db,
                &format!(
                    "BEGIN; CREATE TABLE cairn_schema (version INTEGER PRIMARY KEY,
                        applied_at TIMESTAMPTZ NOT NULL DEFAULT now(), by_client TEXT NOT NULL);
                     {v1}
                     INSERT INTO cairn_schema (version, by_client) VALUES (1, 'earlier');
                     INSERT INTO executions (id, created_at, destination, host, port, \"user\",
                        command, command_digest, remote_dir, timeout_secs, client)
                        VALUES ('v1x', 'then', 'db-1', '127.0.0.1', 22, 'ops', '\\x00', 'd',
                                '.cairn', 0, '1@then');
                     INSERT INTO chain_heads VALUES ('v1x', 0, '');
                     COMMIT;"
                ),
            )
            .unwrap();
        let mut old = Journal::open(Path::new(&old_url)).unwrap();
        let id = ExecutionId::parse("v1x").unwrap();
        let e = old
            .append(&id, EventKind::Note, None, serde_json::json!({}))
            .unwrap();
        assert_eq!(old.events(&id).unwrap()[0].hash, e.hash);
        assert_eq!(
            server
                .psql(
                    &old_db,
                    "SELECT string_agg(version::text, ',' ORDER BY version) FROM cairn_schema"
                )
                .unwrap()
                .trim(),
            (1..=PG_SCHEMA_VERSION)
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        // A bad URL is a clear error that does not repeat the password.
        let e = Journal::open(Path::new("postgres://ops:s3cret@127.0.0.1:1/x"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("postgres://ops:***@127.0.0.1:1/x"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }
    /// Waiting across replicas: a watcher of an execution is woken when the listener first
    /// listens, by the notification of that execution's settling append (not by an append that
    /// does not settle, nor by another execution's), and, when the listener's connection is
    /// terminated, again once it listens again, with nothing appended: whatever was notified
    /// while it was down is lost, so every waiter reads the journal once more.
    // Long: one scenario, its phases in order.
    #[test]
    fn a_settling_append_wakes_its_watcher_and_a_listener_that_reconnects_wakes_every_waiter() {
        use super::Woken;
        let Some(server) = test_postgres::server("postgres_wake") else {
            return;
        };
        let url = server.database("wake");
        let db = url.rsplit('/').next().unwrap().to_owned();
        let mut j = Journal::open(Path::new(&url)).unwrap();
        let (a, b) = (
            ExecutionId::parse("wake-a").unwrap(),
            ExecutionId::parse("wake-b").unwrap(),
        );
        for id in [&a, &b] {
            j.accept(&rec(id.as_str()), serde_json::json!({})).unwrap();
            walk(&mut j, id, &[State::Authorized, State::Dispatched]);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // What comes next, skipping empty polls (bounded).
        let next = |w: &mut super::Watch| {
            for _ in 0..120 {
                match rt.block_on(w.wait(Duration::from_secs(1))) {
                    Woken::Timeout => continue,
                    other => return other,
                }
            }
            panic!("nothing woke the watcher");
        };
        let (mut wa, mut wb) = (j.watch(&a).unwrap(), j.watch(&b).unwrap());
        assert_eq!(next(&mut wa), Woken::Listening);
        assert_eq!(next(&mut wb), Woken::Listening);
        // b's append that does not settle, then a's that does: notifications arrive in commit
        // order, so once a's is here, one for b would have been handled already.
        j.append(
            &b,
            EventKind::Running,
            Some(State::Running),
            serde_json::json!({}),
        )
        .unwrap();
        j.append(
            &a,
            EventKind::Completed,
            Some(State::Completed),
            serde_json::json!({}),
        )
        .unwrap();
        assert_eq!(next(&mut wa), Woken::Notified);
        assert_eq!(
            rt.block_on(wb.wait(Duration::ZERO)),
            Woken::Timeout,
            "b was not woken"
        );
        let killed = server
            .psql(
                &db,
                &format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = '{db}' AND application_name = '{}'",
                    super::listener_name()
                ),
            )
            .unwrap();
        assert_eq!(killed.trim(), "1", "one listener connection");
        assert_eq!(
            next(&mut wb),
            Woken::Listening,
            "woken with nothing appended"
        );
        assert_eq!(next(&mut wa), Woken::Listening);
        j.append(
            &b,
            EventKind::Completed,
            Some(State::Completed),
            serde_json::json!({}),
        )
        .unwrap();
        assert_eq!(
            next(&mut wb),
            Woken::Notified,
            "notified after it listens again"
        );
    }

    /// Leases and fencing on a shared journal, against the real server. The other replica is
    /// played by SQL on its own rows (one process is one replica): it takes over an execution
    /// this process owns, and this process's next append as owner is refused, with nothing
    /// written; then the other replica stops heartbeating, and this process takes over one of
    /// its executions (epoch bumped, a `takeover` event naming both), at most MAX_TAKEOVERS
    /// times.
    // Long: one scenario, its phases in order.
    #[test]
    fn an_owner_whose_execution_was_taken_over_cannot_append_and_an_expired_lease_is_taken_over() {
        let Some(server) = test_postgres::server("postgres_fence") else {
            return;
        };
        let url = server.database("fence");
        let db = url.rsplit('/').next().unwrap().to_owned();
        let mut j = Journal::open(Path::new(&url)).unwrap();
        let mine = ExecutionId::parse("fence-mine").unwrap();
        j.accept(&rec(mine.as_str()), serde_json::json!({}))
            .unwrap();
        let o = j.ownership(&mine).unwrap().unwrap();
        assert!(o.mine && o.live && !o.settled, "{o:?}");
        assert_eq!((o.epoch, o.takeovers), (1, 0));
        assert_eq!(o.replica, replica_id());
        j.append(&mine, EventKind::Note, None, serde_json::json!({}))
            .unwrap();
        walk(&mut j, &mine, &[State::Authorized, State::Dispatched]);

        // Another replica takes it over (as its takeover does: the epoch bumped).
        let psql = |sql: &str| server.psql(&db, sql).unwrap();
        psql(
            "INSERT INTO replicas (id, client, lease_ms) VALUES ('other/r', '9@elsewhere', 60000)",
        );
        psql(
            "UPDATE owners SET replica = 'other/r', epoch = 2, takeovers = 1 \
              WHERE execution_id = 'fence-mine'",
        );
        let before = j.events(&mine).unwrap().len();
        let e = j
            .append(
                &mine,
                EventKind::Dispatched,
                Some(State::Dispatched),
                serde_json::json!({}),
            )
            .unwrap_err();
        assert!(e.is_fenced(), "{e}");
        assert!(
            e.to_string().contains("taken over by replica other/r"),
            "{e}"
        );
        assert_eq!(j.events(&mine).unwrap().len(), before, "nothing written");
        // Fenced out, this process appends nothing more to it: not even a note, which it
        // would otherwise write unfenced as a non-owner.
        let e = j
            .append(
                &mine,
                EventKind::Note,
                None,
                serde_json::json!({"late": true}),
            )
            .unwrap_err();
        assert!(e.is_fenced(), "{e}");
        let e = j
            .append_all_if(
                &mine,
                &[State::Dispatched],
                vec![(EventKind::Cancelled, Some(State::Cancelled), json!({}))],
            )
            .unwrap_err();
        assert!(e.is_fenced(), "{e}");
        assert_eq!(j.events(&mine).unwrap().len(), before, "nothing written");
        let o = j.ownership(&mine).unwrap().unwrap();
        assert!(!o.mine && o.live, "{o:?}");
        // A live owner's execution is not taken.
        let t = j.take_over(Some(&mine), 1).unwrap();
        assert!(matches!(t[..], [(_, TakeOver::Held)]), "{t:?}");

        // The other replica's lease expires (database time): this one takes it back.
        psql(
            "UPDATE replicas SET heartbeat_at = now() - interval '2 minutes' WHERE id = 'other/r'",
        );
        assert!(!j.ownership(&mine).unwrap().unwrap().live);
        let t = j.take_over(None, 8).unwrap();
        assert!(
            matches!(&t[..], [(id, TakeOver::Taken { from, epoch: 3 })]
                if id == &mine && from == "other/r"),
            "{t:?}"
        );
        let o = j.ownership(&mine).unwrap().unwrap();
        assert!(o.mine && o.live, "{o:?}");
        assert_eq!((o.epoch, o.takeovers), (3, 2));
        assert!(j.taken_over_here(&mine));
        let evs = j.events(&mine).unwrap();
        let took = evs.last().unwrap();
        assert_eq!(took.kind, "takeover");
        assert_eq!(took.evidence["from"], "other/r");
        assert_eq!(took.evidence["from_client"], "9@elsewhere");
        assert_eq!(took.evidence["to"], replica_id());
        assert_eq!(took.evidence["epoch"], 3);
        // Its appends are fenced at the new epoch and go through.
        j.append(
            &mine,
            EventKind::Completed,
            Some(State::Completed),
            serde_json::json!({}),
        )
        .unwrap();
        let o = j.ownership(&mine).unwrap().unwrap();
        assert!(o.settled, "settling ends the ownership: {o:?}");
        assert!(
            j.take_over(None, 8).unwrap().is_empty(),
            "nothing settled is taken over"
        );
        assert_eq!(j.takeover_counts().unwrap().get("fence-mine"), Some(&2));

        // Bounded: an execution taken over MAX_TAKEOVERS times is left for review.
        let worn = ExecutionId::parse("fence-worn").unwrap();
        j.accept(&rec(worn.as_str()), serde_json::json!({}))
            .unwrap();
        psql(&format!(
            "UPDATE owners SET replica = 'other/r', epoch = 9, takeovers = {MAX_TAKEOVERS} \
             WHERE execution_id = 'fence-worn'"
        ));
        assert!(
            j.take_over(None, 8).unwrap().is_empty(),
            "the sweep skips it"
        );
        let t = j.take_over(Some(&worn), 1).unwrap();
        assert!(matches!(t[..], [(_, TakeOver::Exhausted)]), "{t:?}");
        assert_eq!(j.ownership(&worn).unwrap().unwrap().epoch, 9);
    }
}
