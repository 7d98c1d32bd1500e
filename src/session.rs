//! Host sessions: one long-lived marker-protocol exec per pooled connection and marker home
//! (the host script's `session` mode) that starts many dispatches per flush.
//!
//! A dispatch on its own exec pays for an SSH session, a script parse and about 15 processes,
//! three of them `sync`. The client sends each request as soon as it has it; the host takes
//! every request that arrived while its previous batch was being started and starts them
//! together: one start-guard `ln`, one `mv` and one `sync` for the whole batch, then a fork,
//! `setsid` and the login shell per command. Finishes that arrive together share one `wc` (none
//! if their outputs are empty), one `sync` of their records and one of their names. The host's
//! session shell leaves that file work to helper subshells beside it and only answers and
//! starts commands.
//!
//! The session shell on the host is the supervisor named in every started record it writes,
//! so a probe, a reattach or a cancel of such an execution is the same `watch`/`cancel` exec as
//! for any other. If the session's channel breaks, each execution it had sent is in the state
//! of any execution whose connection broke: the executor records `connection-lost` and asks the
//! host. A request it had not sent yet is handed back ([`Event::Unavailable`]) and dispatched
//! on an exec of its own.
//!
//! Used only by `cairn serve` / `cairn mcp` with `--host-session`, for dispatches without
//! secrets whose command is at most [`MAX_COMMAND`] bytes without a NUL byte, and whose caller
//! waits for the result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::id::ExecutionId;
use crate::marker::{self, Line, Op, SessionDemux, SessionItem};
use crate::ssh::{Connection, Exec, ExecEvent, SshError};

/// Longest command sent through a session (the host reads it with the shell's `read`, a byte
/// at a time); longer ones, and any with a NUL byte, are dispatched on an exec of their own.
pub const MAX_COMMAND: usize = 4096;

/// Requests in one batch, and executions in flight on one session (the host refuses a batch of
/// more than 64; the cap on executions in flight keeps its event queue far below a pipe's
/// 64 KiB).
pub const MAX_IN_FLIGHT: usize = 64;

/// Why a host session stops reading what the host says: its reply is unreadable.
///
/// Layer: host sessions (`src/session.rs`), below the executor. Never an [`crate::ExecError`]:
/// the session ends, and its Display is the reason every execution it carried hears
/// ([`Event::Broken`] for those it had sent, [`Event::Unavailable`] for the others).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// A line of the session's own that does not parse.
    #[error("the host session's reply is unreadable: {0}")]
    Line(marker::MarkerError),
    /// The stream is not what the protocol says (the demultiplexer's reason).
    #[error("the host session's reply is unreadable: {0}")]
    Stream(String),
}

/// What a session tells one execution.
#[derive(Debug)]
pub enum Event {
    /// A protocol line: `hello` (the session's, first), then `verdict`, `start`, `sizes`,
    /// `done`, `end`, `error`.
    Line(Result<Line, marker::MarkerError>),
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The session's channel broke after the request was sent: the outcome is for the host to
    /// say (probe it).
    Broken(String),
    /// The request was never sent: dispatch it another way.
    Unavailable(String),
}

/// One dispatch through a session.
pub struct Request {
    pub id: ExecutionId,
    pub digest: String,
    pub timeout_secs: u64,
    pub command: Vec<u8>,
    pub events: mpsc::UnboundedSender<Event>,
}

/// A running session; dropping the last handle ends it once its executions have finished.
pub struct HostSession {
    tx: mpsc::UnboundedSender<Request>,
    dead: Arc<AtomicBool>,
    /// The native host helper runs it (else the sh script).
    helper: Arc<AtomicBool>,
}

impl std::fmt::Debug for HostSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSession")
            .field("dead", &self.dead.load(Ordering::Relaxed))
            .finish()
    }
}

impl HostSession {
    /// Start a session on `conn` for marker home `dir`; its task runs on `rt`.
    /// With `helper`, the native host helper runs it; if the helper does not run (no `hello`
    /// before its exec ended), the sh script does, before any request was sent.
    pub fn start(
        conn: Connection,
        dir: String,
        helper: bool,
        rt: &tokio::runtime::Handle,
    ) -> Arc<HostSession> {
        let (tx, rx) = mpsc::unbounded_channel();
        let dead = Arc::new(AtomicBool::new(false));
        let d = dead.clone();
        let helper = Arc::new(AtomicBool::new(helper));
        let h = helper.clone();
        rt.spawn(async move {
            let why = run(conn, &dir, rx, &h).await;
            d.store(true, Ordering::Relaxed);
            tracing::debug!("host session for {dir} ended: {why}");
        });
        Arc::new(HostSession { tx, dead, helper })
    }

    /// Which side runs this session.
    pub fn side(&self) -> crate::host_helper::Side {
        if self.helper.load(Ordering::Relaxed) {
            crate::host_helper::Side::Helper
        } else {
            crate::host_helper::Side::Script
        }
    }

    /// Whether the session has ended (a new one is needed).
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed) || self.tx.is_closed()
    }

    /// Queue a dispatch; its events arrive on `req.events`. Given back when the session has
    /// ended.
    pub fn dispatch(&self, req: Request) -> Result<(), Request> {
        self.tx.send(req).map_err(|e| e.0)
    }
}

/// The session's task: returns why it ended. Every request it was given hears `Broken` or
/// `Unavailable` if it had no `end` line.
async fn run(
    conn: Connection,
    dir: &str,
    mut rx: mpsc::UnboundedReceiver<Request>,
    helper: &AtomicBool,
) -> String {
    let mut stage = if helper.load(Ordering::Relaxed) { 0 } else { 1 };
    let (exec, nonce) = start(&conn, dir, stage).await;
    let mut ex = match exec {
        Ok(e) => e,
        Err(e) => {
            let why = format!("cannot start a host session: {e}");
            unavailable(&mut rx, Vec::new(), &why);
            return why;
        }
    };
    let mut demux = SessionDemux::new(&nonce);
    let mut items = Vec::new();
    let mut hello: Option<marker::Hello> = None;
    let mut queued: Vec<Request> = Vec::new();
    let mut waiting: HashMap<String, mpsc::UnboundedSender<Event>> = HashMap::new();
    let mut open = true;
    let mut stdin_closed = false;
    let why = 'session: loop {
        if let Some(h) = &hello {
            // Send what is queued at once: the host gathers what arrives while its batch helper
            // is busy into the next batch, so waiting here for verdicts would only add a round
            // trip to every batch.
            if !queued.is_empty() && waiting.len() < MAX_IN_FLIGHT {
                let take = queued.len().min(MAX_IN_FLIGHT - waiting.len());
                let buf = requests(queued.drain(..take), h, &mut waiting);
                if let Err(e) = ex.write_stdin(&buf).await {
                    break 'session format!("the host session's channel broke: {e}");
                }
                continue;
            }
        }
        if !open && queued.is_empty() && waiting.is_empty() && !stdin_closed {
            // nobody will ask for more: the host session ends when its commands have
            stdin_closed = true;
            let _ = ex.close_stdin().await;
        }
        tokio::select! {
            ev = ex.next() => match ev {
                Ok(Some(ExecEvent::Stdout(d))) => {
                    demux.feed(&d, &mut items);
                    if let Err(why) = hand_out(dir, items.drain(..), &mut hello, &mut waiting) {
                        break 'session why.to_string();
                    }
                }
                Ok(Some(ExecEvent::Stderr(d))) => {
                    tracing::debug!(
                        "host session for {dir}, stderr: {}",
                        String::from_utf8_lossy(&d)
                    );
                }
                Ok(Some(_)) => {}
                // a side that did not run (nothing was sent before its hello): the next one
                Ok(None) if hello.is_none() && stage < 2 => {
                    helper.store(false, Ordering::Relaxed);
                    stage += 1;
                    tracing::info!("cairn: the host {} did not start a session on {dir}; using the sh script{}",
                        if stage == 1 { "helper" } else { "script" },
                        if stage == 2 { ", streamed" } else { "" });
                    let (exec, nonce) = start(&conn, dir, stage).await;
                    match exec {
                        Ok(e) => {
                            ex = e;
                            demux = SessionDemux::new(&nonce);
                            stdin_closed = false;
                        }
                        Err(e) => break 'session format!("cannot start a host session: {e}"),
                    }
                }
                Ok(None) => break 'session "the host session ended".to_owned(),
                Err(e) => break 'session format!("the host session's channel broke: {e}"),
            },
            r = rx.recv(), if open => match r {
                // (one ID twice in one session would stop it: send the second another way)
                Some(r) if waiting.contains_key(r.id.as_str())
                    || queued.iter().any(|q| q.id == r.id) =>
                {
                    let _ = r.events.send(Event::Unavailable("already in this session".into()));
                }
                Some(r) => queued.push(r),
                None => open = false,
            },
        }
    };
    for (_, tx) in waiting.drain() {
        let _ = tx.send(Event::Broken(why.clone()));
    }
    unavailable(&mut rx, queued, &why);
    why
}

/// Start the host session's exec at `stage`, with the nonce it was started with. Who runs it:
/// 0 the helper, 1 the script installed in the marker home, 2 the script streamed on stdin
/// ahead of the requests (where it is not installed). Each gives way to the next when its exec
/// ends before `hello`: nothing was sent, nothing happened.
async fn start(conn: &Connection, dir: &str, stage: u8) -> (Result<Exec, SshError>, String) {
    let nonce = marker::new_nonce();
    let (inv, lead) = match stage {
        0 => (
            crate::host_helper::invocation(&Op::Session, dir, &nonce),
            None,
        ),
        1 => (marker::invocation(&Op::Session, dir, &nonce), None),
        _ => {
            let (inv, lead) = marker::streamed_invocation(&Op::Session, dir, &nonce);
            (inv, Some(lead))
        }
    };
    let mut exec = conn.exec(inv.as_bytes()).await;
    if let (Ok(ex), Some(lead)) = (&mut exec, lead) {
        if let Err(e) = ex.write_stdin(&lead).await {
            exec = Err(e);
        }
    }
    (exec, nonce)
}

/// The bytes that send `batch` (each request, then `g`); each request hears the session's
/// hello and waits for its lines from now on.
fn requests(
    batch: impl Iterator<Item = Request>,
    hello: &marker::Hello,
    waiting: &mut HashMap<String, mpsc::UnboundedSender<Event>>,
) -> Vec<u8> {
    let mut buf = Vec::new();
    for r in batch {
        buf.extend(marker::session_request(
            &r.id,
            &r.digest,
            r.timeout_secs,
            &r.command,
        ));
        let _ = r.events.send(Event::Line(Ok(Line::Hello(hello.clone()))));
        waiting.insert(r.id.as_str().to_owned(), r.events);
    }
    buf.extend_from_slice(b"g\n");
    buf
}

/// Give what the host session said to whom it is for: its own hello and errors to the
/// session, each execution's lines and output to its waiter (which stops waiting at its
/// `end`). `Err`: the reply is unreadable and the session ends.
fn hand_out(
    dir: &str,
    items: impl Iterator<Item = SessionItem>,
    hello: &mut Option<marker::Hello>,
    waiting: &mut HashMap<String, mpsc::UnboundedSender<Event>>,
) -> Result<(), SessionError> {
    for item in items {
        match item {
            SessionItem::Session(Ok(Line::Hello(h))) => *hello = Some(h),
            SessionItem::Session(Ok(Line::Error(e))) => {
                tracing::warn!("host session for {dir}: {e}");
            }
            SessionItem::Session(Ok(_)) => {}
            SessionItem::Session(Err(e)) => return Err(SessionError::Line(e)),
            SessionItem::Broken(e) => return Err(SessionError::Stream(e)),
            SessionItem::For(id, line) => {
                let end = matches!(line, Ok(Line::End));
                match waiting.get(&id) {
                    Some(tx) => {
                        let _ = tx.send(Event::Line(line));
                    }
                    None => tracing::warn!(
                        "host session for {dir}: a line for {id}, which it was not given"
                    ),
                }
                if end {
                    waiting.remove(&id);
                }
            }
            SessionItem::Output { id, stderr, data } => {
                if let Some(tx) = waiting.get(&id) {
                    let _ = tx.send(if stderr {
                        Event::Stderr(data)
                    } else {
                        Event::Stdout(data)
                    });
                }
            }
        }
    }
    Ok(())
}

/// Hand back requests that were never sent.
fn unavailable(rx: &mut mpsc::UnboundedReceiver<Request>, queued: Vec<Request>, why: &str) {
    rx.close();
    let mut all = queued;
    while let Ok(r) = rx.try_recv() {
        all.push(r);
    }
    for r in all {
        let _ = r.events.send(Event::Unavailable(why.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What ends a session on an unreadable reply reads as it did when it was a string: the
    /// executions it carried hear this text.
    #[test]
    fn an_unreadable_reply_ends_the_session_with_the_same_words() {
        let mut hello = None;
        let mut waiting = HashMap::new();
        let line = SessionItem::Session(Err(marker::MarkerError::UnknownLine("zap".into())));
        let why = hand_out("d", [line].into_iter(), &mut hello, &mut waiting).unwrap_err();
        assert_eq!(
            why.to_string(),
            "the host session's reply is unreadable: unknown protocol line \"zap\""
        );
        let broken = SessionItem::Broken("no frame".into());
        let why = hand_out("d", [broken].into_iter(), &mut hello, &mut waiting).unwrap_err();
        assert_eq!(
            why.to_string(),
            "the host session's reply is unreadable: no frame"
        );
        let error = SessionItem::Session(Ok(Line::Error("busy".into())));
        assert!(hand_out("d", [error].into_iter(), &mut hello, &mut waiting).is_ok());
    }
}
