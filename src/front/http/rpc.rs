//! `POST /rpc`: one JSON-RPC 2.0 request per HTTP request, the methods of `cairn serve
//! --stdio`, acting as the token's actor. The response is the JSON-RPC response (HTTP 200,
//! also for JSON-RPC errors); a notification (no `id`) is answered 202 with no body. A result
//! is recorded `delivered` once the response has been handed to the connection whole.
//!
//! The methods, and what is checked of each before it runs, are the table of
//! [`crate::front::rpc`]: the per-execution methods (`status`, `output`, `attach`, `resolve`)
//! see only the caller's own executions; `review` lists only them; `recover` (every unsettled
//! execution of the journal) is an operator's command and is not offered over HTTP: `cairn
//! recover` runs it.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::Value;

use super::{DeliverOnEnd, Front};
use crate::front::caller::{admit_execute, admit_read, HttpCaller};
use crate::front::gateway::{self, GatewayConfig, GatewayError};
use crate::front::rpc::{self, error, OverHttp};
use crate::id::ExecutionId;

fn correlation(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The execution a request names, if it names one.
fn named(params: &Value) -> Option<ExecutionId> {
    params
        .get("execution_id")
        .and_then(Value::as_str)
        .and_then(|s| ExecutionId::parse(s).ok())
}

pub(super) async fn rpc(State(front): State<Arc<Front>>, req: Request) -> Response {
    let Some(caller) = req.extensions().get::<HttpCaller>().cloned() else {
        return (StatusCode::UNAUTHORIZED, "no caller").into_response();
    };
    // Over the limit: 413 with a JSON-RPC error, as on /mcp.
    let body = match super::headers::read_body(req.into_body(), front.max_body).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    let line = String::from_utf8_lossy(&body);
    let r = match rpc::decode_line(&line) {
        Ok(r) => r,
        Err(resp) => return DeliverOnEnd::response(StatusCode::OK, resp, None),
    };
    let shown = r.id.clone().unwrap_or(Value::Null);
    let cfg = caller.config(&front.cfg);
    let (resp, deliver) = answer(&front, &caller, cfg.clone(), r.method, r.params, &shown).await;
    if r.id.is_none() {
        return StatusCode::ACCEPTED.into_response();
    }
    let on_end = (!deliver.is_empty()).then(|| {
        Box::new(move || {
            // On a blocking thread of its own: the journal write must not stall the
            // connection's task.
            std::thread::spawn(move || {
                for id in &deliver {
                    gateway::delivered(&cfg, id);
                }
            });
        }) as Box<dyn FnOnce() + Send>
    });
    DeliverOnEnd::response(StatusCode::OK, resp, on_end)
}

/// What the caller may do with this method: `Some(scope)` for an `execute` or a `call`, the scope it acts
/// in (its token's prefix when none was given); an error for another actor's execution, a
/// scope the token does not allow, or `recover`.
async fn admit(
    cfg: &GatewayConfig,
    caller: &HttpCaller,
    method: &str,
    params: &Value,
) -> Result<Option<Value>, GatewayError> {
    let (cfg, caller) = (cfg.clone(), caller.clone());
    let (m, p) = (method.to_owned(), params.clone());
    tokio::task::spawn_blocking(move || -> Result<Option<Value>, GatewayError> {
        // An unknown method is checked as a read (and then answered "not found").
        let over = rpc::find(&m).map_or(OverHttp::Own, |m| m.over_http);
        match over {
            OverHttp::Execute => {
                let mut e: gateway::ExecuteParams = serde_json::from_value(p)
                    .map_err(|e| GatewayError::params(format!("execute: {e}")))?;
                admit_execute(&cfg, &caller, &mut e)?;
                Ok(e.scope.map(Value::String))
            }
            OverHttp::Call => {
                let mut scope = p.get("scope").and_then(Value::as_str).map(str::to_owned);
                crate::front::caller::admit_scope(&caller, &mut scope)?;
                Ok(scope.map(Value::String))
            }
            OverHttp::Operator(why) => Err(GatewayError {
                code: -32601,
                message: why.into(),
                data: None,
            }),
            OverHttp::Own | OverHttp::OwnListed => {
                if let Some(x) = named(&p) {
                    admit_read(&cfg, &caller, &x)?;
                }
                Ok(None)
            }
        }
    })
    .await
    .unwrap_or_else(|e| Err(GatewayError::params(format!("internal error: {e}"))))
}

/// Check what the caller may do, then run the method.
async fn answer(
    front: &Arc<Front>,
    caller: &HttpCaller,
    cfg: GatewayConfig,
    method: String,
    mut params: Value,
    id: &Value,
) -> (Value, Vec<ExecutionId>) {
    let corr = caller.correlation(&correlation(id));
    let admitted = admit(&cfg, caller, &method, &params).await;
    match admitted {
        Ok(Some(scope)) => params["scope"] = scope,
        Ok(None) => {}
        Err(e) => return (error(id, &e), vec![]),
    }
    if rpc::waits(&method) {
        let slot = match caller.slot() {
            Ok(s) => s,
            Err(e) => return (error(id, &e), vec![]),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let shown = id.clone();
        let span = tracing::info_span!("call", actor = %cfg.actor, correlation = %corr);
        front.workers.submit(Box::new(move || {
            Box::pin(tracing::Instrument::instrument(
                async move {
                    let r = rpc::handle_waiting(&cfg, &method, params, &shown, Some(corr)).await;
                    drop(slot);
                    let _ = tx.send(r);
                },
                span,
            ))
        }));
        return rx.await.unwrap_or_else(|_| {
            let e = GatewayError {
                code: -32603,
                message: "internal error: the execution's task ended without an answer; its \
                          journal record says what happened"
                    .into(),
                data: None,
            };
            (error(id, &e), vec![])
        });
    }
    let shown = id.clone();
    let actor = caller.caller.actor.clone();
    tokio::task::spawn_blocking(move || {
        let (mut resp, deliver) = rpc::handle(&cfg, &method, params, &shown);
        let listed = rpc::find(&method).is_some_and(|m| m.over_http == OverHttp::OwnListed);
        if listed {
            own_only(&cfg, &actor, &mut resp);
        }
        (resp, deliver)
    })
    .await
    .unwrap_or_else(|e| {
        (
            error(id, &GatewayError::params(format!("internal error: {e}"))),
            vec![],
        )
    })
}

/// Keep, of a `review` result, the executions of `actor`.
fn own_only(cfg: &GatewayConfig, actor: &str, resp: &mut Value) {
    let Ok(j) = crate::journal::Journal::open(&cfg.journal) else {
        return;
    };
    if let Some(items) = resp.get_mut("result").and_then(Value::as_array_mut) {
        items.retain(|it| {
            named(it)
                .and_then(|id| j.intent_of(&id).ok().flatten())
                .is_some_and(|c| c.actor == actor)
        });
    }
}
