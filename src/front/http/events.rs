//! Resumable response streams backed by the journal (rmcp's `EventStore`, `SessionStore` and
//! a `SessionManager` around its local one).
//!
//! Every SSE event of a response stream is committed to the journal before it is sent, and its
//! event ID is its journal sequence number. A client that lost the stream (a proxy cut it, the
//! laptop changed networks, the server was restarted) sends `GET` with `Last-Event-ID` and is
//! given what followed that event on the same stream:
//! - the events already stored, then, while the call is still running in this process, each
//!   new one as it is stored, until the response;
//! - if the call's handler died with an earlier server process (no response was stored and
//!   none will be), the answer is made from the journal: the execution the call created is
//!   found by its correlation (actor, MCP session, request ID) and attached to by its ID, which
//!   never runs anything; a call that died before its execution was accepted gets an error
//!   saying nothing ran. Either way the answer is stored as the stream's next event, and the
//!   client never sends its `tools/call` again.
//!
//! Sessions survive a restart too: the `initialize` parameters are stored, and rmcp restores
//! a session it does not know from them.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ErrorData, RequestId, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, RestoreOutcome, ServerSseMessage, SessionId,
    SessionManager, SessionState, SessionStore, SessionStoreError,
};
use serde_json::{json, Value};

use crate::front::gateway::{GatewayConfig, Workers};
use crate::journal::{Journal, StoredEvent, StreamRecord};

/// The journal-backed event store.
pub struct JournalEvents {
    cfg: GatewayConfig,
    workers: Arc<Workers>,
    /// Streams this process wrote to: their handlers are alive here.
    live: Mutex<HashSet<String>>,
    /// Bumped after every stored event (wakes the streams being replayed).
    stored: tokio::sync::watch::Sender<u64>,
}

fn boxed(e: impl std::fmt::Display) -> EventStoreError {
    e.to_string().into()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, super::HttpError> + Send + 'static,
) -> Result<T, EventStoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(boxed)?
        .map_err(boxed)
}

/// The SSE message of a stored event.
fn to_sse(e: &StoredEvent) -> Option<ServerSseMessage> {
    let id = e.seq.to_string();
    match &e.message {
        Some(m) => {
            let msg: ServerJsonRpcMessage = serde_json::from_str(m)
                .inspect_err(|err| tracing::warn!("cairn: stored SSE event {id}: {err}"))
                .ok()?;
            Some(ServerSseMessage::new(id, msg))
        }
        None => Some(ServerSseMessage::priming(
            id,
            Duration::from_millis(e.retry_ms.unwrap_or(3000).max(0) as u64),
        )),
    }
}

/// Whether a stored message ends its stream (a response or an error).
fn ends_stream(e: &StoredEvent) -> bool {
    e.message.as_deref().is_some_and(|m| {
        serde_json::from_str::<Value>(m)
            .is_ok_and(|v| v.get("result").is_some() || v.get("error").is_some())
    })
}

impl JournalEvents {
    pub fn new(cfg: GatewayConfig, workers: Arc<Workers>) -> Arc<Self> {
        Arc::new(JournalEvents {
            cfg,
            workers,
            live: Mutex::new(HashSet::new()),
            stored: tokio::sync::watch::channel(0).0,
        })
    }

    fn journal(&self) -> Result<Journal, super::HttpError> {
        Ok(Journal::open(&self.cfg.journal)?)
    }

    fn is_live(&self, stream: &str) -> bool {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(stream)
    }

    async fn store(
        &self,
        stream: &str,
        retry_ms: Option<i64>,
        message: Option<String>,
    ) -> Result<i64, EventStoreError> {
        let (path, s) = (self.cfg.journal.clone(), stream.to_owned());
        let seq = blocking(move || {
            Journal::open(&path)
                .and_then(|j| j.store_http_event(&s, retry_ms, message.as_deref()))
                .map_err(Into::into)
        })
        .await?;
        self.stored.send_modify(|n| *n += 1);
        Ok(seq)
    }

    /// The answer to a call whose handler died with an earlier server process: from the
    /// journal, never by running anything (see the module doc).
    async fn answer_orphan(self: &Arc<Self>, stream: &str) -> Option<StoredEvent> {
        let me = self.clone();
        let s = stream.to_owned();
        let found = blocking(move || -> Result<_, super::HttpError> {
            let j = me.journal()?;
            let Some(rec) = j.http_stream(&s)? else {
                return Ok(None);
            };
            let req: Value = serde_json::from_str(&rec.request).unwrap_or_default();
            let rid = req.get("id").cloned().unwrap_or(Value::Null);
            let corr = correlation_of(&rec, &rid);
            let id = j.execution_by_correlation(&corr)?;
            Ok(Some((rec, rid, corr, id)))
        })
        .await
        .ok()
        .flatten()?;
        let (rec, rid, corr, id) = found;
        let request_id: RequestId = serde_json::from_value(rid).ok()?;
        let message = match id {
            Some(id) => {
                let mut cfg = self.cfg.clone();
                cfg.actor = rec.actor.clone();
                let (tx, rx) = tokio::sync::oneshot::channel();
                let params = json!({"execution_id": id});
                let c2 = cfg.clone();
                self.workers.submit(Box::new(move || {
                    Box::pin(async move {
                        let r = crate::front::gateway::attach(&c2, &params, Some(corr)).await;
                        let _ = tx.send(r);
                    })
                }));
                match rx.await.ok()? {
                    Ok((v, deliver)) => {
                        if let Some(d) = deliver {
                            let c3 = cfg.clone();
                            let _ = tokio::task::spawn_blocking(move || {
                                crate::front::gateway::delivered(&c3, &d)
                            })
                            .await;
                        }
                        ServerJsonRpcMessage::response(
                            rmcp::model::ServerResult::CallToolResult(
                                crate::front::tool_result::result(v),
                            ),
                            request_id,
                        )
                    }
                    Err(e) => ServerJsonRpcMessage::response(
                        rmcp::model::ServerResult::CallToolResult(
                            crate::front::tool_result::tool_error(e),
                        ),
                        request_id,
                    ),
                }
            }
            None => ServerJsonRpcMessage::error(
                ErrorData::internal_error(
                    "the server restarted before this call was accepted: nothing was run; send \
                     the call again",
                    None,
                ),
                Some(request_id),
            ),
        };
        let text = serde_json::to_string(&message).ok()?;
        let seq = self.store(stream, None, Some(text.clone())).await.ok()?;
        Some(StoredEvent {
            seq,
            stream_id: stream.to_owned(),
            retry_ms: None,
            message: Some(text),
        })
    }

    /// Feed `tx` with the events of `stream` after `after` until its response (see the module
    /// doc). Ends early when the receiver is gone.
    async fn replay(
        self: Arc<Self>,
        stream: String,
        mut after: i64,
        tx: tokio::sync::mpsc::Sender<ServerSseMessage>,
    ) {
        let mut woken = self.stored.subscribe();
        let mut orphan_checked = false;
        loop {
            woken.borrow_and_update();
            let (path, s) = (self.cfg.journal.clone(), stream.clone());
            let rows = blocking(move || {
                Journal::open(&path)
                    .and_then(|j| j.http_events_after(&s, after))
                    .map_err(Into::into)
            })
            .await
            .unwrap_or_default();
            for e in &rows {
                after = e.seq;
                if let Some(m) = to_sse(e) {
                    if tx.send(m).await.is_err() {
                        return;
                    }
                }
                if ends_stream(e) {
                    return;
                }
            }
            if rows.is_empty() && !self.is_live(&stream) && !orphan_checked {
                // Not live: its end may have been stored since the query. Look once more.
                orphan_checked = true;
                continue;
            }
            if rows.is_empty() && !self.is_live(&stream) {
                if let Some(e) = self.answer_orphan(&stream).await {
                    if let Some(m) = to_sse(&e) {
                        let _ = tx.send(m).await;
                    }
                }
                return;
            }
            if rows.is_empty() {
                tokio::select! {
                    r = woken.changed() => if r.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        }
    }
}

/// The correlation the HTTP front recorded for the call a stream answers.
fn correlation_of(rec: &StreamRecord, request_id: &Value) -> String {
    let rid = match request_id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match &rec.session_id {
        Some(s) => format!("actor={} mcp-session={s} request={rid}", rec.actor),
        None => format!("actor={} request={rid}", rec.actor),
    }
}

/// The [`EventStore`] rmcp holds: a handle on the shared [`JournalEvents`].
pub struct Events(pub Arc<JournalEvents>);

#[async_trait::async_trait]
impl EventStore for Events {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let message = match &event.message {
            Some(m) => Some(serde_json::to_string(m.as_ref()).map_err(boxed)?),
            None => None,
        };
        let retry = event.retry.map(|d| d.as_millis() as i64);
        let ends = message
            .as_deref()
            .and_then(|m| serde_json::from_str::<Value>(m).ok())
            .is_some_and(|v| v.get("result").is_some() || v.get("error").is_some());
        let me = &self.0;
        me.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(stream_id.to_owned());
        let seq = me.store(stream_id, retry, message).await?;
        if ends {
            // Stored first: a replay that finds the stream no longer live finds its end.
            me.live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(stream_id);
        }
        Ok(seq.to_string())
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let seq: i64 = last_event_id.parse().map_err(|_| {
            boxed(format!(
                "event ID {last_event_id:?} is not one of this server's"
            ))
        })?;
        let path = self.0.cfg.journal.clone();
        let stream = blocking(move || {
            Journal::open(&path)
                .and_then(|j| j.http_event_stream(seq))
                .map_err(Into::into)
        })
        .await?
        .ok_or_else(|| boxed(format!("no event {seq} in this journal")))?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(self.0.clone().replay(stream, seq, tx));
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// MCP sessions' `initialize` parameters in the journal.
pub struct JournalSessions {
    pub journal: PathBuf,
}

#[async_trait::async_trait]
impl SessionStore for JournalSessions {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let (path, id) = (self.journal.clone(), session_id.to_owned());
        let state = blocking(move || {
            Journal::open(&path)
                .and_then(|j| j.http_session(&id))
                .map_err(Into::into)
        })
        .await?
        .and_then(|(_, state)| state);
        Ok(state.and_then(|s| serde_json::from_str(&s).ok()))
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let text = serde_json::to_string(state).map_err(boxed)?;
        let (path, id) = (self.journal.clone(), session_id.to_owned());
        blocking(move || {
            Journal::open(&path)
                .and_then(|j| j.store_http_session(&id, &text))
                .map_err(Into::into)
        })
        .await
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        let (path, id) = (self.journal.clone(), session_id.to_owned());
        blocking(move || {
            Journal::open(&path)
                .and_then(|j| j.delete_http_session(&id))
                .map_err(Into::into)
        })
        .await
    }
}

/// rmcp's local session manager, which also records which request each response stream
/// answers (for [`JournalEvents::answer_orphan`]).
pub struct Sessions {
    pub inner: LocalSessionManager,
    pub journal: PathBuf,
}

impl SessionManager for Sessions {
    type Error = <LocalSessionManager as SessionManager>::Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.inner.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let actor = match &message {
            ClientJsonRpcMessage::Request(r) => {
                use rmcp::model::GetExtensions;
                r.request
                    .extensions()
                    .get::<http::request::Parts>()
                    .and_then(|p| p.extensions.get::<super::HttpCaller>())
                    .map(|c| c.caller.actor.clone())
            }
            _ => None,
        };
        let request = serde_json::to_string(&message).unwrap_or_default();
        let mut stream = Box::pin(self.inner.create_stream(id, message).await?);
        // The first event is the priming event, stored already: its ID names the stream.
        let first = stream.next().await;
        if let (Some(actor), Some(seq)) = (
            actor,
            first
                .as_ref()
                .and_then(|f| f.event_id.as_deref())
                .and_then(|e| e.parse::<i64>().ok()),
        ) {
            let (path, session) = (self.journal.clone(), id.to_string());
            let _ = tokio::task::spawn_blocking(move || {
                let what = format!("the resumable stream of event {seq}");
                crate::journal::append_evidence_retrying(&what, || {
                    let j = Journal::open(&path)?;
                    if let Some(stream_id) = j.http_event_stream(seq)? {
                        j.record_http_stream(&StreamRecord {
                            stream_id,
                            session_id: Some(session.clone()),
                            actor: actor.clone(),
                            request: request.clone(),
                        })?;
                    }
                    Ok::<_, crate::journal::JournalError>(())
                })
            })
            .await;
        }
        Ok(futures::stream::iter(first).chain(stream))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}
