//! Connections shared by the executions of one long-lived process (`cairn serve`, `cairn mcp`).
//!
//! Each execution in flight needs one session channel at a time, not a connection of its own. A
//! [`Pool`] lends connections to executions, at most `per_connection` executions on one
//! connection (OpenSSH's `MaxSessions` is 10 by default; the default of 8 leaves room for the
//! channels of a finished execution still closing). Executions arriving together share the
//! connect of the connection they are given: one TCP connect, handshake and authentication for
//! up to `per_connection` of them, and one error for all of them if it fails.
//!
//! Connections run on one runtime thread of their own, so a connection outlives the execution
//! (and the thread and runtime) that first asked for it. A connection an execution saw fail is
//! retired: nobody new is given it, and it closes when its last user lets go. An idle connection
//! is kept for the next execution to the same host for [`IDLE_FOR`], then closed.
//!
//! Jump hosts (ProxyJump) are shared by every target behind them in this process, pooled or
//! not: [`connect`] reaches a target through one connection per hop, whatever the number of
//! targets behind it (each target is one `direct-tcpip` channel of the hop before it; sshd's
//! `MaxSessions` does not count those). `cairn run --hosts` behind one bastion therefore makes
//! one connection to the bastion, where `ssh -J` makes one per target. A hop connection that
//! closed is replaced on the next connect; one nobody runs through is closed after
//! [`IDLE_FOR`].

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::ssh::{ConnectOptions, Connection, SshError, Target};

/// How long an unused connection stays open for the next execution to its host.
pub const IDLE_FOR: Duration = Duration::from_secs(60);

/// Executions sharing one connection by default (below OpenSSH's default `MaxSessions` of 10).
pub const DEFAULT_PER_CONNECTION: usize = 8;

type Shared = Arc<tokio::sync::OnceCell<Result<Connection, Arc<SshError>>>>;

struct Entry {
    id: u64,
    /// Everything that decides how the connection is made (host, port, user, keys, host-key
    /// checking …): only an execution with the same target may share it.
    key: String,
    conn: Shared,
    users: usize,
    retired: bool,
    idle_since: Option<Instant>,
    /// Host sessions on this connection, one per marker home (`--host-session`).
    sessions: Vec<(String, Arc<crate::session::HostSession>)>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    entries: Vec<Entry>,
}

/// Connections lent to executions; see the module documentation.
pub struct Pool {
    per_connection: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("per_connection", &self.per_connection)
            .finish_non_exhaustive()
    }
}

/// One execution's claim on a pooled connection; released on drop.
pub struct Lease {
    pool: Arc<Pool>,
    id: u64,
    retire: bool,
}

impl Lease {
    /// This connection failed for its holder: give it to nobody new.
    pub fn retire(&mut self) {
        self.retire = true;
    }

    /// The host session on this lease's connection `conn` for marker home `dir`, started on
    /// first use (and again if the last one ended). It lives as long as the connection's entry.
    /// `helper`: run it with the native host helper (falling back to the script if the helper
    /// does not run).
    pub fn session(
        &self,
        conn: &Connection,
        dir: &str,
        helper: bool,
    ) -> Arc<crate::session::HostSession> {
        let mut st = self.pool.lock();
        let Some(e) = st.entries.iter_mut().find(|e| e.id == self.id) else {
            // (cannot happen while the lease lives) a session of its own, ended with its holder
            return crate::session::HostSession::start(
                conn.clone(),
                dir.to_owned(),
                helper,
                runtime(),
            );
        };
        e.sessions.retain(|(_, s)| !s.is_dead());
        if let Some((_, s)) = e.sessions.iter().find(|(d, _)| d == dir) {
            return s.clone();
        }
        let s = crate::session::HostSession::start(conn.clone(), dir.to_owned(), helper, runtime());
        e.sessions.push((dir.to_owned(), s.clone()));
        s
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        if let Some(e) = st.entries.iter_mut().find(|e| e.id == self.id) {
            e.users = e.users.saturating_sub(1);
            e.retired |= self.retire;
            if e.users == 0 {
                e.idle_since = Some(Instant::now());
            }
        }
        // Retired connections close once nobody uses them (dropped outside the lock).
        let gone = sweep(&mut st, Instant::now());
        drop(st);
        drop(gone);
    }
}

/// Remove the entries nobody uses that are retired, closed or idle too long; returned so that
/// they are dropped (and their connections closed) outside the lock.
fn sweep(st: &mut State, now: Instant) -> Vec<Entry> {
    let (gone, keep): (Vec<Entry>, Vec<Entry>) =
        std::mem::take(&mut st.entries).into_iter().partition(|e| {
            e.users == 0
                && (e.retired
                    || closed(&e.conn)
                    || e.idle_since
                        .is_some_and(|t| now.duration_since(t) >= IDLE_FOR))
        });
    st.entries = keep;
    gone
}

fn closed(conn: &Shared) -> bool {
    match conn.get() {
        Some(Ok(c)) => c.is_closed(),
        Some(Err(_)) => true,
        None => false,
    }
}

/// The runtime every pooled connection's SSH session runs on: the process's one runtime, so a
/// connection outlives the call that opened it.
fn runtime() -> &'static tokio::runtime::Handle {
    crate::rt::handle()
}

impl Pool {
    /// A pool lending each connection to at most `per_connection` executions at once (at least 1).
    pub fn new(per_connection: usize) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            per_connection: per_connection.max(1),
            state: Mutex::new(State::default()),
        });
        // Close idle connections on time even when no execution comes to trigger a sweep; ends
        // with the pool.
        let weak = Arc::downgrade(&pool);
        runtime().spawn(async move {
            loop {
                tokio::time::sleep(IDLE_FOR / 4).await;
                let Some(pool) = weak.upgrade() else { break };
                let gone = sweep(&mut pool.lock(), Instant::now());
                drop(gone);
            }
        });
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection to `target` with room for one more execution, and the claim on it.
    pub async fn get(
        self: &Arc<Self>,
        target: &Target,
        opts: &ConnectOptions,
    ) -> Result<(Connection, Lease), SshError> {
        let key = format!("{target:?}");
        // A shared connection found closed on arrival is retired and another one tried: at
        // most twice, then the fresh connect's own answer stands.
        let mut tries = 0;
        loop {
            tries += 1;
            let (conn, mut lease) = self.claim(&key);
            let made = conn
                .get_or_init(|| async {
                    let (t, o) = (target.clone(), opts.clone());
                    match runtime().spawn(async move { connect(&t, &o).await }).await {
                        Ok(r) => r.map_err(Arc::new),
                        Err(e) => Err(Arc::new(SshError::Disconnected(format!(
                            "the connecting task ended: {e}"
                        )))),
                    }
                })
                .await;
            match made {
                Ok(c) if !c.is_closed() => return Ok((c.clone(), lease)),
                Ok(c) => {
                    lease.retire();
                    if tries >= 3 {
                        return Err(SshError::Disconnected(
                            c.disconnect_reason()
                                .unwrap_or_else(|| "connection closed".into()),
                        ));
                    }
                }
                Err(e) => {
                    lease.retire();
                    return Err(e.duplicate());
                }
            }
        }
    }

    /// Claim a place on a connection for `key` with room, or on a new one (not yet connected).
    fn claim(self: &Arc<Self>, key: &str) -> (Shared, Lease) {
        let mut st = self.lock();
        let gone = sweep(&mut st, Instant::now());
        let free = st.entries.iter_mut().find(|e| {
            e.key == key && !e.retired && e.users < self.per_connection && !closed(&e.conn)
        });
        let (id, conn) = match free {
            Some(e) => {
                e.users += 1;
                e.idle_since = None;
                (e.id, e.conn.clone())
            }
            None => {
                st.next_id += 1;
                let id = st.next_id;
                let conn: Shared = Default::default();
                st.entries.push(Entry {
                    id,
                    key: key.to_owned(),
                    conn: conn.clone(),
                    users: 1,
                    retired: false,
                    idle_since: None,
                    sessions: Vec::new(),
                });
                (id, conn)
            }
        };
        drop(st);
        drop(gone);
        let lease = Lease {
            pool: self.clone(),
            id,
            retire: false,
        };
        (conn, lease)
    }
}

/// Connect to `target` (TCP, its ProxyCommand, or through its jump hosts), sharing the
/// connections to the jump hosts with every other target of this process behind them; see the
/// module documentation.
pub async fn connect(target: &Target, opts: &ConnectOptions) -> Result<Connection, SshError> {
    if target.jump.is_empty() {
        return Connection::connect(target, opts).await;
    }
    let hop = hop_connection(target, target.jump.len()).await?;
    Connection::connect_via(target, crate::ssh::Via::Jump(&hop)).await
}

type HopCell = Arc<tokio::sync::OnceCell<Result<Connection, Arc<SshError>>>>;

struct Hop {
    /// The hops up to and including this one and how the first is reached.
    key: String,
    conn: HopCell,
    /// Since when only the registry holds the connection.
    idle_since: Option<Instant>,
}

/// Connections to jump hosts, shared by the whole process.
static HOPS: Mutex<Vec<Hop>> = Mutex::new(Vec::new());

fn hops() -> std::sync::MutexGuard<'static, Vec<Hop>> {
    HOPS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn hop_closed(cell: &HopCell) -> bool {
    match cell.get() {
        Some(Ok(c)) => c.is_closed(),
        Some(Err(_)) => true,
        None => false,
    }
}

/// Drop the hop connections that closed or that nobody ran through for [`IDLE_FOR`]; returned
/// to be dropped outside the lock.
fn sweep_hops(list: &mut Vec<Hop>, now: Instant) -> Vec<Hop> {
    for h in list.iter_mut() {
        // Only the registry's own handle left: idle.
        let idle = matches!(h.conn.get(), Some(Ok(c)) if c.users() <= 1);
        match (idle, h.idle_since) {
            (true, None) => h.idle_since = Some(now),
            (false, _) => h.idle_since = None,
            _ => {}
        }
    }
    let (gone, keep): (Vec<Hop>, Vec<Hop>) = std::mem::take(list).into_iter().partition(|h| {
        hop_closed(&h.conn)
            || h.idle_since
                .is_some_and(|t| now.duration_since(t) >= IDLE_FOR)
    });
    *list = keep;
    gone
}

/// The shared connection to `target.jump[n - 1]`, reached through the hops before it.
async fn hop_connection(target: &Target, n: usize) -> Result<Connection, SshError> {
    static SWEEPER: OnceLock<()> = OnceLock::new();
    SWEEPER.get_or_init(|| {
        runtime().spawn(async {
            loop {
                tokio::time::sleep(IDLE_FOR / 4).await;
                let gone = sweep_hops(&mut hops(), Instant::now());
                drop(gone);
            }
        });
    });
    let mut prev: Option<Connection> = None;
    for i in 0..n {
        let key = format!("{:?} {:?}", target.proxy_command, &target.jump[..=i]);
        let cell = {
            let mut list = hops();
            let gone = sweep_hops(&mut list, Instant::now());
            let cell = match list
                .iter_mut()
                .find(|h| h.key == key && !hop_closed(&h.conn))
            {
                Some(h) => h.conn.clone(),
                None => {
                    let cell = HopCell::default();
                    list.push(Hop {
                        key,
                        conn: cell.clone(),
                        idle_since: None,
                    });
                    cell
                }
            };
            drop(list);
            drop(gone);
            cell
        };
        let (hop, before) = (target.jump[i].clone(), prev.clone());
        let first = target.proxy_command.clone();
        let made = cell
            .get_or_init(|| async move {
                // On the pool's runtime: the hop outlives the execution (and the runtime) that
                // first needed it.
                match runtime()
                    .spawn(async move {
                        let via = match (&before, &first) {
                            (Some(c), _) => crate::ssh::Via::Jump(c),
                            (None, Some(cmd)) => crate::ssh::Via::Command(cmd),
                            (None, None) => crate::ssh::Via::Tcp,
                        };
                        Connection::connect_via(&hop, via).await
                    })
                    .await
                {
                    Ok(r) => r.map_err(Arc::new),
                    Err(e) => Err(Arc::new(SshError::Disconnected(format!(
                        "the connecting task ended: {e}"
                    )))),
                }
            })
            .await;
        match made {
            Ok(c) => prev = Some(c.clone()),
            Err(e) => return Err(e.duplicate()),
        }
    }
    prev.ok_or_else(|| SshError::Protocol("no jump host to connect through".into()))
}
