//! The SSH layer: resolve a destination with ssh_config, connect with strict host-key checking,
//! authenticate (agent, then key files), and run commands on session channels.
//!
//! Built on russh. Notes that matter to callers:
//! - [`Exec::next`] returning `Ok(None)` without an `ExitStatus` having been seen, or
//!   `Err(SshError::Disconnected)`, means the outcome is unknown — never exit 0.
//! - Keepalives (`keepalive_interval` × `keepalive_max`, plus one interval of slack, as russh
//!   counts) turn a black-holed link into an error instead of a hang.
//! - An encrypted key that no agent holds is asked for on the terminal only where the front end
//!   allowed it ([`allow_prompts`]) and there is one; otherwise it is [`SshError::EncryptedKey`].
//! - A target behind jump hosts runs its SSH session over a `direct-tcpip` channel of the hop
//!   before it ([`Via::Jump`]); one behind a ProxyCommand over the command's stdin/stdout.

mod auth;
mod config;
mod exec;
mod handler;
mod keyfix;
pub mod known_hosts;
mod prompt;
mod proxy;
mod stream;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client;

pub use config::{ssh_g_lines, AgentSetting};
use exec::OpenChannel;
pub use exec::{Exec, ExecEvent};
use handler::{preferred_host_key_algs, ClientHandler};
pub use prompt::allow_prompts;

/// Resolve one destination through ssh_config without following its ProxyJump or
/// ProxyCommand (for a hop whose way there is already known, as recorded with an execution).
pub fn resolve_plain(destination: &str, opts: &ConnectOptions) -> Result<Target, SshError> {
    config::resolve_plain(destination, opts)
}

/// How to connect; mirrors the `ssh` command-line options cairn offers.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `-F`: the ssh_config file. Default: ~/.ssh/config (if present) then /etc/ssh/ssh_config.
    pub ssh_config: Option<PathBuf>,
    /// `-p`: overrides the config's Port.
    pub port: Option<u16>,
    /// `-i`: identity files, tried before the config's IdentityFile entries.
    pub identity: Vec<PathBuf>,
    /// `--known-hosts`: the only known_hosts file consulted (and written with `accept_new`).
    /// Default: the config's UserKnownHostsFile, else ~/.ssh/known_hosts (+ the global files).
    pub known_hosts: Option<PathBuf>,
    /// `--accept-new`: record the key of a host that has none recorded (never a changed one).
    pub accept_new: bool,
    /// Overall deadline for TCP connect + handshake + authentication.
    pub connect_timeout: Duration,
    /// Send a keepalive after this long without hearing from the server.
    pub keepalive_interval: Duration,
    /// Give up after this many unanswered keepalives.
    pub keepalive_max: usize,
    /// `connect_timeout` was given on the command line: it wins over ssh_config's
    /// ConnectTimeout (as OpenSSH's `-o` does). Otherwise it is only the default.
    pub connect_timeout_explicit: bool,
    /// Likewise for `keepalive_interval` over ServerAliveInterval.
    pub keepalive_explicit: bool,
    /// `-J`: jump hosts (`[user@]host[:port]`, comma-separated) or `none`; read before
    /// ssh_config, so it wins over the config's ProxyJump (and, unless `none`, ProxyCommand).
    pub jump: Option<String>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            ssh_config: None,
            port: None,
            identity: Vec::new(),
            known_hosts: None,
            accept_new: false,
            connect_timeout: Duration::from_secs(15),
            keepalive_interval: Duration::from_secs(5),
            keepalive_max: 3,
            connect_timeout_explicit: false,
            keepalive_explicit: false,
            jump: None,
        }
    }
}

/// A destination after ssh_config has been applied. Fields are what [`Connection::connect`]
/// uses; a caller may adjust them after [`resolve`].
#[derive(Debug, Clone)]
pub struct Target {
    /// The name as given (`host` of `[user@]host`); ssh_config Host patterns match this.
    pub alias: String,
    /// The name or address actually connected to (HostName).
    pub hostname: String,
    pub port: u16,
    pub user: String,
    /// Key files to try, in order (after the agent).
    pub identity_files: Vec<PathBuf>,
    /// The known_hosts file that is checked first and written by accept-new.
    pub known_hosts: PathBuf,
    /// Further known_hosts files that are only read (UserKnownHostsFile extras, global files).
    pub known_hosts_read: Vec<PathBuf>,
    /// Record an unknown host key (`--accept-new` or `StrictHostKeyChecking accept-new`).
    pub accept_new: bool,
    /// Write accept-new entries hashed (`HashKnownHosts yes`).
    pub hash_known_hosts: bool,
    pub connect_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_max: usize,
    /// Which ssh-agent to ask (IdentityAgent).
    pub identity_agent: AgentSetting,
    /// HostKeyAlias: when set, the only name looked up in (and written to) known_hosts,
    /// verbatim (no `[host]:port` form), as OpenSSH does.
    pub host_key_alias: Option<String>,
    /// The host key (`SHA256:…`) verified when an execution was dispatched: a connection made
    /// for that execution accepts this key and no other, even where known_hosts would now
    /// accept another. It only restricts: the key must still pass known_hosts as well.
    /// `None`: known_hosts alone decides.
    pub pinned_host_key: Option<String>,
    /// IdentitiesOnly: offer only the configured identities (agent keys only when a
    /// configured identity names them).
    pub identities_only: bool,
    /// CertificateFile entries, tried with their private keys before the keys alone.
    pub certificate_files: Vec<PathBuf>,
    /// GlobalKnownHostsFile entries (also in `known_hosts_read`), kept apart for `cairn config`.
    pub global_known_hosts: Vec<PathBuf>,
    /// Jump hosts (ProxyJump, `-J`), flattened in the order they are reached: `jump[0]` first
    /// (through `proxy_command` when set), each later one through a `direct-tcpip` channel of
    /// the one before, and this target through the last. Each hop was resolved through
    /// ssh_config as OpenSSH resolves it (its own HostName, User, Port, IdentityFile,
    /// known_hosts); hops carry no `jump` or `proxy_command` of their own.
    pub jump: Vec<Target>,
    /// ProxyCommand with its tokens expanded: run through `$SHELL -c "exec …"`, its stdin and
    /// stdout the transport to `jump[0]` (or to this target when there are no hops).
    pub proxy_command: Option<String>,
    /// ProxyJump / ProxyCommand as ssh_config (or `-J`) set them for this destination, in
    /// `ssh -G`'s words, for `cairn config`.
    pub route_line: Option<(&'static str, String)>,
}

impl Target {
    /// `user@alias:port`, for messages.
    pub fn display(&self) -> String {
        format!("{}@{}:{}", self.user, self.alias, self.port)
    }

    /// The names looked up in known_hosts: HostKeyAlias if set, else the HostName, in
    /// `[host]:port` form when the port is not 22. As in OpenSSH, the ssh_config alias (the
    /// name given) is not looked up when HostName replaces it.
    pub fn known_host_names(&self) -> Vec<String> {
        if let Some(alias) = &self.host_key_alias {
            return vec![alias.clone()];
        }
        vec![known_hosts::lookup_name(&self.hostname, self.port)]
    }

    /// OpenSSH's fallback for a non-default port without HostKeyAlias: the bare names (no
    /// `[host]:port`), where only a matching key counts ("found matching key w/out port").
    fn known_host_names_without_port(&self) -> Vec<String> {
        if self.host_key_alias.is_some() || self.port == 22 {
            return Vec::new();
        }
        vec![self.hostname.clone()]
    }

    /// How the first connection of this target's chain is made: through its ProxyCommand,
    /// else over TCP.
    pub fn first_via(&self) -> Via<'_> {
        match &self.proxy_command {
            Some(c) => Via::Command(c),
            None => Via::Tcp,
        }
    }

    fn known_hosts_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.known_hosts.clone()];
        files.extend(self.known_hosts_read.iter().cloned());
        files
    }
}

/// Parse `[user@]host` and apply ssh_config: Host patterns (with `*`, `?` and `!negation`, first
/// value wins), HostName (with %h), User, Port, IdentityFile (with `~`, %d %u %h %r %p %n),
/// UserKnownHostsFile, GlobalKnownHostsFile, ConnectTimeout, ServerAliveInterval,
/// ServerAliveCountMax, StrictHostKeyChecking (`no` refused), HashKnownHosts, IdentityAgent,
/// HostKeyAlias, IdentitiesOnly, CertificateFile, Include, and `Match` (host, originalhost,
/// user, localuser, exec, all, canonical, final, `!` negation) as OpenSSH's client reads them.
/// ProxyJump (and `-J`: several hops, `user@host:port`, `none`) and ProxyCommand (tokens %h %p
/// %r %n %u %d %i %%) are followed as OpenSSH follows them; see [`Target::jump`].
/// Default user: `$USER`, else the current uid's name.
pub fn resolve(destination: &str, opts: &ConnectOptions) -> Result<Target, SshError> {
    config::resolve(destination, opts)
}

/// Errors of the SSH layer. Every message says what happened and what to do about it.
///
/// Layer: ssh (`src/ssh/**`). The executor and the CLI convert it with `ExecError::Ssh`
/// (`#[from]`); its parsers of ssh_config words and ProxyJump lists return a message that
/// `resolve` locates into [`SshError::Config`] with the file and line.
#[non_exhaustive]
#[derive(thiserror::Error, Debug)]
pub enum SshError {
    #[error(
        "the host key of {host} is not known (fingerprint {fingerprint}); it is not recorded in {}. \
         cairn checks host keys strictly and refused to connect. If you trust this fingerprint \
         (compare it with the server's `ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub`), run again \
         with --accept-new to record it, or add the key to that file yourself.",
        file.display()
    )]
    UnknownHostKey {
        host: String,
        file: PathBuf,
        fingerprint: String,
    },

    #[error(
        "WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED for {host}! The server presented a key \
         (fingerprint {fingerprint}) that does not match the one recorded in {}:{line}. Someone \
         could be eavesdropping on you right now (man-in-the-middle attack), or the host key has \
         just been changed. cairn refused to connect. If the change is legitimate, remove the old \
         entry (`ssh-keygen -R` or delete line {line}) and connect again with --accept-new.",
        file.display()
    )]
    HostKeyChanged {
        host: String,
        file: PathBuf,
        line: usize,
        fingerprint: String,
    },

    #[error(
        "the host key of {host} (fingerprint {fingerprint}) is marked @revoked in {}:{line}; \
         cairn refused to connect. The key must not be trusted: ask the host's administrator \
         for its current key.",
        file.display()
    )]
    HostKeyRevoked {
        host: String,
        file: PathBuf,
        line: usize,
        fingerprint: String,
    },

    #[error(
        "{host} presents host key {presented}, but the execution was dispatched to the host with \
         key {pinned} (verified then), and that key pins every later connection made for it: \
         cairn refused to connect, even if known_hosts accepts the new key. This may be another \
         machine at that address (re-imaged, replaced, or an impostor). If the host really was \
         re-keyed or replaced, its marker home is probably gone too: find out what happened to \
         the command there, then record it with `cairn resolve ID --as completed|failed \
         --reason ...`"
    )]
    HostKeyPinned {
        host: String,
        pinned: String,
        presented: String,
    },

    #[error("could not read or write the known_hosts file {}: {source}", file.display())]
    KnownHosts {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("could not connect to {host} port {port}: {source}")]
    Connect {
        host: String,
        port: u16,
        #[source]
        source: std::io::Error,
    },

    #[error("{what} timed out after {}s; the host may be down, unreachable, hung or overloaded", after.as_secs_f64())]
    Timeout { what: &'static str, after: Duration },

    #[error(
        "authentication as {user} on {host} failed: the server accepted none of the keys tried ({}). \
         Add the right key to ssh-agent, pass it with -i, or set IdentityFile in ssh_config; \
         check that its public key is in the account's authorized_keys.",
        if tried.is_empty() { "no usable key was found: no agent keys and no key files".to_string() } else { tried.join("; ") }
    )]
    Auth {
        user: String,
        host: String,
        tried: Vec<String>,
    },

    #[error(
        "the key file {} is encrypted with a passphrase, no ssh-agent holds it, and there is no \
         terminal to ask for the passphrase on (cairn asks on a terminal, as ssh does, and never \
         in `serve` or `mcp`). Load it into your agent first (`ssh-add {}`) and make sure \
         SSH_AUTH_SOCK is set.",
        path.display(), path.display()
    )]
    EncryptedKey { path: PathBuf },

    #[error(
        "the user certificate {what} is {when}: it is valid from {valid_after} to {valid_before} \
         (UTC), and the time here is {now}. Get a fresh certificate from your SSH CA (or check \
         this machine's clock)"
    )]
    CertificateNotValid {
        what: String,
        when: &'static str,
        valid_after: String,
        valid_before: String,
        now: String,
    },

    #[error("{}:{line}: {message}", file.display())]
    Config {
        file: PathBuf,
        line: usize,
        message: String,
    },

    #[error("invalid destination {0:?}: expected [user@]host")]
    InvalidDestination(String),

    /// A `-J` argument that is not a list of `[user@]host[:port]`, or a chain of jump hosts
    /// that never ends.
    #[error("{0}")]
    InvalidJump(String),

    #[error("the server refused to open a channel ({0}); it may have too many sessions open (MaxSessions), try again later")]
    ChannelRefused(String),

    /// The server refused a second session channel on a connection where none was open: it
    /// allows one per connection (tinysshd does), and cairn needs one per operation.
    #[error("the server refused a second session channel on this connection although none was open ({0}): it allows one channel per connection (tinysshd is such a server); cairn needs one per operation (hello, install, dispatch, watch) on a connection, as OpenSSH and Dropbear allow")]
    OneChannelPerConnection(String),

    #[error("the SSH connection was lost: {0}")]
    Disconnected(String),

    #[error("SSH protocol error: {0}")]
    Protocol(String),
}

impl SshError {
    /// Whether trying again (reconnecting with backoff) can help: refused/reset connections,
    /// timeouts and lost connections are transient; host-key, auth and config problems are not.
    pub fn is_transient(&self) -> bool {
        match self {
            SshError::Connect { source, .. } => !matches!(
                source.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::InvalidInput
                    | std::io::ErrorKind::PermissionDenied
            ),
            SshError::Timeout { .. } | SshError::Disconnected(_) | SshError::ChannelRefused(_) => {
                true
            }
            SshError::OneChannelPerConnection(_) => false,
            SshError::UnknownHostKey { .. }
            | SshError::HostKeyPinned { .. }
            | SshError::HostKeyChanged { .. }
            | SshError::HostKeyRevoked { .. }
            | SshError::KnownHosts { .. }
            | SshError::Auth { .. }
            | SshError::EncryptedKey { .. }
            | SshError::CertificateNotValid { .. }
            | SshError::Config { .. }
            | SshError::InvalidDestination(_)
            | SshError::InvalidJump(_)
            | SshError::Protocol(_) => false,
        }
    }
}

impl SshError {
    /// The same error again, for each of several callers that shared one attempt (a pooled
    /// connect): same variant, so the same `is_transient` and the same message.
    // Long: one arm per variant and no catch-all, so that a new variant cannot be duplicated as
    // another.
    pub fn duplicate(&self) -> SshError {
        let io = |e: &std::io::Error| std::io::Error::new(e.kind(), e.to_string());
        match self {
            SshError::UnknownHostKey {
                host,
                file,
                fingerprint,
            } => SshError::UnknownHostKey {
                host: host.clone(),
                file: file.clone(),
                fingerprint: fingerprint.clone(),
            },
            SshError::HostKeyChanged {
                host,
                file,
                line,
                fingerprint,
            } => SshError::HostKeyChanged {
                host: host.clone(),
                file: file.clone(),
                line: *line,
                fingerprint: fingerprint.clone(),
            },
            SshError::HostKeyRevoked {
                host,
                file,
                line,
                fingerprint,
            } => SshError::HostKeyRevoked {
                host: host.clone(),
                file: file.clone(),
                line: *line,
                fingerprint: fingerprint.clone(),
            },
            SshError::HostKeyPinned {
                host,
                pinned,
                presented,
            } => SshError::HostKeyPinned {
                host: host.clone(),
                pinned: pinned.clone(),
                presented: presented.clone(),
            },
            SshError::KnownHosts { file, source } => SshError::KnownHosts {
                file: file.clone(),
                source: io(source),
            },
            SshError::Connect { host, port, source } => SshError::Connect {
                host: host.clone(),
                port: *port,
                source: io(source),
            },
            SshError::Timeout { what, after } => SshError::Timeout {
                what,
                after: *after,
            },
            SshError::Auth { user, host, tried } => SshError::Auth {
                user: user.clone(),
                host: host.clone(),
                tried: tried.clone(),
            },
            SshError::EncryptedKey { path } => SshError::EncryptedKey { path: path.clone() },
            SshError::CertificateNotValid {
                what,
                when,
                valid_after,
                valid_before,
                now,
            } => SshError::CertificateNotValid {
                what: what.clone(),
                when,
                valid_after: valid_after.clone(),
                valid_before: valid_before.clone(),
                now: now.clone(),
            },
            SshError::Config {
                file,
                line,
                message,
            } => SshError::Config {
                file: file.clone(),
                line: *line,
                message: message.clone(),
            },
            SshError::InvalidDestination(d) => SshError::InvalidDestination(d.clone()),
            SshError::InvalidJump(d) => SshError::InvalidJump(d.clone()),
            SshError::ChannelRefused(m) => SshError::ChannelRefused(m.clone()),
            SshError::OneChannelPerConnection(m) => SshError::OneChannelPerConnection(m.clone()),
            SshError::Disconnected(m) => SshError::Disconnected(m.clone()),
            SshError::Protocol(m) => SshError::Protocol(m.clone()),
        }
    }
}

impl From<russh::Error> for SshError {
    fn from(e: russh::Error) -> Self {
        use russh::Error as E;
        match e {
            E::KeepaliveTimeout => SshError::Disconnected(
                "the server stopped answering keepalives (link down or host hung)".into(),
            ),
            E::InactivityTimeout => SshError::Disconnected("inactivity timeout".into()),
            E::IO(io) => SshError::Disconnected(format!("I/O error: {io}")),
            E::Disconnect | E::HUP | E::SendError => {
                SshError::Disconnected("connection closed".into())
            }
            E::ConnectionTimeout => SshError::Disconnected("connection timed out".into()),
            E::ChannelOpenFailure(r) => SshError::ChannelRefused(format!("{r:?}")),
            other => SshError::Protocol(other.to_string()),
        }
    }
}

/// State shared between the russh handler task and the [`Connection`]/[`Exec`] handles.
#[derive(Debug, Default)]
struct Shared {
    fingerprint: Mutex<String>,
    disconnect_reason: Mutex<Option<String>>,
    /// Session channels opened on this connection so far, and those still open (an [`Exec`]
    /// not yet dropped): a refusal while none is open, after one was, is a server that allows
    /// one channel per connection.
    channels_opened: std::sync::atomic::AtomicUsize,
    channels_open: std::sync::atomic::AtomicUsize,
}

impl Shared {
    fn reason(&self) -> String {
        self.disconnect_reason
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .unwrap_or_else(|| "the connection closed unexpectedly".into())
    }
}

/// An authenticated SSH connection. Clones share it (a `pool::Pool` lends one to several
/// executions); it closes when the last clone and the last [`Exec`] on it are dropped.
#[derive(Clone)]
pub struct Connection {
    handle: Arc<client::Handle<ClientHandler>>,
    shared: Arc<Shared>,
    fingerprint: String,
    target: Target,
    /// The jump host this connection runs through (kept open while this one lives).
    via: Option<Arc<Connection>>,
}

/// How one SSH connection of a chain reaches its server.
#[derive(Clone, Copy)]
pub enum Via<'a> {
    /// TCP to the target's HostName and port.
    Tcp,
    /// The standard input and output of this command (ProxyCommand).
    Command(&'a str),
    /// A `direct-tcpip` channel of this connection (the jump host before the target).
    Jump(&'a Connection),
}

/// A transport russh can run an SSH session over.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("target", &self.target.display())
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

impl Connection {
    /// TCP connect, handshake, host-key check and authentication, all under the target's
    /// `connect_timeout`. (`opts` is accepted for symmetry; the target already carries the
    /// settings derived from it.)
    ///
    /// A target with jump hosts ([`Target::jump`]) is reached through each of them in turn, every
    /// hop under its own deadline and with its own host-key check; the connections to the hops
    /// are this connection's own (a `pool` shares them between targets instead).
    pub async fn connect(target: &Target, opts: &ConnectOptions) -> Result<Connection, SshError> {
        let _ = opts;
        let mut prev: Option<Connection> = None;
        for hop in &target.jump {
            let via = match &prev {
                Some(c) => Via::Jump(c),
                None => target.first_via(),
            };
            prev = Some(Connection::connect_via(hop, via).await?);
        }
        let via = match &prev {
            Some(c) => Via::Jump(c),
            None => target.first_via(),
        };
        Connection::connect_via(target, via).await
    }

    /// One connection of a chain: to `target` (its `jump` and `proxy_command` are not looked
    /// at) over `via`, under the target's `connect_timeout`.
    pub async fn connect_via(target: &Target, via: Via<'_>) -> Result<Connection, SshError> {
        let deadline = target.connect_timeout;
        // Time spent at a passphrase prompt does not count against the deadline.
        let prompted_before = prompt::prompt_millis();
        let fut = Self::connect_inner(target, via);
        tokio::pin!(fut);
        let sleep = tokio::time::sleep(deadline);
        tokio::pin!(sleep);
        let mut extended = 0;
        loop {
            tokio::select! {
                r = &mut fut => return r,
                () = &mut sleep => {
                    let prompted = prompt::prompt_millis().saturating_sub(prompted_before);
                    if prompted <= extended {
                        break;
                    }
                    let extra = Duration::from_millis(prompted - extended);
                    extended = prompted;
                    sleep.as_mut().reset(tokio::time::Instant::now() + extra);
                }
            }
        }
        {
            Err(SshError::Timeout {
                what: match via {
                    Via::Tcp => "connecting (TCP connect, SSH handshake and authentication)",
                    Via::Command(_) => {
                        "connecting through the ProxyCommand (SSH handshake and authentication)"
                    }
                    Via::Jump(_) => {
                        "connecting through the jump host (channel, SSH handshake and authentication)"
                    }
                },
                after: deadline,
            })
        }
    }

    /// A `direct-tcpip` channel from this connection's server to `host:port`, as a stream.
    async fn direct_tcpip(&self, host: &str, port: u16) -> Result<Box<dyn Io>, SshError> {
        match self
            .handle
            .channel_open_direct_tcpip(host, u32::from(port), "127.0.0.1", 0)
            .await
        {
            Ok(ch) => Ok(Box::new(ch.into_stream())),
            Err(russh::Error::ChannelOpenFailure(why)) => {
                use russh::ChannelOpenFailure as F;
                let (kind, hint) = match why {
                    F::AdministrativelyProhibited | F::UnknownChannelType => (
                        std::io::ErrorKind::PermissionDenied,
                        "; it refuses to forward (AllowTcpForwarding, PermitOpen or \
                         DisableForwarding in its sshd_config)",
                    ),
                    F::ConnectFailed => (std::io::ErrorKind::ConnectionRefused, ""),
                    _ => (std::io::ErrorKind::Other, ""),
                };
                Err(SshError::Connect {
                    host: host.to_owned(),
                    port,
                    source: std::io::Error::new(
                        kind,
                        format!(
                            "the jump host {} could not open a connection to it ({why:?}){hint}",
                            self.target.display()
                        ),
                    ),
                })
            }
            Err(russh::Error::SendError | russh::Error::Disconnect | russh::Error::HUP) => {
                Err(SshError::Disconnected(format!(
                    "the connection to the jump host {} was lost: {}",
                    self.target.display(),
                    self.shared.reason()
                )))
            }
            Err(other) => Err(other.into()),
        }
    }

    /// The byte stream the SSH session runs over: TCP (with quick ACKs unless
    /// `CAIRN_SSH_NO_QUICKACK` is set, and dead after the keepalives would have given up), a
    /// ProxyCommand's stdio, or a jump host's `direct-tcpip` channel.
    async fn open_stream(target: &Target, via: Via<'_>) -> Result<Box<dyn Io>, SshError> {
        Ok(match via {
            Via::Tcp => {
                let tcp = tokio::net::TcpStream::connect((target.hostname.as_str(), target.port))
                    .await
                    .map_err(|source| SshError::Connect {
                        host: target.hostname.clone(),
                        port: target.port,
                        source,
                    })?;
                let quickack = std::env::var_os("CAIRN_SSH_NO_QUICKACK").is_none();
                let dead_after = target.keepalive_interval.saturating_mul(
                    target
                        .keepalive_max
                        .saturating_add(1)
                        .min(u32::MAX as usize) as u32,
                );
                Box::new(stream::QuickAckStream::new(tcp, quickack, Some(dead_after)))
            }
            Via::Command(cmd) => {
                Box::new(
                    proxy::ProxyStream::spawn(cmd).map_err(|source| SshError::Connect {
                        host: target.hostname.clone(),
                        port: target.port,
                        source,
                    })?,
                )
            }
            Via::Jump(hop) => hop.direct_tcpip(&target.hostname, target.port).await?,
        })
    }

    async fn connect_inner(target: &Target, via: Via<'_>) -> Result<Connection, SshError> {
        let stream = Self::open_stream(target, via).await?;

        let names = target.known_host_names();
        let files = target.known_hosts_files();
        let recorded = known_hosts::recorded_algorithms(&files, &names);
        let key_algs = preferred_host_key_algs(&recorded);
        let want_certificates = known_hosts::has_cert_authority(&files, &names);
        let config = client::Config {
            inactivity_timeout: None,
            keepalive_interval: Some(target.keepalive_interval),
            keepalive_max: target.keepalive_max,
            nodelay: true,
            preferred: russh::Preferred {
                key: key_algs.clone().into(),
                // Ask for a host certificate only when an authority could vouch for one.
                host_key_certificates: if want_certificates {
                    key_algs.into()
                } else {
                    Vec::new().into()
                },
                ..russh::Preferred::DEFAULT
            },
            ..Default::default()
        };
        let shared = Arc::new(Shared::default());
        let host = if target.alias == target.hostname {
            format!("{}:{}", target.hostname, target.port)
        } else {
            format!("{} ({}:{})", target.alias, target.hostname, target.port)
        };
        let handler = ClientHandler {
            host: host.clone(),
            write_name: match &target.host_key_alias {
                Some(alias) => alias.clone(),
                None => known_hosts::lookup_name(&target.hostname, target.port),
            },
            names,
            bare_names: target.known_host_names_without_port(),
            cert_principal: target
                .host_key_alias
                .clone()
                .unwrap_or_else(|| target.hostname.clone()),
            files,
            accept_new: target.accept_new,
            hash_known_hosts: target.hash_known_hosts,
            pinned: target.pinned_host_key.clone(),
            shared: shared.clone(),
        };
        let mut handle = client::connect_stream(Arc::new(config), stream, handler)
            .await
            .map_err(|e| match e {
                SshError::Disconnected(m) => SshError::Disconnected(match via {
                    Via::Command(cmd) => format!(
                        "the ProxyCommand for {host} (`{cmd}`) ended or closed its output before \
                         the SSH handshake finished ({m}); its error output, if any, is above"
                    ),
                    _ => format!(
                        "{host} closed the connection before the SSH handshake finished ({m}); \
                         is this an SSH server, and is it accepting connections?"
                    ),
                }),
                other => other,
            })?;
        auth::authenticate(&mut handle, target).await?;
        let fingerprint = shared
            .fingerprint
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        Ok(Connection {
            handle: Arc::new(handle),
            shared,
            fingerprint,
            target: target.clone(),
            via: match via {
                Via::Jump(hop) => Some(Arc::new(hop.clone())),
                _ => None,
            },
        })
    }

    /// How many handles share this connection's SSH session: clones of it, its [`Exec`]s,
    /// and the connections running through it as their jump host.
    pub fn users(&self) -> usize {
        Arc::strong_count(&self.handle)
    }

    /// The server's host key fingerprint, `SHA256:...` as OpenSSH prints it.
    pub fn host_key_fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The target this connection was made to.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// True once the connection is gone (closed, lost, or keepalive timeout).
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Why the connection ended, if it has.
    pub fn disconnect_reason(&self) -> Option<String> {
        self.shared
            .disconnect_reason
            .lock()
            .ok()
            .and_then(|r| r.clone())
    }

    /// Open a session channel and run `command` (no PTY).
    pub async fn exec(&self, command: &[u8]) -> Result<Exec, SshError> {
        let map = |e: russh::Error, shared: &Shared| match e {
            russh::Error::ChannelOpenFailure(r) => SshError::ChannelRefused(format!("{r:?}")),
            russh::Error::SendError | russh::Error::Disconnect | russh::Error::HUP => {
                SshError::Disconnected(shared.reason())
            }
            other => SshError::from(other),
        };
        use std::sync::atomic::Ordering::SeqCst;
        let channel = match self.handle.channel_open_session().await {
            Ok(c) => c,
            Err(russh::Error::ChannelOpenFailure(r))
                if self.shared.channels_opened.load(SeqCst) > 0
                    && self.shared.channels_open.load(SeqCst) == 0 =>
            {
                return Err(SshError::OneChannelPerConnection(format!("{r:?}")));
            }
            Err(e) => {
                let first_ended = self.shared.channels_opened.load(SeqCst) > 0
                    && self.shared.channels_open.load(SeqCst) == 0;
                return Err(match map(e, &self.shared) {
                    // The race's other side: the server closed the connection as its one channel
                    // ended, before it could refuse this one. Still transient (a link can drop
                    // there too), but the message names the likely cause.
                    SshError::Disconnected(m) if first_ended => SshError::Disconnected(format!(
                        "{m} (the server closed the connection once its first channel ended: a \
                         server that allows one channel per connection, as tinysshd, does so; \
                         cairn needs one per operation)"
                    )),
                    other => other,
                });
            }
        };
        self.shared.channels_opened.fetch_add(1, SeqCst);
        self.shared.channels_open.fetch_add(1, SeqCst);
        let open = OpenChannel(self.shared.clone());
        channel
            .exec(true, command.to_vec())
            .await
            .map_err(|e| map(e, &self.shared))?;
        let (read, write) = channel.split();
        Ok(Exec {
            read,
            write,
            pending: VecDeque::new(),
            read_ended: false,
            saw_close: false,
            done: false,
            shared: self.shared.clone(),
            _open: open,
            _handle: self.handle.clone(),
            _via: self.via.clone(),
        })
    }

    /// Disconnect politely (best effort).
    pub async fn close(self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
    }
}

/// Read at most `max` bytes of a file that should be small (a config, known_hosts, a key):
/// a path that names `/dev/zero` or a huge file is an error, not an endless read.
pub(crate) fn read_capped(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes; refusing to read it"),
        ));
    }
    Ok(buf)
}

/// [`read_capped`] for text files.
pub(crate) fn read_text_capped(path: &std::path::Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_capped(path, max)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}
