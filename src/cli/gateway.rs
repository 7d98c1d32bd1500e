//! The command-line parts of intent, authorization, review, sessions and the gateway
//! servers: `cairn run`'s intent flags, `cairn review`, `cairn resolve`, `cairn sessions`,
//! `cairn serve --stdio`, `cairn mcp`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{parse_duration, Common};
use crate::executor::{ExecError, Executor};
use crate::front::gateway::GatewayConfig;
use crate::id::ExecutionId;
use crate::intent::{Intent, OpClass};
use crate::journal::Journal;
use crate::options::{ApproveOptions, IntentOptions};
use crate::state::State;

/// What the operation is, beyond host and command: the intent and who may start it.
#[derive(Args, Debug, Clone)]
pub struct IntentArgs {
    /// Operation class: read-only, idempotent, conditional, irreversible, remote-command.
    /// Decides the retention window and what a retry may do after an unknown outcome.
    #[arg(long, default_value = "remote-command")]
    pub class: OpClass,
    /// How long a repeat of this operation (same intent) attaches to this execution instead of
    /// running again (default: per class; 24h for remote-command).
    #[arg(long, value_parser = parse_duration)]
    pub retention: Option<Duration>,
    /// Intent scope: a task, change ticket or conversation the operation belongs to.
    #[arg(long, env = "CAIRN_SCOPE")]
    pub scope: Option<String>,
    /// Who asks (default: local:$USER).
    #[arg(long, env = "CAIRN_ACTOR")]
    pub actor: Option<String>,
    /// Working directory on the host (default: the account's home).
    #[arg(long)]
    pub cwd: Option<String>,
    /// A behaviour-changing environment variable for the command, NAME=VALUE (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// Pass the variable NAME from cairn's environment as a secret: never journaled, never on
    /// the host's disk; only its name is part of the intent (repeatable).
    #[arg(long = "secret-env", value_name = "NAME")]
    pub secret_env: Vec<String>,
    /// A reference to the credential used (recorded in the intent; never the credential).
    /// Default: the -i files, else `default`.
    #[arg(long)]
    pub credential_ref: Option<String>,
    #[command(flatten)]
    pub approve: ApproveArgs,
}

/// Who decides whether a new execution may start.
#[derive(Args, Debug, Clone)]
pub struct ApproveArgs {
    /// allow (the request is the approval), deny, or prompt (ask on the terminal).
    #[arg(long, default_value = crate::options::DEFAULT_APPROVE)]
    pub approve: String,
    /// A JSON policy file of allow/deny rules (overrides --approve).
    #[arg(long, env = "CAIRN_POLICY")]
    pub policy: Option<PathBuf>,
}

impl IntentArgs {
    /// The library's options from these flags.
    pub fn options(&self) -> IntentOptions {
        IntentOptions {
            class: self.class,
            retention: self.retention,
            scope: self.scope.clone(),
            actor: self.actor.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            secret_env: self.secret_env.clone(),
            credential_ref: self.credential_ref.clone(),
        }
    }

    pub fn intent(&self, common: &Common) -> Result<Intent, ExecError> {
        self.options().intent(&common.identity)
    }
}

impl ApproveArgs {
    /// The library's options from these flags.
    pub fn options(&self) -> ApproveOptions {
        ApproveOptions {
            mode: self.approve.clone(),
            policy: self.policy.clone(),
        }
    }
}

/// Prepare an executor for a command that creates executions: approver and session.
pub fn prepare(
    ex: &mut Executor,
    approve: &ApproveArgs,
    kind: &str,
    actor: &str,
) -> Result<String, ExecError> {
    crate::runner::prepare(ex, &approve.options(), kind, actor)
}

/// `cairn review`.
#[derive(Args, Debug)]
pub struct ReviewArgs {
    #[arg(long, env = "CAIRN_JOURNAL")]
    pub journal: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn review(a: ReviewArgs) -> Result<i32, ExecError> {
    let path = a.journal.unwrap_or_else(Journal::default_path);
    let j = Journal::open(&path)?;
    let items = crate::review::pending(&j)?;
    if a.json {
        println!("{}", serde_json::to_string(&items).unwrap_or_default());
        return Ok(0);
    }
    if items.is_empty() {
        println!("nothing needs review");
        return Ok(0);
    }
    for r in &items {
        println!("{}  {}", r.execution_id, r.state);
        println!(
            "  target          {} ({})",
            r.target,
            r.host_key.as_deref().unwrap_or("host key not seen")
        );
        println!("  command         {}", r.command.replace('\n', "\\n"));
        println!(
            "  intent          class {}, actor {}, scope {}",
            r.class,
            r.actor.as_deref().unwrap_or("-"),
            r.scope.as_deref().unwrap_or("-")
        );
        println!("  accepted        {}", r.accepted_at);
        println!(
            "  first dispatch  {} ({} dispatch{})",
            r.first_dispatched_at.as_deref().unwrap_or("never"),
            r.dispatches,
            if r.dispatches == 1 { "" } else { "es" }
        );
        println!("  known outcome   {}", r.known_outcome);
        if let Some(e) = &r.evidence {
            println!("  evidence        {e}");
        }
        println!("  not resent      {}", r.why_not_resent);
        println!(
            "  decide with     cairn resolve {} --as completed|failed|retry --reason TEXT",
            r.execution_id
        );
        println!();
    }
    Ok(0)
}

/// `cairn resolve`.
#[derive(Args, Debug)]
pub struct ResolveArgs {
    pub id: String,
    /// completed (it ran; you checked), failed (it did not run or had no effect), or retry
    /// (dispatch again under the same ID, only if the marker proves it never started).
    #[arg(long = "as")]
    pub resolution: crate::review::Resolution,
    /// What you checked: recorded as evidence.
    #[arg(long)]
    pub reason: String,
    /// Who decides (default: local:$USER).
    #[arg(long, env = "CAIRN_ACTOR")]
    pub actor: Option<String>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub common: Common,
}

pub async fn resolve(a: ResolveArgs) -> Result<i32, ExecError> {
    let id = ExecutionId::parse(&a.id).map_err(|e| ExecError::InvalidRequest(e.to_string()))?;
    let mut ex = a.common.executor()?;
    let by = a
        .actor
        .clone()
        .unwrap_or_else(|| crate::intent::local_actor("local"));
    let mut cap = crate::front::gateway::Capture {
        cap: 1 << 20,
        ..Default::default()
    };
    let o = ex
        .resolve(&id, a.resolution, &a.reason, &by, &mut cap)
        .await?;
    if a.json {
        println!("{}", crate::front::gateway::outcome_value(&o, Some(&cap)));
    } else {
        use std::io::Write;
        let _ = std::io::stdout().write_all(&cap.out);
        let _ = std::io::stderr().write_all(&cap.err);
        println!("{}", crate::front::gateway::summary(&o));
    }
    Ok(match o.state {
        State::Completed | State::Failed | State::Delivered => 0,
        _ => o.exit_code_for_cli(),
    })
}

/// `cairn sessions`.
#[derive(Args, Debug)]
pub struct SessionsArgs {
    #[arg(long, env = "CAIRN_JOURNAL")]
    pub journal: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

pub fn sessions(a: SessionsArgs) -> Result<i32, ExecError> {
    let path = a.journal.unwrap_or_else(Journal::default_path);
    let j = Journal::open(&path)?;
    let rows = j.sessions()?;
    if a.json {
        let arr: Vec<_> = rows
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).unwrap_or_default();
                v["execution_ids"] = j
                    .executions_of_session(&s.record.id)
                    .unwrap_or_default()
                    .into();
                v
            })
            .collect();
        println!("{}", serde_json::Value::Array(arr));
        return Ok(0);
    }
    println!(
        "{:<35} {:<6} {:<20} {:>7} {:<24} {:<24} EXECUTIONS",
        "SESSION", "KIND", "ACTOR", "PID", "STARTED", "ENDED"
    );
    for s in rows {
        println!(
            "{:<35} {:<6} {:<20} {:>7} {:<24} {:<24} {}",
            s.record.id,
            s.record.kind,
            s.record.actor,
            s.record.pid,
            s.record.started_at,
            s.ended_at.as_deref().unwrap_or("-"),
            s.executions
        );
    }
    Ok(0)
}

/// Options of the gateway servers (`serve`, `mcp`).
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// The actor every request of this server acts as (default: serve:$USER / mcp:$USER).
    #[arg(long, env = "CAIRN_ACTOR")]
    pub actor: Option<String>,
    /// Marker directory on the host (relative to the account's home).
    #[arg(long, env = "CAIRN_REMOTE_DIR", default_value = crate::options::DEFAULT_REMOTE_DIR)]
    pub remote_dir: String,
    /// Executions in flight sharing one SSH connection to a host, each on a session channel of
    /// its own. Keep it below the server's `MaxSessions` (OpenSSH: 10 by default); 1 gives every
    /// execution a connection of its own.
    #[arg(long, default_value_t = crate::pool::DEFAULT_PER_CONNECTION as u64,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub channels_per_connection: u64,
    /// Start dispatches through one long-lived exec per connection (the host script's session
    /// mode), which starts those that arrive together with one start guard and one flush:
    /// several times the throughput on a busy host. Applies to dispatches whose caller waits,
    /// without secrets, with a command of at most 4 KiB; others get an exec of their own.
    #[arg(long)]
    pub host_session: bool,
    /// Named operations to expose, each with its replay contract (docs/OPERATIONS.md); the
    /// file is checked as `cairn ops check` does, and refused if anything is found.
    #[arg(long, env = "CAIRN_OPERATIONS", value_name = "FILE")]
    pub operations: Option<PathBuf>,
    /// Expose the named operations alone: no `execute` (JSON-RPC), no `run_command` (MCP).
    #[arg(long)]
    pub operations_only: bool,
    #[command(flatten)]
    pub approve: ApproveArgs,
    #[command(flatten)]
    pub common: Common,
}

impl ServerArgs {
    pub fn config(&self, kind: &str) -> GatewayConfig {
        crate::journal::set_lease_for(self.common.lease_for);
        GatewayConfig {
            journal: self
                .common
                .journal
                .clone()
                .unwrap_or_else(Journal::default_path),
            connect: self.common.connect_options(),
            patience: crate::executor::Patience {
                reconnect_for: self.common.reconnect_for,
                ..Default::default()
            },
            intent_key: self.common.intent_key.clone(),
            actor: self
                .actor
                .clone()
                .unwrap_or_else(|| crate::intent::local_actor(kind)),
            approve: self.approve.approve.clone(),
            policy: self.approve.policy.clone(),
            remote_dir: self.remote_dir.clone(),
            session_id: None,
            transport: if kind == "mcp" { "mcp" } else { "jsonrpc" }.into(),
            pool: Some(crate::pool::Pool::new(
                self.channels_per_connection as usize,
            )),
            host_session: self.host_session,
            host_helper: self.common.host_helper,
            operations: None,
            operations_only: self.operations_only,
        }
    }

    /// [`ServerArgs::config`] with the operations file loaded and checked.
    pub fn config_with_operations(&self, kind: &str) -> Result<GatewayConfig, ExecError> {
        let mut cfg = self.config(kind);
        cfg.operations =
            crate::operations::call::for_server(self.operations.as_deref(), self.operations_only)?;
        Ok(cfg)
    }
}

/// `cairn serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Speak JSON-RPC 2.0 on stdin/stdout, one message per line (the only transport).
    #[arg(long, required = true)]
    pub stdio: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// `cairn mcp`.
#[derive(Args, Debug)]
pub struct McpArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub http: super::listen::HttpArgs,
}
