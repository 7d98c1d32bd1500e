//! Running a call of a named operation: one execution per destination, through the executor,
//! exactly as `cairn run` would run its command, with the intent the contract defines.
//!
//! [`prepare`] checks everything the caller gave (the operation, each argument, the destinations)
//! before any host is contacted; [`run`] then runs the executions, concurrently when there are
//! several, each with an executor of its own (its own journal handle and connection).

use futures::future::join_all;
use serde_json::{json, Value};

use super::contract::{Approval, OperationsFile};
use crate::approve::{ApprovalRequest, Approver, Decision, Prompt};
use crate::executor::{ExecError, Executor, Outcome, RunRequest};
use crate::front::gateway::Capture;
use crate::id::ExecutionId;
use crate::intent::Intent;

/// What the caller gives besides the operation's own arguments.
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    pub actor: String,
    pub scope: Option<String>,
    /// Narrow the destinations (the CLI's `--hosts` / `--inventory`); each is checked against
    /// the contract's rule.
    pub hosts: Option<Vec<String>>,
    pub detach: bool,
    pub remote_dir: String,
    pub correlation_id: Option<String>,
    pub session_id: Option<String>,
}

/// A checked call: one request and intent per destination. Nothing has been contacted.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub operation: String,
    pub contract: String,
    pub approval: Approval,
    pub runs: Vec<(RunRequest, Intent)>,
}

/// Check a call of `name` with `args` (unknown arguments, types, patterns, destinations).
pub fn prepare(
    file: &OperationsFile,
    name: &str,
    args: &serde_json::Map<String, Value>,
    o: &CallOptions,
) -> Result<Prepared, String> {
    let op = file.get(name)?;
    let call = op.call(args)?;
    prepare_call(file, &call, o)
}

/// [`prepare`] for a call already made canonical (the CLI's `key=value` words).
pub fn prepare_call(
    file: &OperationsFile,
    call: &super::Call<'_>,
    o: &CallOptions,
) -> Result<Prepared, String> {
    let hosts = call.destinations(file, o.hosts.as_deref())?;
    let command = call.command();
    let mut runs = Vec::new();
    for h in hosts {
        let mut intent = call.intent(&o.actor, o.scope.clone());
        intent.correlation_id = o.correlation_id.clone();
        intent.session_id = o.session_id.clone();
        intent.validate()?;
        let req = RunRequest {
            destination: h,
            command: command.clone(),
            id: None,
            timeout_secs: call.timeout_secs(),
            detach: o.detach,
            remote_dir: o.remote_dir.clone(),
        };
        runs.push((req, intent));
    }
    Ok(Prepared {
        operation: call.op.name.clone(),
        contract: call.op.digest(),
        approval: call.op.approval,
        runs,
    })
}

/// The approver for a new execution of an operation: its rule on top of the process's own.
pub fn approver(
    rule: Approval,
    base: Box<dyn Approver>,
    has_policy: bool,
    operation: &str,
) -> Box<dyn Approver> {
    Box::new(RuleApprover {
        rule,
        base,
        has_policy,
        operation: operation.to_owned(),
    })
}

struct RuleApprover {
    rule: Approval,
    base: Box<dyn Approver>,
    has_policy: bool,
    operation: String,
}

impl Approver for RuleApprover {
    fn decide(&mut self, req: &ApprovalRequest<'_>) -> Decision {
        match self.rule {
            Approval::Caller => self.base.decide(req),
            Approval::Policy if !self.has_policy => Decision {
                allow: false,
                by: format!("operation {}", self.operation),
                rule: Some("approval = \"policy\"".into()),
                reason:
                    "its contract needs a policy decision, and this process has no --policy file"
                        .into(),
            },
            Approval::Policy => self.base.decide(req),
            Approval::Prompt => {
                let d = self.base.decide(req);
                if !d.allow {
                    return d;
                }
                Prompt.decide(req)
            }
        }
    }
}

/// One destination's result.
pub struct HostResult {
    pub destination: String,
    pub result: Result<Outcome, ExecError>,
    pub output: Capture,
}

/// Run every execution of `p`, concurrently; `executor` makes a ready executor (journal,
/// connection options, approver, key, session) for each.
pub async fn run(
    p: &Prepared,
    executor: &dyn Fn() -> Result<Executor, ExecError>,
    output_cap: usize,
) -> Vec<HostResult> {
    let jobs = p.runs.iter().cloned().map(|(req, intent)| async move {
        let destination = req.destination.clone();
        let mut output = Capture {
            cap: output_cap,
            ..Capture::default()
        };
        let result = match executor() {
            Ok(mut ex) => ex.execute(req, intent, &mut output).await,
            Err(e) => Err(e),
        };
        HostResult {
            destination,
            result,
            output,
        }
    });
    join_all(jobs).await
}

/// The executions whose result a response delivers.
pub fn deliverable(results: &[HostResult]) -> Vec<ExecutionId> {
    results
        .iter()
        .filter_map(|r| r.result.as_ref().ok())
        .filter(|o| o.state.has_result())
        .filter_map(|o| ExecutionId::parse(&o.execution_id).ok())
        .collect()
}

/// The result as gateways return it: with one destination, that execution's outcome (as
/// `execute` returns it); with several, `results` holds one per destination. Both name the
/// operation and its contract digest. With one destination whose execution ended in an error,
/// that error.
pub fn result_value<'r>(p: &Prepared, results: &'r [HostResult]) -> Result<Value, &'r ExecError> {
    let one = |r: &HostResult| match &r.result {
        Ok(o) => crate::front::gateway::outcome_value(o, Some(&r.output)),
        Err(e) => json!({"destination": r.destination, "error": e.to_string(),
                         "summary": format!("{}: not run: {e}", r.destination)}),
    };
    if let [r] = results {
        if let Err(e) = &r.result {
            return Err(e);
        }
        let mut v = one(r);
        v["operation"] = p.operation.clone().into();
        v["contract"] = p.contract.clone().into();
        return Ok(v);
    }
    let values: Vec<Value> = results.iter().map(one).collect();
    let summary: Vec<String> = values
        .iter()
        .map(|v| v["summary"].as_str().unwrap_or("").to_owned())
        .collect();
    Ok(json!({
        "operation": p.operation,
        "contract": p.contract,
        "summary": format!("{} on {} destinations: {}", p.operation, results.len(), summary.join(" | ")),
        "results": values,
    }))
}

/// A call through a gateway (JSON-RPC `call`, an operation's MCP tool), as the server's actor:
/// the value to answer, and the executions whose result it delivers.
pub async fn gateway_call(
    cfg: &crate::front::gateway::GatewayConfig,
    name: &str,
    args: &serde_json::Map<String, Value>,
    scope: Option<String>,
    detach: bool,
    correlation_id: Option<String>,
) -> Result<(Value, Vec<ExecutionId>), crate::front::gateway::GatewayError> {
    use crate::front::gateway::GatewayError;
    let empty = OperationsFile::empty();
    let file = cfg.operations.as_deref().unwrap_or(&empty);
    let opts = CallOptions {
        actor: cfg.actor.clone(),
        scope,
        hosts: None,
        detach,
        remote_dir: cfg.remote_dir.clone(),
        correlation_id,
        session_id: cfg.session_id.clone(),
    };
    let p = prepare(file, name, args, &opts).map_err(GatewayError::params)?;
    let make = || -> Result<Executor, ExecError> {
        let mut ex = cfg.build_executor()?;
        let base = std::mem::replace(&mut ex.approver, Box::new(crate::approve::Deny));
        ex.approver = approver(p.approval, base, cfg.policy.is_some(), &p.operation);
        Ok(ex)
    };
    let results = run(&p, &make, crate::front::gateway::INLINE_OUTPUT_CAP).await;
    let v = result_value(&p, &results).map_err(GatewayError::exec)?;
    Ok((v, deliverable(&results)))
}

/// `operations` (JSON-RPC): every operation with its description, input schema and contract.
pub fn list(file: &OperationsFile) -> Value {
    let ops: Vec<Value> = file
        .operations
        .values()
        .map(|op| {
            json!({
                "name": op.name,
                "description": super::doc::tool_description(op),
                "input_schema": super::doc::input_schema(op),
                "contract": super::doc::contract_json(op),
            })
        })
        .collect();
    json!({"source": file.source, "operations": ops})
}

/// The operations file for a server: `--operations FILE`, else `$CAIRN_OPERATIONS`; checked.
/// `--operations-only` without a file is refused (it would expose nothing).
pub fn for_server(
    path: Option<&std::path::Path>,
    only: bool,
) -> Result<Option<std::sync::Arc<OperationsFile>>, ExecError> {
    match path {
        Some(p) => super::load(p)
            .map(|f| Some(std::sync::Arc::new(f)))
            .map_err(ExecError::from),
        None if only => Err(ExecError::InvalidRequest(
            "--operations-only needs --operations FILE (or CAIRN_OPERATIONS)".into(),
        )),
        None => Ok(None),
    }
}
