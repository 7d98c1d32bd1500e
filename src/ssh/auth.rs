//! Public-key authentication: ssh-agent first, then key files, each with its user certificate
//! first when there is one (`CertificateFile`, `KEY-cert.pub` beside a key file, certificates
//! held by the agent), as OpenSSH offers them. `IdentitiesOnly` limits the agent to the
//! configured identities. Never prompts.

use std::path::Path;
use std::sync::Arc;

use russh::client::{AuthResult, Handle};
use russh::keys::agent::client::AgentClient;
use russh::keys::agent::AgentIdentity;
use russh::keys::ssh_key::public::KeyData;
use russh::keys::ssh_key::{Certificate, HashAlg, PrivateKey, PublicKey};
use russh::keys::PrivateKeyWithHashAlg;

use super::config::AgentSetting;
use super::{ClientHandler, SshError, Target};

fn describe(key: &PublicKey) -> String {
    format!(
        "{} {}",
        key.algorithm().as_str(),
        key.fingerprint(HashAlg::Sha256)
    )
}

async fn connect_agent(
    setting: &AgentSetting,
) -> Option<AgentClient<Box<dyn russh::keys::agent::client::AgentStream + Send + Unpin>>> {
    let path = match setting {
        AgentSetting::None => return None,
        AgentSetting::Env => std::env::var_os("SSH_AUTH_SOCK")
            .filter(|s| !s.is_empty())?
            .into(),
        AgentSetting::Path(p) => p.clone(),
    };
    match AgentClient::connect_uds(&path).await {
        Ok(c) => Some(c.dynamic()),
        Err(e) => {
            tracing::debug!(socket = %Path::new(&path).display(), "cannot reach ssh-agent: {e}");
            None
        }
    }
}

struct Attempts<'a> {
    handle: &'a mut Handle<ClientHandler>,
    rsa_hash: Option<Option<HashAlg>>,
    tried: Vec<String>,
    user: String,
    /// Keys the agent offered: not offered again from their files.
    agent_keys: Vec<PublicKey>,
    /// The first encrypted key no agent holds (the error when nothing else was accepted).
    encrypted: Option<std::path::PathBuf>,
}

impl Attempts<'_> {
    async fn rsa_hash(&mut self) -> Result<Option<HashAlg>, SshError> {
        if let Some(h) = self.rsa_hash {
            return Ok(h);
        }
        let h = self.handle.best_supported_rsa_hash().await?.flatten();
        self.rsa_hash = Some(h);
        Ok(h)
    }

    /// Note one agent-signed attempt; `true` when the server accepted it.
    fn settle<E: std::fmt::Display>(
        &mut self,
        label: String,
        r: Result<AuthResult, E>,
    ) -> Result<bool, SshError> {
        match r {
            Ok(AuthResult::Success) => return Ok(true),
            Ok(AuthResult::Failure { .. }) => self.tried.push(label),
            Err(e) => self
                .tried
                .push(format!("{label} (agent could not sign: {e})")),
        }
        self.check_alive()?;
        Ok(false)
    }

    fn check_alive(&self) -> Result<(), SshError> {
        if self.handle.is_closed() {
            return Err(SshError::Disconnected(format!(
                "the server closed the connection during authentication (tried: {})",
                self.tried.join("; ")
            )));
        }
        Ok(())
    }
}

/// The user certificates this target may offer, and the first one found outside its validity
/// window (the error to give if nothing else is accepted).
struct Certs {
    usable: Vec<(String, Certificate)>,
    not_valid: Option<SshError>,
}

impl Certs {
    fn load(target: &Target) -> Certs {
        let mut c = Certs {
            usable: Vec::new(),
            not_valid: None,
        };
        let beside = target.identity_files.iter().map(|p| {
            let mut s = p.as_os_str().to_owned();
            s.push("-cert.pub");
            (std::path::PathBuf::from(s), false)
        });
        let named = target.certificate_files.iter().map(|p| (p.clone(), true));
        for (path, explicit) in named.chain(beside) {
            let text = match super::read_text_capped(&path, 1 << 20) {
                Ok(t) => t,
                Err(e) => {
                    if explicit || e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(file = %path.display(), "cannot read certificate: {e}");
                    }
                    continue;
                }
            };
            match Certificate::from_openssh(text.trim()) {
                Ok(cert) => c.admit(path.display().to_string(), cert),
                Err(e) => {
                    tracing::warn!(file = %path.display(), "not an OpenSSH certificate: {e}")
                }
            }
        }
        c
    }

    /// Keep `cert` if it is valid now; else remember why not.
    fn admit(&mut self, what: String, cert: Certificate) {
        match validity(&what, &cert) {
            Ok(()) => {
                if !self
                    .usable
                    .iter()
                    .any(|(_, c)| c.public_key() == cert.public_key() && c == &cert)
                {
                    self.usable.push((what, cert));
                }
            }
            Err(e) => {
                self.not_valid.get_or_insert(e);
            }
        }
    }

    fn for_key<'c>(&'c self, key: &'c KeyData) -> impl Iterator<Item = &'c (String, Certificate)> {
        self.usable
            .iter()
            .filter(move |(_, c)| c.public_key() == key)
    }
}

/// A certificate is offered only inside its validity window; outside it, the error names the
/// window so the user knows to fetch a fresh one.
fn validity(what: &str, cert: &Certificate) -> Result<(), SshError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let when = if now < cert.valid_after() {
        "not yet valid"
    } else if now >= cert.valid_before() {
        "expired"
    } else {
        return Ok(());
    };
    Err(SshError::CertificateNotValid {
        what: what.to_owned(),
        when,
        valid_after: utc(cert.valid_after()),
        valid_before: utc(cert.valid_before()),
        now: utc(now),
    })
}

/// `YYYY-MM-DD HH:MM:SS` in UTC, or `forever` for OpenSSH's "no end" value.
fn utc(secs: u64) -> String {
    if secs >= i64::MAX as u64 {
        return "forever".into();
    }
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The public keys of the configured identities (`IdentityFile`, `-i`, certificates), for
/// `IdentitiesOnly`: from `KEY.pub` when present, else from the key file itself.
fn configured_keys(target: &Target, certs: &Certs) -> Vec<KeyData> {
    let mut keys: Vec<KeyData> = certs
        .usable
        .iter()
        .map(|(_, c)| c.public_key().clone())
        .collect();
    for path in &target.identity_files {
        let mut pub_path = path.as_os_str().to_owned();
        pub_path.push(".pub");
        let from_pub = super::read_text_capped(std::path::Path::new(&pub_path), 1 << 20)
            .ok()
            .and_then(|t| PublicKey::from_openssh(t.trim()).ok());
        let key = from_pub.or_else(|| {
            let text = super::read_capped(path, 1 << 20).ok()?;
            PrivateKey::from_openssh(&text)
                .ok()
                .map(|k| k.public_key().clone())
        });
        if let Some(k) = key {
            keys.push(k.key_data().clone());
        }
    }
    keys
}

pub(super) async fn authenticate(
    handle: &mut Handle<ClientHandler>,
    target: &Target,
) -> Result<(), SshError> {
    let certs = Certs::load(target);
    let only: Option<Vec<KeyData>> = target
        .identities_only
        .then(|| configured_keys(target, &certs));
    let mut a = Attempts {
        handle,
        rsa_hash: None,
        tried: Vec::new(),
        user: target.user.clone(),
        agent_keys: Vec::new(),
        encrypted: None,
    };
    if try_agent(&mut a, target, &certs, only.as_deref()).await?
        || try_key_files(&mut a, target, &certs).await?
    {
        return Ok(());
    }
    if let Some(path) = a.encrypted {
        return Err(SshError::EncryptedKey { path });
    }
    // A certificate that would have been offered but for its validity window is the likely
    // reason nothing was accepted: say that, with the window.
    if let Some(e) = certs.not_valid {
        return Err(e);
    }
    Err(SshError::Auth {
        user: a.user,
        host: target.alias.clone(),
        tried: a.tried,
    })
}

/// 1. The agent's keys and certificates (only the configured ones under IdentitiesOnly).
async fn try_agent(
    a: &mut Attempts<'_>,
    target: &Target,
    certs: &Certs,
    only: Option<&[KeyData]>,
) -> Result<bool, SshError> {
    let allowed = |k: &KeyData| only.is_none_or(|o| o.contains(k));
    let user = a.user.clone();
    if let Some(mut agent) = connect_agent(&target.identity_agent).await {
        let identities = match agent.request_identities().await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::debug!("ssh-agent did not list identities: {e}");
                Vec::new()
            }
        };
        for id in identities {
            let key = match id {
                AgentIdentity::PublicKey { key, .. } => key,
                AgentIdentity::Certificate { certificate, .. } => {
                    if !allowed(certificate.public_key()) {
                        continue;
                    }
                    let label = format!("agent certificate {}", certificate.key_id());
                    if let Err(e) = validity(&label, &certificate) {
                        a.tried.push(format!("{label} (skipped: {e})"));
                        continue;
                    }
                    let hash = if certificate.algorithm().is_rsa() {
                        a.rsa_hash().await?
                    } else {
                        None
                    };
                    let r = a
                        .handle
                        .authenticate_certificate_with(user.clone(), certificate, hash, &mut agent)
                        .await;
                    if a.settle(label, r)? {
                        return Ok(true);
                    }
                    continue;
                }
            };
            if !allowed(key.key_data()) {
                continue;
            }
            let hash = if key.algorithm().is_rsa() {
                a.rsa_hash().await?
            } else {
                None
            };
            // A certificate file for a key the agent holds: the agent signs, the certificate
            // is offered first.
            for (what, cert) in certs.for_key(key.key_data()) {
                let label = format!("certificate {what} (key in agent)");
                let r = a
                    .handle
                    .authenticate_certificate_with(user.clone(), cert.clone(), hash, &mut agent)
                    .await;
                if a.settle(label, r)? {
                    return Ok(true);
                }
            }
            let label = format!("agent key {}", describe(&key));
            tracing::debug!(user = %user, "trying {label}");
            a.agent_keys.push(key.clone());
            let r = a
                .handle
                .authenticate_publickey_with(user.clone(), key, hash, &mut agent)
                .await;
            if a.settle(label, r)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// 2. The key files, each with its certificates first.
async fn try_key_files(
    a: &mut Attempts<'_>,
    target: &Target,
    certs: &Certs,
) -> Result<bool, SshError> {
    let user = a.user.clone();
    for path in &target.identity_files {
        let Some(key) = load_key_file(a, path) else {
            continue;
        };
        let hash = if key.algorithm().is_rsa() {
            a.rsa_hash().await?
        } else {
            None
        };
        let key = Arc::new(key);
        for (what, cert) in certs.for_key(key.public_key().key_data()) {
            tracing::debug!(user = %user, certificate = %what, "trying user certificate");
            let r = a
                .handle
                .authenticate_openssh_cert(user.clone(), key.clone(), cert.clone())
                .await?;
            if r.success() {
                return Ok(true);
            }
            a.tried.push(format!("certificate {what}"));
            a.check_alive()?;
        }
        let label = format!("{} ({})", path.display(), describe(key.public_key()));
        tracing::debug!(user = %user, file = %path.display(), "trying key file");
        let r = a
            .handle
            .authenticate_publickey(user.clone(), PrivateKeyWithHashAlg::new(key, hash))
            .await?;
        if r.success() {
            return Ok(true);
        }
        a.tried.push(label);
        a.check_alive()?;
    }
    Ok(false)
}

/// An encrypted key no agent holds: ask its passphrase on the terminal (three tries, as ssh),
/// where prompts are allowed and there is one; else note it for the error.
fn unlock(
    a: &mut Attempts<'_>,
    path: &std::path::Path,
    decrypt: impl Fn(&str) -> Option<PrivateKey>,
) -> Option<PrivateKey> {
    for attempt in 0..3 {
        let Some(pass) = super::prompt::passphrase(path, attempt > 0) else {
            break;
        };
        if let Some(k) = decrypt(&pass) {
            return Some(k);
        }
        if attempt == 2 {
            a.tried.push(format!(
                "{} (wrong passphrase, three times)",
                path.display()
            ));
            return None;
        }
    }
    a.tried.push(format!(
        "{} (encrypted, no agent holds it: skipped)",
        path.display()
    ));
    a.encrypted.get_or_insert_with(|| path.to_path_buf());
    None
}

/// Read and decode one key file; `None` (with the reason in `tried`) when it cannot be offered:
/// missing, unreadable, encrypted with no agent holding it, or already offered by the agent.
fn load_key_file(a: &mut Attempts<'_>, path: &std::path::Path) -> Option<PrivateKey> {
    let mut text = match super::read_capped(path, 1 << 20) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!(file = %path.display(), "no such key file");
            return None;
        }
        Err(e) => {
            a.tried
                .push(format!("{} (unreadable: {e})", path.display()));
            return None;
        }
    };
    // OpenSSH writes some ECDSA scalars shorter than ssh-key accepts; see keyfix.
    if let Some(fixed) = super::keyfix::pad_short_ecdsa_scalar(&text) {
        tracing::debug!(file = %path.display(), "ECDSA key with a short private scalar: re-encoded it at full length");
        text = fixed;
    }
    // Encrypted OpenSSH keys still carry their public key in the clear.
    if let Ok(pk) = PrivateKey::from_openssh(&text) {
        if pk.is_encrypted() {
            let public = pk.public_key().clone();
            if a.agent_keys
                .iter()
                .any(|k| k.key_data() == public.key_data())
            {
                // Already offered through the agent.
                return None;
            }
            return unlock(a, path, |pass| pk.decrypt(pass).ok());
        }
    }
    let key = match russh::keys::decode_secret_key(&String::from_utf8_lossy(&text), None) {
        Ok(k) => k,
        Err(russh::keys::Error::KeyIsEncrypted) => {
            let pem = String::from_utf8_lossy(&text).into_owned();
            return unlock(a, path, |pass| {
                russh::keys::decode_secret_key(&pem, Some(pass)).ok()
            });
        }
        Err(e) => {
            a.tried.push(format!(
                "{} (not a usable private key: {e})",
                path.display()
            ));
            return None;
        }
    };
    if a.agent_keys
        .iter()
        .any(|k| k.key_data() == key.public_key().key_data())
    {
        return None;
    }
    Some(key)
}
