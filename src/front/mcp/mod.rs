//! `cairn mcp`: a Model Context Protocol server over stdio, on the official Rust SDK (`rmcp`);
//! with `--listen`, the same tools over Streamable HTTP ([`crate::front::http`]), where each request acts
//! as its bearer token's actor.
//!
//! Tools (each declares its input with a JSON schema):
//! - `run_command`: run a command on a host (or attach to the execution already doing the
//!   same thing); waits for the outcome unless `detach`.
//! - `execution_status`: the journal's record of an execution (optionally a fresh probe).
//! - `read_output`: an execution's stdout or stderr from a byte offset.
//! - with `--operations FILE`, one tool per named operation, its replay contract in its
//!   description and `_meta` (`src/front/mcp/operations.rs`); `--operations-only` drops `run_command`.
//!
//! Tool calls carry execution identity through intent matching: an agent that retries a
//! `tools/call` (after a timeout, a crash, a reconnect) with the same arguments has the same
//! intent fingerprint, so the retry attaches to the first execution instead of running the
//! command again. The MCP request id is recorded as the correlation ID. Results say in plain
//! words when the outcome is unknown, and when a result was recovered or attached rather than
//! freshly run; the full record is the structured content.
//!
//! Delivery: MCP gives the server no acknowledgement, so a result is recorded `delivered`
//! when the tool hands it to the transport. A client that vanished before reading it and
//! retries later starts a new execution once the first is delivered; a client that died
//! while the command ran (the usual case) attaches.

pub mod operations;
pub mod schema;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::evidence::SessionEvidence;
use crate::executor::ExecError;
use crate::front::gateway::{self, ExecuteParams, GatewayConfig, GatewayError};
pub(crate) use crate::front::tool_result::{result, tool_error};
use crate::id::ExecutionId;

/// `execution_status` input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusParams {
    /// The execution ID (`ex_…`) returned by run_command.
    pub execution_id: String,
    /// Also ask the host now (one short SSH exchange).
    #[serde(default)]
    pub probe: bool,
}

/// `read_output` input.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputParams {
    /// The execution ID (`ex_…`).
    pub execution_id: String,
    /// `stdout` (default) or `stderr`.
    #[serde(default)]
    pub stream: Option<String>,
    /// First byte to return (the previous call's next_offset).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Most bytes to return (default 1 MiB).
    #[serde(default)]
    pub limit: Option<u64>,
}

#[derive(Clone)]
pub struct CairnMcp {
    cfg: GatewayConfig,
    /// `run_command` calls run as tasks on these threads (as `cairn serve`'s `execute`).
    workers: std::sync::Arc<gateway::Workers>,
    /// Tasks' results and the closed-stream setting (src/front/tasks.rs).
    tasks: crate::front::tasks::TaskState,
    tool_router: ToolRouter<Self>,
}

fn correlation(id: &rmcp::model::RequestId) -> String {
    match serde_json::to_value(id) {
        Ok(Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => String::new(),
    }
}

/// Over HTTP, a caller reads only its own executions.
fn own(
    cfg: &GatewayConfig,
    caller: Option<&crate::front::caller::HttpCaller>,
    params: &Value,
) -> Result<(), GatewayError> {
    let id = params.get("execution_id").and_then(Value::as_str);
    match (
        caller,
        id.and_then(|s| crate::id::ExecutionId::parse(s).ok()),
    ) {
        (Some(c), Some(id)) => crate::front::caller::admit_read(cfg, c, &id),
        _ => Ok(()),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, GatewayError> + Send + 'static,
) -> Result<T, GatewayError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(GatewayError {
            code: -32603,
            message: format!("internal error: {e}"),
            data: None,
        })
    })
}

#[tool_router]
impl CairnMcp {
    pub fn new(cfg: GatewayConfig) -> Self {
        Self::with_workers(
            cfg,
            std::sync::Arc::new(gateway::Workers::start(gateway::WORKER_THREADS)),
        )
    }

    /// A server whose `run_command` calls run on `workers` (shared with other front ends).
    pub fn with_workers(cfg: GatewayConfig, workers: std::sync::Arc<gateway::Workers>) -> Self {
        let mut tool_router = Self::tool_router();
        if cfg.operations_only {
            tool_router.remove_route("run_command");
        }
        if let Some(ops) = &cfg.operations {
            operations::add_tools(&mut tool_router, ops);
        }
        CairnMcp {
            cfg,
            workers,
            tasks: Default::default(),
            tool_router,
        }
    }

    /// Tasks' state shared with the rest of the server (src/front/tasks.rs).
    pub fn with_tasks(mut self, t: crate::front::tasks::TaskState) -> Self {
        self.tasks = t;
        self
    }

    /// Run a command on a host over SSH, at most once per intent.
    #[tool(
        name = "run_command",
        description = "Run a shell command on a remote host over SSH, at most once. A retried \
                       call (same destination, command, class, scope, cwd, env; or the same \
                       execution_id) attaches to the earlier execution instead of running it \
                       again, also after a lost connection, a timeout or a restart of either \
                       side: the result then has attached=true and the earlier execution_id. \
                       It is therefore safe to send again, but not idempotent in itself: a new \
                       call with other arguments runs again. Waits for the exit status unless \
                       detach is true. certainty says how much is known: unknown means cairn \
                       cannot prove whether it ran (OUTCOME UNKNOWN): do not assume it ran or not.",
        annotations(
            title = "Run a command on a host (at most once)",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = true
        ),
        output_schema = schema::run_command()
    )]
    async fn run_command(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<ExecuteParams>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        let (cfg, corr, slot, p) = match self.admit(&ctx, p).await {
            Ok(x) => x,
            Err(e) => return Ok(tool_error(e).into()),
        };
        self.serve_call(&ctx, cfg, corr, slot, true, move |cfg, corr| async move {
            let (v, deliver) = gateway::execute(&cfg, p, Some(corr)).await?;
            Ok((v, deliver.into_iter().collect()))
        })
        .await
    }

    /// The journal's record of an execution.
    #[tool(
        name = "execution_status",
        description = "Status of an execution by ID: state (running, completed, failed, unknown, \
                       interrupted, ...), certainty, exit code, times, and whether it needs human \
                       review. probe=true also asks the host now (read-only there too).",
        annotations(
            title = "Execution status",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        ),
        output_schema = schema::execution_status()
    )]
    async fn execution_status(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<StatusParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let cfg = self.cfg.clone();
        let caller = crate::front::caller::caller_of(&ctx.extensions);
        let params = json!({"execution_id": p.execution_id, "probe": p.probe});
        Ok(
            match blocking(move || {
                own(&cfg, caller.as_ref(), &params)?;
                gateway::status(&cfg, &params)
            })
            .await
            {
                Ok(v) => result(v),
                Err(e) => tool_error(e),
            },
        )
    }

    /// Output from a byte offset.
    #[tool(
        name = "read_output",
        description = "Read an execution's stdout or stderr from a byte offset (as stored on the \
                       host). Returns data, next_offset, and eof once the command has finished \
                       and everything was read.",
        annotations(
            title = "Read an execution's output",
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        ),
        output_schema = schema::read_output()
    )]
    async fn read_output(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(p): Parameters<OutputParams>,
    ) -> Result<CallToolResult, ErrorData> {
        let cfg = self.cfg.clone();
        let caller = crate::front::caller::caller_of(&ctx.extensions);
        let params = json!({"execution_id": p.execution_id, "stream": p.stream.unwrap_or_else(|| "stdout".into()),
                            "offset": p.offset.unwrap_or(0), "limit": p.limit});
        let params = if params["limit"].is_null() {
            let mut p = params;
            p.as_object_mut().map(|m| m.remove("limit"));
            p
        } else {
            params
        };
        Ok(
            match blocking(move || {
                own(&cfg, caller.as_ref(), &params)?;
                gateway::output(&cfg, &params)
            })
            .await
            {
                Ok(mut v) => {
                    v["summary"] = format!(
                        "{} bytes of {} from offset {}; next_offset {}{}",
                        v["next_offset"].as_u64().unwrap_or(0) - v["offset"].as_u64().unwrap_or(0),
                        v["stream"].as_str().unwrap_or("stdout"),
                        v["offset"],
                        v["next_offset"],
                        if v["eof"] == true {
                            " (end of output)"
                        } else {
                            ""
                        }
                    )
                    .into();
                    result(v)
                }
                Err(e) => tool_error(e),
            },
        )
    }
}

impl CairnMcp {
    /// A named operation's tool (`src/front/mcp/operations.rs`): as `run_command` (a job that runs to
    /// its recorded outcome whatever the client does, a task when the client declares the
    /// extension and the call has one destination, a closed stream as `run_command`'s); over
    /// HTTP as the token's actor, in its scope, within its cap on calls in flight.
    pub(crate) async fn call_operation(
        &self,
        ctx: RequestContext<RoleServer>,
        name: String,
        args: serde_json::Map<String, Value>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        let mut cfg = self.cfg.clone();
        let mut corr = correlation(&ctx.id);
        let (mut scope, mut slot) = (None, None);
        if let Some(caller) = crate::front::caller::caller_of(&ctx.extensions) {
            cfg = caller.config(&self.cfg);
            corr = caller.call_correlation(&corr);
            if let Err(e) = crate::front::caller::admit_scope(&caller, &mut scope) {
                return Ok(tool_error(e).into());
            }
            match caller.slot() {
                Ok(s) => slot = Some(s),
                Err(e) => return Ok(tool_error(e).into()),
            }
        }
        // A task names one execution: a call on several destinations is answered inline.
        let one_destination = cfg.operations.as_deref().is_some_and(|file| {
            let opts = crate::operations::call::CallOptions {
                actor: cfg.actor.clone(),
                scope: scope.clone(),
                hosts: None,
                detach: false,
                remote_dir: cfg.remote_dir.clone(),
                correlation_id: None,
                session_id: None,
            };
            crate::operations::call::prepare(file, &name, &args, &opts)
                .is_ok_and(|p| p.runs.len() == 1)
        });
        self.serve_call(
            &ctx,
            cfg,
            corr,
            slot,
            one_destination,
            move |cfg, corr| async move {
                crate::operations::call::gateway_call(&cfg, &name, &args, scope, false, Some(corr))
                    .await
            },
        )
        .await
    }

    /// Serve one call whose `job` starts or attaches to executions (`run_command`, a named
    /// operation): the job runs on a worker thread inside the call's dispatch boundary
    /// (src/exec/claims/gate.rs) and its log span, and runs to its recorded outcome whatever the client
    /// does. A client that declared the tasks extension gets a task once the execution is
    /// accepted (`may_task`: the call has one execution). Otherwise the answer waits for the
    /// job, unless the request is cancelled first (its stream closed, `notifications/cancelled`):
    /// then nothing is answered, and the executions follow [`crate::front::tasks::stream_closed`].
    // Long: the submission, the choice between a task and a waited answer, and the race with
    // cancellation share the channels and the gate set up at its top.
    async fn serve_call<F, Fut>(
        &self,
        ctx: &RequestContext<RoleServer>,
        cfg: GatewayConfig,
        corr: String,
        slot: Option<crate::front::caller::Slot>,
        may_task: bool,
        job: F,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData>
    where
        F: FnOnce(GatewayConfig, String) -> Fut + Send + 'static,
        Fut:
            std::future::Future<Output = Result<(Value, Vec<ExecutionId>), GatewayError>> + 'static,
    {
        let as_task = may_task
            && ctx
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks());
        // One indexed read of the journal's last seq, done here: on the blocking pool, every
        // call in flight held a thread of its own (52 threads for 40 calls). The call's
        // correlation comes after it.
        let after = crate::front::tasks::last_seq(&cfg);
        let gate = crate::gate::Gate::new();
        let (job_cfg, job_corr, job_gate) = (cfg.clone(), corr.clone(), gate.clone());
        let results = self.tasks.results.clone();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
        // Every log line of the call names who asked and which request it was.
        let span = tracing::info_span!("call", actor = %cfg.actor, correlation = %corr);
        self.workers.submit(Box::new(move || {
            Box::pin(tracing::Instrument::instrument(
                crate::gate::scope(job_gate, async move {
                    let r = job(job_cfg, job_corr).await;
                    if let Ok((v, _)) = &r {
                        if let Some(id) = v["execution_id"].as_str() {
                            results.put(id, v.clone());
                            results.unwatch(id);
                        }
                    }
                    drop(slot);
                    let _ = tx.send(r);
                    let _ = done_tx.send(());
                }),
                span,
            ))
        }));
        if as_task {
            if let Some(id) =
                crate::front::tasks::wait_accepted(&cfg, &corr, after, &mut done_rx).await
            {
                self.tasks.results.watch_unless_done(id.as_str());
                let t = crate::front::tasks::get(
                    cfg.clone(),
                    &self.workers,
                    &self.tasks.results,
                    id.as_str(),
                )
                .await?;
                // The task as the journal has it now: a call that failed at first contact is
                // already `failed`, never reported as working.
                return Ok(rmcp::model::CreateTaskResult::new(t.task).into());
            }
        }
        let r = tokio::select! {
            r = &mut rx => r,
            _ = ctx.ct.cancelled() => {
                crate::front::tasks::stream_closed(cfg, &self.workers, &self.tasks.closed_stream,
                                            &gate, &corr, after).await;
                return Err(ErrorData::internal_error("the request was cancelled", None));
            }
        };
        let r = r.unwrap_or_else(|_| {
            Err(GatewayError {
                code: -32603,
                message: "internal error: the execution's task ended without an answer; its \
                          journal record says what happened"
                    .into(),
                data: None,
            })
        });
        Ok(match r {
            Ok((v, deliver)) => {
                if !deliver.is_empty() {
                    let _ = blocking(move || {
                        for id in &deliver {
                            gateway::delivered(&cfg, id);
                        }
                        Ok(())
                    })
                    .await;
                }
                result(v).into()
            }
            Err(e) => tool_error(e).into(),
        })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CairnMcp {
    fn get_info(&self) -> ServerConfig {
        let caps = ServerCapabilities::builder()
            .enable_tools()
            .enable_tasks()
            .build();
        ServerConfig::new(caps)
            .with_server_info(rmcp::model::Implementation::new(
                "cairn",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
            "cairn runs commands on remote hosts over SSH so that a retry never becomes a second \
             run. Call run_command again with the same arguments after a timeout or crash: it \
             attaches to the first execution. Treat OUTCOME UNKNOWN as unknown.",
        )
    }

    /// `tasks/get`: the execution's journal record (src/front/tasks.rs).
    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        let cfg = self.task_caller(&ctx, &request.task_id).await?;
        crate::front::tasks::get(cfg, &self.workers, &self.tasks.results, &request.task_id)
            .await
            .map(rmcp::model::GetTaskResult::new)
    }

    /// `tasks/cancel`: `cairn cancel` of the execution.
    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let cfg = self.task_caller(&ctx, &request.task_id).await?;
        crate::front::tasks::cancel(cfg, &self.workers, &request.task_id).await
    }
}

impl CairnMcp {
    /// Who a `run_command` acts as, its correlation, and (over HTTP) its token's scope and its
    /// slot among the actor's calls in flight.
    async fn admit(
        &self,
        ctx: &RequestContext<RoleServer>,
        mut p: ExecuteParams,
    ) -> Result<
        (
            GatewayConfig,
            String,
            Option<crate::front::caller::Slot>,
            ExecuteParams,
        ),
        GatewayError,
    > {
        let corr = correlation(&ctx.id);
        let Some(caller) = crate::front::caller::caller_of(&ctx.extensions) else {
            return Ok((self.cfg.clone(), corr, None, p));
        };
        let cfg = caller.config(&self.cfg);
        let corr = caller.call_correlation(&corr);
        let p = {
            let (cfg, caller) = (cfg.clone(), caller.clone());
            blocking(move || crate::front::caller::admit_execute(&cfg, &caller, &mut p).map(|()| p))
                .await?
        };
        let slot = caller.slot()?;
        Ok((cfg, corr, Some(slot), p))
    }

    /// The configuration a task request runs with; over HTTP, only the caller's own tasks.
    async fn task_caller(
        &self,
        ctx: &RequestContext<RoleServer>,
        task_id: &str,
    ) -> Result<GatewayConfig, ErrorData> {
        let Some(caller) = crate::front::caller::caller_of(&ctx.extensions) else {
            return Ok(self.cfg.clone());
        };
        let cfg = caller.config(&self.cfg);
        let (c2, id) = (cfg.clone(), task_id.to_owned());
        blocking(move || {
            let id = crate::id::ExecutionId::parse(&id)
                .map_err(|e| GatewayError::params(e.to_string()))?;
            crate::front::caller::admit_read(&c2, &caller, &id)
        })
        .await
        .map_err(|e| ErrorData::invalid_params(e.message, None))?;
        Ok(cfg)
    }
}

/// Serve MCP on stdin/stdout until the client leaves.
pub async fn main(mut cfg: GatewayConfig) -> Result<i32, ExecError> {
    cfg.start_session("mcp")?;
    cfg.sweep_takeovers();
    let server = CairnMcp::new(cfg.clone());
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ExecError::Setup(format!("mcp: {e}")))?;
    let r = running.waiting().await;
    cfg.end_session(SessionEvidence::Ended {
        reason: &format!("{r:?}"),
    });
    // The client is gone: stop now. Calls still running stay in the journal as they are
    // (dispatched/running, never delivered), so a reconnected client's retry attaches.
    std::process::exit(0)
}
