//! Authorization: whether a caller may start an execution.
//!
//! docs/DESIGN.md: approvals are evidence, not idempotency. The approver is asked once, for a new
//! execution only: a request that matches an earlier execution's intent attaches to it and is
//! never asked again (no second approval for an ambiguous retry). Each decision is a journal
//! event, `authorized` or `rejected`, with who decided, by which rule, and when.
//!
//! Approvers:
//! - [`Allow`]: the invoking user decided by typing the command (`cairn run`'s default).
//! - [`Deny`]: refuse everything (a dry gateway, tests).
//! - [`Prompt`]: ask on the controlling terminal (`/dev/tty`); no terminal means no.
//! - [`Policy`]: rules from a JSON file, first match wins:
//!
//! ```json
//! { "default": "deny",
//!   "rules": [
//!     { "name": "status is harmless", "decision": "allow",
//!       "class": ["read-only"], "command_prefix": "systemctl status " },
//!     { "name": "ops may migrate db hosts", "decision": "allow",
//!       "actor": "local:ops*", "host": "db-*", "class": ["remote-command", "idempotent"] },
//!     { "name": "no payments from agents", "decision": "deny",
//!       "actor": "mcp:*", "class": ["irreversible"] } ] }
//! ```
//!
//! Rule fields (all optional; an absent field matches anything): `actor`, `host` (the
//! destination as written, or the resolved `user@host:port`), `account`, `host_key`
//! (`SHA256:…`), `scope` are globs (`*`, `?`, case-insensitive); `class` is a list of classes;
//! `command_prefix` matches the start of the command bytes exactly.

use std::io::{BufRead, Write};
use std::path::Path;

use serde::Deserialize;

use crate::intent::OpClass;
use crate::ssh::known_hosts::wildcard_match;

/// What the approver is asked about.
#[derive(Clone, Debug)]
pub struct ApprovalRequest<'a> {
    pub execution_id: &'a str,
    pub actor: &'a str,
    /// The destination as the caller wrote it.
    pub destination: &'a str,
    /// `user@host:port` as resolved.
    pub target: &'a str,
    pub account: &'a str,
    pub host_key: &'a str,
    pub class: OpClass,
    pub scope: &'a str,
    pub command: &'a [u8],
}

/// An approver's answer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    pub allow: bool,
    /// Who decided (`local-cli`, `policy:/etc/cairn/policy.json`, `tty:alice`).
    pub by: String,
    /// The rule that decided, if any.
    pub rule: Option<String>,
    pub reason: String,
}

/// Decides whether a new execution may start.
pub trait Approver: Send {
    fn decide(&mut self, req: &ApprovalRequest<'_>) -> Decision;
}

/// Allow: the request itself is the approval (the user typed `cairn run`).
pub struct Allow {
    pub by: String,
}

impl Approver for Allow {
    fn decide(&mut self, _: &ApprovalRequest<'_>) -> Decision {
        Decision {
            allow: true,
            by: self.by.clone(),
            rule: None,
            reason: "the caller's own request".into(),
        }
    }
}

/// Deny everything.
pub struct Deny;

impl Approver for Deny {
    fn decide(&mut self, _: &ApprovalRequest<'_>) -> Decision {
        Decision {
            allow: false,
            by: "deny".into(),
            rule: None,
            reason: "every execution is refused (--approve deny)".into(),
        }
    }
}

/// Ask on the controlling terminal.
pub struct Prompt;

impl Approver for Prompt {
    fn decide(&mut self, r: &ApprovalRequest<'_>) -> Decision {
        let deny = |reason: String| Decision {
            allow: false,
            by: "tty".into(),
            rule: None,
            reason,
        };
        let tty = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/tty")
        {
            Ok(t) => t,
            Err(e) => return deny(format!("no terminal to ask on: {e}")),
        };
        let mut w = match tty.try_clone() {
            Ok(w) => w,
            Err(e) => return deny(format!("terminal: {e}")),
        };
        let _ = write!(
            w,
            "cairn: {} asks to run on {} ({}, key {}), class {}, scope {}:\n  {}\nAllow? [y/N] ",
            r.actor,
            r.destination,
            r.target,
            r.host_key,
            r.class,
            r.scope,
            String::from_utf8_lossy(r.command).replace('\n', "\n  ")
        );
        let _ = w.flush();
        let mut line = String::new();
        let _ = std::io::BufReader::new(tty).read_line(&mut line);
        let user = crate::intent::local_actor("tty");
        if matches!(line.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            Decision {
                allow: true,
                by: user,
                rule: None,
                reason: "approved at the terminal".into(),
            }
        } else {
            Decision {
                allow: false,
                by: user,
                rule: None,
                reason: "refused at the terminal".into(),
            }
        }
    }
}

/// One policy rule.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default)]
    pub name: Option<String>,
    pub decision: Verdict,
    #[serde(default)]
    pub actor: Option<String>,
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub account: Option<String>,
    #[serde(default)]
    pub host_key: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub class: Option<Vec<OpClass>>,
    #[serde(default)]
    pub command_prefix: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
}

/// A policy file: rules, first match wins, then the default.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default = "default_deny")]
    pub default: Verdict,
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(skip)]
    pub source: String,
}

fn default_deny() -> Verdict {
    Verdict::Deny
}

/// Why no approver could be built from the flags: the policy file cannot be read or parsed,
/// or `--approve` names no approver.
///
/// Layer: authorization (`src/approve.rs`). Its callers (the runner's executor builder,
/// `cairn run`/`cairn op` through `runner::prepare`) convert it with
/// `From<ApproveError> for ExecError` into [`ExecError::Setup`](crate::error::ExecError::Setup).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApproveError {
    /// The policy file could not be read.
    #[error("policy {}: {source}", path.display())]
    PolicyUnreadable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The policy file is not a policy (JSON that does not parse as one).
    #[error("policy {}: {source}", path.display())]
    PolicyInvalid {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
    /// `--approve` names none of the approvers.
    #[error("--approve {0:?}: expected allow, deny or prompt (or --policy FILE)")]
    UnknownMode(String),
}

impl From<ApproveError> for crate::error::ExecError {
    fn from(e: ApproveError) -> Self {
        crate::error::ExecError::Setup(e.to_string())
    }
}

impl Policy {
    pub fn load(path: &Path) -> Result<Policy, ApproveError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ApproveError::PolicyUnreadable {
                path: path.to_owned(),
                source,
            })?;
        let mut p: Policy =
            serde_json::from_str(&text).map_err(|source| ApproveError::PolicyInvalid {
                path: path.to_owned(),
                source,
            })?;
        p.source = path.display().to_string();
        Ok(p)
    }

    fn matches(rule: &Rule, r: &ApprovalRequest<'_>) -> bool {
        let g = |pat: &Option<String>, vals: &[&str]| {
            pat.as_deref()
                .is_none_or(|p| vals.iter().any(|v| wildcard_match(p, v)))
        };
        g(&rule.actor, &[r.actor])
            && g(&rule.host, &[r.destination, r.target])
            && g(&rule.account, &[r.account])
            && g(&rule.host_key, &[r.host_key])
            && g(&rule.scope, &[r.scope])
            && rule.class.as_ref().is_none_or(|cs| cs.contains(&r.class))
            && rule
                .command_prefix
                .as_deref()
                .is_none_or(|p| r.command.starts_with(p.as_bytes()))
    }
}

impl Approver for Policy {
    fn decide(&mut self, r: &ApprovalRequest<'_>) -> Decision {
        let by = format!("policy:{}", self.source);
        for (i, rule) in self.rules.iter().enumerate() {
            if Self::matches(rule, r) {
                let name = rule
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("rule {}", i + 1));
                return Decision {
                    allow: rule.decision == Verdict::Allow,
                    by,
                    reason: format!(
                        "{} by {name}",
                        if rule.decision == Verdict::Allow {
                            "allowed"
                        } else {
                            "denied"
                        }
                    ),
                    rule: Some(name),
                };
            }
        }
        Decision {
            allow: self.default == Verdict::Allow,
            by,
            rule: None,
            reason: format!(
                "no rule matched; the policy's default is {}",
                if self.default == Verdict::Allow {
                    "allow"
                } else {
                    "deny"
                }
            ),
        }
    }
}

/// Build an approver from the CLI's `--approve MODE` and `--policy FILE`.
pub(crate) fn from_flags(
    mode: &str,
    policy: Option<&Path>,
    by: &str,
) -> Result<Box<dyn Approver>, ApproveError> {
    if let Some(p) = policy {
        return Ok(Box::new(Policy::load(p)?));
    }
    match mode {
        "allow" => Ok(Box::new(Allow { by: by.to_owned() })),
        "deny" => Ok(Box::new(Deny)),
        "prompt" => Ok(Box::new(Prompt)),
        other => Err(ApproveError::UnknownMode(other.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(actor: &'a str, class: OpClass, cmd: &'a [u8]) -> ApprovalRequest<'a> {
        ApprovalRequest {
            execution_id: "ex_1",
            actor,
            destination: "db-1",
            target: "ops@10.0.0.5:22",
            account: "ops",
            host_key: "SHA256:abc",
            class,
            scope: "default",
            command: cmd,
        }
    }

    #[test]
    fn policy_first_match_wins_then_default() {
        let mut p: Policy = serde_json::from_str(
            r#"{"default":"deny","rules":[
                {"name":"status","decision":"allow","class":["read-only"],"command_prefix":"systemctl status "},
                {"name":"no agents","decision":"deny","actor":"mcp:*"},
                {"name":"ops on db","decision":"allow","actor":"local:*","host":"db-*"}]}"#,
        )
        .unwrap();
        let d = p.decide(&req(
            "mcp:bot",
            OpClass::ReadOnly,
            b"systemctl status nginx",
        ));
        assert!(d.allow);
        assert_eq!(d.rule.as_deref(), Some("status"));
        let d = p.decide(&req("mcp:bot", OpClass::RemoteCommand, b"rm -rf /"));
        assert!(!d.allow);
        assert_eq!(d.rule.as_deref(), Some("no agents"));
        let d = p.decide(&req("local:alice", OpClass::Irreversible, b"pay"));
        assert!(d.allow);
        let mut r = req("x:y", OpClass::RemoteCommand, b"ls");
        r.destination = "web-1";
        r.target = "ops@web-1:22";
        let d = p.decide(&r);
        assert!(!d.allow);
        assert_eq!(d.rule, None);
        assert!(
            serde_json::from_str::<Policy>(r#"{"rules":[{"decision":"allow","bogus":1}]}"#)
                .is_err()
        );
    }

    #[test]
    fn flags() {
        assert!(from_flags("allow", None, "x").is_ok());
        assert!(from_flags("deny", None, "x").is_ok());
        assert!(from_flags("maybe", None, "x").is_err());
        assert!(!Deny.decide(&req("a", OpClass::ReadOnly, b"ls")).allow);
    }
}
