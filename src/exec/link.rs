//! The host link (issue #36 part 4): [`HostLink`], which the executor owns and which knows no
//! journal, connects (own or pooled connections), says hello, installs the host script, probes
//! and uploads the native helper, and decides which side runs the marker protocol, remembered
//! per process behind one gate per host and marker home. Below it, the executor's side of the
//! link: one protocol exec or host-session dispatch, its reply consumed as it streams (output
//! to the sink, `running` and the offsets to the journal).

use std::time::{Duration, Instant};

use crate::host_helper::{self, HostHelper, Side};
use crate::marker::{self, Hello, Line, Op, Piece, StderrDemux};
use crate::ssh::{ExecEvent, SshError, Target};

use super::*;

/// Why the host link could not prepare a host: say hello, install the host script, probe or
/// upload the native helper, or run the side it chose at all.
///
/// Layer: the host link (`src/exec/link.rs`), below the executor. Most of it never ends an
/// operation: a side that did not run, or a helper that cannot run there, is remembered (by
/// connection and marker home) and the link falls back to the script. Where it does end one,
/// the executor converts it at its boundary: a failed hello into the `failed` conclusion
/// ("never dispatched: preparing the host failed: …"), a helper refused under
/// `--host-helper always` into [`ExecError::Refused`], and the rest by
/// `From<LinkError> for ExecError` ([`ExecError::Ssh`] for the connection,
/// [`ExecError::HostReported`] for what the host said or did). Its Display is the text users
/// read after those prefixes.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum LinkError {
    /// The connection failed under the exec (shared: a decision is remembered and cloned).
    #[error(transparent)]
    Ssh(std::sync::Arc<SshError>),
    /// The host's `error` lines, and lines that did not parse, joined with `; `.
    #[error("{0}")]
    Host(String),
    /// No `hello` line came back.
    #[error("the host did not answer the marker protocol (is /bin/sh POSIX?)")]
    NoHello,
    /// A side that did not run: its exit status and what it wrote (on one line).
    #[error("exit status {status}: {said}")]
    NotRun { status: u32, said: String },
    /// The installed script did not run: its exit status, and no protocol line.
    #[error("exit status {0}, no protocol line")]
    NoProtocolLine(u32),
    /// The script, installed again, still did not run.
    #[error("installed, the host script still did not run ({0})")]
    StillNotRun(Box<LinkError>),
    /// Installing the host script gave neither `installed` nor an error line.
    #[error("installing the host script ended without an answer (exit status {0:?})")]
    InstallUnanswered(Option<u32>),
    /// The native helper did not run (why), so the script runs the protocol.
    #[error("the host helper did not run ({0})")]
    HelperNotRun(Box<LinkError>),
    #[error("this cairn was built without the host helper")]
    HelperNotBuilt,
    #[error("the host did not answer the helper probe")]
    ProbeUnanswered,
    #[error("the host's architecture is {host:?}; the helper is built for {built}")]
    Arch { host: String, built: &'static str },
    /// The helper's state on the host is one it cannot be used in (not `absent`/`mismatch`).
    #[error("the helper on the host is {0}")]
    HelperState(String),
    #[error("the host's script does not report the helper")]
    HelperUnreported,
    /// The helper was uploaded, and its state on the host is still not `ok`.
    #[error("the uploaded helper is {0} on the host")]
    UploadedState(String),
    /// The upload gave no state: the host's errors.
    #[error("uploading the helper failed: {0}")]
    UploadFailed(String),
}

impl From<SshError> for LinkError {
    fn from(e: SshError) -> LinkError {
        LinkError::Ssh(std::sync::Arc::new(e))
    }
}

impl From<LinkError> for ExecError {
    fn from(e: LinkError) -> ExecError {
        match e {
            LinkError::Ssh(e) => match std::sync::Arc::try_unwrap(e) {
                Ok(e) => ExecError::Ssh(e),
                Err(e) => ExecError::HostReported(e.to_string()),
            },
            other => ExecError::HostReported(other.to_string()),
        }
    }
}

/// Which side runs the marker protocol, by connection and marker home, for every executor of
/// this process (a gateway makes one per request): `Err` (the script, and why) is asked again
/// after [`SCRIPT_DECISION_FOR`].
type SideCache = std::collections::HashMap<String, (Instant, Result<(), LinkError>)>;
fn host_helper_cache() -> &'static std::sync::Mutex<SideCache> {
    static C: std::sync::OnceLock<std::sync::Mutex<SideCache>> = std::sync::OnceLock::new();
    C.get_or_init(Default::default)
}
const SCRIPT_DECISION_FOR: Duration = Duration::from_secs(600);

/// The gate each key of [`host_helper_cache`] is decided behind: executions that reach a host
/// together (a gateway given a thousand calls at once) wait for the first one's probe and upload
/// instead of each probing and each sending the 1.2 MB helper: those copies, and the SSH write
/// buffers they grew (which keep their size), were most of what an execution in flight cost.
fn host_helper_gate(key: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    type Gates = std::collections::HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>;
    static G: std::sync::OnceLock<std::sync::Mutex<Gates>> = std::sync::OnceLock::new();
    G.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key.to_owned())
        .or_default()
        .clone()
}

/// Where the host script cannot be installed, by connection and marker home: `Err` (it is
/// streamed with each operation, and why), asked again after [`SCRIPT_DECISION_FOR`].
fn script_cache() -> &'static std::sync::Mutex<SideCache> {
    static C: std::sync::OnceLock<std::sync::Mutex<SideCache>> = std::sync::OnceLock::new();
    C.get_or_init(Default::default)
}
fn host_helper_cache_get(key: &str) -> Option<Result<(), LinkError>> {
    cache_get(host_helper_cache(), key)
}
fn host_helper_cache_put(key: &str, d: Result<(), LinkError>) {
    cache_put(host_helper_cache(), key, d)
}
fn cache_get(c: &std::sync::Mutex<SideCache>, key: &str) -> Option<Result<(), LinkError>> {
    let c = c.lock().unwrap_or_else(|e| e.into_inner());
    match c.get(key) {
        Some((at, Err(_))) if at.elapsed() > SCRIPT_DECISION_FOR => None,
        Some((_, d)) => Some(d.clone()),
        None => None,
    }
}
fn cache_put(c: &std::sync::Mutex<SideCache>, key: &str, d: Result<(), LinkError>) {
    let mut c = c.lock().unwrap_or_else(|e| e.into_inner());
    c.insert(key.to_owned(), (Instant::now(), d));
}

/// The host link: how an executor reaches hosts. Its connections (its own, or leased from a
/// process-wide pool), the options new ones are made with, and which side runs the marker
/// protocol (the host script, installed or streamed, or the native helper). It knows nothing
/// of the journal: the executor's drive records what the link's execs bring back.
pub(crate) struct HostLink {
    pub(crate) connect: ConnectOptions,
    /// Connections this executor uses, with its claim when the connection is pooled.
    pub(super) conns: Vec<(String, Connection, Option<crate::pool::Lease>)>,
    /// Connections shared with other executors of this process (`cairn serve`, `cairn mcp`);
    /// `None`: this executor connects for itself.
    pub(crate) pool: Option<std::sync::Arc<crate::pool::Pool>>,
    /// Dispatch through the pooled connection's host session (`--host-session`; see
    /// [`crate::session`]) when the dispatch allows it. Needs `pool`.
    pub(crate) host_session: bool,
    /// Which host implementation runs the marker protocol (`--host-helper`).
    pub(crate) host_helper: HostHelper,
}

impl HostLink {
    pub(super) fn new(connect: ConnectOptions) -> HostLink {
        HostLink {
            connect,
            conns: Vec::new(),
            pool: None,
            host_session: false,
            host_helper: HostHelper::Auto,
        }
    }

    /// The host key connection `ci` presented.
    pub(super) fn host_key(&self, ci: usize) -> &str {
        self.conns[ci].1.host_key_fingerprint()
    }
    /// A live connection to `target`, reusing one if it is still open (and presents the key
    /// the target is pinned to, if any).
    pub(super) async fn connection(&mut self, target: &Target) -> Result<usize, SshError> {
        let key = format!("{}@{}:{}", target.user, target.hostname, target.port);
        if let Some(i) = self
            .conns
            .iter()
            .position(|(k, c, _)| *k == key && !c.is_closed())
        {
            let presented = self.conns[i].1.host_key_fingerprint();
            return match &target.pinned_host_key {
                Some(p) if p != presented => Err(SshError::HostKeyPinned {
                    host: target.display(),
                    pinned: p.clone(),
                    presented: presented.to_owned(),
                }),
                _ => Ok(i),
            };
        }
        self.conns.retain(|(k, _, _)| *k != key);
        let (c, lease) = match &self.pool {
            Some(pool) => {
                let (c, lease) = pool.get(target, &self.connect).await?;
                (c, Some(lease))
            }
            None => (crate::pool::connect(target, &self.connect).await?, None),
        };
        self.conns.push((key, c, lease));
        Ok(self.conns.len() - 1)
    }

    /// Stop using a connection that failed; a pooled one is given to nobody new.
    pub(super) fn drop_connection(&mut self, idx: usize) {
        if idx < self.conns.len() {
            let (_, _, lease) = self.conns.remove(idx);
            if let Some(mut l) = lease {
                l.retire();
            }
        }
    }

    pub(super) async fn hello(&mut self, ci: usize, dir: &str) -> Result<Hello, LinkError> {
        let (lines, errors) = self.small_exec(ci, &Op::Hello, dir, None).await?;
        let hello = lines.into_iter().rev().find_map(|l| match l {
            Line::Hello(h) => Some(h),
            _ => None,
        });
        match hello {
            Some(h) if errors.is_empty() => Ok(h),
            _ if !errors.is_empty() => Err(LinkError::Host(errors.join("; "))),
            _ => Err(LinkError::NoHello),
        }
    }

    /// The installed script did not run (`why`) on attempt `attempt` (0 or 1): install it and
    /// say whether to try it again; otherwise this connection streams the script from now on.
    /// `Err`: the installer's exec could not even start (the connection's fault, not the
    /// host's: nothing is decided).
    async fn script_missing(
        &mut self,
        ci: usize,
        dir: &str,
        attempt: usize,
        why: LinkError,
    ) -> Result<bool, crate::ssh::SshError> {
        tracing::debug!("cairn: the host script did not run ({why})");
        let why = if attempt > 0 {
            LinkError::StillNotRun(Box::new(why))
        } else {
            match self.install_script(ci, dir).await? {
                Ok(()) => return Ok(true),
                Err(e) => e,
            }
        };
        tracing::info!("cairn: {why}; streaming the script with each operation");
        if let Some((k, _, _)) = self.conns.get(ci) {
            cache_put(script_cache(), &format!("{k}\n{dir}"), Err(why));
        }
        Ok(false)
    }

    /// Whether this connection streams the script to `dir` (it could not be installed there).
    fn script_streamed(&self, ci: usize, dir: &str) -> bool {
        self.conns.get(ci).is_some_and(|(k, _, _)| {
            matches!(
                cache_get(script_cache(), &format!("{k}\n{dir}")),
                Some(Err(_))
            )
        })
    }

    /// Install the host script into marker home `dir` (docs/HOST-HELPER.md): `Ok(Err)`, why
    /// the host could not hold it; `Err`, the exec could not start.
    async fn install_script(
        &mut self,
        ci: usize,
        dir: &str,
    ) -> Result<Result<(), LinkError>, crate::ssh::SshError> {
        let nonce = marker::new_nonce();
        let cmd = marker::install_invocation(dir, &nonce);
        let text = marker::session_script().as_bytes();
        let (lines, errors, exit) = self.small_exec_raw(ci, cmd, &nonce, Some(text)).await?;
        Ok(if lines.contains(&Line::Installed) {
            tracing::info!("cairn: installed the host script ({} bytes)", text.len());
            Ok(())
        } else if !errors.is_empty() {
            Err(LinkError::Host(errors.join("; ")))
        } else {
            Err(LinkError::InstallUnanswered(exit))
        })
    }

    /// Which side runs the marker protocol on this connection and marker home: decided once per
    /// process, by one execution at a time (a probe, and an upload when the helper is missing),
    /// then remembered.
    pub(super) async fn side_for(&mut self, ci: usize, dir: &str) -> Result<Side, ExecError> {
        if self.host_helper == HostHelper::Never {
            return Ok(Side::Script);
        }
        let key = format!("{}\n{dir}", self.conns[ci].0);
        let decided = match host_helper_cache_get(&key) {
            Some(d) => d,
            None => {
                let gate = host_helper_gate(&key);
                let _decider = gate.lock().await;
                // Another execution may have decided while this one waited.
                match host_helper_cache_get(&key) {
                    Some(d) => d,
                    None => {
                        let d = self.probe_helper(ci, dir).await;
                        if let Err(why) = &d {
                            tracing::info!("cairn: {why}; using the sh script");
                        }
                        host_helper_cache_put(&key, d.clone());
                        d
                    }
                }
            }
        };
        match decided {
            Ok(()) => Ok(Side::Helper),
            Err(why) if self.host_helper == HostHelper::Always => {
                Err(ExecError::Refused(format!("--host-helper always: {why}")))
            }
            Err(_) => Ok(Side::Script),
        }
    }

    fn decide_side(&mut self, ci: usize, dir: &str, d: Result<(), LinkError>) {
        if let Some((k, _, _)) = self.conns.get(ci) {
            host_helper_cache_put(&format!("{k}\n{dir}"), d);
        }
    }

    /// Ask the host (with the script) for its architecture and the helper's state; upload the
    /// helper when it is missing or not the expected file. `Ok`: the helper runs there.
    async fn probe_helper(&mut self, ci: usize, dir: &str) -> Result<(), LinkError> {
        if !host_helper::available() {
            return Err(LinkError::HelperNotBuilt);
        }
        let sha = host_helper::SHA256;
        let (lines, _) = self
            .small_exec(ci, &Op::Probe { helper_sha256: sha }, dir, None)
            .await?;
        let hello = lines
            .iter()
            .find_map(|l| match l {
                Line::Hello(h) => Some(h.clone()),
                _ => None,
            })
            .ok_or(LinkError::ProbeUnanswered)?;
        let arch = hello.arch.unwrap_or_default();
        if arch != host_helper::arch() {
            return Err(LinkError::Arch {
                host: arch,
                built: host_helper::arch(),
            });
        }
        match hello.helper.as_deref() {
            Some("ok") => return Ok(()),
            Some("absent" | "mismatch") => {}
            Some(other) => return Err(LinkError::HelperState(other.to_owned())),
            None => return Err(LinkError::HelperUnreported),
        }
        let op = Op::Install {
            helper_sha256: sha,
            len: host_helper::BINARY.len(),
        };
        let (lines, errors) = self
            .small_exec(ci, &op, dir, Some(host_helper::BINARY))
            .await?;
        match lines.iter().find_map(|l| match l {
            Line::Helper(s) => Some(s.as_str()),
            _ => None,
        }) {
            Some("ok") => {
                tracing::info!(
                    "cairn: uploaded the host helper ({} bytes)",
                    host_helper::BINARY.len()
                );
                Ok(())
            }
            Some(state) => Err(LinkError::UploadedState(state.to_owned())),
            None => Err(LinkError::UploadFailed(errors.join("; "))),
        }
    }

    /// One exec of the script whose reply is a few protocol lines: those, and the errors.
    /// The script installed in the marker home (installed first when it is missing), or
    /// streamed where it cannot be installed.
    async fn small_exec(
        &mut self,
        ci: usize,
        op: &Op<'_>,
        dir: &str,
        stdin: Option<&[u8]>,
    ) -> Result<(Vec<Line>, Vec<String>), LinkError> {
        if !self.script_streamed(ci, dir) {
            for attempt in 0..2 {
                let nonce = marker::new_nonce();
                let cmd = marker::invocation(op, dir, &nonce);
                let (lines, errors, exit) = self.small_exec_raw(ci, cmd, &nonce, stdin).await?;
                if !lines.is_empty() || !errors.is_empty() || !marker::script_did_not_run(exit) {
                    return Ok((lines, errors));
                }
                let why = LinkError::NoProtocolLine(exit.unwrap_or(0));
                let again = self.script_missing(ci, dir, attempt, why).await?;
                if !again {
                    break;
                }
            }
        }
        let nonce = marker::new_nonce();
        let (cmd, mut input) = marker::streamed_invocation(op, dir, &nonce);
        input.extend_from_slice(stdin.unwrap_or_default());
        let (lines, errors, _) = self.small_exec_raw(ci, cmd, &nonce, Some(&input)).await?;
        Ok((lines, errors))
    }

    /// One exec of `cmd` whose reply is a few protocol lines: those, the errors, the exit
    /// status.
    async fn small_exec_raw(
        &mut self,
        ci: usize,
        cmd: String,
        nonce: &str,
        stdin: Option<&[u8]>,
    ) -> Result<(Vec<Line>, Vec<String>, Option<u32>), crate::ssh::SshError> {
        let exec = self.conns[ci].1.exec(cmd.as_bytes()).await;
        drop(cmd);
        let mut exec = exec?;
        if let Some(data) = stdin {
            exec.write_stdin(data).await?;
        }
        let _ = exec.close_stdin().await;
        let mut demux = StderrDemux::new(nonce);
        let (mut lines, mut errors, mut exit) = (Vec::new(), Vec::new(), None);
        loop {
            match exec.next().await {
                Ok(Some(ExecEvent::Stderr(d))) => {
                    let mut pieces = Vec::new();
                    demux.feed(&d, &mut pieces);
                    for p in pieces {
                        match p {
                            Piece::Line(Ok(Line::Error(e))) => errors.push(e),
                            Piece::Line(Ok(l)) => lines.push(l),
                            Piece::Line(Err(e)) => errors.push(e.to_string()),
                            Piece::Stderr(_) => {}
                        }
                    }
                }
                Ok(Some(ExecEvent::ExitStatus(c))) => exit = Some(c),
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => return Err(e),
            }
        }
        Ok((lines, errors, exit))
    }
}

/// The execs whose replies the drive consumes (output to the sink, events to the journal).
impl Executor {
    /// Run one protocol exec and consume its reply, streaming command output to `sink` and
    /// recording `running` the moment the started record is seen. With the native helper
    /// where it runs (`--host-helper`), else the sh script; a helper that did not run at all
    /// (nothing happened on the host) gives way to the script for this and later operations.
    pub(super) async fn exec_op(
        &mut self,
        ci: usize,
        op: &Op<'_>,
        nonce: &str,
        stdin: Option<&[u8]>,
        run: &mut Run,
        sink: &mut dyn OutputSink,
    ) -> Result<Reply, ExecError> {
        let dir = run.rec.remote_dir.clone();
        if self.link.side_for(ci, &dir).await? == Side::Helper {
            let cmd = host_helper::invocation(op, &dir, nonce);
            run.host_side = Some(Side::Helper);
            match self
                .exec_cmd(
                    ci,
                    cmd,
                    nonce,
                    stdin,
                    run,
                    sink,
                    Some(host_helper::did_not_run),
                )
                .await?
            {
                Ok(reply) => return Ok(reply),
                Err(why) => {
                    let why = LinkError::HelperNotRun(Box::new(why));
                    tracing::info!("cairn: {why}; using the sh script");
                    self.link.decide_side(ci, &dir, Err(why.clone()));
                    if self.link.host_helper == HostHelper::Always {
                        return Err(ExecError::Refused(format!("--host-helper always: {why}")));
                    }
                }
            }
        }
        run.host_side = Some(Side::Script);
        // The script installed in the marker home; where it is not (yet) there, installed
        // first; where it cannot be, streamed on stdin (docs/HOST-HELPER.md).
        if !self.link.script_streamed(ci, &dir) {
            for attempt in 0..2 {
                let cmd = marker::invocation(op, &dir, nonce);
                let not_run = Some(marker::script_did_not_run as fn(Option<u32>) -> bool);
                match self
                    .exec_cmd(ci, cmd, nonce, stdin, run, sink, not_run)
                    .await?
                {
                    Ok(reply) => return Ok(reply),
                    Err(why) => match self.link.script_missing(ci, &dir, attempt, why).await {
                        Ok(true) => {}
                        Ok(false) => break,
                        // (the connection, not the host: the machine reconnects)
                        Err(e) => {
                            return Ok(Reply {
                                broken: Some(e.to_string()),
                                ..Reply::default()
                            })
                        }
                    },
                }
            }
        }
        let (cmd, mut input) = marker::streamed_invocation(op, &dir, nonce);
        input.extend_from_slice(stdin.unwrap_or_default());
        match self
            .exec_cmd(ci, cmd, nonce, Some(&input), run, sink, None)
            .await?
        {
            Ok(reply) => Ok(reply),
            Err(why) => Err(why.into()),
        }
    }

    /// One exec of `cmd`. `Err(why)`: a host side that did not run (`not_run` says so of the
    /// exit status, and no protocol line came): what it wrote is held back, not taken as the
    /// command's output.
    #[allow(clippy::too_many_arguments)]
    async fn exec_cmd(
        &mut self,
        ci: usize,
        cmd: String,
        nonce: &str,
        stdin: Option<&[u8]>,
        run: &mut Run,
        sink: &mut dyn OutputSink,
        not_run: Option<fn(Option<u32>) -> bool>,
    ) -> Result<Result<Reply, LinkError>, ExecError> {
        let mut reply = Reply::default();
        let exec = self.link.conns[ci].1.exec(cmd.as_bytes()).await;
        drop(cmd);
        let mut exec = match exec {
            Ok(e) => e,
            Err(e) => {
                reply.broken = Some(e.to_string());
                return Ok(Ok(reply));
            }
        };
        let sent = match stdin {
            Some(data) => exec.write_stdin(data).await.and(exec.close_stdin().await),
            None => exec.close_stdin().await,
        };
        if let Err(e) = sent {
            reply.broken = Some(e.to_string());
            return Ok(Ok(reply));
        }
        let mut demux = StderrDemux::new(nonce);
        let mut pieces = Vec::new();
        // (a helper's bytes before its first protocol line: held until that line comes)
        let mut held: Option<Vec<(bool, Vec<u8>)>> = not_run.map(|_| Vec::new());
        let mut exit = None;
        loop {
            let next = match hold_left(run) {
                None => exec.next().await,
                Some(left) => match tokio::time::timeout(left, exec.next()).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.flush_held(run)?;
                        continue;
                    }
                },
            };
            let ev = match next {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    reply.broken = Some(e.to_string());
                    break;
                }
            };
            match ev {
                ExecEvent::Stdout(d) => match &mut held {
                    Some(h) => h.push((false, d)),
                    None => self.take_output(run, sink, &d, false)?,
                },
                ExecEvent::Stderr(d) => {
                    demux.feed(&d, &mut pieces);
                    for p in pieces.drain(..) {
                        match p {
                            Piece::Stderr(s) => match &mut held {
                                Some(h) => h.push((true, s)),
                                None => self.take_output(run, sink, &s, true)?,
                            },
                            Piece::Line(l) => {
                                if let Some(h) = held.take() {
                                    for (err, b) in h {
                                        self.take_output(run, sink, &b, err)?;
                                    }
                                }
                                match l {
                                    Ok(line) => self.on_line(line, run, &mut reply)?,
                                    Err(e) => reply.bad.push(e),
                                }
                            }
                        }
                    }
                }
                ExecEvent::ExitStatus(c) => exit = Some(c),
                ExecEvent::ExitSignal(_) => {}
            }
        }
        if let Some(h) = held {
            if reply.broken.is_none() && not_run.is_some_and(|f| f(exit)) {
                let text: Vec<u8> = h.into_iter().flat_map(|(_, b)| b).collect();
                let text = String::from_utf8_lossy(&text).trim().replace('\n', " ");
                return Ok(Err(LinkError::NotRun {
                    status: exit.unwrap_or(0),
                    said: text,
                }));
            }
            for (err, b) in h {
                self.take_output(run, sink, &b, err)?;
            }
        }
        self.reply_over(run, reply).map(Ok)
    }

    /// A dispatch through the connection's host session; the same reply as [`Self::exec_op`]
    /// gives for a `dispatch` exec. `None`: the session never sent it (dispatch it on an exec).
    pub(super) async fn session_op(
        &mut self,
        sess: &crate::session::HostSession,
        run: &mut Run,
        sink: &mut dyn OutputSink,
    ) -> Result<Option<Reply>, ExecError> {
        use crate::session::{Event, Request};
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let req = Request {
            id: run.rec.id.clone(),
            digest: run.rec.command_digest.clone(),
            timeout_secs: run.rec.timeout_secs,
            command: run.rec.command.clone(),
            events: tx,
        };
        if sess.dispatch(req).is_err() {
            return Ok(None);
        }
        run.host_side = Some(sess.side());
        let mut reply = Reply::default();
        loop {
            let next = match hold_left(run) {
                None => rx.recv().await,
                Some(left) => match tokio::time::timeout(left, rx.recv()).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.flush_held(run)?;
                        continue;
                    }
                },
            };
            match next {
                // (only ever the first event: a request the session never sent)
                Some(Event::Unavailable(why)) if reply.hello.is_none() => {
                    tracing::debug!("host session unavailable ({why}); dispatching on an exec");
                    return Ok(None);
                }
                Some(Event::Unavailable(why) | Event::Broken(why)) => {
                    reply.broken = Some(why);
                    break;
                }
                None => {
                    reply.broken = Some("the host session went away".into());
                    break;
                }
                Some(Event::Stdout(d)) => self.take_output(run, sink, &d, false)?,
                Some(Event::Stderr(d)) => self.take_output(run, sink, &d, true)?,
                Some(Event::Line(Ok(line))) => {
                    let end = line == Line::End;
                    self.on_line(line, run, &mut reply)?;
                    if end {
                        break;
                    }
                }
                Some(Event::Line(Err(e))) => reply.bad.push(e),
            }
        }
        self.reply_over(run, reply).map(Some)
    }

    /// Command output received: to the sink, unless this run does not want the bytes.
    fn take_output(
        &mut self,
        run: &mut Run,
        sink: &mut dyn OutputSink,
        d: &[u8],
        stderr: bool,
    ) -> Result<(), ExecError> {
        let off = if stderr {
            &mut run.err_off
        } else {
            &mut run.out_off
        };
        if *off < NO_BYTES {
            // (counted once the sink has them: the offset is what was delivered)
            if stderr {
                sink.stderr(d)?;
            } else {
                sink.stdout(d)?;
            }
            *off += d.len() as u64;
            self.save_cursor(run, false);
        }
        Ok(())
    }
}
