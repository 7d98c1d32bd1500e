//! Public-key authentication: ssh-agent first, then key files. Never prompts.

use std::path::Path;
use std::sync::Arc;

use russh::client::{AuthResult, Handle};
use russh::keys::agent::client::AgentClient;
use russh::keys::agent::AgentIdentity;
use russh::keys::ssh_key::{HashAlg, PrivateKey, PublicKey};
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

pub(super) async fn authenticate(
    handle: &mut Handle<ClientHandler>,
    target: &Target,
) -> Result<(), SshError> {
    let mut a = Attempts {
        handle,

        rsa_hash: None,
        tried: Vec::new(),
    };
    let user = target.user.clone();
    let mut agent_keys: Vec<PublicKey> = Vec::new();

    // 1. ssh-agent.
    if let Some(mut agent) = connect_agent(&target.identity_agent).await {
        let identities = match agent.request_identities().await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::debug!("ssh-agent did not list identities: {e}");
                Vec::new()
            }
        };
        for id in identities {
            let AgentIdentity::PublicKey { key, .. } = id else {
                continue; // certificates: not used yet
            };
            let hash = if key.algorithm().is_rsa() {
                a.rsa_hash().await?
            } else {
                None
            };
            let label = format!("agent key {}", describe(&key));
            tracing::debug!(user = %user, "trying {label}");
            agent_keys.push(key.clone());
            let r = a
                .handle
                .authenticate_publickey_with(user.clone(), key, hash, &mut agent)
                .await;
            match r {
                Ok(AuthResult::Success) => return Ok(()),
                Ok(AuthResult::Failure { .. }) => a.tried.push(label),
                Err(e) => a.tried.push(format!("{label} (agent could not sign: {e})")),
            }
            a.check_alive()?;
        }
    }

    // 2. Key files.
    let mut encrypted: Option<std::path::PathBuf> = None;
    for path in &target.identity_files {
        let mut text = match super::read_capped(path, 1 << 20) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(file = %path.display(), "no such key file");
                continue;
            }
            Err(e) => {
                a.tried
                    .push(format!("{} (unreadable: {e})", path.display()));
                continue;
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
                if agent_keys.iter().any(|k| k.key_data() == public.key_data()) {
                    // Already offered through the agent.
                    continue;
                }
                a.tried.push(format!(
                    "{} (encrypted, no agent holds it: skipped)",
                    path.display()
                ));
                encrypted.get_or_insert_with(|| path.clone());
                continue;
            }
        }
        let key = match russh::keys::decode_secret_key(&String::from_utf8_lossy(&text), None) {
            Ok(k) => k,
            Err(russh::keys::Error::KeyIsEncrypted) => {
                a.tried.push(format!(
                    "{} (encrypted, no agent holds it: skipped)",
                    path.display()
                ));
                encrypted.get_or_insert_with(|| path.clone());
                continue;
            }
            Err(e) => {
                a.tried.push(format!(
                    "{} (not a usable private key: {e})",
                    path.display()
                ));
                continue;
            }
        };
        if agent_keys
            .iter()
            .any(|k| k.key_data() == key.public_key().key_data())
        {
            continue;
        }
        let hash = if key.algorithm().is_rsa() {
            a.rsa_hash().await?
        } else {
            None
        };
        let label = format!("{} ({})", path.display(), describe(key.public_key()));
        tracing::debug!(user = %user, file = %path.display(), "trying key file");
        let r = a
            .handle
            .authenticate_publickey(
                user.clone(),
                PrivateKeyWithHashAlg::new(Arc::new(key), hash),
            )
            .await?;
        if r.success() {
            return Ok(());
        }
        a.tried.push(label);
        a.check_alive()?;
    }

    if let Some(path) = encrypted {
        return Err(SshError::EncryptedKey { path });
    }
    Err(SshError::Auth {
        user,
        host: target.alias.clone(),
        tried: a.tried,
    })
}
