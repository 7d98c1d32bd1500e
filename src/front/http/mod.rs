//! `cairn mcp --listen`: the MCP server over Streamable HTTP, and the `cairn serve` JSON-RPC
//! methods over HTTP, for gateways that run cairn as a service many agents reach.
//!
//! Routes (one listener):
//! - `/mcp`: MCP Streamable HTTP (rmcp's server transport; the same tools as `cairn mcp` on
//!   stdio). Sessions (`Mcp-Session-Id`) and SSE event IDs for the 2025-11-25 revision, so a
//!   client that lost a response stream resumes it with `Last-Event-ID` instead of sending its
//!   `tools/call` again.
//! - `/rpc`: one JSON-RPC 2.0 request per `POST`, the methods of `cairn serve --stdio`.
//! - `/healthz`: `ok` (no token needed; says nothing else).
//! - `/metrics`: the Prometheus text format (what it counts: `src/front/http/metrics.rs`).
//!
//! Every request but `/healthz` passes one guard, in this order, before anything else runs:
//! the `Host` header must name this server (DNS rebinding), an `Origin` header, when present,
//! must be one that was allowed (`--allow-origin`), and `Authorization: Bearer <token>` must
//! carry a valid token ([`crate::front::token`]). A refused request gets 403 or 401, touches no
//! execution, and is recorded as a `refused` event of the server's session (with the reason
//! and the peer address; never the token). An accepted request acts as its token's actor: the
//! actor of every execution it starts, the `by` of every decision; an MCP session belongs to
//! the actor that opened it. Calls in flight are capped per actor.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use serde_json::{json, Value};

use crate::evidence::SessionEvidence;
use crate::executor::ExecError;
use crate::front::caller::{HttpCaller, InFlight};
use crate::front::gateway::{GatewayConfig, Workers};
use crate::front::token::Caller;
use crate::journal::Journal;
pub(crate) use error::HttpError;

mod error;
mod events;
mod headers;
pub mod listen;
mod metrics;
mod refusals;
mod rpc;

/// How the HTTP front listens and what it lets in (plain options: the CLI fills them).
#[derive(Clone, Debug)]
pub struct HttpOptions {
    pub listen: SocketAddr,
    /// Host names (or addresses) the `Host` header may name, besides the defaults: the
    /// loopback names on a loopback listener, the listening address otherwise.
    pub allow_hosts: Vec<String>,
    /// Browser origins (`https://app.example.com`) allowed to call; an `Origin` not listed is
    /// refused with 403. Clients that are not browsers send none.
    pub allow_origins: Vec<String>,
    /// Largest request body accepted (413 past it).
    pub max_body_bytes: usize,
    /// Calls in flight per actor (`tools/call`, `execute`, `attach`); past it a call is refused
    /// with an error saying so, and nothing starts.
    pub max_in_flight_per_actor: usize,
    /// Classes whose executions are cancelled when the caller's stream closes (src/front/tasks.rs).
    pub cancel_on_closed_stream: Vec<crate::intent::OpClass>,
    /// Serve TLS with this PEM certificate chain and PEM private key.
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// The default address of `cairn mcp --listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8421";
/// The default request size limit (4 MiB, as rmcp's).
pub const DEFAULT_MAX_BODY: usize = 4 << 20;
/// How long stored response streams are kept for a client to resume (pruned at start).
pub const STREAM_RETENTION: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);
/// The default cap of calls in flight per actor.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// The server's shared state.
struct Front {
    cfg: GatewayConfig,
    hosts: Vec<String>,
    origins: Vec<String>,
    max_body: usize,
    in_flight: Arc<InFlight>,
    workers: Arc<Workers>,
    /// MCP session → the actor that opened it (also in the journal, for a restarted server).
    sessions: Mutex<HashMap<String, String>>,
    tasks: crate::front::tasks::TaskState,
    local: metrics::Local,
}

fn loopback_names() -> Vec<String> {
    ["localhost", "127.0.0.1", "::1"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The host part of a `Host` header value (`[::1]:8421` → `::1`), lowercased.
fn host_of(v: &str) -> String {
    let v = v.trim();
    let host = if let Some(rest) = v.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        v.rsplit_once(':').map_or(v, |(h, p)| {
            if p.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                v
            }
        })
    };
    host.to_ascii_lowercase()
}

fn origin_norm(v: &str) -> String {
    v.trim().trim_end_matches('/').to_ascii_lowercase()
}

fn plain(status: StatusCode, msg: impl Into<String>) -> Response {
    let body = json!({"error": msg.into()}).to_string();
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

impl Front {
    /// Record a refused request as an event of the server's session (blocking: call from a
    /// blocking context).
    fn record_refusal(&self, evidence: Value) {
        tracing::warn!(
            "cairn: refused {} {} from {}: {}",
            evidence["method"].as_str().unwrap_or(""),
            evidence["path"].as_str().unwrap_or(""),
            evidence["peer"].as_str().unwrap_or(""),
            evidence["reason"].as_str().unwrap_or("")
        );
        if let Some(s) = &self.cfg.session_id {
            match Journal::open(&self.cfg.journal) {
                Ok(mut j) => {
                    if let Err(e) = j.session_event(s, "refused", evidence) {
                        tracing::warn!("cairn: recording a refused request: {e}");
                    }
                }
                Err(e) => tracing::warn!("cairn: recording a refused request: {e}"),
            }
        }
    }

    async fn refuse(
        self: &Arc<Self>,
        status: StatusCode,
        reason: String,
        seen: &Seen,
        token_id: Option<String>,
    ) -> Response {
        let evidence = SessionEvidence::Refused {
            status: status.as_u16(),
            reason: &reason,
            method: &seen.method,
            path: &seen.path,
            peer: seen.peer.to_string(),
            origin: seen.origin.as_deref(),
            token_id: token_id.as_deref(),
        }
        .to_value();
        self.local
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Sampled: at most a few per source and minute cost an append (src/front/http/refusals.rs).
        if self
            .local
            .refusals
            .admit(seen.peer.ip(), std::time::Instant::now())
        {
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.record_refusal(evidence)).await;
        } else {
            tracing::debug!(
                "cairn: refused {} {} from {} (counted, not recorded): {reason}",
                seen.method,
                seen.path,
                seen.peer
            );
        }
        let mut r = plain(status, reason);
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"cairn\""),
            );
        }
        r
    }

    /// Why a request does not come from a page or name this server may serve (DNS rebinding:
    /// a `Host` that is not one of its names; a browser `Origin` that was not allowed).
    fn foreign(&self, req: &Request) -> Option<String> {
        let host = req
            .headers()
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(host_of);
        if !host.as_ref().is_some_and(|h| self.hosts.contains(h)) {
            return Some(format!(
                "Host {:?} is not a name of this server (allow it with --allow-host)",
                host.unwrap_or_default()
            ));
        }
        let o = req.headers().get(http::header::ORIGIN)?;
        let o = o.to_str().map(origin_norm).unwrap_or_default();
        (!self.origins.contains(&o))
            .then(|| format!("Origin {o:?} is not allowed (allow it with --allow-origin)"))
    }

    /// The caller the request's bearer token proves, or the refusal to answer with.
    /// (`auth`: the `Authorization` header's value; a request is not `Sync`, so not held.)
    async fn authenticate(
        self: &Arc<Self>,
        auth: Option<String>,
        seen: &Seen,
    ) -> Result<Caller, Response> {
        let f = self.clone();
        let verified = tokio::task::spawn_blocking(move || {
            let j =
                Journal::open(&f.cfg.journal).map_err(crate::front::token::VerifyError::from)?;
            crate::front::token::verify(&j, auth.as_deref())
        })
        .await;
        match verified {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(crate::front::token::VerifyError::Refused(r))) => {
                let token_id = match &r {
                    crate::front::token::Refusal::Revoked(id)
                    | crate::front::token::Refusal::Expired(id) => Some(id.clone()),
                    _ => None,
                };
                Err(self
                    .refuse(StatusCode::UNAUTHORIZED, r.reason(), seen, token_id)
                    .await)
            }
            Ok(Err(e)) => Err(plain(StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
            Err(e) => Err(plain(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        }
    }

    /// The actor an MCP session is bound to, if it is known; an error when the journal could
    /// not say (the request is then refused: an owner that cannot be checked is no owner).
    fn session_actor(&self, id: &str) -> Result<Option<String>, HttpError> {
        if let Some(a) = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
        {
            return Ok(Some(a.clone()));
        }
        if crate::failpoint::fails("session-lookup") {
            return Err(HttpError::Failpoint("the session lookup failed (test)"));
        }
        let j = Journal::open(&self.cfg.journal)?;
        let Some(actor) = j.http_session(id)?.and_then(|s| s.0) else {
            return Ok(None);
        };
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned(), actor.clone());
        Ok(Some(actor))
    }

    /// Record which actor opened MCP session `id`, durably, before the session is handed out:
    /// a session whose owner is not recorded could be used by any token after a restart.
    fn bind_session(&self, id: &str, actor: &str) -> Result<(), HttpError> {
        if crate::failpoint::fails("session-bind") {
            return Err(HttpError::Failpoint("recording the session failed (test)"));
        }
        Journal::open(&self.cfg.journal).and_then(|j| j.bind_http_session(id, actor))?;
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.to_owned(), actor.to_owned());
        Ok(())
    }
}

/// What a refusal records of the request.
struct Seen {
    method: String,
    path: String,
    peer: SocketAddr,
    origin: Option<String>,
}

/// The guard in front of every route (see the module doc; `/healthz` needs no token).
async fn guard(
    State(front): State<Arc<Front>>,
    ConnectInfo(listen::Peer(peer)): ConnectInfo<listen::Peer>,
    mut req: Request,
    next: Next,
) -> Response {
    let seen = Seen {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        peer,
        origin: req
            .headers()
            .get(http::header::ORIGIN)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
    };
    if let Some(reason) = front.foreign(&req) {
        return front
            .refuse(StatusCode::FORBIDDEN, reason, &seen, None)
            .await;
    }
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let auth = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or("?").to_owned());
    let caller = match front.authenticate(auth, &seen).await {
        Ok(c) => c,
        Err(refused) => return refused,
    };
    let mcp_session = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(s) = &mcp_session {
        let (f, s2) = (front.clone(), s.clone());
        let owner = match tokio::task::spawn_blocking(move || f.session_actor(&s2)).await {
            Ok(Ok(owner)) => owner,
            Ok(Err(e)) => {
                tracing::warn!("cairn: MCP session {s}: its owner cannot be checked: {e}");
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("MCP session {s}: its owner cannot be checked now; try again"),
                );
            }
            Err(e) => return plain(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
        if owner.is_some_and(|a| a != caller.actor) {
            // Another actor's session is, to this caller, a session that does not exist.
            let reason = format!("MCP session {s} is not a session of actor {}", caller.actor);
            return front
                .refuse(StatusCode::NOT_FOUND, reason, &seen, Some(caller.token_id))
                .await;
        }
    }
    let actor = caller.actor.clone();
    req.extensions_mut().insert(HttpCaller::new(
        caller,
        mcp_session.clone(),
        front.in_flight.clone(),
    ));
    let resp = next.run(req).await;
    if mcp_session.is_none() {
        if let Some(s) = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        {
            let (f, s) = (front.clone(), s.to_owned());
            let bound = tokio::task::spawn_blocking(move || f.bind_session(&s, &actor))
                .await
                .unwrap_or_else(|e| Err(e.into()));
            if let Err(e) = bound {
                // The session is not handed out: the caller initializes again.
                tracing::warn!("cairn: recording a new MCP session: {e}");
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the new MCP session could not be recorded; initialize again".to_owned(),
                );
            }
        }
    }
    resp
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn metrics_text(State(front): State<Arc<Front>>) -> Response {
    let f = front.clone();
    let r = tokio::task::spawn_blocking(move || {
        let j = Journal::open(&f.cfg.journal)?;
        metrics::scrape(&j, &f.local, f.tasks.results.watched_count())
    })
    .await
    .unwrap_or_else(|e| Err(e.into()));
    match r {
        Ok(text) => {
            let mut r = text.into_response();
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        Err(e) => plain(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// Serve MCP (and JSON-RPC) over HTTP until interrupted (SIGINT / SIGTERM).
pub async fn serve_mcp(mut cfg: GatewayConfig, opts: HttpOptions) -> Result<i32, ExecError> {
    let tls = match &opts.tls {
        Some((cert, key)) => Some(listen::tls_config(cert, key)?),
        None => None,
    };
    if !opts.listen.ip().is_loopback() && tls.is_none() {
        tracing::warn!(
            "cairn: listening on {} (not loopback) without TLS: put a TLS-terminating proxy in \
             front, or keep it on a trusted network",
            opts.listen
        );
    }
    cfg.transport = "mcp-http".into();
    // Streams a client could still resume are minutes old; a week is far beyond any retry.
    if let Ok(j) = Journal::open(&cfg.journal) {
        let week_ago = crate::journal::now_ms() - STREAM_RETENTION.as_millis() as i64;
        if let Err(e) = j.prune_http_events(week_ago) {
            tracing::warn!("cairn: pruning old response streams: {e}");
        }
    }
    cfg.start_session("mcp-http")?;
    cfg.sweep_takeovers();
    let tcp = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| ExecError::Setup(format!("cannot listen on {}: {e}", opts.listen)))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listener = listen::Listener::new(tcp, tls)
        .map_err(|e| ExecError::Setup(format!("listener address: {e}")))?;
    let addr = axum::serve::Listener::local_addr(&listener)
        .map_err(|e| ExecError::Setup(format!("listener address: {e}")))?;
    let front = front(&cfg, &opts, addr);
    let ct = tokio_util::sync::CancellationToken::new();
    // /mcp: what a client left out of its headers is read from its body (src/front/http/headers.rs).
    let mcp = axum::Router::new()
        .route_service("/mcp", mcp_service(&front, &opts, ct.clone()))
        .layer(axum::middleware::from_fn_with_state(
            front.clone(),
            headers::normalize,
        ));
    let app = axum::Router::new()
        .merge(mcp)
        .route("/rpc", axum::routing::post(rpc::rpc))
        .route("/healthz", axum::routing::get(healthz))
        .route("/metrics", axum::routing::get(metrics_text))
        .layer(axum::middleware::from_fn_with_state(front.clone(), guard))
        .with_state(front.clone());
    // Tests and supervisors read the address from this line (with --listen 127.0.0.1:0).
    eprintln!("cairn: listening on {scheme}://{addr} (MCP at /mcp, JSON-RPC at /rpc)");
    let shutdown = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        ct.cancel();
    };
    let r = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<listen::Peer>(),
    )
    .with_graceful_shutdown(shutdown)
    .await;
    let why = match &r {
        Ok(()) => "signal".to_owned(),
        Err(e) => e.to_string(),
    };
    cfg.end_session(SessionEvidence::Ended { reason: &why });
    r.map_err(|e| ExecError::Setup(format!("http server: {e}")))?;
    // Calls still running stay in the journal as they are; a client's retry attaches.
    std::process::exit(0)
}

/// The server's shared state, for a listener bound to `addr`.
fn front(cfg: &GatewayConfig, opts: &HttpOptions, addr: SocketAddr) -> Arc<Front> {
    let mut hosts = if addr.ip().is_loopback() {
        loopback_names()
    } else {
        vec![addr.ip().to_string()]
    };
    hosts.extend(opts.allow_hosts.iter().map(|h| host_of(h)));
    Arc::new(Front {
        cfg: cfg.clone(),
        hosts,
        origins: opts.allow_origins.iter().map(|o| origin_norm(o)).collect(),
        max_body: opts.max_body_bytes,
        in_flight: InFlight::with_cap(opts.max_in_flight_per_actor),
        workers: Arc::new(Workers::start(crate::front::gateway::WORKER_THREADS)),
        sessions: Mutex::new(HashMap::new()),
        tasks: crate::front::tasks::TaskState {
            results: Default::default(),
            closed_stream: crate::front::tasks::ClosedStream {
                cancel_classes: opts.cancel_on_closed_stream.clone(),
            },
        },
        local: Default::default(),
    })
}

/// rmcp's Streamable HTTP service over the same tools as stdio, with sessions and response
/// streams in the journal (events.rs).
fn mcp_service(
    front: &Arc<Front>,
    opts: &HttpOptions,
    ct: tokio_util::sync::CancellationToken,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    crate::front::mcp::CairnMcp,
    events::Sessions,
> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let cfg = &front.cfg;
    let server = crate::front::mcp::CairnMcp::with_workers(cfg.clone(), front.workers.clone())
        .with_tasks(front.tasks.clone());
    // The guard checks Host and Origin itself (and records refusals), so rmcp's own checks are
    // off; its body limit stays.
    let mut mcp_cfg = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_max_request_body_bytes(opts.max_body_bytes)
        .with_cancellation_token(ct);
    mcp_cfg.session_store = Some(Arc::new(events::JournalSessions {
        journal: cfg.journal.clone(),
    }));
    let store = events::JournalEvents::new(cfg.clone(), front.workers.clone());
    let sessions = events::Sessions {
        inner: LocalSessionManager::default().with_event_store(Arc::new(events::Events(store))),
        journal: cfg.journal.clone(),
    };
    StreamableHttpService::new(move || Ok(server.clone()), Arc::new(sessions), mcp_cfg)
}

/// The body of a response that records `delivered` once the connection has taken it whole
/// (when the body is dropped after its data was taken; a connection that failed before taking
/// it delivers nothing).
pub(crate) struct DeliverOnEnd {
    data: Option<bytes::Bytes>,
    len: u64,
    on_end: Option<Box<dyn FnOnce() + Send>>,
}

impl http_body::Body for DeliverOnEnd {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Ready(self.data.take().map(|d| Ok(http_body::Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        // Exact: the response carries a Content-Length.
        http_body::SizeHint::with_exact(self.len)
    }
}

impl Drop for DeliverOnEnd {
    fn drop(&mut self) {
        if self.data.is_none() {
            if let Some(f) = self.on_end.take() {
                f();
            }
        }
    }
}

impl DeliverOnEnd {
    pub(crate) fn response(
        status: StatusCode,
        body: Value,
        on_end: Option<Box<dyn FnOnce() + Send>>,
    ) -> Response {
        let data = bytes::Bytes::from(body.to_string());
        let b = DeliverOnEnd {
            len: data.len() as u64,
            data: Some(data),
            on_end,
        };
        let mut r = Response::new(Body::new(b));
        *r.status_mut() = status;
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_headers_are_compared_by_host_alone() {
        assert_eq!(host_of("127.0.0.1:8421"), "127.0.0.1");
        assert_eq!(host_of("[::1]:8421"), "::1");
        assert_eq!(host_of("LocalHost"), "localhost");
        assert_eq!(host_of("evil.example:80"), "evil.example");
        assert_eq!(
            origin_norm("HTTPS://App.Example.com/"),
            "https://app.example.com"
        );
    }
}
