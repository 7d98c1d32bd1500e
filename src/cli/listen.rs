//! The command-line parts of the HTTP front: `cairn mcp --listen …`'s flags, and
//! `cairn token add|ls|revoke`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::executor::ExecError;
use crate::front::http::HttpOptions;
use crate::journal::Journal;
use crate::options::parse_duration;

/// `cairn mcp`'s HTTP flags.
#[derive(Args, Debug, Clone)]
pub struct HttpArgs {
    /// Serve MCP over Streamable HTTP (at /mcp, with JSON-RPC at /rpc) on ADDR instead of
    /// stdio; every request needs a bearer token (`cairn token add`).
    #[arg(long, value_name = "ADDR", num_args = 0..=1,
          default_missing_value = crate::front::http::DEFAULT_LISTEN)]
    pub listen: Option<SocketAddr>,
    /// Listen on an address that is not loopback (without it, such an address is refused).
    #[arg(long, requires = "listen")]
    pub allow_remote: bool,
    /// A Host name clients use to reach this server, besides the defaults (repeatable).
    #[arg(long = "allow-host", value_name = "HOST", requires = "listen")]
    pub allow_hosts: Vec<String>,
    /// A browser origin allowed to call (e.g. https://app.example.com; repeatable). Requests
    /// with any other Origin header are refused (DNS rebinding).
    #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "listen")]
    pub allow_origins: Vec<String>,
    /// The largest request body accepted, in bytes.
    #[arg(long, default_value_t = crate::front::http::DEFAULT_MAX_BODY, requires = "listen")]
    pub max_body: usize,
    /// Calls in flight per actor (tools/call, execute, attach); past it a call is refused.
    #[arg(long, default_value_t = crate::front::http::DEFAULT_MAX_IN_FLIGHT as u64, requires = "listen",
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub max_in_flight: u64,
    /// An operation class whose executions are cancelled (as `cairn cancel`) when the caller's
    /// response stream closes before the result (repeatable). Others keep running: a transport
    /// event never kills a dispatched command by default (docs/GATEWAYS.md).
    #[arg(
        long = "cancel-on-closed-stream",
        value_name = "CLASS",
        requires = "listen"
    )]
    pub cancel_on_closed_stream: Vec<crate::intent::OpClass>,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, value_name = "PEM", requires_all = ["listen", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (keep it readable by this user only).
    #[arg(long, value_name = "PEM", requires_all = ["listen", "tls_cert"])]
    pub tls_key: Option<PathBuf>,
}

impl HttpArgs {
    /// The HTTP options, or `None` for stdio. `fixed_actor`: `--actor` was given (meaningless
    /// over HTTP, where each request acts as its token's actor).
    pub fn options(&self, fixed_actor: bool) -> Result<Option<HttpOptions>, ExecError> {
        let Some(listen) = self.listen else {
            return Ok(None);
        };
        if fixed_actor {
            return Err(ExecError::InvalidRequest(
                "--actor (or CAIRN_ACTOR) with --listen: over HTTP each request acts as the actor \
                 of its bearer token (cairn token add ACTOR); drop --actor"
                    .into(),
            ));
        }
        if !listen.ip().is_loopback() && !self.allow_remote {
            return Err(ExecError::Refused(format!(
                "--listen {listen} is not a loopback address: add --allow-remote to serve other \
                 machines (behind TLS: see docs/GATEWAYS.md)"
            )));
        }
        Ok(Some(HttpOptions {
            listen,
            allow_hosts: self.allow_hosts.clone(),
            allow_origins: self.allow_origins.clone(),
            max_body_bytes: self.max_body,
            max_in_flight_per_actor: self.max_in_flight as usize,
            cancel_on_closed_stream: self.cancel_on_closed_stream.clone(),
            tls: self.tls_cert.clone().zip(self.tls_key.clone()),
        }))
    }
}

/// `cairn token …`.
#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Make a token for ACTOR: printed once, stored only as a hash.
    Add {
        actor: String,
        /// Requests with this token act only in intent scopes starting with this.
        #[arg(long)]
        scope_prefix: Option<String>,
        /// The token stops working after this long (e.g. 30d, 12h).
        #[arg(long, value_parser = parse_duration)]
        expires: Option<Duration>,
        #[arg(long, env = "CAIRN_JOURNAL")]
        journal: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The tokens (never the tokens themselves): ID, actor, scope prefix, created, expiry,
    /// revocation.
    Ls {
        #[arg(long, env = "CAIRN_JOURNAL")]
        journal: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its ID (`tk_…`): refused from the next request on.
    Revoke {
        id: String,
        #[arg(long, env = "CAIRN_JOURNAL")]
        journal: Option<PathBuf>,
    },
}

fn open(journal: &Option<PathBuf>) -> Result<Journal, ExecError> {
    Ok(Journal::open(
        &journal.clone().unwrap_or_else(Journal::default_path),
    )?)
}

pub fn token(c: TokenCommand) -> Result<i32, ExecError> {
    match c {
        TokenCommand::Add {
            actor,
            scope_prefix,
            expires,
            journal,
            json,
        } => {
            let mut j = open(&journal)?;
            let (t, rec) = crate::front::token::add(&mut j, &actor, scope_prefix, expires)?;
            if json {
                let mut v = serde_json::to_value(&rec).unwrap_or_default();
                v["token"] = t.into();
                println!("{v}");
            } else {
                println!("{t}");
                eprintln!(
                    "cairn: token {} for actor {}{}; shown once, stored only as a hash",
                    rec.id,
                    rec.actor,
                    rec.expires_at
                        .as_deref()
                        .map(|e| format!(", expires {e}"))
                        .unwrap_or_default()
                );
            }
            Ok(0)
        }
        TokenCommand::Ls { journal, json } => {
            let j = open(&journal)?;
            let rows = j.tokens()?;
            if json {
                println!("{}", serde_json::to_string(&rows).unwrap_or_default());
                return Ok(0);
            }
            println!(
                "{:<20} {:<24} {:<16} {:<24} {:<24} REVOKED",
                "ID", "ACTOR", "SCOPE PREFIX", "CREATED", "EXPIRES"
            );
            for t in rows {
                println!(
                    "{:<20} {:<24} {:<16} {:<24} {:<24} {}",
                    t.id,
                    t.actor,
                    t.scope_prefix.as_deref().unwrap_or("-"),
                    t.created_at,
                    t.expires_at.as_deref().unwrap_or("never"),
                    t.revoked_at.as_deref().unwrap_or("-")
                );
            }
            Ok(0)
        }
        TokenCommand::Revoke { id, journal } => {
            let mut j = open(&journal)?;
            if j.revoke_token(&id)? {
                println!("{id} revoked");
                Ok(0)
            } else {
                Err(ExecError::InvalidRequest(format!(
                    "no token {id} that is not revoked already (cairn token ls)"
                )))
            }
        }
    }
}
