//! The command-line parts of named operations: `cairn op NAME key=value …` and
//! `cairn ops check|doc FILE` (docs/OPERATIONS.md).

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::gateway::ApproveArgs;
use super::Common;
use crate::evidence::SessionEvidence;
use crate::executor::{ExecError, Executor, OutputSink, EXIT_NOT_DISPATCHED, EXIT_UNKNOWN};
use crate::operations::call::{self, CallOptions, HostResult, Prepared};
use crate::operations::OperationsFile;
use crate::state::State;

/// `cairn op`.
#[derive(Args, Debug)]
pub struct OpArgs {
    /// The operation's name.
    pub name: String,
    /// Its arguments, as key=value words (omitted ones take their defaults).
    #[arg(value_name = "KEY=VALUE")]
    pub args: Vec<String>,
    /// The operations file.
    #[arg(long, env = "CAIRN_OPERATIONS", value_name = "FILE")]
    pub operations: PathBuf,
    /// Run on these of the operation's destinations only (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "HOST,…")]
    pub hosts: Vec<String>,
    /// Run on the destinations listed in FILE (one a line), each allowed by the operation.
    #[arg(long, value_name = "FILE")]
    pub inventory: Option<PathBuf>,
    /// Intent scope: a task, change ticket or conversation the call belongs to.
    #[arg(long, env = "CAIRN_SCOPE")]
    pub scope: Option<String>,
    /// Who asks (default: local:$USER).
    #[arg(long, env = "CAIRN_ACTOR")]
    pub actor: Option<String>,
    /// Return once the command is durably started; print its execution ID.
    #[arg(long)]
    pub detach: bool,
    /// Marker directory on the host (relative to the account's home).
    #[arg(long, env = "CAIRN_REMOTE_DIR", default_value = ".cairn")]
    pub remote_dir: String,
    /// Print one JSON object describing the outcome instead of the output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub approve: ApproveArgs,
    #[command(flatten)]
    pub common: Common,
}

/// `cairn ops …`
#[derive(Subcommand, Debug)]
pub enum OpsCommand {
    /// Check an operations file: every unsafe or ambiguous contract, with its line and a fix.
    Check {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Write the contracts of an operations file as Markdown, one section per operation.
    Doc { file: PathBuf },
}

/// `cairn ops check|doc`.
pub fn ops(cmd: OpsCommand) -> Result<i32, ExecError> {
    let (file, check_json) = match &cmd {
        OpsCommand::Check { file, json } => (file, *json),
        OpsCommand::Doc { file } => (file, false),
    };
    let text = std::fs::read_to_string(file)
        .map_err(|e| ExecError::Setup(format!("{}: {e}", file.display())))?;
    let shown = file.display().to_string();
    let parsed = OperationsFile::parse(&text, &shown);
    match (cmd, parsed) {
        (OpsCommand::Check { .. }, r) if check_json => {
            let findings = r.as_ref().err().cloned().unwrap_or_default();
            let ops = r.map(|f| f.operations.len()).unwrap_or(0);
            println!(
                "{}",
                serde_json::json!({"file": shown, "ok": findings.is_empty(), "operations": ops,
                                   "findings": findings})
            );
            Ok(if findings.is_empty() { 0 } else { 1 })
        }
        (OpsCommand::Check { .. }, Ok(f)) => {
            println!(
                "{shown}: {} operation{}, no findings",
                f.operations.len(),
                if f.operations.len() == 1 { "" } else { "s" }
            );
            Ok(0)
        }
        (_, Err(findings)) => {
            println!("{}", crate::operations::check::render(&shown, &findings));
            eprintln!(
                "cairn: {shown}: {} finding{}; nothing in this file can be used until they are fixed",
                findings.len(),
                if findings.len() == 1 { "" } else { "s" }
            );
            Ok(1)
        }
        (OpsCommand::Doc { .. }, Ok(f)) => {
            print!("{}", crate::operations::doc::markdown(&f));
            Ok(0)
        }
    }
}

/// Streams one execution's output to this process's stdout/stderr.
struct Stream;

impl OutputSink for Stream {
    fn stdout(&mut self, d: &[u8]) -> std::io::Result<()> {
        let mut o = std::io::stdout().lock();
        o.write_all(d)?;
        o.flush()
    }
    fn stderr(&mut self, d: &[u8]) -> std::io::Result<()> {
        let mut e = std::io::stderr().lock();
        e.write_all(d)?;
        e.flush()
    }
}

/// `cairn op NAME key=value …`: everything is checked before any host is contacted.
pub async fn op(a: OpArgs) -> Result<i32, ExecError> {
    let file = crate::operations::load(&a.operations)?;
    let op = file.get(&a.name).map_err(ExecError::InvalidRequest)?;
    let c = op
        .call_from_pairs(&a.args)
        .map_err(ExecError::InvalidRequest)?;
    let mut hosts = a.hosts.clone();
    if let Some(p) = &a.inventory {
        let text = std::fs::read_to_string(p)
            .map_err(|e| ExecError::Setup(format!("--inventory {}: {e}", p.display())))?;
        hosts.extend(crate::fleet::parse_inventory(&text));
    }
    let actor = a
        .actor
        .clone()
        .unwrap_or_else(|| crate::intent::local_actor("local"));
    let opts = CallOptions {
        actor: actor.clone(),
        scope: a.scope.clone(),
        hosts: (!hosts.is_empty() || a.inventory.is_some()).then_some(hosts),
        detach: a.detach,
        remote_dir: a.remote_dir.clone(),
        correlation_id: None,
        session_id: None,
    };
    let p = call::prepare_call(&file, &c, &opts).map_err(ExecError::InvalidRequest)?;
    let mut first = a.common.executor()?;
    let session = super::gateway::prepare(&mut first, &a.approve, "cli", &actor)?;
    let make = || -> Result<Executor, ExecError> {
        let base = crate::approve::from_flags(
            &a.approve.approve,
            a.approve.policy.as_deref(),
            "local-cli",
        )?;
        crate::runner::ExecutorBuilder::host(&a.common.host_options())
            .approver(call::approver(
                p.approval,
                base,
                a.approve.policy.is_some(),
                &p.operation,
            ))
            .session(Some(session.clone()))
            .build()
    };
    let code = if p.runs.len() == 1 && !a.json {
        one_streamed(&p, &make, a.detach).await
    } else {
        let results = call::run(&p, &make, 1 << 20).await;
        many(&p, &results, a.json, &mut first)
    };
    let _ = first.end_session(
        &session,
        SessionEvidence::EndedOperation {
            operation: &p.operation,
        },
    );
    code
}

/// One destination, output streamed as it arrives (as `cairn run`).
async fn one_streamed(
    p: &Prepared,
    make: &dyn Fn() -> Result<Executor, ExecError>,
    detach: bool,
) -> Result<i32, ExecError> {
    let (req, intent) = p.runs[0].clone();
    let mut ex = make()?;
    let o = ex.execute(req, intent, &mut Stream).await?;
    if o.attached {
        eprintln!(
            "cairn: same call of {} as execution {} ({}): attached to it; it was not run again",
            p.operation, o.execution_id, o.state
        );
    }
    if detach && matches!(o.state, State::Running | State::Dispatched) {
        println!("{}", o.execution_id);
        return Ok(0);
    }
    if !matches!(o.state, State::Completed | State::Delivered) {
        eprintln!("cairn: {}", crate::front::gateway::summary(&o));
    }
    let _ = std::io::stdout().flush();
    deliver(&mut ex, &o);
    Ok(o.exit_code_for_cli())
}

fn deliver(ex: &mut Executor, o: &crate::executor::Outcome) {
    if o.state.has_result() {
        if let Ok(id) = crate::id::ExecutionId::parse(&o.execution_id) {
            if let Err(e) = ex.mark_delivered(&id, "cli") {
                tracing::warn!("cairn: recording delivery of {id}: {e}");
            }
        }
    }
}

/// Several destinations (or `--json`): each host's output after it, then one summary line
/// per host; or one JSON object.
fn many(
    p: &Prepared,
    results: &[HostResult],
    json: bool,
    ex: &mut Executor,
) -> Result<i32, ExecError> {
    if json {
        let v = match call::result_value(p, results) {
            Ok(v) => v,
            Err(e) => {
                // As `cairn` ends on any error (its message, its exit code), without moving the
                // error out of the results.
                eprintln!("cairn: {e}");
                return Ok(e.exit_code());
            }
        };
        println!("{}", serde_json::to_string(&v).unwrap_or_default());
    } else {
        for r in results {
            println!("== {} ==", r.destination);
            let _ = std::io::stdout().write_all(&r.output.out);
            let _ = std::io::stderr().write_all(&r.output.err);
            match &r.result {
                Ok(o) => println!("{}: {}", r.destination, crate::front::gateway::summary(o)),
                Err(e) => println!("{}: not run: {e}", r.destination),
            }
        }
    }
    let _ = std::io::stdout().flush();
    let (mut worst, mut dispatched) = (0, false);
    for r in results {
        match &r.result {
            Ok(o) => {
                deliver(ex, o);
                dispatched |= o.state != State::Failed && o.state != State::Rejected;
                let code = o.exit_code_for_cli();
                worst = match (worst, code) {
                    (EXIT_UNKNOWN, _) | (_, EXIT_UNKNOWN) => EXIT_UNKNOWN,
                    (w, 0) => w,
                    (_, c) if results.len() == 1 => c,
                    _ => 1,
                };
            }
            Err(_) => worst = if worst == EXIT_UNKNOWN { worst } else { 1 },
        }
    }
    if !dispatched {
        return Ok(EXIT_NOT_DISPATCHED);
    }
    Ok(worst)
}
