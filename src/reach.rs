//! How an execution reached its host, recorded with it so that recovery needs no flags typed
//! again (docs/DESIGN.md, recovery; issue 16).
//!
//! At acceptance the `accepted` event's evidence gets a `connection` object (hash-chained with
//! the rest of the record): the destination as resolved (HostName, port, account), the identity
//! file paths, the known_hosts files, the ssh_config file given with `-F`, HostKeyAlias, the
//! marker home, and the way there: the jump hosts in the order they are reached (each with its
//! own resolved HostName, port, account, identity and known_hosts files) and the ProxyCommand
//! that reaches the first of them (or the host itself), tokens expanded. Paths, names and
//! commands only, never key material.
//!
//! Later connections made for that execution (`recover`, `attach`, `status`, `output`,
//! `cancel`, `gc`, `batch resume`) start from the record; whatever the command line says
//! overrides the matching part of it:
//!
//! | recorded | overridden by |
//! |---|---|
//! | HostName, port, account | nothing: an execution is always followed to the host it was dispatched to |
//! | ssh_config file (and HostKeyAlias from it) | `-F` |
//! | identity files | `-i` (then ssh_config's IdentityFile entries, as for a new run) |
//! | known_hosts files | `--known-hosts` |
//! | jump hosts and ProxyCommand | `-J` (the chain then comes from `-J` and ssh_config, as for a new run) |
//!
//! The host key verified at dispatch pins every later connection for the execution
//! ([`crate::ssh::Target::pinned_host_key`]): another key is refused even where known_hosts
//! would now accept it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ssh::{ConnectOptions, SshError, Target};

/// The `connection` object of an `accepted` event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reach {
    /// HostName as resolved (what was connected to).
    pub hostname: String,
    pub port: u16,
    /// The remote account.
    pub user: String,
    /// Key files tried after the agent, in order (`-i` first, then ssh_config's).
    pub identity_files: Vec<PathBuf>,
    /// The known_hosts file checked first (and written by accept-new).
    pub known_hosts: PathBuf,
    /// Further known_hosts files that were read.
    #[serde(default)]
    pub known_hosts_read: Vec<PathBuf>,
    /// The ssh_config file given with `-F`; `None`: the defaults (~/.ssh/config, then
    /// /etc/ssh/ssh_config).
    pub ssh_config: Option<PathBuf>,
    /// HostKeyAlias, when ssh_config set one.
    #[serde(default)]
    pub host_key_alias: Option<String>,
    /// The marker home on the host.
    pub remote_dir: String,
    /// Jump hosts, in the order they are reached (empty: no ProxyJump).
    #[serde(default)]
    pub jump: Vec<HopReach>,
    /// The ProxyCommand (tokens expanded) that reaches the first jump host, or the host itself
    /// when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_command: Option<String>,
}

/// One jump host as an execution reached it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HopReach {
    /// The hop's name as the chain gave it (resolved through ssh_config again on a reconnect,
    /// for the settings not recorded here).
    pub name: String,
    pub hostname: String,
    pub port: u16,
    pub user: String,
    pub identity_files: Vec<PathBuf>,
    pub known_hosts: PathBuf,
    #[serde(default)]
    pub known_hosts_read: Vec<PathBuf>,
    #[serde(default)]
    pub host_key_alias: Option<String>,
}

impl HopReach {
    fn of(t: &Target) -> HopReach {
        HopReach {
            name: t.alias.clone(),
            hostname: t.hostname.clone(),
            port: t.port,
            user: t.user.clone(),
            identity_files: t.identity_files.iter().map(|p| absolute(p)).collect(),
            known_hosts: absolute(&t.known_hosts),
            known_hosts_read: t.known_hosts_read.iter().map(|p| absolute(p)).collect(),
            host_key_alias: t.host_key_alias.clone(),
        }
    }

    /// The hop as recorded, with ssh_config (resolved with `opts`) supplying what is not
    /// recorded and `flags` overriding as for the host itself (`-i` is the host's alone).
    fn target(&self, opts: &ConnectOptions, flags: &ConnectOptions) -> Result<Target, SshError> {
        let o = ConnectOptions {
            port: None,
            identity: Vec::new(),
            ..opts.clone()
        };
        let mut t = crate::ssh::resolve_plain(&self.name, &o)?;
        t.hostname.clone_from(&self.hostname);
        t.port = self.port;
        t.user.clone_from(&self.user);
        t.identity_files.clone_from(&self.identity_files);
        if flags.known_hosts.is_none() {
            t.known_hosts.clone_from(&self.known_hosts);
            t.known_hosts_read.clone_from(&self.known_hosts_read);
        }
        if flags.ssh_config.is_none() {
            t.host_key_alias.clone_from(&self.host_key_alias);
        }
        Ok(t)
    }
}

/// A path as recorded: absolute (relative to this process's directory), so that a recovery run
/// from another directory finds the same file. Nothing is read or resolved on disk.
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

impl Reach {
    /// What a connection to `target` (resolved with `opts`) used.
    pub fn of(target: &Target, opts: &ConnectOptions, remote_dir: &str) -> Reach {
        Reach {
            hostname: target.hostname.clone(),
            port: target.port,
            user: target.user.clone(),
            identity_files: target.identity_files.iter().map(|p| absolute(p)).collect(),
            known_hosts: absolute(&target.known_hosts),
            known_hosts_read: target
                .known_hosts_read
                .iter()
                .map(|p| absolute(p))
                .collect(),
            ssh_config: opts.ssh_config.as_deref().map(absolute),
            host_key_alias: target.host_key_alias.clone(),
            remote_dir: remote_dir.to_owned(),
            jump: target.jump.iter().map(HopReach::of).collect(),
            proxy_command: target.proxy_command.clone(),
        }
    }

    /// The record in an `accepted` event's evidence, if it has one (executions accepted
    /// before it was recorded have none).
    pub fn from_accepted(evidence: &serde_json::Value) -> Option<Reach> {
        serde_json::from_value(evidence.get("connection")?.clone()).ok()
    }

    /// The options to resolve the execution's destination with: the recorded ssh_config file
    /// unless `flags` name one (or the recorded file is gone: then the defaults, with a
    /// warning).
    pub fn resolve_options(&self, flags: &ConnectOptions) -> ConnectOptions {
        self.options(flags, true)
    }

    fn options(&self, flags: &ConnectOptions, warn: bool) -> ConnectOptions {
        let mut o = flags.clone();
        if o.ssh_config.is_none() {
            match &self.ssh_config {
                Some(p) if p.exists() => o.ssh_config = Some(p.clone()),
                Some(p) if !warn => {
                    let _ = p;
                }
                Some(p) => tracing::warn!(
                    "cairn: the ssh_config file {} recorded for this execution is gone; using \
                     the default files (give -F to choose another)",
                    p.display()
                ),
                None => {}
            }
        }
        o
    }

    /// Apply the record to a target resolved with [`Reach::resolve_options`]: each recorded
    /// part the command line (`flags`) does not set. The jump hosts are rebuilt from the record
    /// (through ssh_config for what it does not hold), which fails only on a config error.
    pub fn apply(&self, t: &mut Target, flags: &ConnectOptions) -> Result<(), SshError> {
        t.hostname.clone_from(&self.hostname);
        t.port = self.port;
        t.user.clone_from(&self.user);
        if flags.identity.is_empty() {
            t.identity_files.clone_from(&self.identity_files);
        }
        if flags.known_hosts.is_none() {
            t.known_hosts.clone_from(&self.known_hosts);
            t.known_hosts_read.clone_from(&self.known_hosts_read);
        }
        if flags.ssh_config.is_none() {
            t.host_key_alias.clone_from(&self.host_key_alias);
        }
        if flags.jump.is_none() {
            let opts = self.options(flags, false);
            t.jump = self
                .jump
                .iter()
                .map(|h| h.target(&opts, flags))
                .collect::<Result<_, _>>()?;
            t.proxy_command.clone_from(&self.proxy_command);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        crate::ssh::resolve(
            "ops@db-1",
            &ConnectOptions {
                ssh_config: Some(PathBuf::from("/dev/null")),
                identity: vec![PathBuf::from("keys/id_test")],
                known_hosts: Some(PathBuf::from("/tmp/kh")),
                port: Some(2222),
                ..ConnectOptions::default()
            },
        )
        .unwrap()
    }

    #[test]
    fn the_record_holds_paths_and_names_and_round_trips() {
        let opts = ConnectOptions {
            ssh_config: Some(PathBuf::from("/dev/null")),
            ..ConnectOptions::default()
        };
        let r = Reach::of(&target(), &opts, ".cairn");
        assert_eq!(
            (r.hostname.as_str(), r.port, r.user.as_str()),
            ("db-1", 2222, "ops")
        );
        assert!(r.identity_files[0].is_absolute());
        assert!(r.identity_files[0].ends_with("keys/id_test"));
        assert_eq!(r.known_hosts, PathBuf::from("/tmp/kh"));
        assert_eq!(r.ssh_config.as_deref(), Some(Path::new("/dev/null")));
        assert!(r.jump.is_empty());
        let ev = serde_json::json!({"destination": "ops@db-1", "connection": r});
        assert_eq!(Reach::from_accepted(&ev), Some(r));
        assert_eq!(Reach::from_accepted(&serde_json::json!({})), None);
    }

    #[test]
    fn flags_override_the_record_part_by_part() {
        let r = Reach::of(&target(), &ConnectOptions::default(), ".cairn");
        let mut plain = crate::ssh::resolve("db-1", &ConnectOptions::default()).unwrap();
        r.apply(&mut plain, &ConnectOptions::default()).unwrap();
        assert_eq!(plain.identity_files, r.identity_files);
        assert_eq!(plain.known_hosts, r.known_hosts);
        assert_eq!((plain.port, plain.user.as_str()), (2222, "ops"));

        let flags = ConnectOptions {
            identity: vec![PathBuf::from("/other/key")],
            known_hosts: Some(PathBuf::from("/other/kh")),
            ..ConnectOptions::default()
        };
        let mut t = crate::ssh::resolve("db-1", &flags).unwrap();
        r.apply(&mut t, &flags).unwrap();
        assert_eq!(t.identity_files[0], PathBuf::from("/other/key"));
        assert_eq!(t.known_hosts, PathBuf::from("/other/kh"));
        assert_eq!(t.port, 2222, "the host is the one it was dispatched to");
    }

    #[test]
    fn a_recorded_ssh_config_that_is_gone_falls_back_to_the_defaults() {
        let r = Reach {
            ssh_config: Some(PathBuf::from("/nonexistent/cairn-test-config")),
            ..Reach::of(&target(), &ConnectOptions::default(), ".cairn")
        };
        assert!(r
            .resolve_options(&ConnectOptions::default())
            .ssh_config
            .is_none());
        let given = ConnectOptions {
            ssh_config: Some(PathBuf::from("/dev/null")),
            ..ConnectOptions::default()
        };
        assert_eq!(
            r.resolve_options(&given).ssh_config.as_deref(),
            Some(Path::new("/dev/null"))
        );
    }
}
