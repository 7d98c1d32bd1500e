//! `cairn serve --stdio`: JSON-RPC 2.0 on stdin/stdout, one JSON message per line.
//!
//! Methods (params and results in `docs/GATEWAYS.md`): `execute`, `status`, `output`,
//! `attach`, `recover`, `review`, `resolve`; with `--operations FILE`, `call` (a named operation,
//! `docs/OPERATIONS.md`) and `operations` (their list and contracts); `--operations-only` refuses
//! `execute`. Requests are handled concurrently: `execute` and
//! `attach` as tasks on a few worker threads, the others each on a thread of its own. Responses
//! are written whole, one per line, in completion order, and carry the request's `id`. The `id` is the caller's correlation ID: `execute` and `attach` record it
//! as a journal event on the execution, and it never enters the intent fingerprint, so a
//! retried request with a new `id` and the same intent attaches to the same execution.
//!
//! A result is recorded `delivered` only after its response line was written and flushed;
//! if the caller vanished first, the result stays retrievable and a retry gets it.

use std::io::{BufRead, Write};
use std::sync::mpsc;

use serde_json::{json, Value};

use crate::evidence::SessionEvidence;
use crate::executor::ExecError;
use crate::front::gateway::{self, GatewayConfig, GatewayError};
use crate::id::ExecutionId;

/// The methods, for `rpc.discover`-style listing in errors.
pub const METHODS: [&str; 9] = [
    "execute",
    "status",
    "output",
    "attach",
    "recover",
    "review",
    "resolve",
    "call",
    "operations",
];

/// Serve JSON-RPC on stdin/stdout until stdin ends.
pub async fn main(mut cfg: GatewayConfig) -> Result<i32, ExecError> {
    cfg.start_session("serve")?;
    cfg.sweep_takeovers();
    let code = tokio::task::spawn_blocking(move || {
        let stdin = std::io::stdin();
        let n = serve(&cfg, stdin.lock(), std::io::stdout());
        cfg.end_session(SessionEvidence::EndedStdin {
            requests: n as u64,
            reason: (),
        });
        0
    })
    .await
    .unwrap_or(255);
    Ok(code)
}

pub(crate) fn error(id: &Value, e: &GatewayError) -> Value {
    let mut err = json!({"code": e.code, "message": e.message});
    if let Some(d) = &e.data {
        err["data"] = d.clone();
    }
    json!({"jsonrpc": "2.0", "id": id, "error": err})
}

/// The correlation ID as text: a string ID as it is, any other as its JSON text.
fn correlation(id: &Value) -> Option<String> {
    match id {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Handle one request; the value to answer and the execution whose result it delivers.
/// (`execute` and `attach` run on a runtime of their own here; `serve` runs them as tasks.)
pub fn handle(
    cfg: &GatewayConfig,
    method: &str,
    params: Value,
    id: &Value,
) -> (Value, Vec<ExecutionId>) {
    if waits(method) {
        return gateway::block_on(handle_waiting(cfg, method, params, id));
    }
    let r: Result<(Value, Vec<ExecutionId>), GatewayError> = match method {
        "status" => gateway::status(cfg, &params).map(|v| (v, vec![])),
        "output" => gateway::output(cfg, &params).map(|v| (v, vec![])),
        "recover" => gateway::recover(cfg, &params).map(|v| (v, vec![])),
        "review" => gateway::review(cfg).map(|v| (v, vec![])),
        "resolve" => gateway::resolve(cfg, &params).map(|v| (v, vec![])),
        "operations" => Ok((
            crate::operations::call::list(
                cfg.operations
                    .as_deref()
                    .unwrap_or(&crate::operations::OperationsFile::empty()),
            ),
            vec![],
        )),
        other => Err(GatewayError {
            code: -32601,
            message: format!(
                "method {other:?} not found; methods: {}",
                METHODS.join(", ")
            ),
            data: None,
        }),
    };
    respond(id, r)
}

/// The response to a request answered with `r`, and the execution whose result it delivers.
fn respond(
    id: &Value,
    r: Result<(Value, Vec<ExecutionId>), GatewayError>,
) -> (Value, Vec<ExecutionId>) {
    match r {
        Ok((v, deliver)) => (json!({"jsonrpc": "2.0", "id": id, "result": v}), deliver),
        Err(e) => (error(id, &e), vec![]),
    }
}

/// Whether a method waits for an execution (and so runs as a task on a [`gateway::Workers`]
/// thread).
fn waits(method: &str) -> bool {
    matches!(method, "execute" | "attach" | "call")
}

/// [`handle`] for the methods that wait for an execution, as a future.
async fn handle_waiting(
    cfg: &GatewayConfig,
    method: &str,
    params: Value,
    id: &Value,
) -> (Value, Vec<ExecutionId>) {
    handle_waiting_as(cfg, method, params, id, correlation(id)).await
}

/// [`handle_waiting`] with the correlation recorded given by the caller (the HTTP front
/// records the actor and the request ID, not the JSON-RPC id alone).
pub async fn handle_waiting_as(
    cfg: &GatewayConfig,
    method: &str,
    params: Value,
    id: &Value,
    corr: Option<String>,
) -> (Value, Vec<ExecutionId>) {
    let one = |r: Result<(Value, Option<ExecutionId>), GatewayError>| {
        r.map(|(v, d)| (v, d.into_iter().collect()))
    };
    let r = match method {
        "execute" if cfg.operations_only => Err(GatewayError {
            code: -32601,
            message: "execute is disabled (--operations-only): call a named operation with `call`; `operations` lists them".into(),
            data: None,
        }),
        "execute" => match serde_json::from_value::<gateway::ExecuteParams>(params) {
            Ok(p) => one(gateway::execute(cfg, p, corr).await),
            Err(e) => Err(GatewayError::params(format!("execute: {e}"))),
        },
        "call" => match serde_json::from_value::<CallParams>(params) {
            Ok(p) => {
                crate::operations::call::gateway_call(
                    cfg, &p.operation, &p.arguments, p.scope, p.detach, corr,
                )
                .await
            }
            Err(e) => Err(GatewayError::params(format!("call: {e}"))),
        },
        _ => one(gateway::attach(cfg, &params, corr).await),
    };
    respond(id, r)
}

/// `call` parameters: a named operation and its arguments.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CallParams {
    operation: String,
    #[serde(default)]
    arguments: serde_json::Map<String, Value>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    detach: bool,
}

/// One decoded request line of `cairn serve --stdio`.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request's `id`; `None` for a notification (which gets no response).
    pub id: Option<Value>,
    pub method: String,
    /// `params`, `{}` when absent.
    pub params: Value,
}

/// Decode one input line: a JSON-RPC 2.0 request, or the error response to send instead
/// (`-32700` parse error, `-32600` invalid request). Pure and total: never panics on any
/// input (fuzzed in `tests/it/fuzz.rs`); nesting depth is bounded by serde_json's limit.
pub fn decode_line(line: &str) -> Result<Request, Value> {
    let msg: Value = serde_json::from_str(line).map_err(|e| {
        error(
            &Value::Null,
            &GatewayError {
                code: -32700,
                message: format!("parse error: {e}"),
                data: None,
            },
        )
    })?;
    let id = msg.get("id").cloned();
    let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
    let valid = msg.get("jsonrpc").and_then(Value::as_str) == Some("2.0");
    let Some(method) = method.filter(|_| valid) else {
        return Err(error(
            &id.unwrap_or(Value::Null),
            &GatewayError {
                code: -32600,
                message: "invalid request: expected {\"jsonrpc\":\"2.0\",\"id\":…,\"method\":…,\"params\":…} (batches are not supported)".into(),
                data: None,
            },
        ));
    };
    let params = msg.get("params").cloned().unwrap_or(json!({}));
    Ok(Request { id, method, params })
}

/// Serve requests from `input` until it ends; returns how many were read.
pub fn serve(
    cfg: &GatewayConfig,
    input: impl BufRead,
    output: impl Write + Send + 'static,
) -> usize {
    let (tx, rx) = mpsc::channel::<(Value, Vec<ExecutionId>)>();
    let wcfg = cfg.clone();
    let writer = std::thread::spawn(move || {
        let mut out = output;
        for (msg, deliver) in rx {
            let line = serde_json::to_string(&msg).unwrap_or_default();
            let ok = out
                .write_all(line.as_bytes())
                .and_then(|_| out.write_all(b"\n"))
                .and_then(|_| out.flush())
                .is_ok();
            for id in deliver.iter().filter(|_| ok) {
                gateway::delivered(&wcfg, id);
            }
        }
    });
    let mut workers = Vec::new();
    let waiting = gateway::Workers::start(gateway::WORKER_THREADS);
    let mut n = 0;
    for line in input.lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        n += 1;
        let Request { id, method, params } = match decode_line(&line) {
            Ok(r) => r,
            Err(response) => {
                let _ = tx.send((response, vec![]));
                continue;
            }
        };
        let cfg = cfg.clone();
        let tx = tx.clone();
        if waits(&method) {
            waiting.submit(Box::new(move || {
                Box::pin(async move {
                    let shown = id.clone().unwrap_or(Value::Null);
                    let (resp, deliver) = handle_waiting(&cfg, &method, params, &shown).await;
                    if id.is_some() {
                        let _ = tx.send((resp, deliver));
                    }
                })
            }));
            continue;
        }
        workers.push(std::thread::spawn(move || {
            let shown = id.clone().unwrap_or(Value::Null);
            let (resp, deliver) = handle(&cfg, &method, params, &shown);
            // A notification (no id) gets no response, and nothing is delivered.
            if id.is_some() {
                let _ = tx.send((resp, deliver));
            }
        }));
        workers.retain(|w| !w.is_finished());
    }
    for w in workers {
        let _ = w.join();
    }
    waiting.finish();
    drop(tx);
    let _ = writer.join();
    n
}
