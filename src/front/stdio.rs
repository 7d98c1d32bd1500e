//! `cairn serve --stdio`: JSON-RPC 2.0 on stdin/stdout, one JSON message per line.
//!
//! Methods (the table in [`crate::front::rpc`], shared with `POST /rpc`; params and results
//! in `docs/GATEWAYS.md`): `execute`, `status`, `output`,
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

use serde_json::Value;

use crate::evidence::SessionEvidence;
use crate::executor::ExecError;
use crate::front::gateway::{self, GatewayConfig};
use crate::front::rpc::{self, correlation, waits};
use crate::id::ExecutionId;

// The method table and the request's decoding are shared with `POST /rpc`.
use crate::front::rpc::{decode_line, handle, Request};

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
                    let corr = correlation(&shown);
                    let (resp, deliver) =
                        rpc::handle_waiting(&cfg, &method, params, &shown, corr).await;
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
