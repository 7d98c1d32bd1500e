//! The russh client handler: host-key checking against known_hosts (and certificates, pins,
//! HostKeyAlias), and disconnect bookkeeping.

use std::path::PathBuf;
use std::sync::Arc;

use russh::client;
use russh::keys::ssh_key::{Algorithm, HashAlg, PublicKey};

use super::{known_hosts, Shared, SshError};

/// The russh handler: host-key checking against known_hosts, disconnect bookkeeping.
pub(super) struct ClientHandler {
    pub(super) host: String,
    pub(super) names: Vec<String>,
    /// See [`Target::known_host_names_without_port`].
    pub(super) bare_names: Vec<String>,
    /// The principal a host certificate must name: HostKeyAlias, else the HostName.
    pub(super) cert_principal: String,
    pub(super) files: Vec<PathBuf>,
    pub(super) write_name: String,
    pub(super) accept_new: bool,
    pub(super) hash_known_hosts: bool,
    /// See [`Target::pinned_host_key`].
    pub(super) pinned: Option<String>,
    pub(super) shared: Arc<Shared>,
}

impl ClientHandler {
    fn verify(&self, key: &PublicKey) -> Result<(), SshError> {
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        if let Ok(mut f) = self.shared.fingerprint.lock() {
            f.clone_from(&fingerprint);
        }
        let io_err = |source| SshError::KnownHosts {
            file: self.files[0].clone(),
            source,
        };
        if let Some(p) = self.pinned.as_ref().filter(|p| **p != fingerprint) {
            return Err(SshError::HostKeyPinned {
                host: self.host.clone(),
                pinned: p.clone(),
                presented: fingerprint,
            });
        }
        let mut verdict = known_hosts::check(&self.files, &self.names, key).map_err(io_err)?;
        if verdict == known_hosts::Verdict::Unknown && !self.bare_names.is_empty() {
            // Nothing for `[host]:port`: a matching key under the bare name is accepted and a
            // revoked one refused; a different key there leaves the host unknown (as OpenSSH).
            let bare = known_hosts::check(&self.files, &self.bare_names, key).map_err(io_err)?;
            if matches!(
                bare,
                known_hosts::Verdict::Known { .. } | known_hosts::Verdict::Revoked { .. }
            ) {
                verdict = bare;
            }
        }
        match verdict {
            known_hosts::Verdict::Known { file, line } => {
                tracing::debug!(host = %self.host, %fingerprint, file = %file.display(), line, "host key known");
                Ok(())
            }
            known_hosts::Verdict::Revoked { file, line } => Err(SshError::HostKeyRevoked {
                host: self.host.clone(),
                file,
                line,
                fingerprint,
            }),
            known_hosts::Verdict::Changed { file, line } => Err(SshError::HostKeyChanged {
                host: self.host.clone(),
                file,
                line,
                fingerprint,
            }),
            known_hosts::Verdict::Unknown if self.accept_new => {
                let file = &self.files[0];
                let name = if self.hash_known_hosts {
                    known_hosts::hash_name(&self.write_name)
                } else {
                    self.write_name.clone()
                };
                known_hosts::append(file, &name, key).map_err(|source| SshError::KnownHosts {
                    file: file.clone(),
                    source,
                })?;
                tracing::info!(host = %self.host, %fingerprint, file = %file.display(), "recorded new host key");
                Ok(())
            }
            known_hosts::Verdict::Unknown => Err(SshError::UnknownHostKey {
                host: self.host.clone(),
                file: self.files[0].clone(),
                fingerprint,
            }),
        }
    }
}

impl ClientHandler {
    /// Check a host certificate against `@cert-authority` lines. `Ok(false)`: no authority
    /// vouches for it, and (as OpenSSH does) its key is then checked as a plain host key.
    fn verify_certificate(
        &self,
        cert: &russh::keys::ssh_key::Certificate,
    ) -> Result<bool, SshError> {
        let key = PublicKey::new(cert.public_key().clone(), "");
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        if let Ok(mut f) = self.shared.fingerprint.lock() {
            f.clone_from(&fingerprint);
        }
        if let Some(p) = self.pinned.as_ref().filter(|p| **p != fingerprint) {
            return Err(SshError::HostKeyPinned {
                host: self.host.clone(),
                pinned: p.clone(),
                presented: fingerprint,
            });
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let verdict = known_hosts::check_certificate(
            &self.files,
            &self.names,
            cert,
            &self.cert_principal,
            now,
        )
        .map_err(|source| SshError::KnownHosts {
            file: self.files[0].clone(),
            source,
        })?;
        match verdict {
            known_hosts::CertVerdict::Trusted { file, line } => {
                tracing::debug!(host = %self.host, %fingerprint, file = %file.display(), line, "host certificate trusted");
                Ok(true)
            }
            known_hosts::CertVerdict::Revoked { file, line } => Err(SshError::HostKeyRevoked {
                host: self.host.clone(),
                file,
                line,
                fingerprint,
            }),
            known_hosts::CertVerdict::Untrusted(reason) => {
                tracing::debug!(host = %self.host, %fingerprint, "host certificate not trusted ({reason}); checking its key as a plain host key");
                Ok(false)
            }
        }
    }
}

impl client::Handler for ClientHandler {
    type Error = SshError;

    async fn check_server_key(
        &mut self,
        server_public_key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let key = match server_public_key {
            russh::keys::PublicKeyOrCertificate::PublicKey { key, .. } => key.clone(),
            russh::keys::PublicKeyOrCertificate::Certificate(cert) => {
                // Requested only when a @cert-authority line applies to this host.
                if self.verify_certificate(cert)? {
                    return Ok(true);
                }
                PublicKey::new(cert.public_key().clone(), "")
            }
        };
        self.verify(&key)?;
        Ok(true)
    }

    async fn disconnected(
        &mut self,
        reason: client::DisconnectReason<Self::Error>,
    ) -> Result<(), Self::Error> {
        let text = match reason {
            client::DisconnectReason::ReceivedDisconnect(info) => {
                format!(
                    "the server disconnected ({:?}: {})",
                    info.reason_code, info.message
                )
            }
            client::DisconnectReason::Error(SshError::Disconnected(m)) => m,
            client::DisconnectReason::Error(e) => e.to_string(),
        };
        tracing::debug!(host = %self.host, "disconnected: {text}");
        if let Ok(mut r) = self.shared.disconnect_reason.lock() {
            r.get_or_insert(text);
        }
        Ok(())
    }
}

/// Host key algorithms with those already recorded for the host first (as OpenSSH does), so a
/// host with several key types presents the one we know.
pub(super) fn preferred_host_key_algs(recorded: &[Algorithm]) -> Vec<Algorithm> {
    let defaults: Vec<Algorithm> = russh::Preferred::DEFAULT.key.to_vec();
    let family = |a: &Algorithm, b: &Algorithm| match (a, b) {
        (Algorithm::Rsa { .. }, Algorithm::Rsa { .. }) => true,
        _ => a == b,
    };
    let mut first: Vec<Algorithm> = Vec::new();
    let mut rest: Vec<Algorithm> = Vec::new();
    for a in defaults {
        if recorded.iter().any(|r| family(r, &a)) {
            first.push(a);
        } else {
            rest.push(a);
        }
    }
    first.extend(rest);
    first
}
