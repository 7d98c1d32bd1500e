//! ProxyCommand: a command whose standard input and output carry the SSH connection.
//!
//! Run as OpenSSH runs it: `$SHELL -c "exec COMMAND"` (`/bin/sh` when `SHELL` is unset), stdin
//! and stdout piped to cairn, stderr passed through to cairn's own. The command runs in a
//! process group of its own, which is hung up (SIGHUP, as ssh signals its proxy command) when
//! the connection it carries ends, so that helpers it started in the background go too; a
//! command that exits is a lost connection like any other.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::process::{Child, ChildStdin, ChildStdout};

pub(crate) struct ProxyStream {
    stdin: ChildStdin,
    stdout: ChildStdout,
    /// Killed (and reaped by tokio) when the stream is dropped.
    _child: Child,
    /// Its process group.
    pgid: Option<i32>,
}

impl Drop for ProxyStream {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid.filter(|p| *p > 1) {
            // SAFETY: signals the process group this stream started (its leader is not yet
            // reaped: `_child` still holds it, so the group ID cannot have been reused).
            unsafe {
                libc::kill(-pgid, libc::SIGHUP);
            }
        }
    }
}

impl ProxyStream {
    pub(crate) fn spawn(command: &str) -> io::Result<ProxyStream> {
        let shell = std::env::var_os("SHELL")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "/bin/sh".into());
        let mut child = tokio::process::Command::new(&shell)
            .arg("-c")
            .arg(format!("exec {command}"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot run the ProxyCommand through {}: {e}",
                        std::path::Path::new(&shell).display()
                    ),
                )
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(io::Error::other("the ProxyCommand's pipes were not set up"));
        };
        let pgid = child.id().and_then(|p| i32::try_from(p).ok());
        Ok(ProxyStream {
            stdin,
            stdout,
            _child: child,
            pgid,
        })
    }
}

impl AsyncRead for ProxyStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stdout).poll_read(cx, buf)
    }
}

impl AsyncWrite for ProxyStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stdin).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stdin).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stdin).poll_shutdown(cx)
    }
}
