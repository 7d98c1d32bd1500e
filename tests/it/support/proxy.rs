//! A fault-injecting TCP proxy on 127.0.0.1, on std threads (independent of any tokio runtime).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(20);

struct Conn {
    client: TcpStream,
    server: TcpStream,
    /// Client→server bytes since the last `cut_after_upstream_bytes`.
    up_bytes: AtomicU64,
    dead: AtomicBool,
}

impl Conn {
    fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

struct Inner {
    upstream: u16,
    stop: AtomicBool,
    refuse: AtomicBool,
    pause_down: AtomicBool,
    cut_after: Mutex<Option<u64>>,
    conns: Mutex<Vec<Arc<Conn>>>,
    accepted: AtomicUsize,
}

impl Inner {
    fn cut_all(&self) {
        let conns = std::mem::take(&mut *self.conns.lock().unwrap());
        for c in conns {
            c.kill();
        }
    }
}

pub struct Proxy {
    inner: Arc<Inner>,
    port: u16,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listen on a free 127.0.0.1 port and forward to 127.0.0.1:`upstream_port`.
    pub fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let inner = Arc::new(Inner {
            upstream: upstream_port,
            stop: AtomicBool::new(false),
            refuse: AtomicBool::new(false),
            pause_down: AtomicBool::new(false),
            cut_after: Mutex::new(None),
            conns: Mutex::new(Vec::new()),
            accepted: AtomicUsize::new(0),
        });
        let i2 = inner.clone();
        let accept = std::thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept_loop(listener, i2))
            .unwrap();
        Proxy {
            inner,
            port,
            accept: Some(accept),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Close every live connection, both ways, now.
    pub fn cut(&self) {
        self.inner.cut_all();
    }

    /// While true, new connections are accepted and closed at once.
    pub fn set_refuse(&self, refuse: bool) {
        self.inner.refuse.store(refuse, Ordering::SeqCst);
    }

    /// Stop (true) or resume (false) forwarding server→client bytes; held bytes are delivered
    /// on resume, and lost on a cut.
    pub fn pause_downstream(&self, pause: bool) {
        self.inner.pause_down.store(pause, Ordering::SeqCst);
    }

    /// Cut the connections once `n` client→server bytes have passed on one connection,
    /// counting from now. `None` disables.
    pub fn cut_after_upstream_bytes(&self, n: Option<u64>) {
        let mut g = self.inner.cut_after.lock().unwrap();
        for c in self.inner.conns.lock().unwrap().iter() {
            c.up_bytes.store(0, Ordering::SeqCst);
        }
        *g = n;
    }

    /// Connections accepted so far (including refused ones).
    pub fn connections(&self) -> usize {
        self.inner.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.cut_all();
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    while !inner.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                inner.accepted.fetch_add(1, Ordering::SeqCst);
                if inner.refuse.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let _ = client.set_nonblocking(false);
                let server = match TcpStream::connect_timeout(
                    &([127, 0, 0, 1], inner.upstream).into(),
                    Duration::from_secs(2),
                ) {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    }
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let conn = Arc::new(Conn {
                    client,
                    server,
                    up_bytes: AtomicU64::new(0),
                    dead: AtomicBool::new(false),
                });
                inner.conns.lock().unwrap().push(conn.clone());
                let (i_up, c_up) = (inner.clone(), conn.clone());
                let _ = std::thread::Builder::new()
                    .name("proxy-up".into())
                    .spawn(move || pump_up(i_up, c_up));
                let (i_down, c_down) = (inner.clone(), conn);
                let _ = std::thread::Builder::new()
                    .name("proxy-down".into())
                    .spawn(move || pump_down(i_down, c_down));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

fn running(inner: &Inner, conn: &Conn) -> bool {
    !inner.stop.load(Ordering::SeqCst) && !conn.dead.load(Ordering::SeqCst)
}

fn remove(inner: &Inner, conn: &Arc<Conn>) {
    conn.kill();
    inner
        .conns
        .lock()
        .unwrap()
        .retain(|c| !Arc::ptr_eq(c, conn));
}

fn pump_up(inner: Arc<Inner>, conn: Arc<Conn>) {
    let mut src = conn.client.try_clone().unwrap();
    let mut dst = conn.server.try_clone().unwrap();
    let _ = src.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; 64 * 1024];
    while running(&inner, &conn) {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        let limit = *inner.cut_after.lock().unwrap();
        let mut send = n;
        let mut cut = false;
        if let Some(limit) = limit {
            let before = conn.up_bytes.load(Ordering::SeqCst);
            if before + n as u64 >= limit {
                send = limit.saturating_sub(before) as usize;
                cut = true;
            }
        }
        if send > 0 && dst.write_all(&buf[..send]).is_err() {
            break;
        }
        conn.up_bytes.fetch_add(send as u64, Ordering::SeqCst);
        if cut {
            inner.cut_all();
            break;
        }
    }
    remove(&inner, &conn);
}

fn pump_down(inner: Arc<Inner>, conn: Arc<Conn>) {
    let mut src = conn.server.try_clone().unwrap();
    let mut dst = conn.client.try_clone().unwrap();
    let _ = src.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; 64 * 1024];
    let mut held: Vec<u8> = Vec::new();
    while running(&inner, &conn) {
        let paused = inner.pause_down.load(Ordering::SeqCst);
        if !paused && !held.is_empty() {
            if dst.write_all(&held).is_err() {
                break;
            }
            held.clear();
        }
        let n = match src.read(&mut buf) {
            Ok(0) => {
                if held.is_empty() || inner.pause_down.load(Ordering::SeqCst) {
                    // While paused, keep the held bytes (and the client connection) until
                    // resumed or cut.
                    if !held.is_empty() {
                        std::thread::sleep(POLL);
                        continue;
                    }
                    break;
                }
                let _ = dst.write_all(&held);
                break;
            }
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        if inner.pause_down.load(Ordering::SeqCst) {
            held.extend_from_slice(&buf[..n]);
        } else {
            // Resumed while this read waited: what was held goes first, in order.
            if !held.is_empty() {
                if dst.write_all(&held).is_err() {
                    break;
                }
                held.clear();
            }
            if dst.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    }
    remove(&inner, &conn);
}
