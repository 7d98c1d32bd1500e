//! Plain option structs the library takes, and setting up an executor from them.
//!
//! The fronts fill these: the command line from its flags (`crate::cli`, the only module that
//! knows clap), the gateway servers from theirs. Their `Default`s are the defaults the command
//! line shows; a test in the CLI pins that the two agree. [`crate::runner::ExecutorBuilder`] makes
//! an executor from them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::ExecError;
use crate::executor::Patience;
use crate::intent::{Intent, OpClass};
use crate::journal::Journal;
use crate::ssh::ConnectOptions;

/// Which host implementation runs the marker protocol ([`HostOptions::host_helper`],
/// [`crate::ExecutorBuilder::host_helper`]): re-exported here because its module is
/// crate-private and a library user sets it.
pub use crate::host_helper::HostHelper;

/// The marker directory on the host, relative to the account's home.
pub const DEFAULT_REMOTE_DIR: &str = ".cairn";

/// The approver when none is named: the request is the approval.
pub const DEFAULT_APPROVE: &str = "allow";

/// Parse `90`, `90s`, `5m`, `2h`, `1d`, `250ms`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 30s, 5m, 2h, 250ms)"))?;
    let d = match unit {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        "d" => Duration::from_secs(n * 86_400),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m, h, d)")),
    };
    Ok(d)
}

/// Where the journal is and how to reach hosts: what every command that talks to a host takes.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Journal file (`None`: [`Journal::default_path`]).
    pub journal: Option<PathBuf>,
    pub connect: ConnectOptions,
    /// After losing the host, how long to keep trying to reach it before reporting `unknown`.
    pub reconnect_for: Duration,
    /// The intent fingerprint key (`None`: intent.key next to the journal).
    pub intent_key: Option<PathBuf>,
    /// Which host implementation runs the marker protocol (`--host-helper`).
    pub host_helper: crate::host_helper::HostHelper,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            journal: None,
            connect: ConnectOptions::default(),
            reconnect_for: Patience::default().reconnect_for,
            intent_key: None,
            host_helper: crate::host_helper::HostHelper::Auto,
        }
    }
}

impl HostOptions {
    pub fn journal_path(&self) -> PathBuf {
        self.journal.clone().unwrap_or_else(Journal::default_path)
    }
}

/// Who decides whether a new execution may start.
#[derive(Clone, Debug)]
pub struct ApproveOptions {
    /// `allow` (the request is the approval), `deny`, or `prompt` (ask on the terminal).
    pub mode: String,
    /// A JSON policy file of allow/deny rules (overrides `mode`).
    pub policy: Option<PathBuf>,
}

impl Default for ApproveOptions {
    fn default() -> Self {
        ApproveOptions {
            mode: DEFAULT_APPROVE.to_owned(),
            policy: None,
        }
    }
}

/// What the operation is, beyond host and command, as the caller states it.
#[derive(Clone, Debug, Default)]
pub struct IntentOptions {
    pub class: OpClass,
    /// How long a repeat of this operation attaches instead of running again (`None`: per class).
    pub retention: Option<Duration>,
    pub scope: Option<String>,
    /// Who asks (`None`: local:$USER).
    pub actor: Option<String>,
    pub cwd: Option<String>,
    /// Behaviour-changing environment variables, each `NAME=VALUE`.
    pub env: Vec<String>,
    /// Names of variables passed from this process's environment as secrets.
    pub secret_env: Vec<String>,
    /// A reference to the credential used (`None`: the identity files, else `default`).
    pub credential_ref: Option<String>,
}

impl IntentOptions {
    /// The intent, validated; `identity` are the identity files used (for the credential ref).
    pub fn intent(&self, identity: &[PathBuf]) -> Result<Intent, ExecError> {
        let mut env = BTreeMap::new();
        for kv in &self.env {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                ExecError::InvalidRequest(format!("--env {kv:?}: expected NAME=VALUE"))
            })?;
            env.insert(k.to_owned(), v.to_owned());
        }
        let credential_ref = self.credential_ref.clone().or_else(|| {
            (!identity.is_empty()).then(|| {
                let files: Vec<String> = identity.iter().map(|p| p.display().to_string()).collect();
                format!("identity:{}", files.join(","))
            })
        });
        let intent = Intent {
            actor: self
                .actor
                .clone()
                .unwrap_or_else(|| crate::intent::local_actor("local")),
            command: None,
            cwd: self.cwd.clone(),
            env,
            secret_env: self.secret_env.iter().cloned().collect(),
            credential_ref,
            class: self.class,
            scope: self.scope.clone(),
            retention: self.retention,
            correlation_id: None,
            session_id: None,
            operation: None,
        };
        intent.validate().map_err(ExecError::InvalidRequest)?;
        Ok(intent)
    }
}
