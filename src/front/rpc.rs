//! The JSON-RPC 2.0 methods of `cairn serve --stdio` and `POST /rpc`, written once.
//!
//! [`METHODS`] is the table: each method's name, how it runs (at once on a thread of its own,
//! or as a task that waits for an execution) and what the HTTP front checks before running it
//! ([`OverHttp`]). Both fronts decode a request with [`decode_line`], answer it with
//! [`handle`] or [`handle_waiting`], and shape errors with [`error`]; what differs between
//! them (who the caller is, the scopes a token allows, a connection's sessions) stays in the
//! front and comes in as the config and the correlation recorded.
//!
//! Params and results: `docs/GATEWAYS.md`; `call` and `operations`: `docs/OPERATIONS.md`.

use std::future::Future;
use std::pin::Pin;

use serde_json::{json, Value};

use crate::front::gateway::{self, GatewayConfig, GatewayError};
use crate::id::ExecutionId;

/// A method's answer, and the executions whose results it delivers once written.
pub type Answer = (Value, Vec<ExecutionId>);

type Answered = Result<Answer, GatewayError>;

/// A method that waits for an execution, as a future (the correlation to record is given).
type Waiting = for<'a> fn(
    &'a GatewayConfig,
    Value,
    Option<String>,
) -> Pin<Box<dyn Future<Output = Answered> + 'a>>;

/// How a method runs.
#[derive(Clone, Copy)]
pub enum Run {
    /// Answered at once, blocking (each request on a thread of its own).
    Now(fn(&GatewayConfig, &Value) -> Result<Value, GatewayError>),
    /// Waits for an execution: a task on a [`gateway::Workers`] thread.
    Waits(Waiting),
}

/// What the HTTP front checks before it runs a method for a token's actor (on stdio the
/// caller is the process's own actor, and nothing is checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverHttp {
    /// `execute`: the intent's scope must be one the token allows (its prefix when none).
    Execute,
    /// `call`: the scope it acts in, as for `execute`.
    Call,
    /// Only the caller's own execution, when the params name one.
    Own,
    /// As [`OverHttp::Own`], and a listing keeps only the caller's own executions.
    OwnListed,
    /// Not offered over HTTP: an operator's command (the message says which).
    Operator(&'static str),
}

/// One JSON-RPC method.
#[derive(Clone, Copy)]
pub struct Method {
    pub name: &'static str,
    pub run: Run,
    pub over_http: OverHttp,
}

/// Every method of both fronts, in the order errors list them.
pub static METHODS: [Method; 9] = [
    Method {
        name: "execute",
        run: Run::Waits(execute),
        over_http: OverHttp::Execute,
    },
    Method {
        name: "status",
        run: Run::Now(status),
        over_http: OverHttp::Own,
    },
    Method {
        name: "output",
        run: Run::Now(output),
        over_http: OverHttp::Own,
    },
    Method {
        name: "attach",
        run: Run::Waits(attach),
        over_http: OverHttp::Own,
    },
    Method {
        name: "recover",
        run: Run::Now(recover),
        over_http: OverHttp::Operator(
            "recover acts on every execution of the journal: an operator's \
             command (cairn recover), not offered over HTTP",
        ),
    },
    Method {
        name: "review",
        run: Run::Now(review),
        over_http: OverHttp::OwnListed,
    },
    Method {
        name: "resolve",
        run: Run::Now(resolve),
        over_http: OverHttp::Own,
    },
    Method {
        name: "call",
        run: Run::Waits(call),
        over_http: OverHttp::Call,
    },
    Method {
        name: "operations",
        run: Run::Now(operations),
        over_http: OverHttp::Own,
    },
];

/// The method called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// The names of the methods, in the table's order.
pub fn names() -> Vec<&'static str> {
    METHODS.iter().map(|m| m.name).collect()
}

/// Whether a method waits for an execution (and so runs as a task on a [`gateway::Workers`]
/// thread).
pub fn waits(method: &str) -> bool {
    matches!(find(method).map(|m| m.run), Some(Run::Waits(_)))
}

fn not_found(method: &str) -> GatewayError {
    GatewayError {
        code: -32601,
        message: format!(
            "method {method:?} not found; methods: {}",
            names().join(", ")
        ),
        data: None,
    }
}

fn status(cfg: &GatewayConfig, params: &Value) -> Result<Value, GatewayError> {
    gateway::status(cfg, params)
}

fn output(cfg: &GatewayConfig, params: &Value) -> Result<Value, GatewayError> {
    gateway::output(cfg, params)
}

fn recover(cfg: &GatewayConfig, params: &Value) -> Result<Value, GatewayError> {
    gateway::recover(cfg, params)
}

fn review(cfg: &GatewayConfig, _: &Value) -> Result<Value, GatewayError> {
    gateway::review(cfg)
}

fn resolve(cfg: &GatewayConfig, params: &Value) -> Result<Value, GatewayError> {
    gateway::resolve(cfg, params)
}

fn operations(cfg: &GatewayConfig, _: &Value) -> Result<Value, GatewayError> {
    Ok(crate::operations::call::list(
        cfg.operations
            .as_deref()
            .unwrap_or(&crate::operations::OperationsFile::empty()),
    ))
}

fn execute(
    cfg: &GatewayConfig,
    params: Value,
    corr: Option<String>,
) -> Pin<Box<dyn Future<Output = Answered> + '_>> {
    Box::pin(async move {
        if cfg.operations_only {
            return Err(GatewayError {
                code: -32601,
                message: "execute is disabled (--operations-only): call a named operation with `call`; `operations` lists them".into(),
                data: None,
            });
        }
        match serde_json::from_value::<gateway::ExecuteParams>(params) {
            Ok(p) => one(gateway::execute(cfg, p, corr).await),
            Err(e) => Err(GatewayError::params(format!("execute: {e}"))),
        }
    })
}

fn attach(
    cfg: &GatewayConfig,
    params: Value,
    corr: Option<String>,
) -> Pin<Box<dyn Future<Output = Answered> + '_>> {
    Box::pin(async move { one(gateway::attach(cfg, &params, corr).await) })
}

fn call(
    cfg: &GatewayConfig,
    params: Value,
    corr: Option<String>,
) -> Pin<Box<dyn Future<Output = Answered> + '_>> {
    Box::pin(async move {
        match serde_json::from_value::<CallParams>(params) {
            Ok(p) => {
                crate::operations::call::gateway_call(
                    cfg,
                    &p.operation,
                    &p.arguments,
                    p.scope,
                    p.detach,
                    corr,
                )
                .await
            }
            Err(e) => Err(GatewayError::params(format!("call: {e}"))),
        }
    })
}

fn one(r: Result<(Value, Option<ExecutionId>), GatewayError>) -> Answered {
    r.map(|(v, d)| (v, d.into_iter().collect()))
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

/// The error response to request `id`.
pub fn error(id: &Value, e: &GatewayError) -> Value {
    let mut err = json!({"code": e.code, "message": e.message});
    if let Some(d) = &e.data {
        err["data"] = d.clone();
    }
    json!({"jsonrpc": "2.0", "id": id, "error": err})
}

/// The response to a request answered with `r`, and the executions whose results it delivers.
fn respond(id: &Value, r: Answered) -> Answer {
    match r {
        Ok((v, deliver)) => (json!({"jsonrpc": "2.0", "id": id, "result": v}), deliver),
        Err(e) => (error(id, &e), vec![]),
    }
}

/// Handle one request; the value to answer and the executions whose results it delivers.
/// (The methods that wait run on a runtime of their own here; the fronts run them as tasks
/// with [`handle_waiting`].)
pub fn handle(cfg: &GatewayConfig, method: &str, params: Value, id: &Value) -> Answer {
    let r = match find(method).map(|m| m.run) {
        Some(Run::Now(f)) => f(cfg, &params).map(|v| (v, vec![])),
        Some(Run::Waits(_)) => {
            return gateway::block_on(handle_waiting(cfg, method, params, id, correlation(id)))
        }
        None => Err(not_found(method)),
    };
    respond(id, r)
}

/// [`handle`] for the methods that wait for an execution, as a future, recording `corr` as
/// the request's correlation (stdio records the JSON-RPC id; HTTP the actor and the id).
pub async fn handle_waiting(
    cfg: &GatewayConfig,
    method: &str,
    params: Value,
    id: &Value,
    corr: Option<String>,
) -> Answer {
    let r = match find(method).map(|m| m.run) {
        Some(Run::Waits(f)) => f(cfg, params, corr).await,
        Some(Run::Now(f)) => f(cfg, &params).map(|v| (v, vec![])),
        None => Err(not_found(method)),
    };
    respond(id, r)
}

/// The correlation ID as text: a string ID as it is, any other as its JSON text.
pub fn correlation(id: &Value) -> Option<String> {
    match id {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// One decoded JSON-RPC request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request's `id`; `None` for a notification (which gets no response).
    pub id: Option<Value>,
    pub method: String,
    /// `params`, `{}` when absent.
    pub params: Value,
}

/// Decode one request (a line on stdio, a body over HTTP): a JSON-RPC 2.0 request, or the
/// error response to send instead (`-32700` parse error, `-32600` invalid request). Pure and
/// total: never panics on any input (fuzzed in `tests/it/fuzz.rs`); nesting depth is bounded
/// by serde_json's limit.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_fronts_list_the_methods_of_the_one_table() {
        let listed = [
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
        assert_eq!(names(), listed);
        for (i, m) in METHODS.iter().enumerate() {
            assert!(
                !METHODS[..i].iter().any(|n| n.name == m.name),
                "{} twice",
                m.name
            );
            assert!(std::ptr::eq(find(m.name).unwrap(), m));
        }
    }

    #[test]
    fn the_methods_that_wait_are_those_that_wait_for_an_execution() {
        let waiting: Vec<_> = names().into_iter().filter(|m| waits(m)).collect();
        assert_eq!(waiting, ["execute", "attach", "call"]);
        assert!(!waits("nope"));
    }

    #[test]
    fn over_http_recover_is_refused_and_the_listing_keeps_the_callers_own() {
        let over = |n| find(n).unwrap().over_http;
        assert!(matches!(over("recover"), OverHttp::Operator(_)));
        assert_eq!(over("review"), OverHttp::OwnListed);
        assert_eq!(over("execute"), OverHttp::Execute);
        assert_eq!(over("call"), OverHttp::Call);
        for m in ["status", "output", "attach", "resolve", "operations"] {
            assert_eq!(over(m), OverHttp::Own, "{m}");
        }
    }

    #[test]
    fn an_unknown_method_is_not_found_and_the_error_lists_the_table() {
        let e = not_found("nope");
        assert_eq!(e.code, -32601);
        assert_eq!(
            e.message,
            "method \"nope\" not found; methods: execute, status, output, attach, recover, \
             review, resolve, call, operations"
        );
    }
}
