//! The canonical operation record and its intent fingerprint; operation classes and their
//! retention windows and rules after an `unknown` outcome.
//!
//! docs/DESIGN.md keeps three identities apart: the caller's correlation ID (which message is this a
//! reply to), cairn's execution ID (is this the same attempt) and the intent fingerprint (might
//! this be a retry of an earlier attempt). This module makes the third:
//! `fingerprint = HMAC-SHA256(key, canonical bytes of the operation record)`, hex.
//!
//! The key is 32 random bytes in a file created on first use with mode 0600 (`--intent-key
//! FILE`, `$CAIRN_INTENT_KEY`, default `intent.key` next to the journal). Keying the hash means
//! a fingerprint seen in a log or a shared journal reveals nothing about the command, and cannot
//! be precomputed by someone without the key. The key is never printed or logged
//! ([`IntentKey`]'s `Debug` says `<redacted>`).
//!
//! # The record and its canonical form
//!
//! The canonical bytes are `cairn-intent-v2` followed by every field below, **in this order**,
//! each as `name`, `0x00`, the value's length as 8 bytes big-endian, the value's bytes. Nothing
//! else goes in: not the correlation ID, not the execution ID, not the time, not the output, not
//! a secret's value. A JSON request is parsed into [`OperationSpec`] first, so JSON key order and
//! whitespace cannot reach the bytes.
//!
//! | # | field | canonical value | defaults made explicit |
//! |---|---|---|---|
//! | 1 | `actor` | who asks (`local:alice`, `mcp:alice`, a gateway's principal), surrounding whitespace trimmed | CLI: `local:$USER` |
//! | 2 | `host_key` | SHA256 fingerprint of the host key the connection verified (`SHA256:…`), not the name | — (always the verified key) |
//! | 3 | `host` | the destination as resolved: `HostName:port`, HostName lower-cased | from ssh_config's HostName and Port, else the name given and 22 |
//! | 4 | `account` | the remote login name, exact | from ssh_config / `user@`, else the local user |
//! | 5 | `command` | the exact bytes the remote login shell receives (see below) | — |
//! | 6 | `cwd` | `~` for the account's home; otherwise the path with `~/` removed (relative = under home), `//` collapsed, trailing `/` removed | `~` |
//! | 7 | `env` | `NAME=VALUE` lines, sorted by name, joined with `\n` (behaviour-changing variables only) | empty |
//! | 8 | `secret_env` | the **names** of secret variables, sorted, joined with `\n`; never a value | empty |
//! | 9 | `credential` | a reference to the credential (`default`, `identity:/path/key`, `agent`, a vault path), never the credential | `default` |
//! | 10 | `class` | `read-only`, `idempotent`, `conditional`, `irreversible`, `remote-command` | `remote-command` |
//! | 11 | `scope` | the caller's intent scope (a task, a change ticket, a conversation), trimmed | `default` |
//!
//! **Command, string form.** `cairn run host -- a b` is `ssh`'s string form: the words after `--`
//! joined with single spaces, `a b`, exactly the bytes the remote login shell parses. Those bytes
//! are the canonical command, unchanged: inside a shell string whitespace and quoting are
//! meaningful (`echo 'a  b'`), so nothing is trimmed or collapsed.
//!
//! **Command, argv form** (JSON-RPC `argv`, MCP `argv`): each word is quoted for a POSIX shell
//! (left bare when it is non-empty and made only of `A-Z a-z 0-9 _ @ % + = : , . / -`, otherwise
//! single-quoted with `'` written as `'\''`) and the words are joined with single spaces. So
//! `argv ["echo", "hi"]` and the string `echo hi` are the same operation (the host runs the same
//! bytes) and have the same fingerprint, while `argv ["echo", "a b"]` is `echo 'a b'`.
//!
//! **Host identity** is the verified key *and* the resolved destination: hosts cloned from one
//! image share a host key, and the same command sent to two of them is two operations, never a
//! retry of one (`cairn-intent-v1` had the key alone). A host reached under two different
//! resolved names is, for intent matching, two hosts: a retry must use the same destination.
//! An execution accepted under v1 (before the upgrade) still matches a request whose v1
//! fingerprint equals its own and whose resolved destination (HostName, port) is the one it
//! was dispatched to, so a retry across the upgrade never runs twice.
//!
//! **Named operations** (`src/operations/`) append three fields after `scope`, only when the
//! request is a call of an operation, so every other record keeps its bytes:
//! `operation` (the name), `contract` (the digest of the operation's definition, so a changed
//! contract never matches an execution started under the old one) and `arguments` (the
//! fingerprint arguments, defaults filled in and values canonical, as a JSON object with sorted
//! keys). Their `command` is the argv template with those arguments filled in: arguments left
//! out of the fingerprint, and the execution ID, stay placeholders.
//!
//! Fields that do not change the effect are not in the record: the correlation ID, the caller's
//! execution ID, the name as typed (an ssh_config alias counts by what it resolves to), the
//! marker directory, the timeout, `--detach`.
//!
//! # Operation classes
//!
//! | class | retention (default) | after an `unknown` outcome, a matching retry … |
//! |---|---|---|
//! | `read-only` | 5 min | starts a new execution, up to [`READ_ONLY_RETRY_LIMIT`] unknown attempts per window, then stops for review |
//! | `idempotent` | 1 h | drives the same execution again: probe, and re-dispatch under the same execution ID unless the host proves it finished or is running |
//! | `conditional` | 1 h | probes the marker; cairn cannot check a caller's condition, so anything the marker does not settle stops for review |
//! | `irreversible` | 7 d | never touches the host: stops and shows the review record (`cairn review`, `cairn resolve`) |
//! | `remote-command` (default) | 24 h | probes the marker (finished: the stored result; alive: reattach; never started: dispatch under the same ID); otherwise stops for review |
//!
//! Retention is how long a matching fingerprint attaches to an earlier execution, counted from
//! its acceptance; `--retention` (or `retention` in a request) sets it per operation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Version tag at the start of the canonical bytes.
pub const CANONICAL_VERSION: &str = "cairn-intent-v2";

/// A read-only operation whose earlier attempts ended `unknown` this many times within the
/// window stops for review instead of trying again (the admission table's bound).
pub const READ_ONLY_RETRY_LIMIT: usize = crate::admission::READ_ONLY_RETRY_LIMIT;

/// Operation class: how dangerous a second run would be, and so what a retry may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OpClass {
    ReadOnly,
    Idempotent,
    Conditional,
    Irreversible,
    /// A command over SSH whose effect cairn cannot know: the default.
    #[default]
    RemoteCommand,
}

impl OpClass {
    pub const ALL: [OpClass; 5] = [
        OpClass::ReadOnly,
        OpClass::Idempotent,
        OpClass::Conditional,
        OpClass::Irreversible,
        OpClass::RemoteCommand,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OpClass::ReadOnly => "read-only",
            OpClass::Idempotent => "idempotent",
            OpClass::Conditional => "conditional",
            OpClass::Irreversible => "irreversible",
            OpClass::RemoteCommand => "remote-command",
        }
    }

    /// How long a matching fingerprint attaches to an earlier execution, by default.
    pub fn default_retention(self) -> Duration {
        Duration::from_secs(match self {
            OpClass::ReadOnly => 300,
            OpClass::Idempotent | OpClass::Conditional => 3600,
            OpClass::Irreversible => 7 * 86_400,
            OpClass::RemoteCommand => 86_400,
        })
    }

    /// What a matching retry does when the earlier execution's outcome is `unknown`: the
    /// admission table's class rule ([`crate::admission::Class::after_unknown`]).
    pub fn after_unknown(self, unknown_attempts_in_window: usize) -> AfterUnknown {
        crate::admission::Class::from(self).after_unknown(unknown_attempts_in_window)
    }
}

impl From<OpClass> for crate::admission::Class {
    fn from(c: OpClass) -> Self {
        use crate::admission::Class;
        match c {
            OpClass::ReadOnly => Class::ReadOnly,
            OpClass::Idempotent => Class::Idempotent,
            OpClass::Conditional => Class::Conditional,
            OpClass::Irreversible => Class::Irreversible,
            OpClass::RemoteCommand => Class::RemoteCommand,
        }
    }
}

/// The admission table's class for a class name the journal recorded. A name this build does
/// not parse (damaged, or written by a newer build: it may be `irreversible`) is
/// [`Unrecognized`](crate::admission::Class::Unrecognized), whose rule is the strictest,
/// review: never a probe that could dispatch again, never a new run. That is said here, once
/// per call: call it only where the class rule is asked.
pub(crate) fn class_recorded(class: &str) -> crate::admission::Class {
    match class.parse::<OpClass>() {
        Ok(c) => c.into(),
        Err(e) => {
            tracing::warn!("cairn: {e} in the journal: treated as needing review");
            crate::admission::Class::Unrecognized
        }
    }
}

impl std::fmt::Display for OpClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for OpClass {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        OpClass::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == s || c.as_str().replace('-', "_") == s)
            .ok_or_else(|| {
                format!(
                    "unknown operation class {s:?}; expected one of read-only, idempotent, \
                     conditional, irreversible, remote-command"
                )
            })
    }
}

/// The class rule after an `unknown` outcome (docs/DESIGN.md, operation classes): the
/// admission table's.
pub use crate::admission::AfterUnknown;

/// The command, in the caller's form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandForm {
    /// `ssh`'s string form: bytes for the remote login shell.
    Shell(Vec<u8>),
    /// A word list, quoted for the shell word by word.
    Argv(Vec<Vec<u8>>),
}

impl CommandForm {
    /// The exact bytes the remote login shell receives (the canonical command).
    pub fn shell_bytes(&self) -> Vec<u8> {
        match self {
            CommandForm::Shell(b) => b.clone(),
            CommandForm::Argv(words) => {
                let mut out = Vec::new();
                for (i, w) in words.iter().enumerate() {
                    if i > 0 {
                        out.push(b' ');
                    }
                    out.extend_from_slice(&quote_word(w));
                }
                out
            }
        }
    }
}

/// Quote one word for a POSIX shell, leaving plain words bare.
pub(crate) fn quote_word(w: &[u8]) -> Vec<u8> {
    let plain = !w.is_empty()
        && w.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(c));
    if plain {
        return w.to_vec();
    }
    let mut q = vec![b'\''];
    for &c in w {
        if c == b'\'' {
            q.extend_from_slice(b"'\\''");
        } else {
            q.push(c);
        }
    }
    q.push(b'\'');
    q
}

/// Everything that decides an operation's effect. See the module doc for the canonical form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRecord {
    pub actor: String,
    pub host_key: String,
    /// The destination as resolved, `HostName:port` (see [`canonical_host`]).
    pub host: String,
    pub account: String,
    pub command: CommandForm,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub secret_env: BTreeSet<String>,
    pub credential_ref: Option<String>,
    pub class: OpClass,
    pub scope: Option<String>,
    /// The named operation this is a call of (fields 11-13), if any.
    pub operation: Option<OperationRef>,
}

/// A call of a named operation, as the record holds it (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperationRef {
    pub name: String,
    /// `sha256:…` of the operation's definition.
    pub contract: String,
    /// The fingerprint arguments: canonical values, defaults filled in.
    pub arguments: BTreeMap<String, serde_json::Value>,
    /// Arguments outside the fingerprint (a `reason`): recorded for people, never hashed.
    pub notes: BTreeMap<String, serde_json::Value>,
    /// The environment the contract gives the command, as canonical as `command` (arguments
    /// outside the fingerprint stay placeholders); shown in the record, covered by `contract`.
    pub env: BTreeMap<String, String>,
}

fn hmac_hex(key: &IntentKey, bytes: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(&key.0).expect("HMAC takes any key length");
    mac.update(bytes);
    hex::encode(mac.finalize().into_bytes())
}

/// The canonical resolved destination (module doc, field 3): `HostName:port`, HostName
/// lower-cased (DNS names are case-insensitive), brackets of an IPv6 literal removed.
pub fn canonical_host(hostname: &str, port: u16) -> String {
    let h = hostname.trim();
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    format!("{}:{port}", h.to_ascii_lowercase())
}

/// The canonical working directory (module doc, field 6).
pub(crate) fn canonical_cwd(cwd: Option<&str>) -> String {
    let Some(c) = cwd else { return "~".into() };
    let mut c = c.to_owned();
    while c.contains("//") {
        c = c.replace("//", "/");
    }
    if c == "~" || c == "~/" || c.is_empty() {
        return "~".into();
    }
    if let Some(rest) = c.strip_prefix("~/") {
        c = rest.to_owned();
    }
    while c.len() > 1 && c.ends_with('/') {
        c.pop();
    }
    if c.is_empty() {
        "~".into()
    } else {
        c
    }
}

/// The canonical actor or scope: trimmed, with the default when empty.
fn trimmed_or(v: Option<&str>, default: &str) -> String {
    match v.map(str::trim) {
        Some(s) if !s.is_empty() => s.to_owned(),
        _ => default.to_owned(),
    }
}

/// Validate an environment variable name (`[A-Za-z_][A-Za-z0-9_]*`).
pub(crate) fn valid_env_name(n: &str) -> bool {
    let mut it = n.bytes();
    matches!(it.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && it.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

impl OperationRecord {
    /// The canonical fields, in order, as (name, bytes).
    pub fn canonical_fields(&self) -> Vec<(&'static str, Vec<u8>)> {
        let env = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("\n");
        let secrets = self
            .secret_env
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n");
        let mut fields = vec![
            ("actor", self.actor.trim().as_bytes().to_vec()),
            ("host_key", self.host_key.trim().as_bytes().to_vec()),
            ("host", self.host.trim().as_bytes().to_vec()),
            ("account", self.account.as_bytes().to_vec()),
            ("command", self.command.shell_bytes()),
            ("cwd", canonical_cwd(self.cwd.as_deref()).into_bytes()),
            ("env", env.into_bytes()),
            ("secret_env", secrets.into_bytes()),
            (
                "credential",
                trimmed_or(self.credential_ref.as_deref(), "default").into_bytes(),
            ),
            ("class", self.class.as_str().as_bytes().to_vec()),
            (
                "scope",
                trimmed_or(self.scope.as_deref(), "default").into_bytes(),
            ),
        ];
        if let Some(op) = &self.operation {
            let args = serde_json::to_string(&op.arguments).unwrap_or_default();
            fields.push(("operation", op.name.as_bytes().to_vec()));
            fields.push(("contract", op.contract.as_bytes().to_vec()));
            fields.push(("arguments", args.into_bytes()));
        }
        fields
    }

    /// The bytes the fingerprint is computed over.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        self.tagged_bytes(CANONICAL_VERSION, &[])
    }

    fn tagged_bytes(&self, tag: &str, leave_out: &[&str]) -> Vec<u8> {
        let mut out = tag.as_bytes().to_vec();
        for (name, value) in self.canonical_fields() {
            if leave_out.contains(&name) {
                continue;
            }
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            out.extend_from_slice(&(value.len() as u64).to_be_bytes());
            out.extend_from_slice(&value);
        }
        out
    }

    /// HMAC-SHA256 of the canonical bytes under `key`, lower-case hex.
    pub fn fingerprint(&self, key: &IntentKey) -> String {
        hmac_hex(key, &self.canonical_bytes())
    }

    /// The fingerprint `cairn-intent-v1` gave this record (without the destination). Only for
    /// matching executions accepted before v2, and only on the same destination: see
    /// [`crate::journal::LegacyIntent`].
    pub fn fingerprint_v1(&self, key: &IntentKey) -> String {
        hmac_hex(key, &self.tagged_bytes("cairn-intent-v1", &["host"]))
    }

    /// The record for people and for the journal: canonical values, the command by its
    /// SHA-256 and (lossy) text. No secret value exists here to leak: only names.
    pub fn display_json(&self) -> serde_json::Value {
        let cmd = self.command.shell_bytes();
        let mut v = serde_json::json!({
            "actor": self.actor.trim(),
            "host_key": self.host_key.trim(),
            "host": self.host.trim(),
            "account": self.account,
            "command": String::from_utf8_lossy(&cmd),
            "command_sha256": hex::encode(Sha256::digest(&cmd)),
            "command_form": match self.command { CommandForm::Shell(_) => "string", CommandForm::Argv(_) => "argv" },
            "cwd": canonical_cwd(self.cwd.as_deref()),
            "env": self.env,
            "secret_env": self.secret_env,
            "credential": trimmed_or(self.credential_ref.as_deref(), "default"),
            "class": self.class,
            "scope": trimmed_or(self.scope.as_deref(), "default"),
        });
        if let Some(op) = &self.operation {
            v["operation"] = serde_json::json!({
                "name": op.name, "contract": op.contract, "arguments": op.arguments,
                "notes": op.notes, "env": op.env,
            });
        }
        v
    }

    /// The canonical actor.
    pub fn actor_canonical(&self) -> String {
        self.actor.trim().to_owned()
    }

    /// The canonical scope.
    pub fn scope_canonical(&self) -> String {
        trimmed_or(self.scope.as_deref(), "default")
    }
}

/// What a caller specifies about an operation besides the target (from the CLI flags, or
/// parsed from a JSON request: key order and whitespace are gone once parsed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationSpec {
    /// String form: the command for the remote login shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Argv form: words, quoted for the shell one by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Behaviour-changing environment (part of the fingerprint, sent to the host).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Names of secret variables, values taken from cairn's own environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_ref: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<OpClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
}

/// The options of one request that concern intent, authorization and delivery, besides the
/// [`crate::RunRequest`] itself.
#[derive(Clone, Debug, Default)]
pub struct Intent {
    pub actor: String,
    pub command: Option<CommandForm>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    /// Secret variable names; the values are read from cairn's environment at dispatch time.
    pub secret_env: BTreeSet<String>,
    pub credential_ref: Option<String>,
    pub class: OpClass,
    pub scope: Option<String>,
    /// Per-operation retention; `None` = the class default.
    pub retention: Option<Duration>,
    /// The caller's correlation ID (a JSON-RPC id), recorded as an event, never hashed.
    pub correlation_id: Option<String>,
    /// The session (client process / gateway run) this request came through.
    pub session_id: Option<String>,
    /// The named operation this request calls (`src/operations/`), if any.
    pub operation: Option<OperationRef>,
}

impl Intent {
    /// Check names and values before anything is sent.
    pub fn validate(&self) -> Result<(), String> {
        for k in self.env.keys() {
            if !valid_env_name(k) {
                return Err(format!("environment variable name {k:?} is not valid"));
            }
        }
        for k in &self.secret_env {
            if !valid_env_name(k) {
                return Err(format!("secret variable name {k:?} is not valid"));
            }
            if self.env.contains_key(k) {
                return Err(format!(
                    "{k} is given both as a plain variable and as a secret"
                ));
            }
        }
        if let Some(c) = &self.cwd {
            if c.contains(['\0', '\n']) {
                return Err("the working directory contains a newline or NUL".into());
            }
        }
        if self.actor.trim().is_empty() {
            return Err("the actor is empty".into());
        }
        Ok(())
    }

    /// The retention window in seconds.
    pub fn retention_secs(&self) -> u64 {
        self.retention
            .unwrap_or_else(|| self.class.default_retention())
            .as_secs()
    }

    /// The bytes to send to the host's shell: `cd` into the working directory and export the
    /// plain environment, then the command itself. Secret values are never part of this.
    pub fn wrap_command(&self, command: &[u8]) -> Vec<u8> {
        let cwd = canonical_cwd(self.cwd.as_deref());
        if cwd == "~" && self.env.is_empty() {
            return command.to_vec();
        }
        let mut out = Vec::new();
        if cwd != "~" {
            out.extend_from_slice(b"cd -- ");
            out.extend_from_slice(&quote_word(cwd.as_bytes()));
            out.extend_from_slice(b" || exit 126\n");
        }
        for (k, v) in &self.env {
            out.extend_from_slice(format!("export {k}=").as_bytes());
            out.extend_from_slice(&quote_word(v.as_bytes()));
            out.push(b'\n');
        }
        out.extend_from_slice(command);
        out
    }

    /// The operation record for this intent, once the host key, the resolved destination
    /// ([`canonical_host`]) and the account are known.
    pub fn record(
        &self,
        host_key: &str,
        host: &str,
        account: &str,
        command: &[u8],
    ) -> OperationRecord {
        OperationRecord {
            actor: self.actor.clone(),
            host_key: host_key.to_owned(),
            host: host.to_owned(),
            account: account.to_owned(),
            command: self
                .command
                .clone()
                .unwrap_or_else(|| CommandForm::Shell(command.to_vec())),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            secret_env: self.secret_env.clone(),
            credential_ref: self.credential_ref.clone(),
            class: self.class,
            scope: self.scope.clone(),
            operation: self.operation.clone(),
        }
    }
}

impl OperationSpec {
    /// The command bytes (string form as is, argv quoted) and the intent, for `actor`.
    pub fn into_intent(self, actor: &str) -> Result<(Vec<u8>, Intent), String> {
        let form = match (self.command, self.argv) {
            (Some(c), None) => CommandForm::Shell(c.into_bytes()),
            (None, Some(a)) if !a.is_empty() => {
                CommandForm::Argv(a.into_iter().map(String::into_bytes).collect())
            }
            (None, Some(_)) => return Err("argv is empty".into()),
            (Some(_), Some(_)) => return Err("give either command or argv, not both".into()),
            (None, None) => return Err("no command: give command (a string) or argv".into()),
        };
        let bytes = form.shell_bytes();
        if bytes.is_empty() {
            return Err("the command is empty".into());
        }
        if bytes.contains(&0) {
            return Err("the command contains a NUL byte".into());
        }
        let intent = Intent {
            actor: actor.to_owned(),
            command: Some(form),
            cwd: self.cwd,
            env: self.env,
            secret_env: self.secret_env.into_iter().collect(),
            credential_ref: self.credential_ref,
            class: self.class.unwrap_or_default(),
            scope: self.scope,
            ..Intent::default()
        };
        intent.validate()?;
        Ok((bytes, intent))
    }
}

/// The local user as an actor: `local:$USER` (or `local:uid-N`).
pub fn local_actor(prefix: &str) -> String {
    let user = std::env::var("USER")
        .ok()
        .or_else(|| std::env::var("LOGNAME").ok())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| {
            #[cfg(unix)]
            {
                // SAFETY: getuid takes nothing, touches no memory and cannot fail.
                format!("uid-{}", unsafe { libc::getuid() })
            }
            #[cfg(not(unix))]
            {
                "unknown".into()
            }
        });
    format!("{prefix}:{user}")
}

/// The fingerprint key. `Debug` never shows it.
#[derive(Clone)]
pub struct IntentKey(Vec<u8>);

/// Why the intent key (the HMAC key that binds an intent to its execution) cannot be used.
///
/// Layer: intents (`src/intent.rs`). The executor converts it at its boundary:
/// `From<IntentError> for ExecError` makes it [`ExecError::Setup`](crate::error::ExecError::Setup) (the operator fixes the key
/// file and runs again). The request validators here (`Intent::validate`,
/// `OperationSpec::into_intent`) and `OpClass`'s `FromStr` keep returning a message for the
/// caller to wrap: they name the field at fault and are the caller's to locate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntentError {
    /// The key file exists and cannot be read.
    #[error("intent key {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The key file is not hex.
    #[error("intent key {path}: not a hex key")]
    NotHex { path: String },
    /// The key file holds fewer than 16 bytes.
    #[error("intent key {path}: key is {len} bytes; at least 16 are needed")]
    TooShort { path: String, len: usize },
    /// The key's directory cannot be created.
    #[error("cannot create {dir}: {source}")]
    CreateDir { dir: String, source: std::io::Error },
    /// The key file (or its temporary file) cannot be created.
    #[error("cannot create intent key {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    /// The new key cannot be written to its temporary file.
    #[error("cannot write intent key {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

impl std::fmt::Debug for IntentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IntentKey(<redacted>)")
    }
}

impl IntentKey {
    /// A key from bytes (tests, embedders).
    pub fn from_bytes(b: &[u8]) -> IntentKey {
        IntentKey(b.to_vec())
    }

    /// The default key file: `$CAIRN_INTENT_KEY`, else `intent.key` next to the journal.
    /// `None` for a PostgreSQL journal without `$CAIRN_INTENT_KEY`: its replicas must share
    /// one key, so none is made up on one machine.
    pub fn default_path(journal: &Path) -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("CAIRN_INTENT_KEY").filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        if journal
            .to_str()
            .is_some_and(crate::location::is_postgres_url)
        {
            return None;
        }
        Some(
            journal
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .join("intent.key"),
        )
    }

    /// Load the key at `path`, creating it (32 random bytes, hex, mode 0600) on first use.
    /// Two processes creating it at once agree: the file appears atomically (a hard link of
    /// a complete temporary file), and the loser reads the winner's key.
    pub fn load_or_create(path: &Path) -> Result<IntentKey, IntentError> {
        let shown = || path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => return Self::parse(path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(IntentError::Read {
                    path: shown(),
                    source,
                })
            }
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| IntentError::CreateDir {
                dir: dir.display().to_string(),
                source,
            })?;
        }
        let mut key = [0u8; 32];
        rand::Rng::fill(&mut rand::rng(), &mut key[..]);
        let tmp = path.with_extension(format!(
            "tmp.{}.{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        {
            use std::io::Write;
            let mut o = std::fs::OpenOptions::new();
            o.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                o.mode(0o600);
            }
            let mut f = o.open(&tmp).map_err(|source| IntentError::Create {
                path: tmp.display().to_string(),
                source,
            })?;
            f.write_all(format!("{}\n", hex::encode(key)).as_bytes())
                .and_then(|_| f.sync_all())
                .map_err(|source| IntentError::Write {
                    path: tmp.display().to_string(),
                    source,
                })?;
        }
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(IntentKey(key.to_vec())),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let text = std::fs::read_to_string(path).map_err(|source| IntentError::Read {
                    path: shown(),
                    source,
                })?;
                Self::parse(path, &text)
            }
            Err(source) => Err(IntentError::Create {
                path: shown(),
                source,
            }),
        }
    }

    fn parse(path: &Path, text: &str) -> Result<IntentKey, IntentError> {
        let path = || path.display().to_string();
        let b = hex::decode(text.trim()).map_err(|_| IntentError::NotHex { path: path() })?;
        if b.len() < 16 {
            return Err(IntentError::TooShort {
                path: path(),
                len: b.len(),
            });
        }
        Ok(IntentKey(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> IntentKey {
        IntentKey::from_bytes(b"0123456789abcdef0123456789abcdef")
    }

    fn base() -> OperationRecord {
        OperationRecord {
            actor: "local:alice".into(),
            host_key: "SHA256:abc".into(),
            host: "10.0.0.5:22".into(),
            account: "ops".into(),
            command: CommandForm::Shell(b"echo hi".to_vec()),
            cwd: None,
            env: BTreeMap::new(),
            secret_env: BTreeSet::new(),
            credential_ref: None,
            class: OpClass::RemoteCommand,
            scope: None,
            operation: None,
        }
    }

    #[test]
    fn canonical_field_order_is_fixed() {
        let names: Vec<_> = base().canonical_fields().iter().map(|f| f.0).collect();
        assert_eq!(
            names,
            [
                "actor",
                "host_key",
                "host",
                "account",
                "command",
                "cwd",
                "env",
                "secret_env",
                "credential",
                "class",
                "scope"
            ]
        );
        let b = base().canonical_bytes();
        assert!(b.starts_with(b"cairn-intent-v2actor\0"));
    }

    #[test]
    fn two_hosts_sharing_a_host_key_are_two_operations() {
        let a = base();
        let mut b = base();
        b.host = canonical_host("10.0.0.6", 22);
        assert_eq!(a.host_key, b.host_key);
        assert_ne!(a.fingerprint(&key()), b.fingerprint(&key()));
        let mut c = base();
        c.host = canonical_host("10.0.0.5", 2222);
        assert_ne!(a.fingerprint(&key()), c.fingerprint(&key()));
        assert_eq!(canonical_host("DB-1.Example", 22), "db-1.example:22");
        assert_eq!(canonical_host("[::1]", 22), "::1:22");
        assert_eq!(a.display_json()["host"], "10.0.0.5:22");
    }

    #[test]
    fn the_v1_fingerprint_leaves_the_destination_out() {
        let a = base();
        let mut b = base();
        b.host = canonical_host("10.0.0.6", 22);
        assert_eq!(a.fingerprint_v1(&key()), b.fingerprint_v1(&key()));
        assert_ne!(a.fingerprint_v1(&key()), a.fingerprint(&key()));
        let mut v1 = b"cairn-intent-v1".to_vec();
        for (name, value) in a.canonical_fields() {
            if name != "host" {
                v1.extend_from_slice(name.as_bytes());
                v1.push(0);
                v1.extend_from_slice(&(value.len() as u64).to_be_bytes());
                v1.extend_from_slice(&value);
            }
        }
        assert_eq!(a.fingerprint_v1(&key()), hmac_hex(&key(), &v1));
    }

    #[test]
    fn defaults_are_made_explicit() {
        let mut r = base();
        let fp = r.fingerprint(&key());
        r.cwd = Some("~".into());
        assert_eq!(r.fingerprint(&key()), fp);
        r.cwd = Some("~/".into());
        assert_eq!(r.fingerprint(&key()), fp);
        r.cwd = Some(String::new());
        assert_eq!(r.fingerprint(&key()), fp);
        r.credential_ref = Some("default".into());
        assert_eq!(r.fingerprint(&key()), fp);
        r.scope = Some("default".into());
        assert_eq!(r.fingerprint(&key()), fp);
        r.scope = Some("  default ".into());
        assert_eq!(r.fingerprint(&key()), fp);
        r.actor = " local:alice\n".into();
        assert_eq!(r.fingerprint(&key()), fp);
        r.class = OpClass::default();
        assert_eq!(r.fingerprint(&key()), fp);
    }

    #[test]
    fn cwd_normalisation() {
        assert_eq!(canonical_cwd(None), "~");
        assert_eq!(canonical_cwd(Some("~/app/")), "app");
        assert_eq!(canonical_cwd(Some("app//x/")), "app/x");
        assert_eq!(canonical_cwd(Some("/srv/app/")), "/srv/app");
        assert_eq!(canonical_cwd(Some("/")), "/");
        assert_ne!(canonical_cwd(Some("/app")), canonical_cwd(Some("app")));
    }

    #[test]
    fn argv_and_string_forms() {
        let s = CommandForm::Shell(b"echo hi".to_vec());
        let a = CommandForm::Argv(vec![b"echo".to_vec(), b"hi".to_vec()]);
        assert_eq!(s.shell_bytes(), a.shell_bytes());
        let q = CommandForm::Argv(vec![b"echo".to_vec(), b"a b".to_vec(), b"it's".to_vec()]);
        assert_eq!(q.shell_bytes(), b"echo 'a b' 'it'\\''s'".to_vec());
        let e = CommandForm::Argv(vec![b"printf".to_vec(), b"".to_vec()]);
        assert_eq!(e.shell_bytes(), b"printf ''".to_vec());
        let mut r1 = base();
        let mut r2 = base();
        r1.command = s;
        r2.command = a;
        assert_eq!(r1.fingerprint(&key()), r2.fingerprint(&key()));
        // Whitespace inside a shell string is meaningful.
        r2.command = CommandForm::Shell(b"echo  hi".to_vec());
        assert_ne!(r1.fingerprint(&key()), r2.fingerprint(&key()));
    }

    #[test]
    fn the_key_matters_and_is_never_shown() {
        let r = base();
        assert_ne!(
            r.fingerprint(&key()),
            r.fingerprint(&IntentKey::from_bytes(b"another key, sixteen+"))
        );
        assert_eq!(format!("{:?}", key()), "IntentKey(<redacted>)");
        assert_eq!(r.fingerprint(&key()).len(), 64);
    }

    /// A key file that is not a key says which file and why, in the words it always has.
    #[test]
    fn a_bad_key_file_says_which_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("intent.key");
        std::fs::write(&p, "00ff\n").unwrap();
        let e = IntentKey::load_or_create(&p).unwrap_err().to_string();
        let shown = p.display();
        assert_eq!(
            e,
            format!("intent key {shown}: key is 2 bytes; at least 16 are needed")
        );
        std::fs::write(&p, "zz\n").unwrap();
        let e = IntentKey::load_or_create(&p).unwrap_err().to_string();
        assert_eq!(e, format!("intent key {shown}: not a hex key"));
    }

    #[test]
    fn secret_values_never_enter_the_record() {
        let mut r = base();
        r.secret_env.insert("DB_PASSWORD".into());
        let bytes = r.canonical_bytes();
        let json = r.display_json().to_string();
        assert!(String::from_utf8_lossy(&bytes).contains("DB_PASSWORD"));
        std::env::set_var("CAIRN_TEST_SECRET_VALUE_X", "hunter2-very-secret");
        let spec: OperationSpec = serde_json::from_str(
            r#"{"command":"echo hi","secret_env":["CAIRN_TEST_SECRET_VALUE_X"]}"#,
        )
        .unwrap();
        let (cmd, intent) = spec.into_intent("local:alice").unwrap();
        let rec = intent.record("SHA256:abc", "10.0.0.5:22", "ops", &cmd);
        for hay in [
            String::from_utf8_lossy(&rec.canonical_bytes()).into_owned(),
            rec.display_json().to_string(),
            String::from_utf8_lossy(&intent.wrap_command(&cmd)).into_owned(),
            json,
        ] {
            assert!(!hay.contains("hunter2"), "{hay}");
        }
    }

    #[test]
    fn key_file_is_created_0600_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub").join("intent.key");
        let k1 = IntentKey::load_or_create(&p).unwrap();
        let k2 = IntentKey::load_or_create(&p).unwrap();
        assert_eq!(k1.0, k2.0);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let p = dir.path().join("race.key");
                std::thread::spawn(move || {
                    let _ = i;
                    IntentKey::load_or_create(&p).unwrap().0
                })
            })
            .collect();
        let keys: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn wrap_command_exports_env_and_changes_directory() {
        let mut i = Intent {
            actor: "a".into(),
            ..Intent::default()
        };
        assert_eq!(i.wrap_command(b"ls"), b"ls");
        i.cwd = Some("~/srv/app/".into());
        i.env.insert("MODE".into(), "it's fast".into());
        assert_eq!(
            String::from_utf8(i.wrap_command(b"ls")).unwrap(),
            "cd -- srv/app || exit 126\nexport MODE='it'\\''s fast'\nls"
        );
        i.env.insert("BAD NAME".into(), "x".into());
        assert!(i.validate().is_err());
    }

    #[test]
    fn class_rules_after_unknown() {
        assert_eq!(OpClass::ReadOnly.after_unknown(0), AfterUnknown::RunAgain);
        assert_eq!(
            OpClass::ReadOnly.after_unknown(READ_ONLY_RETRY_LIMIT),
            AfterUnknown::Review
        );
        assert_eq!(
            OpClass::Idempotent.after_unknown(9),
            AfterUnknown::RetrySameId
        );
        assert_eq!(OpClass::Irreversible.after_unknown(0), AfterUnknown::Review);
        assert_eq!(
            OpClass::RemoteCommand.after_unknown(0),
            AfterUnknown::ProbeMarker
        );
        for c in OpClass::ALL {
            assert_eq!(c.as_str().parse::<OpClass>().unwrap(), c);
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                format!("\"{}\"", c.as_str())
            );
        }
        assert!(OpClass::Irreversible.default_retention() > OpClass::ReadOnly.default_retention());
    }

    // ----- properties ------------------------------------------------------------------

    fn word() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9 _./'\"$-]{1,12}"
    }
    fn name() -> impl Strategy<Value = String> {
        "[A-Z_][A-Z0-9_]{0,6}"
    }
    fn class() -> impl Strategy<Value = OpClass> {
        prop::sample::select(OpClass::ALL.to_vec())
    }

    prop_compose! {
        fn record()(actor in "[a-z:]{1,10}", host_key in "SHA256:[A-Za-z0-9+/]{4,12}",
                    host in "[a-z0-9.]{1,12}:[0-9]{2,5}",
                    account in "[a-z]{1,8}", argv in prop::bool::ANY,
                    words in prop::collection::vec(word(), 1..4),
                    cwd in prop::option::of("[a-z/]{1,10}"),
                    env in prop::collection::btree_map(name(), word(), 0..3),
                    secrets in prop::collection::btree_set(name(), 0..3),
                    cred in prop::option::of("[a-z:/]{1,10}"), class in class(),
                    scope in prop::option::of("[a-z0-9-]{1,10}")) -> OperationRecord {
            let command = if argv {
                CommandForm::Argv(words.into_iter().map(String::into_bytes).collect())
            } else {
                CommandForm::Shell(words.join(" ").into_bytes())
            };
            let secrets = secrets.into_iter().filter(|s| !env.contains_key(s)).collect();
            OperationRecord { actor, host_key, host, account, command, cwd, env, secret_env: secrets,
                              credential_ref: cred, class, scope, operation: None }
        }
    }

    /// Change one effect-deciding field in a way that changes its canonical value.
    fn mutate(r: &OperationRecord, which: usize, salt: &str) -> OperationRecord {
        let mut m = r.clone();
        match which {
            0 => m.actor = format!("{}x{salt}", r.actor.trim()),
            1 => m.host_key = format!("{}Q{salt}", r.host_key.trim()),
            10 => m.host = format!("{}h{salt}", r.host.trim()),
            2 => m.account = format!("{}z", r.account),
            3 => {
                let mut b = r.command.shell_bytes();
                b.extend_from_slice(format!(" ;{salt}").as_bytes());
                m.command = CommandForm::Shell(b);
            }
            4 => m.cwd = Some(format!("/{}q{salt}", canonical_cwd(r.cwd.as_deref()))),
            5 => {
                let v = r.env.get("CAIRN_P").cloned().unwrap_or_default();
                m.env.insert("CAIRN_P".into(), format!("{v}v{salt}"));
            }
            6 => {
                m.secret_env
                    .insert(format!("s{}_{salt}", r.secret_env.len()));
            }
            7 => {
                m.credential_ref = Some(format!(
                    "{}c{salt}",
                    trimmed_or(r.credential_ref.as_deref(), "default")
                ))
            }
            8 => {
                let i = OpClass::ALL.iter().position(|c| *c == r.class).unwrap();
                m.class = OpClass::ALL[(i + 1) % OpClass::ALL.len()];
            }
            _ => m.scope = Some(format!("{}s{salt}", r.scope_canonical())),
        }
        m
    }

    proptest! {
        #[test]
        fn any_change_to_the_effect_changes_the_fingerprint(
            r in record(), which in 0usize..11, salt in "[a-z0-9]{0,4}")
        {
            let m = mutate(&r, which, &salt);
            prop_assert_ne!(r.fingerprint(&key()), m.fingerprint(&key()), "field {}", which);
        }

        #[test]
        fn json_key_order_whitespace_and_correlation_id_do_not(
            r in record(), seed in any::<u64>(), id_a in any::<u32>(), id_b in "[a-z0-9-]{1,20}")
        {
            let spec = |r: &OperationRecord| -> Vec<(String, serde_json::Value)> {
                let mut v = vec![
                    ("command".to_string(), serde_json::Value::String(
                        String::from_utf8(r.command.shell_bytes()).unwrap())),
                    ("env".into(), serde_json::to_value(&r.env).unwrap()),
                    ("secret_env".into(), serde_json::to_value(&r.secret_env).unwrap()),
                    ("class".into(), serde_json::to_value(r.class).unwrap()),
                ];
                if let Some(c) = &r.cwd { v.push(("cwd".into(), c.clone().into())); }
                if let Some(c) = &r.credential_ref { v.push(("credential_ref".into(), c.clone().into())); }
                if let Some(s) = &r.scope { v.push(("scope".into(), s.clone().into())); }
                v
            };
            // Two JSON texts: different key order, different whitespace, different
            // correlation IDs around the same operation.
            let fields = spec(&r);
            let mut shuffled = fields.clone();
            let mut s = seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (s >> 33) as usize % (i + 1));
            }
            let text = |fs: &[(String, serde_json::Value)], ws: &str, id: serde_json::Value| {
                let body: Vec<String> = fs.iter()
                    .map(|(k, v)| format!("{ws}\"{k}\"{ws}:{ws}{v}"))
                    .collect();
                format!("{{\"id\":{id},{ws}\"params\":{{{}}}}}", body.join(&format!(",{ws}")))
            };
            let t1 = text(&fields, "", serde_json::json!(id_a));
            let t2 = text(&shuffled, " \n\t ", serde_json::json!(id_b));
            let fp = |t: &str| {
                let v: serde_json::Value = serde_json::from_str(t).unwrap();
                let spec: OperationSpec = serde_json::from_value(v["params"].clone()).unwrap();
                let (cmd, intent) = spec.into_intent(&r.actor).unwrap();
                intent.record(&r.host_key, &r.host, &r.account, &cmd).fingerprint(&key())
            };
            let mut plain = r.clone();
            plain.command = CommandForm::Shell(r.command.shell_bytes());
            prop_assert_eq!(fp(&t1), fp(&t2));
            prop_assert_eq!(fp(&t1), plain.fingerprint(&key()));
        }
    }

    /// A class the journal holds that this build does not parse is never probed or run again:
    /// it goes to review, as `irreversible` does.
    #[test]
    fn an_unparseable_recorded_class_after_unknown_is_review() {
        for name in ["irreversable", "", "IRREVERSIBLE", "future-class"] {
            assert_eq!(
                class_recorded(name).after_unknown(0),
                AfterUnknown::Review,
                "{name:?}"
            );
        }
        for c in OpClass::ALL {
            assert_eq!(
                class_recorded(c.as_str()).after_unknown(0),
                c.after_unknown(0)
            );
        }
    }
}
