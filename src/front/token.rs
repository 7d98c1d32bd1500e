//! Bearer tokens for the HTTP front: who a request acts as.
//!
//! `cairn token add ACTOR` makes a token of 32 random bytes (`cairn_…`, base64url), prints it
//! once and stores only its SHA-256 in the journal file, with the actor, an optional scope
//! prefix and an optional expiry. A request carrying `Authorization: Bearer <token>` acts as
//! that actor; the request never names its own actor. The token is a high-entropy secret, so a
//! plain SHA-256 is enough to make the stored value useless to a reader of the journal. Tokens
//! appear in no log line, no journal event and no error message; a token is named by its ID
//! (`tk_` and the first 16 hex digits of its hash).

use std::time::Duration;

use base64::Engine;
use sha2::{Digest, Sha256};

use crate::error::ExecError;
use crate::journal::{now_ms, now_rfc3339, rfc3339_from_unix, Journal, JournalError, TokenRecord};

/// The prefix of every token (lets secret scanners and people recognise one).
pub const PREFIX: &str = "cairn_";

/// A request's authenticated identity.
#[derive(Clone, Debug)]
pub struct Caller {
    pub actor: String,
    pub token_id: String,
    pub scope_prefix: Option<String>,
}

/// Why a token was refused (the text a 401 carries; never the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Missing,
    Malformed,
    Unknown,
    Revoked(String),
    Expired(String),
}

impl Refusal {
    pub fn reason(&self) -> String {
        match self {
            Refusal::Missing => "no bearer token (send Authorization: Bearer <token>)".into(),
            Refusal::Malformed => "the Authorization header is not a cairn bearer token".into(),
            Refusal::Unknown => "unknown token".into(),
            Refusal::Revoked(id) => format!("token {id} was revoked"),
            Refusal::Expired(id) => format!("token {id} has expired"),
        }
    }
}

/// The hex SHA-256 of a token.
pub fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn id_of(hash: &str) -> String {
    format!("tk_{}", &hash[..16])
}

/// Validate an actor name given to `cairn token add` (an [`ExecError::InvalidRequest`] when it
/// is not one).
pub fn validate_actor(actor: &str) -> Result<(), ExecError> {
    if actor.trim().is_empty() {
        return Err(ExecError::InvalidRequest("the actor is empty".into()));
    }
    if actor.len() > 200 || actor.chars().any(char::is_control) {
        return Err(ExecError::InvalidRequest(
            "an actor is at most 200 characters, with no control characters".into(),
        ));
    }
    Ok(())
}

/// Make a token for `actor`, store its hash, and return (the token, its record). The token is
/// not kept anywhere: the caller shows it once.
pub fn add(
    j: &mut Journal,
    actor: &str,
    scope_prefix: Option<String>,
    expires_in: Option<Duration>,
) -> Result<(String, TokenRecord), ExecError> {
    validate_actor(actor)?;
    if let Some(p) = &scope_prefix {
        if p.is_empty() || p.chars().any(char::is_control) {
            return Err(ExecError::InvalidRequest(
                "the scope prefix is empty or has control characters".into(),
            ));
        }
    }
    let raw: [u8; 32] = rand::random();
    let token = format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    );
    let h = hash(&token);
    let expires_ms = expires_in.map(|d| now_ms() + d.as_millis() as i64);
    let rec = TokenRecord {
        id: id_of(&h),
        hash: h,
        actor: actor.to_owned(),
        scope_prefix,
        created_at: now_rfc3339(),
        expires_at: expires_ms.map(|ms| rfc3339_from_unix(ms / 1000, (ms % 1000) as u32)),
        expires_ms,
        revoked_at: None,
    };
    j.add_token(&rec)?;
    Ok((token, rec))
}

/// The caller an `Authorization` header value proves, or why not.
pub fn verify(j: &Journal, authorization: Option<&str>) -> Result<Caller, VerifyError> {
    let Some(v) = authorization else {
        return Err(VerifyError::Refused(Refusal::Missing));
    };
    let token = v
        .strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| t.starts_with(PREFIX))
        .ok_or(VerifyError::Refused(Refusal::Malformed))?;
    let rec = j
        .token_by_hash(&hash(token))?
        .ok_or(VerifyError::Refused(Refusal::Unknown))?;
    if rec.revoked_at.is_some() {
        return Err(VerifyError::Refused(Refusal::Revoked(rec.id)));
    }
    if rec.expires_ms.is_some_and(|e| e <= now_ms()) {
        return Err(VerifyError::Refused(Refusal::Expired(rec.id)));
    }
    Ok(Caller {
        actor: rec.actor,
        token_id: rec.id,
        scope_prefix: rec.scope_prefix,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("{}", .0.reason())]
    Refused(Refusal),
    #[error(transparent)]
    Journal(#[from] JournalError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal() -> (tempfile::TempDir, Journal) {
        let d = tempfile::tempdir().unwrap();
        let j = Journal::open(&d.path().join("j.db")).unwrap();
        (d, j)
    }

    fn bearer(t: &str) -> String {
        format!("Bearer {t}")
    }

    #[test]
    fn a_token_proves_its_actor_and_only_its_hash_is_stored() {
        let (d, mut j) = journal();
        let (t, rec) = add(&mut j, "agent:alice", Some("t-".into()), None).unwrap();
        assert!(t.starts_with(PREFIX) && t.len() > 40);
        let c = verify(&j, Some(&bearer(&t))).unwrap();
        assert_eq!(c.actor, "agent:alice");
        assert_eq!(c.token_id, rec.id);
        assert_eq!(c.scope_prefix.as_deref(), Some("t-"));
        drop(j);
        for f in std::fs::read_dir(d.path()).unwrap() {
            let bytes = std::fs::read(f.unwrap().path()).unwrap();
            let secret = &t.as_bytes()[PREFIX.len()..];
            assert!(!bytes.windows(secret.len()).any(|w| w == secret));
        }
    }

    #[test]
    fn missing_malformed_unknown_revoked_and_expired_tokens_are_refused() {
        let (_d, mut j) = journal();
        let refused = |j: &Journal, h: Option<&str>| match verify(j, h) {
            Err(VerifyError::Refused(r)) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(refused(&j, None), Refusal::Missing);
        assert_eq!(refused(&j, Some("Basic abc")), Refusal::Malformed);
        assert_eq!(
            refused(&j, Some(&bearer("cairn_not-a-token"))),
            Refusal::Unknown
        );
        let (t, rec) = add(&mut j, "bob", None, None).unwrap();
        assert!(j.revoke_token(&rec.id).unwrap());
        assert!(!j.revoke_token(&rec.id).unwrap(), "revoked once");
        assert_eq!(refused(&j, Some(&bearer(&t))), Refusal::Revoked(rec.id));
        let (t, rec) = add(&mut j, "carol", None, Some(Duration::ZERO)).unwrap();
        assert_eq!(refused(&j, Some(&bearer(&t))), Refusal::Expired(rec.id));
        assert!(add(&mut j, " ", None, None).is_err());
        assert!(add(&mut j, "a\nb", None, None).is_err());
    }
}
