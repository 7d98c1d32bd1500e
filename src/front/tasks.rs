//! MCP tasks (the `io.modelcontextprotocol/tasks` extension of the 2026-07-28 revision) kept
//! by the journal: the task ID **is** the execution ID.
//!
//! A `run_command` from a client that declares the extension answers `CreateTaskResult` once
//! the execution's `accepted` event is committed (its `correlation` event follows it, and is
//! what the handler waits for), and the execution goes on as a job of the server. `tasks/get`
//! answers from the journal, so a task outlives the server process that created it:
//! - `working` while the execution is accepted, authorized, dispatched or running;
//! - `completed` with the tool result inline once the host reported an exit status (any
//!   status: exit 3 is a completed run, as in the journal); the result comes from the job
//!   when this process ran it, else from an attach by ID (which replays the output stored on
//!   the host and never runs anything);
//! - `failed` with a plain `statusMessage` for what is not a completed run: failed (proven
//!   never started), rejected, interrupted, and unknown. `unknown` and `interrupted` are never
//!   reported as completed;
//! - `cancelled` once `cairn cancel` (or `tasks/cancel`) stopped it.
//!
//! `ttlMs` is the execution's retention (its operation class's, unless the call set one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{DetailedTask, ErrorData, JsonObject, Task, TaskPayload, TaskStatus};
use serde_json::{json, Value};

use crate::evidence::Evidence;
use crate::front::gateway::{self, GatewayConfig, GatewayError, Workers};
use crate::id::ExecutionId;
use crate::journal::Journal;
use crate::state::State;

/// Suggested polling interval of a working task.
pub const POLL_INTERVAL_MS: u64 = 1000;

/// Results of the executions this process ran as tasks (the job's own result, with its
/// output); after a restart, `tasks/get` attaches instead.
#[derive(Default)]
pub struct Results {
    done: Mutex<HashMap<String, Value>>,
    /// Executions a job of this process is watching.
    watched: Mutex<std::collections::HashSet<String>>,
}

impl Results {
    pub fn watch(&self, id: &str) {
        self.watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned());
    }

    /// Watch `id` unless its job already put its result (a job that ended before the handler
    /// got here would otherwise leave it watched for good).
    pub fn watch_unless_done(&self, id: &str) {
        self.watch(id);
        if self.get(id).is_some() {
            self.unwatch(id);
        }
    }

    pub fn unwatch(&self, id: &str) {
        self.watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    /// How many executions jobs of this process watch as tasks.
    pub fn watched_count(&self) -> usize {
        self.watched.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn watched(&self, id: &str) -> bool {
        self.watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id)
    }

    pub fn put(&self, id: &str, v: Value) {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned(), v);
    }

    fn get(&self, id: &str) -> Option<Value> {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

fn gateway_error(e: GatewayError) -> ErrorData {
    if e.code == -32004 || e.code == -32602 {
        ErrorData::invalid_params(e.message, None)
    } else {
        ErrorData::internal_error(e.message, None)
    }
}

/// What the journal says of a task, before any result is fetched.
struct Seen {
    task: Task,
    state: State,
    summary: String,
    outcome: Value,
}

/// The task's journal record (blocking).
fn seen(cfg: &GatewayConfig, id: &ExecutionId) -> Result<Seen, ErrorData> {
    let mut ex = cfg.executor().map_err(gateway_error)?;
    let o = ex
        .journal_outcome(id)
        .map_err(|e| gateway_error(e.into()))?;
    let review = ex.review_record(id).map_err(|e| gateway_error(e.into()))?;
    let events = ex.timeline(id).map_err(internal)?;
    let last = events.last().map(|e| e.at.clone()).unwrap_or_default();
    let ttl = ex.task_ttl_ms(id);
    let mut task = Task::new(
        id.to_string(),
        TaskStatus::Working,
        review.accepted_at,
        last,
    )
    .with_poll_interval_ms(POLL_INTERVAL_MS);
    if let Some(t) = ttl {
        task = task.with_ttl_ms(t);
    }
    let summary = gateway::summary(&o);
    Ok(Seen {
        task,
        state: o.state,
        summary,
        outcome: gateway::outcome_value(&o, None),
    })
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        other => {
            let mut m = JsonObject::new();
            m.insert("value".into(), other);
            m
        }
    }
}

/// `tasks/get`: the task as the journal has it (see the module doc).
pub async fn get(
    cfg: GatewayConfig,
    workers: &Workers,
    results: &Results,
    id: &str,
) -> Result<DetailedTask, ErrorData> {
    let id = ExecutionId::parse(id).map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
    let (c2, i2) = (cfg.clone(), id.clone());
    let mut s = tokio::task::spawn_blocking(move || seen(&c2, &i2))
        .await
        .map_err(internal)??;
    if !s.state.is_settled() && !results.watched(id.as_str()) {
        // No job here watches it (the server that ran it is gone): ask the host, as
        // `cairn recover` does, and read the journal again.
        recover(cfg.clone(), workers, &id).await;
        let (c2, i2) = (cfg.clone(), id.clone());
        s = tokio::task::spawn_blocking(move || seen(&c2, &i2))
            .await
            .map_err(internal)??;
    }
    let task = s.task.clone();
    let payload = match s.state {
        State::Accepted | State::Authorized | State::Dispatched | State::Running => {
            return Ok(DetailedTask::new(
                task.with_status_message(s.summary),
                TaskPayload::Working,
            ))
        }
        State::Cancelled => TaskPayload::Cancelled,
        State::Completed | State::Delivered => {
            let v = match results.get(id.as_str()) {
                Some(v) => v,
                None => attach(cfg.clone(), workers, &id).await?,
            };
            let (c3, i3) = (cfg.clone(), id.clone());
            let _ = tokio::task::spawn_blocking(move || gateway::delivered(&c3, &i3)).await;
            let r = crate::front::tool_result::result(v);
            TaskPayload::Completed {
                result: object(serde_json::to_value(r).map_err(internal)?),
            }
        }
        // Not a completed run: failed (never started), rejected, interrupted, unknown.
        _ => TaskPayload::Failed {
            error: object(json!({
                "code": -32000,
                "message": s.summary,
                "data": s.outcome,
            })),
        },
    };
    Ok(DetailedTask::new(
        task.with_status_message(s.summary),
        payload,
    ))
}

/// The result of a completed execution from the host's records, by ID (never runs anything).
async fn attach(
    cfg: GatewayConfig,
    workers: &Workers,
    id: &ExecutionId,
) -> Result<Value, ErrorData> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let params = json!({"execution_id": id});
    workers.submit(Box::new(move || {
        Box::pin(async move {
            let _ = tx.send(gateway::attach(&cfg, &params, None).await);
        })
    }));
    let (v, _) = rx.await.map_err(internal)?.map_err(gateway_error)?;
    Ok(v)
}

/// Apply the recovery table to one execution (probe the marker; never re-run).
async fn recover(cfg: GatewayConfig, workers: &Workers, id: &ExecutionId) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let id = id.clone();
    let span = tracing::info_span!("task", execution_id = %id);
    workers.submit(Box::new(move || {
        Box::pin(tracing::Instrument::instrument(
            async move {
                if let Ok(mut ex) = cfg.executor() {
                    if let Err(e) = ex.recover_one(&id, false).await {
                        tracing::warn!("cairn: probing task {id}: {e}");
                    }
                }
                let _ = tx.send(());
            },
            span,
        ))
    }));
    let _ = rx.await;
}

/// `tasks/cancel`: stop the remote process group and record `cancelled`, as `cairn cancel`.
pub async fn cancel(cfg: GatewayConfig, workers: &Workers, id: &str) -> Result<(), ErrorData> {
    let id = ExecutionId::parse(id).map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    workers.submit(Box::new(move || {
        Box::pin(async move {
            let r = match cfg.executor() {
                Ok(mut ex) => ex.cancel(&id, 5).await.map_err(GatewayError::from),
                Err(e) => Err(e),
            };
            let _ = tx.send(r);
        })
    }));
    rx.await.map_err(internal)?.map_err(gateway_error)?;
    Ok(())
}

/// The execution a just-submitted call created or attached to, once its correlation is in the
/// journal (after `after_seq`); `None` if the job ended first (its result then says). The
/// executor that commits the correlation wakes this ([`crate::executor::await_correlation`]);
/// one read of the journal covers a commit made before this began to wait.
pub async fn wait_accepted(
    cfg: &GatewayConfig,
    corr: &str,
    after_seq: i64,
    job_done: &mut tokio::sync::oneshot::Receiver<()>,
) -> Option<ExecutionId> {
    let mut told = crate::executor::await_correlation(corr);
    let (path, c) = (cfg.journal.clone(), corr.to_owned());
    let found = tokio::task::spawn_blocking(move || {
        Journal::open(&path)
            .and_then(|j| j.execution_by_correlation_after(&c, after_seq))
            .ok()
            .flatten()
    })
    .await
    .ok()
    .flatten();
    let id = match found.and_then(|s| ExecutionId::parse(&s).ok()) {
        Some(id) => Some(id),
        // (told first: a job that recorded its correlation and then ended made a task)
        None => tokio::select! {
            biased;
            id = &mut told => id.ok(),
            _ = &mut *job_done => None,
        },
    };
    drop(told);
    crate::executor::forget_correlation(corr);
    id
}

/// The journal's last event sequence (the correlation of a new call comes after it).
pub fn last_seq(cfg: &GatewayConfig) -> i64 {
    Journal::open(&cfg.journal)
        .and_then(|j| j.last_event_seq())
        .unwrap_or(0)
}

/// What a closed response stream (or `notifications/cancelled`) does to the executions of a
/// call that was not made a task. The *request* is cancelled, as the protocol says; for its
/// executions the dispatch boundary decides (src/exec/claims/gate.rs):
/// - not yet dispatched: nothing is sent; the executor concludes it `failed` ("nothing was
///   sent") when it reaches the boundary, and a re-sent call with the same intent is a new
///   execution;
/// - dispatched (or attached to by intent): recorded `delivery-abandoned`, and by default it
///   keeps running to its recorded outcome (a re-sent call with the same intent attaches to
///   it). For the operation classes listed here it is cancelled instead, as `cairn cancel`
///   would.
#[derive(Clone, Debug, Default)]
pub struct ClosedStream {
    pub cancel_classes: Vec<crate::intent::OpClass>,
}

/// The shared state of the MCP server's tasks.
#[derive(Clone, Default)]
pub struct TaskState {
    pub results: Arc<Results>,
    pub closed_stream: ClosedStream,
}

/// A call's response stream closed before its result (see [`ClosedStream`]): close its
/// dispatch boundary, record the closing on the executions past it, and cancel those whose
/// class says so.
pub async fn stream_closed(
    cfg: GatewayConfig,
    workers: &Workers,
    policy: &ClosedStream,
    gate: &Arc<crate::gate::Gate>,
    corr: &str,
    after_seq: i64,
) {
    let (c2, corr2, gate) = (cfg.clone(), corr.to_owned(), gate.clone());
    let cancel_classes = policy.cancel_classes.clone();
    let found = tokio::task::spawn_blocking(move || -> Vec<(ExecutionId, bool)> {
        let crossed = gate.close("the caller's response stream closed");
        let Ok(mut j) = Journal::open(&c2.journal) else {
            return Vec::new();
        };
        let mut past = crossed;
        // An execution the call attached to (by intent or ID) is past the boundary if it was
        // dispatched; one of its own that did not cross is concluded by its executor.
        if let Some(id) = j
            .execution_by_correlation_after(&corr2, after_seq)
            .ok()
            .flatten()
            .and_then(|s| ExecutionId::parse(&s).ok())
        {
            let dispatched = j.status(&id).ok().flatten().is_some_and(|s| {
                !matches!(
                    s.state,
                    State::Accepted | State::Authorized | State::Failed | State::Rejected
                )
            });
            if dispatched && !past.contains(&id) {
                past.push(id);
            }
        }
        if past.is_empty() {
            tracing::info!(
                "cairn: the response stream of {corr2} closed before any dispatch: nothing is \
                 sent for it"
            );
        }
        let mut out = Vec::new();
        for id in past {
            let class = j.intent_of(&id).ok().flatten().map(|c| c.class);
            let cancel =
                class.is_some_and(|class| cancel_classes.iter().any(|c| c.as_str() == class));
            let what = format!("delivery-abandoned of {id}");
            let _ = crate::journal::append_evidence_retrying(&what, || {
                j.append_evidence(
                    &id,
                    Evidence::DeliveryAbandoned {
                        correlation_id: &corr2,
                        session_id: c2.session_id.as_deref(),
                        reason: (),
                        cancel,
                    },
                )
            });
            out.push((id, cancel));
        }
        out
    });
    for (id, by_class) in found.await.unwrap_or_default() {
        if by_class {
            let _ = cancel(cfg.clone(), workers, id.as_str()).await;
        }
    }
}
