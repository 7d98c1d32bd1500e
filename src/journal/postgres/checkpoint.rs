//! Sealed checkpoints: what a PostgreSQL journal has in place of the SQLite anchor file.
//!
//! Every chain head lives in the database (`chain_heads`, `session_heads`), so someone who can
//! rewrite the database can rewrite a chain together with its head. A checkpoint seals the
//! heads that changed since the one before it: a row of `checkpoints` holding those `(id, seq,
//! hash)` triples, the digest of the previous checkpoint (so checkpoints form a chain of their
//! own), and an HMAC-SHA256 under the *seal key*, a file outside the database that every
//! replica holds (as the anchor's MAC is made under a key file next to the anchor). A rewrite of
//! anything sealed then needs the key.
//!
//! Who writes them: a replica (`cairn serve`, `cairn mcp`) whose environment names the key
//! (`CAIRN_SEAL_KEY`) seals every `CAIRN_SEAL_INTERVAL` seconds (default 10) for as long as it
//! runs, and `cairn audit seal` seals once. Sealers serialise on an advisory lock; a round with nothing changed writes
//! nothing. Finding what changed reads `chain_heads` against the sealer's own bookkeeping
//! (`sealed_heads`): one scan per round, no lock taken on any head, so appends never wait for it.
//! Entries appended since the newest checkpoint are "not yet sealed" to `cairn audit verify`,
//! which is not damage.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::Pg;
use crate::journal::{client_identity, now_rfc3339, Result};

/// Version 3 of the schema: checkpoints (append-only, like events) and the sealer's bookkeeping.
pub(in crate::journal) const MIGRATION: &str = "
CREATE TABLE checkpoints (
    n BIGINT PRIMARY KEY,
    at TEXT NOT NULL,
    by_client TEXT NOT NULL,
    prev_digest TEXT NOT NULL,
    body TEXT NOT NULL,
    digest TEXT NOT NULL,
    mac TEXT NOT NULL
);
CREATE TRIGGER checkpoints_append_only BEFORE UPDATE OR DELETE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION cairn_refuse('checkpoints are append-only');
CREATE TRIGGER checkpoints_append_only_t BEFORE TRUNCATE ON checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION cairn_refuse('checkpoints are append-only');
-- The newest sealed seq of each chain ('execution' or 'session'): what the next checkpoint
-- leaves out. Bookkeeping only: verify recomputes it from the checkpoints.
CREATE TABLE sealed_heads (
    chain TEXT NOT NULL,
    id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    PRIMARY KEY (chain, id)
);
";

/// The advisory lock sealers take (one checkpoint at a time, numbered without gaps).
const SEAL_LOCK: i64 = 7306928318543210002;

/// What one checkpoint seals: the heads that changed since the one before it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Body {
    /// `(execution id, seq, hash)` of each execution head that moved.
    pub executions: Vec<(String, i64, String)>,
    /// `(session id, seq, hash)` likewise.
    pub sessions: Vec<(String, i64, String)>,
}

/// What a checkpoint's digest and MAC are computed over.
pub(crate) fn sealed_text(n: i64, at: &str, prev_digest: &str, body: &str) -> String {
    format!("cairn-checkpoint-v1\n{n}\n{at}\n{prev_digest}\n{body}\n")
}

pub(crate) fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

pub(crate) fn mac(key: &[u8], text: &str) -> String {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(text.as_bytes());
    hex::encode(m.finalize().into_bytes())
}

/// Why the seal key cannot be used; each message names the file. The journal's `seal` and
/// `audit verify` wrap it in their own error.
#[derive(Debug, thiserror::Error)]
pub enum SealKeyError {
    #[error("seal key {} is too short (at least 32 bytes)", .0.display())]
    TooShort(std::path::PathBuf),
    #[error("reading seal key {}: {source}", path.display())]
    Reading {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The seal key at `path`: at least 32 bytes (`head -c 32 /dev/urandom > seal.key`).
pub(crate) fn read_key(path: &Path) -> std::result::Result<Vec<u8>, SealKeyError> {
    match std::fs::read(path) {
        Ok(k) if k.len() >= 32 => Ok(k),
        Ok(_) => Err(SealKeyError::TooShort(path.to_owned())),
        Err(source) => Err(SealKeyError::Reading {
            path: path.to_owned(),
            source,
        }),
    }
}

impl Pg {
    /// Write a checkpoint over every head that changed since the last one; its number, or
    /// `None` when nothing changed.
    pub(in crate::journal) fn seal(&self, key: &[u8]) -> Result<Option<i64>> {
        self.block(self.seal_async(key))
    }

    // Long: one transaction under the seal lock, its steps in order (changed heads, the
    // previous checkpoint, the new one, the sealed heads).
    async fn seal_async(&self, key: &[u8]) -> Result<Option<i64>> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SEAL_LOCK])
            .await
            .map_err(|e| self.err(e))?;
        let changed = |table: &str, column: &str, chain: &str| {
            format!(
                "SELECT h.{column}, h.seq, h.hash FROM {table} h
                 LEFT JOIN sealed_heads s ON s.chain = '{chain}' AND s.id = h.{column}
                 WHERE h.seq > 0 AND (s.seq IS NULL OR s.seq <> h.seq)
                 ORDER BY h.{column}"
            )
        };
        let mut body = Body::default();
        for (sql, into) in [
            (
                changed("chain_heads", "execution_id", "execution"),
                &mut body.executions,
            ),
            (
                changed("session_heads", "session_id", "session"),
                &mut body.sessions,
            ),
        ] {
            *into = tx
                .query(&sql, &[])
                .await
                .map_err(|e| self.err(e))?
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
        }
        if body.executions.is_empty() && body.sessions.is_empty() {
            return Ok(None);
        }
        let last = tx
            .query_opt(
                "SELECT n, digest FROM checkpoints ORDER BY n DESC LIMIT 1",
                &[],
            )
            .await
            .map_err(|e| self.err(e))?;
        let (n, prev): (i64, String) = match last {
            Some(r) => (r.get::<_, i64>(0) + 1, r.get(1)),
            None => (1, String::new()),
        };
        let at = now_rfc3339();
        let text = serde_json::to_string(&body).map_err(|e| self.fail(e.to_string()))?;
        let sealed = sealed_text(n, &at, &prev, &text);
        tx.execute(
            "INSERT INTO checkpoints (n, at, by_client, prev_digest, body, digest, mac)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &n,
                &at,
                &client_identity(),
                &prev,
                &text,
                &digest(&sealed),
                &mac(key, &sealed),
            ],
        )
        .await
        .map_err(|e| self.err(e))?;
        for (chain, heads) in [("execution", &body.executions), ("session", &body.sessions)] {
            let ids: Vec<&str> = heads.iter().map(|h| h.0.as_str()).collect();
            let seqs: Vec<i64> = heads.iter().map(|h| h.1).collect();
            tx.execute(
                "INSERT INTO sealed_heads (chain, id, seq)
                 SELECT $1, id, seq FROM unnest($2::text[], $3::bigint[]) AS u(id, seq)
                 ON CONFLICT (chain, id) DO UPDATE SET seq = excluded.seq",
                &[&chain, &ids, &seqs],
            )
            .await
            .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(Some(n))
    }
}

/// Seal `pg` every `every` for the rest of this process (the task keeps the database's pool
/// open meanwhile). A failed round is logged and tried again at the next one.
pub(in crate::journal) fn spawn_sealer(pg: &Arc<Pg>, key: Vec<u8>, every: Duration) {
    let pg = Arc::clone(pg);
    super::runtime().spawn(async move {
        let mut warned = false;
        loop {
            tokio::time::sleep(every).await;
            match pg.seal_async(&key).await {
                Ok(_) => warned = false,
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!("cairn: journal {}: no checkpoint sealed: {e}", pg.location);
                }
                Err(_) => {}
            }
        }
    });
}

/// Start sealing `pg` for the rest of this process when its environment names a seal key
/// (`CAIRN_SEAL_KEY`; `CAIRN_SEAL_INTERVAL` seconds, default 10); once per database, however
/// often it is asked. A key that cannot be read is said and nothing is sealed: the journal
/// itself works as before.
pub(in crate::journal) fn seal_from_env(pg: &Arc<Pg>) {
    let Some(path) = std::env::var_os("CAIRN_SEAL_KEY").filter(|p| !p.is_empty()) else {
        return;
    };
    static SEALING: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let mut sealing = SEALING
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if !sealing.insert(pg.location.clone()) {
        return;
    }
    let key = match read_key(Path::new(&path)) {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(
                "cairn: journal {}: not sealing checkpoints: {e}",
                pg.location
            );
            return;
        }
    };
    let every = std::env::var("CAIRN_SEAL_INTERVAL")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(10));
    spawn_sealer(pg, key, every);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages users read (from `cairn audit verify --seal-key` and `Journal::seal`) are
    /// the ones the `String` errors carried, and a key of 32 bytes is accepted.
    #[test]
    fn a_short_or_missing_seal_key_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short.key");
        std::fs::write(&short, [7u8; 31]).unwrap();
        let e = read_key(&short).unwrap_err();
        assert!(matches!(e, SealKeyError::TooShort(_)));
        assert_eq!(
            e.to_string(),
            format!(
                "seal key {} is too short (at least 32 bytes)",
                short.display()
            )
        );
        let missing = dir.path().join("missing.key");
        let e = read_key(&missing).unwrap_err();
        assert!(e
            .to_string()
            .starts_with(&format!("reading seal key {}: ", missing.display())));
        let good = dir.path().join("good.key");
        std::fs::write(&good, [7u8; 32]).unwrap();
        assert_eq!(read_key(&good).unwrap().len(), 32);
    }
}
