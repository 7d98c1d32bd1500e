//! The gateway-facing operations shared by `cairn serve --stdio` (JSON-RPC 2.0) and
//! `cairn mcp` (Model Context Protocol): execute, status, output, attach, recover, review,
//! resolve. Each call opens its own journal handle and executor; the quick ones drive it on the
//! calling thread with [`block_on`] (the process's runtime, [`crate::rt`]), and `execute` /
//! `attach` are futures that the servers run as tasks on a few threads ([`Workers`]). The journal's
//! transactions (and intent matching's `BEGIN IMMEDIATE`) keep concurrent calls honest. The
//! calls share SSH connections (a [`crate::pool::Pool`], several executions per connection
//! on channels of their own) and SQLite connections (leased per journal operation).
//!
//! Parameters and results are JSON; `docs/GATEWAYS.md` documents them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::evidence::SessionEvidence;
use crate::executor::{ExecError, Executor, Outcome, Patience, RunRequest};
use crate::id::ExecutionId;
use crate::intent::{OpClass, OperationSpec};
use crate::journal::Journal;
use crate::options::ApproveOptions;
use crate::runner::ExecutorBuilder;
use crate::ssh::ConnectOptions;

/// Most output bytes returned inline by `execute` / `attach` (each stream); `output` pages.
pub const INLINE_OUTPUT_CAP: usize = 1 << 20;

/// Everything a gateway call needs to build an executor.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    pub journal: PathBuf,
    pub connect: ConnectOptions,
    pub patience: Patience,
    pub intent_key: Option<PathBuf>,
    /// The actor every request of this server acts as.
    pub actor: String,
    /// `allow`, `deny`, `prompt` (prompt makes no sense without a terminal: it denies).
    pub approve: String,
    pub policy: Option<PathBuf>,
    pub remote_dir: String,
    pub session_id: Option<String>,
    /// Recorded as who the result was delivered to (`jsonrpc`, `mcp`).
    pub transport: String,
    /// SSH connections shared by this server's executions (`None`: each connects for itself).
    pub pool: Option<std::sync::Arc<crate::pool::Pool>>,
    /// Dispatch through host sessions (`--host-session`; needs `pool`).
    pub host_session: bool,
    /// Which host implementation runs the marker protocol (`--host-helper`).
    pub host_helper: crate::host_helper::HostHelper,
    /// Named operations exposed as `call` / MCP tools (`--operations FILE`).
    pub operations: Option<std::sync::Arc<crate::operations::OperationsFile>>,
    /// Expose the named operations alone: no `execute`, no `run_command`.
    pub operations_only: bool,
}

/// An error with a JSON-RPC code.
#[derive(Debug, Clone)]
pub struct GatewayError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl GatewayError {
    pub fn params(m: impl Into<String>) -> Self {
        GatewayError {
            code: -32602,
            message: m.into(),
            data: None,
        }
    }
    /// The answer to an operation that ended with `e`: its code from
    /// [`ExecError::rpc_code`], its message as shown.
    pub fn exec(e: &ExecError) -> Self {
        let code = e.rpc_code();
        // Past the dispatch boundary the caller must learn which execution to ask about,
        // and that it was sent: never a reason to send it again.
        let data = e.unsettled_id().map(
            |id| serde_json::json!({"execution_id": id, "dispatched": true, "state": "unknown"}),
        );
        GatewayError {
            code,
            message: e.to_string(),
            data,
        }
    }
}

impl From<ExecError> for GatewayError {
    fn from(e: ExecError) -> Self {
        GatewayError::exec(&e)
    }
}

type GResult<T> = Result<T, GatewayError>;

impl GatewayConfig {
    pub fn executor(&self) -> GResult<Executor> {
        Ok(self.build_executor()?)
    }

    /// [`GatewayConfig::executor`], its error as it is (for callers that answer with it later).
    pub fn build_executor(&self) -> Result<Executor, ExecError> {
        let approve = ApproveOptions {
            mode: self.approve.clone(),
            policy: self.policy.clone(),
        };
        ExecutorBuilder::new(&self.journal)
            .connect(self.connect.clone())
            .patience(self.patience.clone())
            .intent_key(self.intent_key.clone())
            .session(self.session_id.clone())
            .pool(self.pool.clone())
            .host_session(self.host_session)
            .host_helper(self.host_helper)
            .approve(&approve, &self.actor)
            .build()
    }

    /// On a shared (PostgreSQL) journal, take over the executions of replicas whose lease
    /// expired, without waiting for a caller to retry: every third of the lease, a thread
    /// claims a few (`FOR UPDATE SKIP LOCKED`, so replicas sweeping together take different
    /// ones) and applies the recovery table to each on a thread of its own (reattach and wait
    /// for the result, collect the stored one, or `unknown`/`interrupted`). The same thread
    /// picks up the executions this replica owns that no call of this process has driven for a
    /// lease (see [`pick_up_undriven`]). Nothing on a SQLite file, where `cairn recover` does
    /// it.
    pub fn sweep_takeovers(&self) {
        if !crate::journal::is_postgres_url(&self.journal.to_string_lossy()) {
            return;
        }
        let cfg = self.clone();
        let every = (crate::journal::lease_for() / 3).max(Duration::from_millis(100));
        std::thread::spawn(move || {
            let mut undriven = BTreeMap::new();
            loop {
                std::thread::sleep(every);
                let mut j = match Journal::open(&cfg.journal) {
                    Ok(j) => j,
                    Err(e) => {
                        tracing::warn!("cairn: looking for executions to take over: {e}");
                        continue;
                    }
                };
                match j.take_over(None, 8) {
                    Ok(taken) => cfg.recover_taken(taken),
                    Err(e) => tracing::warn!("cairn: looking for executions to take over: {e}"),
                }
                if let Err(e) = cfg.pick_up_undriven(&j, &mut undriven) {
                    tracing::warn!("cairn: looking for executions no call drives: {e}");
                }
            }
        });
    }

    /// Recover each execution just taken over on a thread of its own.
    fn recover_taken(&self, taken: Vec<(ExecutionId, crate::journal::TakeOver)>) {
        for (id, t) in taken {
            let crate::journal::TakeOver::Taken { from, epoch } = t else {
                continue;
            };
            tracing::info!(
                "cairn: {id}: the lease of its owner {from} expired; this replica took it \
                 over (epoch {epoch}) and recovers it"
            );
            // A caller of this replica that took it over drives it already.
            let Some(driving) = crate::executor::drive_taken(&id) else {
                continue;
            };
            self.drive_on_thread(driving, id, "after takeover", |mut ex, id| async move {
                ex.recover_owned(&id, true).await.map(Some)
            });
        }
    }

    /// Drive `id` on a thread of its own with a new executor, holding `driving` until done,
    /// and log how it ended (`Ok(None)`: left alone).
    fn drive_on_thread<F, Fut>(
        &self,
        driving: crate::executor::Driving,
        id: ExecutionId,
        what: &'static str,
        drive: F,
    ) where
        F: FnOnce(Executor, ExecutionId) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Option<crate::executor::Outcome>, ExecError>>,
    {
        let cfg = self.clone();
        std::thread::spawn(move || {
            let _driving = driving;
            let r = cfg
                .executor()
                .map_err(|e| e.message)
                .and_then(|ex| block_on(drive(ex, id.clone())).map_err(|e| e.to_string()));
            match r {
                Ok(Some(o)) => tracing::info!("cairn: {id} recovered {what}: {}", o.state),
                Ok(None) => {}
                Err(e) => tracing::warn!("cairn: recovering {id} {what}: {e}"),
            }
        });
    }

    /// The owner's half of the sweep: an execution this replica owns, not settled, that no
    /// call of this process drives (or is taking towards its dispatch) would otherwise wait for
    /// a retry that reaches this replica, and callers attached to it on other replicas would
    /// wait with it, since this replica's lease stays current. Once one has gone undriven for a
    /// whole lease (seen so at every sweep: a momentary gap between two calls is not enough),
    /// this replica picks it up on a thread of its own and applies the recovery table, as after
    /// a takeover ([`Executor::redrive_owned`]: a `redrive` event, at most
    /// [`crate::executor::MAX_REDRIVES`] times per execution). `undriven` remembers since when
    /// each was seen undriven, or that it is left alone (`None`: detached, `unknown`, or
    /// picked up too often).
    fn pick_up_undriven(
        &self,
        j: &Journal,
        undriven: &mut BTreeMap<ExecutionId, Option<std::time::Instant>>,
    ) -> Result<(), crate::journal::JournalError> {
        let grace = crate::journal::lease_for();
        let mine = j.owned_unsettled()?;
        let now = std::time::Instant::now();
        undriven.retain(|id, _| mine.contains(id));
        for id in mine {
            if crate::executor::driven_here(&id) {
                undriven.remove(&id);
                continue;
            }
            let since = match undriven.entry(id.clone()).or_insert(Some(now)) {
                Some(since) => *since,
                None => continue, // left alone (see `may_redrive`)
            };
            if now.duration_since(since) < grace {
                continue;
            }
            if crate::executor::may_redrive(j, &id)?.is_none() {
                undriven.insert(id, None);
                continue;
            }
            // Taken under the lock every driving call of this process registers under.
            let Some(driving) = crate::executor::drive_undriven(&id) else {
                undriven.remove(&id);
                continue;
            };
            undriven.remove(&id);
            let for_ = now.duration_since(since);
            self.drive_on_thread(driving, id, "by its owner", move |mut ex, id| async move {
                ex.redrive_owned(&id, for_).await
            });
        }
        Ok(())
    }

    /// Start this server's session in the journal.
    pub fn start_session(&mut self, kind: &str) -> Result<String, ExecError> {
        let mut j = Journal::open(&self.journal)?;
        // A replica seals checkpoints over a shared journal's heads (CAIRN_SEAL_KEY).
        j.seal_periodically_from_env();
        let detail =
            json!({"argv": std::env::args().collect::<Vec<_>>(), "transport": self.transport});
        let id = crate::runner::start_session(&mut j, kind, &self.actor, detail)?;
        self.session_id = Some(id.clone());
        Ok(id)
    }

    pub fn end_session(&self, evidence: SessionEvidence<'_>) {
        if let Some(s) = &self.session_id {
            let value = evidence.to_value();
            let _ = crate::journal::append_evidence_retrying(
                &format!("the end of session {s}"),
                || Journal::open(&self.journal)?.session_event(s, evidence.kind(), value.clone()),
            );
        }
    }
}

/// A request that waits for an execution, made into its future on the worker thread.
pub type Job = Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> + Send>;

/// How many threads run the executions in flight of one server.
pub const WORKER_THREADS: usize = 8;

/// The threads that run `execute` and `attach` requests as tasks: a thousand executions in
/// flight are a thousand futures on a few threads, not a thousand threads (each with its stack
/// and malloc arena). A journal write blocks its thread's tasks until it commits; with several
/// threads, the writes of different threads share a commit (group commit). Quick requests
/// (`status`, `output` …) keep a short-lived thread each. `cairn mcp` runs its `run_command`
/// calls on them too.
pub struct Workers {
    queues: Vec<tokio::sync::mpsc::UnboundedSender<Job>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    next: std::sync::atomic::AtomicUsize,
}

impl Workers {
    pub fn start(n: usize) -> Workers {
        let (mut queues, mut threads) = (Vec::new(), Vec::new());
        for i in 0..n {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
            queues.push(tx);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("cairn-exec-{i}"))
                    .spawn(move || worker(rx))
                    .expect("a worker thread"),
            );
        }
        Workers {
            queues,
            threads,
            next: Default::default(),
        }
    }

    /// Run `job`'s future as a task on one of the threads (round robin).
    pub fn submit(&self, job: Job) {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.queues.len();
        if let Err(e) = self.queues[i].send(job) {
            // The worker is gone (it panicked): run the job on a thread of its own.
            let job = e.0;
            std::thread::spawn(move || block_on(tokio::task::LocalSet::new().run_until(job())));
        }
    }

    /// Wait for every job taken to end.
    pub fn finish(self) {
        drop(self.queues);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// One worker thread: run each job as a local task until the queue closes and all have ended.
fn worker(mut rx: tokio::sync::mpsc::UnboundedReceiver<Job>) {
    let local = tokio::task::LocalSet::new();
    block_on(local.run_until(async move {
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                job = rx.recv() => match job {
                    Some(job) => {
                        tasks.spawn_local(job());
                    }
                    None => break,
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        while tasks.join_next().await.is_some() {}
    }));
}

/// Drive an executor future on this thread, with the process's runtime ([`crate::rt`]).
pub fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    crate::rt::block_on(f)
}

/// `execute` parameters.
#[derive(Clone, Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteParams {
    /// `[user@]host` or an ssh_config alias.
    pub destination: String,
    /// String form: run by the remote login shell, as `ssh host COMMAND`.
    #[serde(default)]
    pub command: Option<String>,
    /// Argv form: words quoted for the shell one by one.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Operation class: read-only, idempotent, conditional, irreversible, remote-command.
    #[serde(default)]
    pub class: Option<String>,
    /// How long a matching retry attaches to this execution (`90s`, `5m`, `2h`, or seconds).
    #[serde(default)]
    pub retention: Option<Value>,
    /// Intent scope (a task, ticket or conversation); default `default`.
    #[serde(default)]
    pub scope: Option<String>,
    /// Working directory on the host (default: the account's home).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Behaviour-changing environment variables (part of the intent).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of secret variables taken from the server's own environment.
    #[serde(default)]
    pub secret_env: Vec<String>,
    /// A reference to the credential (never the credential).
    #[serde(default)]
    pub credential_ref: Option<String>,
    /// Caller-chosen execution ID.
    #[serde(default)]
    pub execution_id: Option<String>,
    /// Host-enforced timeout in seconds.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Return once the command is durably started (poll `status`, page `output`).
    #[serde(default)]
    pub detach: bool,
    /// Marker directory on the host.
    #[serde(default)]
    pub remote_dir: Option<String>,
}

pub use crate::outcome::{summary, Capture};

/// The outcome as gateways see it: every [`Outcome`] field, a plain sentence, and output.
pub fn outcome_value(o: &Outcome, cap: Option<&Capture>) -> Value {
    let mut v = crate::outcome::outcome_json(o, cap);
    v["summary"] = summary(o).into();
    v
}

fn parse_retention(v: &Value) -> GResult<Duration> {
    match v {
        Value::Number(n) => n.as_u64().map(Duration::from_secs).ok_or_else(|| {
            GatewayError::params("retention must be a non-negative number of seconds")
        }),
        Value::String(s) => crate::options::parse_duration(s).map_err(GatewayError::params),
        _ => Err(GatewayError::params(
            "retention must be seconds or a duration like 5m",
        )),
    }
}

/// `execute`: run (or attach to) an operation; waits for the outcome unless `detach`. A future
/// that a server runs with many others on one thread ([`Workers`]); its journal writes block the
/// thread for their commit.
pub async fn execute(
    cfg: &GatewayConfig,
    p: ExecuteParams,
    correlation_id: Option<String>,
) -> GResult<(Value, Option<ExecutionId>)> {
    let class = p
        .class
        .as_deref()
        .map(str::parse::<OpClass>)
        .transpose()
        .map_err(GatewayError::params)?;
    let spec = OperationSpec {
        command: p.command,
        argv: p.argv,
        cwd: p.cwd,
        env: p.env,
        secret_env: p.secret_env,
        credential_ref: p.credential_ref,
        class,
        scope: p.scope,
    };
    let (command, mut intent) = spec.into_intent(&cfg.actor).map_err(GatewayError::params)?;
    intent.retention = p.retention.as_ref().map(parse_retention).transpose()?;
    intent.correlation_id = correlation_id;
    intent.session_id = cfg.session_id.clone();
    let id = p
        .execution_id
        .as_deref()
        .map(ExecutionId::parse)
        .transpose()
        .map_err(|e| GatewayError::params(e.to_string()))?;
    let req = RunRequest {
        destination: p.destination,
        command,
        id,
        timeout_secs: p.timeout_secs.unwrap_or(0),
        detach: p.detach,
        remote_dir: p.remote_dir.unwrap_or_else(|| cfg.remote_dir.clone()),
    };
    let mut ex = cfg.executor()?;
    let mut cap = Capture {
        cap: INLINE_OUTPUT_CAP,
        ..Capture::default()
    };
    let o = ex.execute(req, intent, &mut cap).await?;
    let id = ExecutionId::parse(&o.execution_id).ok();
    let deliverable = o.state.has_result().then_some(id).flatten();
    Ok((outcome_value(&o, Some(&cap)), deliverable))
}

/// Record that the caller now holds the result.
pub fn delivered(cfg: &GatewayConfig, id: &ExecutionId) {
    if let Ok(mut ex) = cfg.executor() {
        let to = format!(
            "{}{}",
            cfg.transport,
            cfg.session_id
                .as_deref()
                .map(|s| format!(" session {s}"))
                .unwrap_or_default()
        );
        // (lost, a replay may deliver the result again: said, and counted in /metrics)
        let _ = crate::journal::append_evidence_retrying(&format!("the delivery of {id}"), || {
            ex.mark_delivered(id, &to)
        });
    }
}

fn parse_id(v: &Value) -> GResult<ExecutionId> {
    let s = v
        .get("execution_id")
        .and_then(Value::as_str)
        .ok_or_else(|| GatewayError::params("execution_id (a string) is required"))?;
    ExecutionId::parse(s).map_err(|e| GatewayError::params(e.to_string()))
}

/// `status`: the journal's record (and, with `probe: true`, a fresh probe of the host).
pub fn status(cfg: &GatewayConfig, params: &Value) -> GResult<Value> {
    let id = parse_id(params)?;
    let probe = params
        .get("probe")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut ex = cfg.executor()?;
    let review = ex.review_record(&id)?;
    let mut v = if probe {
        let (o, p) = block_on(ex.probe(&id))?;
        let mut v = outcome_value(&o, None);
        v["host_says"] = match p {
            Ok(p) => format!("{p:?}"),
            Err(e) => format!("not probed: {e}"),
        }
        .into();
        v
    } else {
        let o = ex.journal_outcome(&id)?;
        outcome_value(&o, None)
    };
    v["accepted_at"] = review.accepted_at.clone().into();
    v["first_dispatched_at"] = json!(review.first_dispatched_at);
    v["events"] = ex
        .timeline(&id)?
        .iter()
        .map(|e| json!({"seq": e.seq, "at": e.at, "kind": e.kind, "state": e.state}))
        .collect::<Vec<_>>()
        .into();
    if v["needs_review"] == true {
        v["review"] = serde_json::to_value(&review).unwrap_or_default();
    }
    Ok(v)
}

/// `output`: bytes of one stream from `offset`, at most `limit` (default 1 MiB).
pub fn output(cfg: &GatewayConfig, params: &Value) -> GResult<Value> {
    let id = parse_id(params)?;
    let stderr = match params
        .get("stream")
        .and_then(Value::as_str)
        .unwrap_or("stdout")
    {
        "stdout" => false,
        "stderr" => true,
        other => {
            return Err(GatewayError::params(format!(
                "stream {other:?}: stdout or stderr"
            )))
        }
    };
    let offset = params.get("offset").and_then(Value::as_u64).unwrap_or(0);
    let limit = params
        .get("limit")
        .and_then(Value::as_u64)
        .unwrap_or(INLINE_OUTPUT_CAP as u64)
        .min(16 << 20) as usize;
    let mut ex = cfg.executor()?;
    let mut cap = Capture {
        cap: limit,
        ..Capture::default()
    };
    let done = block_on(ex.output_from(&id, stderr, offset, &mut cap))?;
    let data = if stderr { cap.err } else { cap.out };
    let next = offset + data.len() as u64;
    let total = done.as_ref().map(|d| if stderr { d.err } else { d.out });
    Ok(json!({
        "execution_id": id,
        "stream": if stderr { "stderr" } else { "stdout" },
        "offset": offset,
        "next_offset": next,
        "data": String::from_utf8_lossy(&data),
        "data_base64": base64::engine::general_purpose::STANDARD.encode(&data),
        "finished": done.is_some(),
        "total_bytes": total,
        "eof": total.is_some_and(|t| next >= t),
    }))
}

/// `attach`: stream (collect) from the start, wait for the outcome (a future, as [`execute`]).
pub async fn attach(
    cfg: &GatewayConfig,
    params: &Value,
    correlation_id: Option<String>,
) -> GResult<(Value, Option<ExecutionId>)> {
    let id = parse_id(params)?;
    let mut ex = cfg.executor()?;
    if let Some(c) = correlation_id {
        ex.record_attached(&id, &c, cfg.session_id.as_deref())?;
    }
    let mut cap = Capture {
        cap: INLINE_OUTPUT_CAP,
        ..Capture::default()
    };
    let o = ex.attach_replay(&id, &mut cap).await?;
    let deliverable = o.state.has_result().then_some(id);
    Ok((outcome_value(&o, Some(&cap)), deliverable))
}

/// `recover`: the recovery table applied to every unsettled execution.
pub fn recover(cfg: &GatewayConfig, params: &Value) -> GResult<Value> {
    let wait = params.get("wait").and_then(Value::as_bool).unwrap_or(false);
    let mut ex = cfg.executor()?;
    let mut out = Vec::new();
    block_on(ex.recover_all(wait, |i, id, before, r| match r {
        Ok(o) => {
            let mut v = outcome_value(&o, None);
            v["state_before"] = before.as_str().into();
            out.push((i, v));
        }
        Err(e) => out.push((
            i,
            json!({"execution_id": id, "state_before": before, "error": e.to_string()}),
        )),
    }))?;
    // In the journal's order, whichever finished first.
    out.sort_by_key(|(i, _)| *i);
    Ok(Value::Array(out.into_iter().map(|(_, v)| v).collect()))
}

/// `review`: executions waiting for a human, with their original record.
pub fn review(cfg: &GatewayConfig) -> GResult<Value> {
    let ex = cfg.executor()?;
    let r = ex.pending_reviews()?;
    Ok(serde_json::to_value(r).unwrap_or_default())
}

/// `resolve`: a human decision as evidence.
pub fn resolve(cfg: &GatewayConfig, params: &Value) -> GResult<Value> {
    let id = parse_id(params)?;
    let how: crate::review::Resolution = params
        .get("as")
        .and_then(Value::as_str)
        .ok_or_else(|| GatewayError::params("as: completed, failed or retry"))?
        .parse()
        .map_err(GatewayError::params)?;
    let reason = params.get("reason").and_then(Value::as_str).unwrap_or("");
    let mut ex = cfg.executor()?;
    let mut cap = Capture {
        cap: INLINE_OUTPUT_CAP,
        ..Capture::default()
    };
    let o = block_on(ex.resolve(&id, how, reason, &cfg.actor, &mut cap))?;
    Ok(outcome_value(&o, Some(&cap)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_error_answers_with_its_rpc_code_and_message() {
        for e in [
            ExecError::InvalidRequest("bad ID".into()),
            ExecError::Refused("refusing to retry ex_1".into()),
            ExecError::Setup("policy file".into()),
            ExecError::HostReported("the host reported: disk full".into()),
            ExecError::Internal("internal: no connection".into()),
            ExecError::NoSuchExecution("ex_1".into(), "j".into()),
        ] {
            let (code, message) = (e.rpc_code(), e.to_string());
            let g = GatewayError::from(e);
            assert_eq!((g.code, g.message), (code, message));
            assert!(g.data.is_none());
        }
        let g = GatewayError::from(ExecError::Unsettled {
            id: "ex_1".into(),
            source: Box::new(ExecError::HostReported("gone".into())),
        });
        assert_eq!(g.code, -32000);
        assert_eq!(
            g.data,
            Some(json!({"execution_id": "ex_1", "dispatched": true, "state": "unknown"}))
        );
    }
}
