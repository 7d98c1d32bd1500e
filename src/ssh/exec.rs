//! Commands on session channels: [`Exec`] reads what the remote command says as [`ExecEvent`]s
//! and writes its stdin within the channel's window.

use std::collections::VecDeque;
use std::sync::Arc;

use russh::client;
use russh::{ChannelMsg, ChannelReadHalf, ChannelWriteHalf};

use super::{ClientHandler, Connection, Shared, SshError};

/// Something the remote command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    ExitStatus(u32),
    /// The command was killed by this signal (name without "SIG", e.g. "TERM").
    ExitSignal(String),
}

/// A command running on a session channel.
pub struct Exec {
    pub(super) read: ChannelReadHalf,
    pub(super) write: ChannelWriteHalf<client::Msg>,
    /// Messages received while `write_stdin` waited for window space.
    pub(super) pending: VecDeque<ChannelMsg>,
    pub(super) read_ended: bool,
    pub(super) saw_close: bool,
    pub(super) done: bool,
    pub(super) shared: Arc<Shared>,
    pub(super) _open: OpenChannel,
    pub(super) _handle: Arc<client::Handle<ClientHandler>>,
    /// The jump host's connection, open as long as this command's channel may be read.
    pub(super) _via: Option<Arc<Connection>>,
}

/// Counts an [`Exec`] among its connection's open channels until it is dropped.
pub(super) struct OpenChannel(pub(super) Arc<Shared>);

impl Drop for OpenChannel {
    fn drop(&mut self) {
        self.0
            .channels_open
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec").field("done", &self.done).finish()
    }
}

impl Exec {
    /// Send bytes to the command's stdin, waiting for the server's window as needed. Output that
    /// arrives meanwhile is kept for [`Exec::next`], so a command that writes while it reads
    /// cannot deadlock us.
    pub async fn write_stdin(&mut self, data: &[u8]) -> Result<(), SshError> {
        if data.is_empty() {
            return Ok(());
        }
        let write = &self.write;
        let fut = write.data_bytes(data.to_vec());
        tokio::pin!(fut);
        loop {
            if self.read_ended {
                if self.saw_close {
                    // The command finished and closed the channel: the rest of stdin has
                    // nowhere to go (like EPIPE). Its exit status is still in `next()`.
                    tracing::debug!("stdin discarded: channel already closed by the server");
                    return Ok(());
                }
                return Err(SshError::Disconnected(self.shared.reason()));
            }
            tokio::select! {
                r = &mut fut => {
                    return r.map_err(|_| SshError::Disconnected(self.shared.reason()));
                }
                msg = self.read.wait() => match msg {
                    Some(m) => {
                        if matches!(m, ChannelMsg::Close) {
                            self.saw_close = true;
                        }
                        self.pending.push_back(m);
                    }
                    None => self.read_ended = true,
                },
            }
        }
    }

    /// Send EOF on stdin.
    pub async fn close_stdin(&mut self) -> Result<(), SshError> {
        self.write
            .eof()
            .await
            .map_err(|_| SshError::Disconnected(self.shared.reason()))
    }

    /// The next event. `Ok(None)` once the channel has closed normally. If the connection dies,
    /// this returns `Err(SshError::Disconnected)` (once; `Ok(None)` after that) — keepalives
    /// bound how long a black-holed link takes to get there.
    pub async fn next(&mut self) -> Result<Option<ExecEvent>, SshError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let msg = if let Some(m) = self.pending.pop_front() {
                Some(m)
            } else if self.read_ended {
                None
            } else {
                self.read.wait().await
            };
            let Some(msg) = msg else {
                self.read_ended = true;
                self.done = true;
                if self.saw_close {
                    return Ok(None);
                }
                return Err(SshError::Disconnected(self.shared.reason()));
            };
            match msg {
                ChannelMsg::Data { data } => return Ok(Some(ExecEvent::Stdout(data.to_vec()))),
                ChannelMsg::ExtendedData { data, ext: 1 } => {
                    return Ok(Some(ExecEvent::Stderr(data.to_vec())))
                }
                ChannelMsg::ExitStatus { exit_status } => {
                    return Ok(Some(ExecEvent::ExitStatus(exit_status)))
                }
                ChannelMsg::ExitSignal { signal_name, .. } => {
                    let name = match signal_name {
                        russh::Sig::Custom(s) => s,
                        other => format!("{other:?}"),
                    };
                    return Ok(Some(ExecEvent::ExitSignal(name)));
                }
                ChannelMsg::Close => {
                    self.saw_close = true;
                    self.done = true;
                    return Ok(None);
                }
                ChannelMsg::Failure => {
                    self.done = true;
                    return Err(SshError::Protocol(
                        "the server refused to run the command (exec request failed)".into(),
                    ));
                }
                _ => continue,
            }
        }
    }
}
