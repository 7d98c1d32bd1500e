//! cairn-host: the native host side of the cairn marker protocol v1 (PROTOCOL.md is the spec,
//! cairn.sh the reference implementation; where the two could differ, the script wins).
//!
//! Built by the client's build script from this one file (std only, plus the C library std
//! links anyway), statically linked, uploaded by the client into the marker home on first
//! contact (HOST-HELPER.md), and run as
//!
//!     HELPER SHA256 MODE DIR NONCE ARG...
//!
//! with the same modes and arguments as the script. SHA256 is the hash the client expects: the
//! helper checks its own file (/proc/self/exe) before anything else and refuses to run
//! (exit 125, nothing written, no protocol line) when it is not that file, so the client falls
//! back to the script. The check is a `stat` and a read of its seal (`.NAME.seal` beside it:
//! the hash with the file's device, inode, size and change time) once the whole file has been
//! hashed and sealed; any write to, rename over or chmod of the file changes its change time,
//! and then it is hashed again (see `self_check`). It spawns no process but the command itself: the supervisor is a fork, the
//! files, links and flushes are system calls.

// (no_main: std's entry point pulls in code this program never runs; std reads the arguments
// and environment on glibc all the same)
#![no_main]

use std::ffi::{CString, OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const VERSION: &str = "1";

// --- the C library: only what std does not offer ---
mod c {
    use std::os::raw::{c_char, c_int, c_void};
    pub const SIGHUP: c_int = 1;
    pub const SIGKILL: c_int = 9;
    pub const SIGPIPE: c_int = 13;
    pub const SIGTERM: c_int = 15;
    pub const SIG_DFL: usize = 0;
    pub const SIG_IGN: usize = 1;
    pub const POLLIN: i16 = 1;
    pub const O_RDWR: c_int = 2;
    pub const O_NONBLOCK: c_int = 0o4000;
    pub const O_CLOEXEC: c_int = 0o2000000;
    pub const IN_MODIFY: u32 = 2;
    pub const IN_NONBLOCK: c_int = 0o4000;
    pub const IN_CLOEXEC: c_int = 0o2000000;
    #[repr(C)]
    pub struct PollFd {
        pub fd: c_int,
        pub events: i16,
        pub revents: i16,
    }
    #[repr(C)]
    pub struct Utsname {
        pub f: [[c_char; 65]; 6],
    }
    extern "C" {
        pub fn fork() -> c_int;
        pub fn setsid() -> c_int;
        pub fn getpid() -> c_int;
        pub fn kill(pid: c_int, sig: c_int) -> c_int;
        pub fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
        pub fn execve(
            path: *const c_char,
            argv: *const *const c_char,
            envp: *const *const c_char,
        ) -> c_int;
        pub fn dup2(old: c_int, new: c_int) -> c_int;
        pub fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize;
        pub fn write(fd: c_int, buf: *const c_void, n: usize) -> isize;
        pub fn close(fd: c_int) -> c_int;
        pub fn chdir(path: *const c_char) -> c_int;
        pub fn signal(sig: c_int, handler: usize) -> usize;
        pub fn _exit(code: c_int) -> !;
        pub fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
        pub fn poll(fds: *mut PollFd, n: u64, timeout: c_int) -> c_int;
        pub fn mkfifo(path: *const c_char, mode: u32) -> c_int;
        pub fn open(path: *const c_char, flags: c_int, ...) -> c_int;
        pub fn access(path: *const c_char, mode: c_int) -> c_int;
        pub fn inotify_init1(flags: c_int) -> c_int;
        pub fn inotify_add_watch(fd: c_int, path: *const c_char, mask: u32) -> c_int;
        pub fn uname(buf: *mut Utsname) -> c_int;
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

/// write all of `b` to `fd`; false when the other end is gone
fn put_fd(fd: RawFd, mut b: &[u8]) -> bool {
    while !b.is_empty() {
        let n = unsafe { c::write(fd, b.as_ptr().cast(), b.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        b = &b[n as usize..];
    }
    true
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn num(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes().all(|b| b.is_ascii_digit())
        && !(s.len() > 1 && s.starts_with('0'))
}
fn hex(s: &str, n: usize) -> bool {
    s.len() == n
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
fn bit(s: &str) -> bool {
    s == "0" || s == "1"
}
fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// newlines turned into spaces
fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// the first line of a file, as `read -r` gives it (surrounding blanks removed)
fn first_line(p: &Path) -> Option<String> {
    let mut s = String::new();
    File::open(p).ok()?.read_to_string(&mut s).ok()?;
    let l = s.split('\n').next().unwrap_or("");
    if s.is_empty() {
        return None;
    }
    Some(l.trim_matches([' ', '\t']).to_owned())
}

/// one `lstat`: a name that is there (a dangling link too) exists; where `lstat` fails, `stat`
/// would fail the same way, so it is not asked as well
fn exists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

fn is_fifo(p: &Path) -> bool {
    fs::metadata(p)
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false)
}

fn size(p: &Path) -> Option<u64> {
    fs::metadata(p).ok().map(|m| m.len())
}

/// flush a file's data (or a directory's entries) to disk
fn flush(p: &Path) -> Result<(), String> {
    File::open(p)
        .and_then(|f| f.sync_data())
        .map_err(|e| format!("sync: {}: {e}", p.display()))
}

fn err_text(what: &str, p: &Path, e: &std::io::Error) -> String {
    format!("{what}: {}: {e}", p.display())
}

/// STATE and start time (field 22) of a process, from /proc/PID/stat
fn pst(pid: &str) -> Option<(String, u64)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(") ")? + 2..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some((f.first()?.to_string(), f.get(19)?.parse().ok()?))
}

/// PID names a live process (not a zombie) that started at START
fn ours(pid: &str, start: &str) -> bool {
    match pst(pid) {
        Some((st, t)) => t.to_string() == start && st != "Z" && st != "X",
        None => false,
    }
}

/// kill -s SIG -- PID, only for a decimal PID > 1 (a group: negative)
fn kill_pid(sig: i32, pid: &str, group: bool) -> bool {
    if !num(pid) {
        return false;
    }
    let Ok(n) = pid.parse::<i32>() else {
        return false;
    };
    if n <= 1 {
        return false;
    }
    unsafe { c::kill(if group { -n } else { n }, sig) == 0 }
}

/// the command's process group (leader g with start time gs, from F/pgid), as the script's
/// kill_group
fn kill_group(sig: i32, g: &str, gs: &str) {
    if !num(g) || g.parse::<i64>().unwrap_or(0) <= 1 {
        return;
    }
    match pst(g) {
        Some((_, t)) => {
            if t.to_string() != gs {
                return;
            }
            if !kill_pid(sig, g, true) {
                kill_pid(sig, g, false);
            }
        }
        None => {
            kill_pid(sig, g, true);
        }
    }
}

fn read_pgid(f: &Path) -> Option<(String, String)> {
    let l = first_line(&f.join("pgid"))?;
    let mut w = l.split_ascii_whitespace();
    Some((w.next()?.to_owned(), w.next().unwrap_or("").to_owned()))
}

fn tick() {
    std::thread::sleep(Duration::from_millis(100));
}

// SHA-256, for the self-check (the client's build script hashes the binary with the same code)
include!("sha256.rs");

/// Whether this executable is the helper whose SHA-256 is `expected`: the seal beside it
/// names that hash and the file as it is now (device, inode, size, change time: the kernel
/// sets the change time on every write, rename or chmod, and no call sets it to a chosen
/// value), or, without a matching seal, the whole file hashes to it (then sealed, atomically,
/// for the next use; a directory that refuses the seal only means hashing every time).
fn self_check(expected: &str) -> bool {
    let ident = |m: &fs::Metadata| {
        format!(
            "{expected} {} {} {} {}.{}\n",
            m.dev(),
            m.ino(),
            m.size(),
            m.ctime(),
            m.ctime_nsec()
        )
    };
    let (Ok(exe), Ok(before)) = (fs::read_link("/proc/self/exe"), fs::metadata("/proc/self/exe"))
    else {
        return false;
    };
    let (Some(dir), Some(name)) = (exe.parent(), exe.file_name()) else {
        return false;
    };
    let mut seal_name = OsString::from(".");
    seal_name.push(name);
    seal_name.push(".seal");
    let seal = dir.join(seal_name);
    let want = ident(&before);
    if fs::read(&seal).is_ok_and(|b| b == want.as_bytes()) {
        return true;
    }
    if !self_hash_ok(expected) {
        return false;
    }
    // sealed only if the file did not change while it was read
    if fs::metadata("/proc/self/exe").is_ok_and(|after| ident(&after) == want) {
        let mut tmp = seal.clone().into_os_string();
        tmp.push(format!(".{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        use std::os::unix::fs::OpenOptionsExt;
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(want.as_bytes()));
        if written.is_ok() && fs::rename(&tmp, &seal).is_ok() {
            return true;
        }
        let _ = fs::remove_file(&tmp);
    }
    true
}

fn self_hash_ok(expected: &str) -> bool {
    match fs::read("/proc/self/exe") {
        Ok(b) => {
            let h = sha256(&b);
            let s: String = h.iter().map(|x| format!("{x:02x}")).collect();
            s == expected
        }
        Err(_) => false,
    }
}

// --- records ---

struct StartRec {
    v: String,
    boot: String,
    pid: String,
    start: String,
}

fn parse_start(l: &str) -> StartRec {
    let mut r = StartRec {
        v: String::new(),
        boot: String::new(),
        pid: String::new(),
        start: String::new(),
    };
    for kv in l.split_ascii_whitespace() {
        if let Some((k, v)) = kv.split_once('=') {
            match k {
                "v" => r.v = v.to_owned(),
                "boot" => r.boot = v.to_owned(),
                "sup_pid" => r.pid = v.to_owned(),
                "sup_start" => r.start = v.to_owned(),
                _ => {}
            }
        }
    }
    r
}

fn field<'a>(rec: &'a str, key: &str) -> Option<&'a str> {
    rec.split_ascii_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// the protocol context of one exec
struct Ctx {
    mode: String,
    tag: String,
    /// protocol lines to stdout (session) or stderr
    pf: RawFd,
    dir: PathBuf,
    dir_text: String,
    x: PathBuf,
    t: PathBuf,
    id: String,
    f: PathBuf,
    stage: Option<PathBuf>,
    boot: Option<String>,
    /// session: protocol lines gathered, written together
    ob: Option<Vec<u8>>,
}

impl Ctx {
    fn say(&mut self, text: &str) {
        let line = format!("{} {text}\n", self.tag);
        match &mut self.ob {
            Some(b) => b.extend_from_slice(line.as_bytes()),
            None => {
                put_fd(self.pf, line.as_bytes());
            }
        }
    }
    fn say_error(&mut self, m: &str) {
        let m = one_line(m);
        self.say(&format!("error {m}"));
    }
    fn fl(&mut self) {
        if let Some(b) = &mut self.ob {
            if !b.is_empty() {
                put_fd(1, b);
                b.clear();
            }
        }
    }
    fn die(&mut self, m: &str) -> ! {
        if let Some(s) = self.stage.take() {
            let _ = fs::remove_dir_all(s);
        }
        self.say_error(m);
        if self.mode == "dispatch" {
            self.say("verdict refused");
        }
        self.say("end");
        self.fl();
        std::process::exit(1)
    }
    /// boot identity: kernel boot ID / start time of PID 1
    fn boot(&mut self) -> Option<String> {
        if self.boot.is_none() {
            let p = std::env::var_os("CAIRN_BOOT_ID_FILE")
                .unwrap_or_else(|| OsString::from("/proc/sys/kernel/random/boot_id"));
            let b = first_line(Path::new(&p))?;
            let (_, s) = pst("1")?;
            self.boot = Some(format!("{b}/{s}"));
        }
        self.boot.clone()
    }
    /// liveness of the supervisor of a started record
    fn alive(&mut self, r: &StartRec) -> &'static str {
        match self.boot() {
            Some(b) if b == r.boot => {}
            _ => return "rebooted",
        }
        if !exists(&self.f.join("lost")) && ours(&r.pid, &r.start) {
            "alive"
        } else {
            "dead"
        }
    }
    fn start_path(&self) -> PathBuf {
        self.x.join(format!("{}.start", self.id))
    }
    fn done_path(&self) -> PathBuf {
        self.x.join(format!("{}.done", self.id))
    }
    fn cancel_path(&self) -> PathBuf {
        self.x.join(format!("{}.cancel", self.id))
    }
}

fn wake(f: &Path) {
    let w = f.join("wake");
    if !is_fifo(&w) {
        return;
    }
    let fd = unsafe { c::open(cstr(&w).as_ptr(), c::O_RDWR | c::O_NONBLOCK | c::O_CLOEXEC) };
    if fd >= 0 {
        put_fd(fd, &[b'\n'; 64]);
        unsafe { c::close(fd) };
    }
}

/// send FILE from OFF up to SIZE (default: its current size) to fd; the new offset
fn rest(file: &Path, off: u64, limit: Option<u64>, fd: RawFd) -> Result<u64, u64> {
    let size = match limit {
        Some(s) => s,
        None => match self::size(file) {
            Some(s) => s,
            None => return Ok(off),
        },
    };
    if size <= off {
        return Ok(off);
    }
    let Ok(mut fh) = File::open(file) else {
        return Ok(off);
    };
    use std::io::Seek;
    if fh.seek(std::io::SeekFrom::Start(off)).is_err() {
        return Ok(off);
    }
    let mut at = off;
    let mut buf = vec![0u8; 65536];
    while at < size {
        let want = ((size - at) as usize).min(buf.len());
        let n = match fh.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !put_fd(fd, &buf[..n]) {
            return Err(at);
        }
        at += n as u64;
    }
    Ok(at)
}

// --- the command: shared by the supervisor of a dispatch and the session ---

struct Launch {
    id: String,
    /// x/ID
    f: PathBuf,
    /// the command file
    cf: PathBuf,
    timeout: u64,
    /// NAME, value: secrets for the command's environment only
    secrets: Vec<(Vec<u8>, Vec<u8>)>,
}

/// start the command: own session, cwd $HOME, stdin /dev/null, output to F/out and F/err; its
/// PID and start time into F/pgid before the cancel flag is checked. The PID, or the status
/// when nothing ran (130: cancelled before the start).
// Long: follows cairn.sh's code for the same step line by line (the script is the reference),
// so that the two can be read side by side.
fn launch(l: &Launch) -> Result<i32, i32> {
    let sh = std::env::var_os("SHELL")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| OsString::from("/bin/sh"));
    let home = std::env::var_os("HOME")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| OsString::from("/"));
    let shc = CString::new(sh.as_bytes()).unwrap_or_default();
    let homec = CString::new(home.as_bytes()).unwrap_or_default();
    let a1 = CString::new("-c").unwrap_or_default();
    let a2 = CString::new(". \"$CAIRN_COMMAND_FILE\"").unwrap_or_default();
    let argv = [shc.as_ptr(), a1.as_ptr(), a2.as_ptr(), std::ptr::null()];
    let mut env: Vec<CString> = Vec::new();
    let skip: Vec<&[u8]> = l.secrets.iter().map(|(n, _)| n.as_slice()).collect();
    for (k, v) in std::env::vars_os() {
        let kb = k.as_bytes();
        if kb == b"CAIRN_EXECUTION_ID" || kb == b"CAIRN_COMMAND_FILE" || skip.contains(&kb) {
            continue;
        }
        let mut e = kb.to_vec();
        e.push(b'=');
        e.extend_from_slice(v.as_bytes());
        if let Ok(c) = CString::new(e) {
            env.push(c);
        }
    }
    let mut add = |k: &[u8], v: &[u8]| {
        let mut e = k.to_vec();
        e.push(b'=');
        e.extend_from_slice(v);
        if let Ok(c) = CString::new(e) {
            env.push(c);
        }
    };
    add(b"CAIRN_EXECUTION_ID", l.id.as_bytes());
    add(b"CAIRN_COMMAND_FILE", l.cf.as_os_str().as_bytes());
    for (k, v) in &l.secrets {
        add(k, v);
    }
    let mut envp: Vec<*const std::os::raw::c_char> = env.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());
    let open_out = |p: PathBuf| {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(p)
    };
    let (Ok(out), Ok(err), Ok(null)) = (
        open_out(l.f.join("out")),
        open_out(l.f.join("err")),
        File::open("/dev/null"),
    ) else {
        return Err(126);
    };
    let mut go = [0i32; 2];
    if unsafe { c::pipe2(go.as_mut_ptr(), c::O_CLOEXEC) } != 0 {
        return Err(126);
    }
    let (ofd, efd, nfd) = (out.as_raw_fd(), err.as_raw_fd(), null.as_raw_fd());
    let pid = unsafe { c::fork() };
    if pid < 0 {
        unsafe {
            c::close(go[0]);
            c::close(go[1]);
        }
        return Err(126);
    }
    if pid == 0 {
        // the child: async-signal-safe calls only (the session has threads)
        unsafe {
            c::setsid();
            let mut b = 0u8;
            if c::read(go[0], (&mut b as *mut u8).cast(), 1) != 1 || b != b'g' {
                c::_exit(130);
            }
            c::signal(c::SIGHUP, c::SIG_DFL);
            c::signal(c::SIGPIPE, c::SIG_DFL);
            if c::chdir(homec.as_ptr()) != 0 {
                c::_exit(126);
            }
            c::dup2(nfd, 0);
            c::dup2(ofd, 1);
            c::dup2(efd, 2);
            c::execve(shc.as_ptr(), argv.as_ptr(), envp.as_ptr());
            c::_exit(127);
        }
    }
    unsafe { c::close(go[0]) };
    let p = pid.to_string();
    let st = pst(&p).map(|(_, t)| t.to_string()).unwrap_or_default();
    let _ = fs::write(l.f.join("pgid"), format!("{p} {st}\n"));
    let mut cp = l.f.clone().into_os_string();
    cp.push(".cancel");
    let cancelled = exists(Path::new(&cp));
    let b: u8 = if cancelled { b'n' } else { b'g' };
    put_fd(go[1], &[b]);
    unsafe { c::close(go[1]) };
    Ok(pid)
}

fn wait_status(pid: i32) -> i32 {
    let mut st = 0i32;
    loop {
        let r = unsafe { c::waitpid(pid, &mut st, 0) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return 255;
        }
    }
    if st & 0x7f == 0 {
        (st >> 8) & 0xff
    } else {
        128 + (st & 0x7f)
    }
}

/// run the command to its end; with a timeout, TERM to its group after it (touching
/// F/timedout), KILL 5 s later. Its exit status as a shell reports it.
fn run_command(l: &Launch) -> i32 {
    let pid = match launch(l) {
        Ok(p) => p,
        Err(s) => return s,
    };
    if l.timeout == 0 {
        return wait_status(pid);
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(wait_status(pid));
    });
    let deadline = Duration::from_secs(l.timeout);
    match rx.recv_timeout(deadline) {
        Ok(s) => return s,
        Err(mpsc::RecvTimeoutError::Disconnected) => return 255,
        Err(_) => {}
    }
    if let Some((g, gs)) = read_pgid(&l.f) {
        let _ = File::create(l.f.join("timedout"));
        kill_group(c::SIGTERM, &g, &gs);
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(s) => return s,
            Err(mpsc::RecvTimeoutError::Disconnected) => return 255,
            Err(_) => kill_group(c::SIGKILL, &g, &gs),
        }
    }
    rx.recv().unwrap_or(255)
}

fn finish_text(id: &str, status: i32, o: u64, e: u64, t: bool, k: bool) -> String {
    format!(
        "v=1 id={id} status={status} finished_at={} out={o} err={e} timed_out={} cancelled={}",
        now(),
        t as u8,
        k as u8
    )
}

/// write a record into its reserved space, in place
fn write_in_place(p: &Path, text: &str) -> bool {
    match OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
    {
        Ok(mut f) => f.write_all(format!("{text}\n").as_bytes()).is_ok(),
        Err(_) => false,
    }
}

// --- the modes ---

#[no_mangle]
pub extern "C" fn main(_argc: i32, _argv: *const *const u8) -> i32 {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    unsafe {
        c::signal(c::SIGPIPE, c::SIG_IGN);
    }
    let expected = args.get(1).cloned().unwrap_or_default();
    if !hex(&expected, 64) || !self_check(&expected) {
        put_fd(
            2,
            b"cairn-host: this helper's SHA-256 is not the one expected; not run\n",
        );
        std::process::exit(125);
    }
    let a = &args[2.min(args.len())..];
    if a.first().map(String::as_str) == Some("selftest") {
        put_fd(1, format!("cairn-host ok v={VERSION}\n").as_bytes());
        std::process::exit(0);
    }
    let mode = a.first().cloned().unwrap_or_default();
    // a, as the script's $1..: MODE DIR NONCE ID ...
    let nonce = a.get(2).cloned().unwrap_or_default();
    if !hex(&nonce, 32) {
        put_fd(2, b"cairn: bad nonce\n");
        std::process::exit(2);
    }
    let n = a.len();
    let g = |i: usize| a.get(i).map(String::as_str).unwrap_or("");
    let ok = match mode.as_str() {
        "hello" => n == 3 || (n == 4 && hex(g(3), 64)),
        "dispatch" => {
            (n == 8 || (n == 9 && num(g(8))))
                && num(g(4))
                && hex(g(5), 64)
                && num(g(6))
                && bit(g(7))
        }
        "watch" => n == 7 && num(g(4)) && num(g(5)) && bit(g(6)),
        "cancel" => n == 5 && num(g(4)),
        "gc" => (n == 5 || (n == 6 && hex(g(5), 64))) && num(g(3)) && num(g(4)),
        "session" => n == 3,
        _ => false,
    };
    let in_session = mode == "session";
    let mut cx = Ctx {
        mode: mode.clone(),
        tag: format!("@@cairn-{nonce}@@"),
        pf: if in_session { 1 } else { 2 },
        dir: PathBuf::new(),
        dir_text: String::new(),
        x: PathBuf::new(),
        t: PathBuf::new(),
        id: String::new(),
        f: PathBuf::new(),
        stage: None,
        boot: None,
        ob: None,
    };
    if !ok {
        cx.die(&format!("bad arguments for mode '{mode}'"));
    }
    if !matches!(mode.as_str(), "hello" | "gc" | "session") {
        if !valid_id(g(3)) {
            cx.die("bad execution ID");
        }
        cx.id = g(3).to_owned();
    }
    let d = g(1);
    if d.is_empty() || d.contains('\n') {
        cx.die("bad marker directory");
    }
    let dir = if d.starts_with('/') {
        d.to_owned()
    } else {
        let home = std::env::var("HOME").unwrap_or_default();
        if home.is_empty() {
            cx.die("HOME is not set");
        }
        format!("{home}/{d}")
    };
    cx.dir = PathBuf::from(&dir);
    cx.dir_text = dir.clone();
    cx.x = cx.dir.join("x");
    cx.t = cx.dir.join("tmp");
    cx.f = cx.x.join(&cx.id);
    // no symbolic link anywhere on the marker path
    let mut r = String::new();
    let mut q: Option<String> = None;
    for comp in dir.split('/') {
        if comp.is_empty() {
            continue;
        }
        r.push('/');
        r.push_str(comp);
        if fs::symlink_metadata(&r)
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false)
        {
            q = Some(r.clone());
            break;
        }
    }
    for p in [&cx.x, &cx.t] {
        if fs::symlink_metadata(p)
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false)
        {
            q = Some(p.display().to_string());
        }
    }
    if let Some(q) = q {
        cx.die(&format!(
            "the marker path {dir} has a symbolic link at {q}; refusing it (give --remote-dir the real path)"
        ));
    }
    // the marker home and the epoch
    if !cx.x.is_dir() || !cx.t.is_dir() {
        // (mkdir -p -m 700: the home itself 0700, its missing parents as the umask says)
        let d = cx.dir.clone();
        let mut made = fs::DirBuilder::new().mode(0o700).create(&d);
        if matches!(&made, Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
            if let Some(parent) = d.parent() {
                if let Err(e) = fs::DirBuilder::new().recursive(true).create(parent) {
                    cx.die(&err_text("mkdir", parent, &e));
                }
            }
            made = fs::DirBuilder::new().mode(0o700).create(&d);
        }
        if let Err(e) = made {
            if !d.is_dir() {
                cx.die(&err_text("mkdir", &d, &e));
            }
        }
        for p in [cx.x.clone(), cx.t.clone()] {
            if let Err(e) = fs::create_dir(&p) {
                if !p.is_dir() {
                    cx.die(&err_text("mkdir", &p, &e));
                }
            }
        }
    }
    let epoch_path = cx.dir.join("epoch");
    let epoch = match first_line(&epoch_path) {
        Some(l) => l.split_ascii_whitespace().next().unwrap_or("").to_owned(),
        None => {
            let Some(u) = first_line(Path::new("/proc/sys/kernel/random/uuid")) else {
                cx.die("cannot read /proc/sys/kernel/random/uuid");
            };
            let u = u.replace('-', "");
            let tmp = cx.t.join(format!("epoch.{}", unsafe { c::getpid() }));
            if let Err(e) = fs::write(&tmp, format!("{u} created={}\n", now())) {
                cx.die(&err_text("cannot write", &tmp, &e));
            }
            let _ = flush(&tmp);
            let _ = fs::hard_link(&tmp, &epoch_path);
            let _ = fs::remove_file(&tmp);
            let _ = flush(&cx.dir);
            match first_line(&epoch_path) {
                Some(l) => l.split_ascii_whitespace().next().unwrap_or("").to_owned(),
                None => cx.die(&format!("cannot read {dir}/epoch")),
            }
        }
    };
    let mut extra = String::new();
    if mode == "hello" {
        let m = fs::metadata(&cx.dir).map(|m| m.mode()).unwrap_or(0o777);
        if m & 0o3077 != 0 {
            cx.die(&format!(
                "the marker directory {dir} is accessible by other users; fix it with: chmod 700 {dir}"
            ));
        }
        if n == 4 {
            extra = format!(" arch={} helper=ok", arch());
        }
    }
    if cx.boot().is_none() {
        cx.die("cannot read the boot identity");
    }
    let boot = cx.boot().unwrap_or_default();
    cx.say(&format!(
        "hello v=1 epoch={epoch} boot={boot} now={}{extra}",
        now()
    ));
    match mode.as_str() {
        "dispatch" => dispatch(&mut cx, a, &epoch),
        "watch" => watch(&mut cx, g(4), g(5), g(6) == "1"),
        "cancel" => cancel(&mut cx, g(4)),
        "gc" => gc(&mut cx, g(3), g(4), a.get(5).map(String::as_str)),
        "session" => session(&mut cx, &epoch),
        _ => {}
    }
    cx.say("end");
    cx.fl();
    0
}

fn arch() -> String {
    let mut u = c::Utsname { f: [[0; 65]; 6] };
    if unsafe { c::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    let m: Vec<u8> = u.f[4]
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as u8)
        .collect();
    String::from_utf8_lossy(&m).into_owned()
}

fn shell_checks(cx: &mut Ctx) {
    let sh = std::env::var_os("SHELL")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| OsString::from("/bin/sh"));
    if unsafe { c::access(CString::new(sh.as_bytes()).unwrap_or_default().as_ptr(), 1) } != 0 {
        cx.die(&format!(
            "login shell {} is not executable",
            sh.to_string_lossy()
        ));
    }
    let home = std::env::var_os("HOME")
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| OsString::from("/"));
    let hp = Path::new(&home);
    if !hp.is_dir() || unsafe { c::access(cstr(hp).as_ptr(), 1) } != 0 {
        cx.die(&format!("cannot cd to home {}", hp.display()));
    }
}

/// exactly n bytes from fd 0 (fewer if it ended first)
fn read_exact_stdin(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    let mut got = 0;
    while got < n {
        let r = unsafe { c::read(0, v[got..].as_mut_ptr().cast(), n - got) };
        if r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if r <= 0 {
            break;
        }
        got += r as usize;
    }
    v.truncate(got);
    v
}

/// `export NAME='value'` lines, as the client writes them (the value single-quoted, `'`
/// written as `'\''`)
fn parse_secrets(b: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let rest = b[i..].strip_prefix(b"export ")?;
        let eq = rest.iter().position(|&c| c == b'=')?;
        let name = rest[..eq].to_vec();
        if name.is_empty() || !name.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_') {
            return None;
        }
        let mut j = eq + 1;
        let mut val = Vec::new();
        loop {
            match rest.get(j)? {
                b'\n' => break,
                b'\'' => {
                    j += 1;
                    while *rest.get(j)? != b'\'' {
                        val.push(rest[j]);
                        j += 1;
                    }
                    j += 1;
                }
                b'\\' => {
                    val.push(*rest.get(j + 1)?);
                    j += 2;
                }
                &ch => {
                    val.push(ch);
                    j += 1;
                }
            }
        }
        out.push((name, val));
        i += "export ".len() + j + 1;
    }
    Some(out)
}

// Long: follows cairn.sh's code for the same step line by line (the script is the reference),
// so that the two can be read side by side.
fn dispatch(cx: &mut Ctx, a: &[String], epoch: &str) {
    let len: usize = a[4].parse().unwrap_or(0);
    let dig = a[5].clone();
    let to: u64 = a[6].parse().unwrap_or(0);
    let att = a[7] == "1";
    let sl: usize = a.get(8).and_then(|s| s.parse().ok()).unwrap_or(0);
    let start = cx.start_path();
    let verdict;
    if !exists(&start) {
        let pid = unsafe { c::getpid() };
        let stage = cx.t.join(format!("{}.{pid}", cx.id));
        if let Err(e) = fs::create_dir(&stage) {
            cx.die(&err_text("mkdir", &stage, &e));
        }
        cx.stage = Some(stage.clone());
        let cmd = read_exact_stdin(len);
        if let Err(e) = fs::write(stage.join("cmd"), &cmd) {
            cx.die(&err_text("cannot write", &stage.join("cmd"), &e));
        }
        if cmd.len() != len {
            cx.die(&format!("stdin ended after {} of {len} bytes", cmd.len()));
        }
        let prep = || -> std::io::Result<()> {
            File::create(stage.join("out"))?;
            File::create(stage.join("err"))?;
            fs::write(stage.join("done.tmp"), format!("{:512}\n", ""))?;
            Ok(())
        };
        if let Err(e) = prep() {
            cx.die(&format!("cannot prepare {}: {e}", stage.display()));
        }
        if unsafe { c::mkfifo(cstr(&stage.join("wake")).as_ptr(), 0o666) } != 0 {
            let e = std::io::Error::last_os_error();
            cx.die(&err_text("mkfifo", &stage.join("wake"), &e));
        }
        shell_checks(cx);
        let mut secrets = Vec::new();
        if sl > 0 {
            let s = read_exact_stdin(sl);
            if s.len() != sl {
                cx.die("stdin ended inside the secrets");
            }
            match parse_secrets(&s) {
                Some(v) => secrets = v,
                None => cx.die("the secrets are not export lines"),
            }
        }
        if cx.boot().is_none() {
            cx.die("cannot read the boot identity");
        }
        let mut vp = [0i32; 2];
        if unsafe { c::pipe2(vp.as_mut_ptr(), c::O_CLOEXEC) } != 0 {
            cx.die("cannot make a pipe");
        }
        let sup = unsafe { c::fork() };
        if sup < 0 {
            cx.die("cannot fork the supervisor");
        }
        if sup == 0 {
            unsafe { c::close(vp[0]) };
            supervise(cx, vp[1], &stage, &a[4], &dig, to, epoch, secrets);
        }
        unsafe { c::close(vp[1]) };
        // error lines, then "verdict X" last
        let mut v = Vec::new();
        // SAFETY: vp[0] is ours alone from here on
        let mut pr = unsafe { File::from_raw_fd(vp[0]) };
        let mut buf = [0u8; 4096];
        while !v.windows(8).any(|w| w == b"verdict ") || !v.ends_with(b"\n") {
            match pr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => v.extend_from_slice(&buf[..n]),
            }
        }
        drop(pr);
        let text = String::from_utf8_lossy(&v).into_owned();
        let (msgs, vd) = match text.rfind("verdict ") {
            Some(i) => (text[..i].to_owned(), text[i + 8..].trim().to_owned()),
            None => (text.clone(), String::new()),
        };
        let msgs = msgs.trim_end_matches('\n');
        if !msgs.is_empty() {
            cx.say_error(msgs);
        }
        verdict = match vd.as_str() {
            "started" | "exists" | "refused" => vd,
            _ => {
                // no verdict: the supervisor died; did it cross the guard?
                let l = if stage.is_dir() {
                    first_line(&stage.join("start"))
                } else {
                    None
                };
                if exists(&start) && (!stage.is_dir() || l.is_some() && first_line(&start) == l) {
                    "started".into()
                } else {
                    "refused".into()
                }
            }
        };
        if verdict == "refused" {
            let _ = fs::remove_dir_all(&stage);
        }
        cx.stage = None;
    } else {
        verdict = "exists".into();
    }
    cx.say(&format!("verdict {verdict}"));
    if verdict != "refused" {
        if let Some(l) = first_line(&start) {
            cx.say(&format!("start {l}"));
            let r = parse_start(&l);
            if verdict == "started" && att && r.v == "1" {
                stream(cx, &r, 0, 0, true);
            }
        }
    }
}

/// the supervisor: its own session, the start guard, the command, the finish record. Never
/// returns.
// Long: follows cairn.sh's code for the same step line by line (the script is the reference),
// so that the two can be read side by side.
#[allow(clippy::too_many_arguments)]
fn supervise(
    cx: &mut Ctx,
    vfd: RawFd,
    stage: &Path,
    len: &str,
    dig: &str,
    to: u64,
    epoch: &str,
    secrets: Vec<(Vec<u8>, Vec<u8>)>,
) -> ! {
    unsafe {
        c::setsid();
        c::signal(c::SIGHUP, c::SIG_IGN);
        let null = c::open(c"/dev/null".as_ptr(), c::O_RDWR);
        if null >= 0 {
            c::dup2(null, 0);
            c::dup2(null, 1);
            c::dup2(null, 2);
            if null > 2 {
                c::close(null);
            }
        }
    }
    let refuse = |m: &str| -> ! {
        let _ = fs::remove_dir_all(stage);
        put_fd(
            vfd,
            format!("{}\nverdict refused\n", one_line(m)).as_bytes(),
        );
        unsafe { c::_exit(1) }
    };
    let me = unsafe { c::getpid() }.to_string();
    let Some((_, st)) = pst(&me) else {
        refuse(&format!("cannot read /proc/{me}/stat"))
    };
    let boot = cx.boot().unwrap_or_default();
    let rec = format!(
        "v=1 id={} len={len} digest={dig} epoch={epoch} boot={boot} sup_pid={me} sup_start={st} started_at={} timeout={to}",
        cx.id,
        now()
    );
    let sp = stage.join("start");
    if fs::write(&sp, format!("{rec}\n")).is_err() {
        refuse(&format!("cannot write {}", sp.display()));
    }
    let guard = cx.start_path();
    // THE start guard: an exclusive link of the complete started record
    if let Err(e) = fs::hard_link(&sp, &guard) {
        if !exists(&guard) {
            refuse(&format!(
                "ln: failed to create hard link '{}': {e}",
                guard.display()
            ));
        }
        put_fd(vfd, b"verdict exists\n");
        let _ = fs::remove_dir_all(stage);
        unsafe { c::_exit(0) }
    }
    if let Err(e) = fs::rename(stage, &cx.f) {
        let m = format!(
            "mv: cannot move '{}' to '{}': {e}",
            stage.display(),
            cx.f.display()
        );
        // nothing ran: give the guard back rather than leave a start we cannot honour (a
        // home made read-only for a moment gets up to 20 tries, a second apart)
        for i in 0..20 {
            let _ = fs::remove_file(&guard);
            if !exists(&guard) {
                break;
            }
            if i < 19 {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        if exists(&guard) {
            // the guard stays and no supervisor will honour it: say so without a verdict (the
            // dispatcher reports it started; the probe finds the supervisor gone, so the
            // client records interrupted, never a "never started" the host's records deny)
            put_fd(
                vfd,
                format!(
                    "the start guard was crossed, then the stage could not be moved into place ({m}) and the guard could not be given back: the command did not start\n"
                )
                .as_bytes(),
            );
            unsafe { c::_exit(1) }
        }
        let _ = flush(&cx.x);
        refuse(&m);
    }
    // one flush for the record and both names before anything runs
    let _ = flush(&cx.f.join("start"));
    let _ = flush(&cx.x);
    put_fd(vfd, b"verdict started\n");
    unsafe { c::close(vfd) };
    let l = Launch {
        id: cx.id.clone(),
        f: cx.f.clone(),
        cf: cx.f.join("cmd"),
        timeout: to,
        secrets,
    };
    let status = run_command(&l);
    drop(l);
    finish_one(cx, status);
    unsafe { c::_exit(0) }
}

fn finish_one(cx: &mut Ctx, status: i32) {
    let f = cx.f.clone();
    let t = exists(&f.join("timedout"));
    let k = exists(&cx.cancel_path());
    let o = size(&f.join("out")).unwrap_or(0);
    let e = size(&f.join("err")).unwrap_or(0);
    let rec = finish_text(&cx.id, status, o, e, t, k);
    let tmp = f.join("done.tmp");
    // a home that refuses the write (made read-only) is tried again each second for an hour,
    // while the client sees a live supervisor and waits; after that the supervisor gives up and
    // the execution reads as interrupted, never as a result the host does not hold
    let mut i = 0;
    let mut again = || {
        i += 1;
        if i >= 3600 {
            unsafe { c::_exit(1) }
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    while !write_in_place(&tmp, &rec) {
        again();
    }
    // the outputs with the record: no record on disk states bytes the disk does not hold (an
    // output of 0 bytes has none to flush: the record states none)
    if o > 0 {
        let _ = flush(&f.join("out"));
    }
    if e > 0 {
        let _ = flush(&f.join("err"));
    }
    let _ = flush(&tmp);
    while fs::rename(&tmp, cx.done_path()).is_err() {
        again();
    }
    let _ = flush(&cx.x);
    wake(&f);
}

/// the body of watch (and of dispatch with ATTACH=1)
fn stream(cx: &mut Ctx, r: &StartRec, mut o: u64, mut e: u64, wait: bool) {
    let done = cx.done_path();
    if wait && !exists(&done) {
        let mut l = cx.alive(r);
        let wk = cx.f.join("wake");
        while l == "alive" && !is_fifo(&wk) {
            if cx.f.is_dir() {
                unsafe { c::mkfifo(cstr(&wk).as_ptr(), 0o666) };
            }
            if is_fifo(&wk) {
                break;
            }
            tick();
            l = cx.alive(r);
        }
        if l == "alive" && is_fifo(&wk) {
            // open wake first, then re-check: a finish after this point wakes us
            let fd =
                unsafe { c::open(cstr(&wk).as_ptr(), c::O_RDWR | c::O_NONBLOCK | c::O_CLOEXEC) };
            if fd >= 0 {
                if !exists(&done) {
                    match live(cx, r, fd, o, e) {
                        Some((a, b)) => {
                            o = a;
                            e = b;
                        }
                        None => {
                            unsafe { c::close(fd) };
                            // the channel is gone: nothing more can be said
                            std::process::exit(0);
                        }
                    }
                }
                unsafe { c::close(fd) };
            }
        }
    }
    // liveness is decided before looking for the finish record
    let l = cx.alive(r);
    let d = if exists(&done) {
        first_line(&done)
    } else {
        None
    };
    let lim = |k: &str| {
        d.as_deref()
            .and_then(|d| field(d, k))
            .and_then(|v| v.parse().ok())
    };
    let (zo, ze) = (lim("out"), lim("err"));
    o = match rest(&cx.f.join("out"), o, zo, 1) {
        Ok(n) => n,
        Err(_) => std::process::exit(0),
    };
    e = match rest(&cx.f.join("err"), e, ze, 2) {
        Ok(n) => n,
        Err(_) => std::process::exit(0),
    };
    cx.say(&format!("sizes out={o} err={e}"));
    cx.say(&format!("live {l}"));
    if let Some(d) = d {
        cx.say(&format!("done {d}"));
    }
}

/// follow out and err until the finish record appears, the supervisor is gone or the channel
/// is: the new offsets (None: the channel is gone)
fn live(cx: &mut Ctx, r: &StartRec, wake_fd: RawFd, mut o: u64, mut e: u64) -> Option<(u64, u64)> {
    let done = cx.done_path();
    let ino = unsafe { c::inotify_init1(c::IN_NONBLOCK | c::IN_CLOEXEC) };
    if ino >= 0 {
        unsafe { c::inotify_add_watch(ino, cstr(&cx.f).as_ptr(), c::IN_MODIFY) };
    }
    let mut last_check = Instant::now();
    let result = loop {
        o = match rest(&cx.f.join("out"), o, None, 1) {
            Ok(n) => n,
            Err(_) => break None,
        };
        e = match rest(&cx.f.join("err"), e, None, 2) {
            Ok(n) => n,
            Err(_) => break None,
        };
        if exists(&done) {
            break Some((o, e));
        }
        if last_check.elapsed() >= Duration::from_secs(2) || ino < 0 {
            last_check = Instant::now();
            if cx.alive(r) != "alive" {
                break Some((o, e));
            }
        }
        // the channel: a pipe whose reader has gone reports an error
        let mut fds = [
            c::PollFd {
                fd: wake_fd,
                events: c::POLLIN,
                revents: 0,
            },
            c::PollFd {
                fd: ino,
                events: c::POLLIN,
                revents: 0,
            },
            c::PollFd {
                fd: 1,
                events: 0,
                revents: 0,
            },
            c::PollFd {
                fd: 2,
                events: 0,
                revents: 0,
            },
        ];
        let timeout = if ino >= 0 { 2000 } else { 100 };
        unsafe { c::poll(fds.as_mut_ptr(), 4, timeout) };
        if fds[2].revents != 0 || fds[3].revents != 0 {
            break None;
        }
        let mut buf = [0u8; 4096];
        for p in &fds[..2] {
            if p.revents != 0 && p.fd >= 0 {
                while unsafe { c::read(p.fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
            }
        }
        if fds[0].revents != 0 {
            // woken: the record is there, or someone wants us to look again
            if cx.alive(r) != "alive" && !exists(&done) {
                break Some((o, e));
            }
        }
    };
    if ino >= 0 {
        unsafe { c::close(ino) };
    }
    result
}

fn watch(cx: &mut Ctx, o: &str, e: &str, wait: bool) {
    let start = cx.start_path();
    if !exists(&start) {
        cx.say("absent");
        return;
    }
    let l = first_line(&start).unwrap_or_default();
    cx.say(&format!("start {l}"));
    let r = parse_start(&l);
    let done = cx.done_path();
    if r.v != "1" {
        cx.say_error(&format!("unsupported started record version '{}'", r.v));
    } else if !cx.f.is_dir() && exists(&done) && first_line(&done).is_some() {
        // gc kept only the tombstone: the result is known, the output is gone
        let d = first_line(&done).unwrap_or_default();
        cx.say("gone output");
        cx.say("live dead");
        cx.say(&format!("done {d}"));
    } else {
        stream(cx, &r, o.parse().unwrap_or(0), e.parse().unwrap_or(0), wait);
    }
}

fn cancel(cx: &mut Ctx, grace: &str) {
    // the flag first: a supervisor that has not started the command yet will see it
    let cp = cx.cancel_path();
    if let Err(e) = OpenOptions::new().append(true).create(true).open(&cp) {
        cx.die(&format!("touch: cannot touch '{}': {e}", cp.display()));
    }
    let start = cx.start_path();
    let done = cx.done_path();
    let res;
    if !exists(&start) {
        cx.say("absent");
        res = "absent";
    } else {
        let l = first_line(&start).unwrap_or_default();
        cx.say(&format!("start {l}"));
        let r = parse_start(&l);
        if r.v != "1" {
            cx.die(&format!("unsupported started record version '{}'", r.v));
        }
        let mut lv = cx.alive(&r);
        let lead = |g: &str, gs: &str| num(g) && ours(g, gs);
        if exists(&done) {
            res = "finished";
        } else if lv == "rebooted" {
            res = "dead";
        } else if let Some((g, gs)) = read_pgid(&cx.f) {
            if lead(&g, &gs) {
                kill_group(c::SIGTERM, &g, &gs);
                res = "signalled";
                let mut i = grace.parse::<u64>().unwrap_or(0) * 10;
                while i > 0 && !exists(&done) && lead(&g, &gs) {
                    tick();
                    i -= 1;
                }
                if !exists(&done) && lead(&g, &gs) {
                    kill_group(c::SIGKILL, &g, &gs);
                }
            } else {
                res = if lv == "alive" { "finished" } else { "dead" };
            }
        } else {
            res = if lv == "alive" { "prevented" } else { "dead" };
        }
        // an alive supervisor records the outcome within moments
        let mut i = 30;
        while i > 0 && lv == "alive" && !exists(&done) {
            tick();
            i -= 1;
            lv = cx.alive(&r);
        }
        cx.say(&format!("live {lv}"));
        if exists(&done) {
            if let Some(d) = first_line(&done) {
                cx.say(&format!("done {d}"));
            }
        }
    }
    cx.say(&format!("cancel {res}"));
}

/// whether a running process executes the file `p` (a supervisor or a session that a client of
/// another version started with its helper), as the script's hused
fn in_use(p: &Path) -> bool {
    let Ok(m) = fs::metadata(p) else {
        return false;
    };
    let Ok(rd) = fs::read_dir("/proc") else {
        return false;
    };
    rd.flatten().any(|e| {
        e.file_name().as_bytes().iter().all(u8::is_ascii_digit)
            && fs::metadata(e.path().join("exe"))
                .is_ok_and(|x| x.dev() == m.dev() && x.ino() == m.ino())
    })
}

// Long: follows cairn.sh's code for the same step line by line (the script is the reference),
// so that the two can be read side by side.
fn gc(cx: &mut Ctx, out_age: &str, tomb_age: &str, keep: Option<&str>) {
    let now = now();
    let (oa, ta): (u64, u64) = (out_age.parse().unwrap_or(0), tomb_age.parse().unwrap_or(0));
    let (mut no, mut nt, mut nk) = (0, 0, 0);
    let mut names: Vec<OsString> = fs::read_dir(&cx.x)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    names.sort();
    let x = cx.x.clone();
    for n in &names {
        let b = n.as_bytes();
        let Some(id) = b.strip_suffix(b".done") else {
            continue;
        };
        let i = x.join(OsStr::from_bytes(id));
        let f = x.join(n);
        let Some(d) = first_line(&f) else { continue };
        let Some(fa) = field(&d, "finished_at").filter(|v| num(v)) else {
            continue;
        };
        let age = now.saturating_sub(fa.parse().unwrap_or(now));
        let with = |s: &str| {
            let mut p = i.clone().into_os_string();
            p.push(s);
            PathBuf::from(p)
        };
        if age >= ta {
            let gone = !i.exists() || fs::remove_dir_all(&i).is_ok();
            if gone {
                let _ = fs::remove_file(with(".cancel"));
                let _ = fs::remove_file(with(".cmd"));
                if fs::remove_file(&f).is_ok() {
                    let _ = fs::remove_file(with(".start"));
                    nt += 1;
                }
            }
        } else if age >= oa && i.is_dir() && fs::remove_dir_all(&i).is_ok() {
            let _ = fs::remove_file(with(".cmd"));
            no += 1;
        }
    }
    for n in &names {
        if let Some(id) = n.as_bytes().strip_suffix(b".start") {
            let mut d = id.to_vec();
            d.extend_from_slice(b".done");
            if exists(&x.join(n)) && !exists(&x.join(OsStr::from_bytes(&d))) {
                nk += 1;
            }
        }
    }
    // stages of dispatches that died before their verdict, a day old
    if let Ok(rd) = fs::read_dir(&cx.t) {
        for ent in rd.flatten() {
            let old = ent
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|m| m.elapsed().ok())
                .map(|a| a > Duration::from_secs(86400))
                .unwrap_or(false);
            if old {
                let p = ent.path();
                let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
            }
        }
    }
    let _ = flush(&cx.x);
    let mut extra = String::new();
    if let Some(k) = keep {
        let mut nh = 0;
        if let Ok(rd) = fs::read_dir(cx.dir.join("bin")) {
            for ent in rd.flatten() {
                let name = ent.file_name();
                let s = name.to_string_lossy();
                if s.starts_with("cairn-host-")
                    && s != format!("cairn-host-{k}")
                    && !in_use(&ent.path())
                    && fs::remove_file(ent.path()).is_ok()
                {
                    nh += 1;
                    // (and its seal, see self_check)
                    let _ = fs::remove_file(cx.dir.join("bin").join(format!(".{s}.seal")));
                }
            }
        }
        extra = format!(" removed_helpers={nh}");
    }
    cx.say(&format!(
        "gc removed_output={no} removed_tombstones={nt} unfinished={nk}{extra}"
    ));
}

// --- session: many dispatches on one exec ---

enum Ev {
    /// a confirmed-or-not request: ID LEN DIGEST TIMEOUT
    Req(String, String, String, u64),
    /// the command could not be stored
    Unstored(String),
    Go,
    Quit(Option<String>),
    Finished(String, i32),
}

// Long: follows cairn.sh's code for the same step line by line (the script is the reference),
// so that the two can be read side by side.
fn reader(i: PathBuf, tx: mpsc::Sender<Ev>, kr: mpsc::Receiver<()>) {
    // SAFETY: fd 0 is the channel's stdin, read by this thread alone; never closed (a free
    // fd 0 would be taken by the next file opened, and a command's dup2 onto 0 would then
    // replace its output)
    let stdin = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
    let mut inp = BufReader::with_capacity(65536, &*stdin);
    let mut n = 0;
    let mut line = Vec::new();
    let quit = |m: Option<&str>| {
        let _ = tx.send(Ev::Quit(m.map(str::to_owned)));
    };
    loop {
        line.clear();
        match inp.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return quit(None),
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            return quit(None);
        }
        line.pop();
        let text = String::from_utf8_lossy(&line).into_owned();
        let w: Vec<&str> = text.split_ascii_whitespace().collect();
        let bad = Some("a request line was not well-formed; nothing more is read");
        match w.first().copied() {
            Some("d") => {
                if w.len() != 7
                    || !valid_id(w[1])
                    || !num(w[2])
                    || !hex(w[3], 64)
                    || !num(w[4])
                    || !num(w[5])
                    || !bit(w[6])
                {
                    return quit(bad);
                }
                n += 1;
                if n > 64 {
                    return quit(bad);
                }
                let id = w[1].to_owned();
                let cf = i.join(format!("{id}.cmd"));
                if exists(&cf) {
                    return quit(Some(&format!(
                        "execution {id} was sent twice in one session; nothing more is read"
                    )));
                }
                let mut lines: usize = w[5].parse().unwrap_or(0);
                let open = w[6] == "1";
                let mut body = Vec::new();
                let mut t = Vec::new();
                while lines > 0 {
                    t.clear();
                    match inp.read_until(b'\n', &mut t) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    if t.last() != Some(&b'\n') {
                        break;
                    }
                    lines -= 1;
                    if lines == 0 && open {
                        t.pop();
                    }
                    body.extend_from_slice(&t);
                }
                let stored = fs::write(&cf, &body).is_ok();
                t.clear();
                let ended = lines == 0 && inp.read_until(b'\n', &mut t).is_ok() && {
                    let s = String::from_utf8_lossy(&t);
                    s.trim_matches([' ', '\t', '\n']) == "e"
                };
                if !ended {
                    let _ = fs::remove_file(&cf);
                    return quit(None);
                }
                if stored {
                    let _ = tx.send(Ev::Req(
                        id,
                        w[2].to_owned(),
                        w[3].to_owned(),
                        w[4].parse().unwrap_or(0),
                    ));
                } else {
                    let _ = fs::remove_file(&cf);
                    let _ = tx.send(Ev::Unstored(id));
                }
            }
            Some("g") if w.len() == 1 => {
                let _ = tx.send(Ev::Go);
                n = 0;
                if kr.recv().is_err() {
                    return quit(None);
                }
            }
            _ => return quit(bad),
        }
    }
}

struct Req {
    id: String,
    len: String,
    dig: String,
    to: u64,
}

// Long: follows cairn.sh's code for the same step line by line (the script is the reference),
// so that the two can be read side by side.
fn session(cx: &mut Ctx, epoch: &str) {
    shell_checks(cx);
    let me = unsafe { c::getpid() };
    let Some((_, sst)) = pst(&me.to_string()) else {
        cx.die(&format!("cannot read /proc/{me}/stat"));
    };
    unsafe { c::signal(c::SIGHUP, c::SIG_IGN) };
    let i = cx.t.join(format!("s{me}"));
    let _ = fs::remove_dir_all(&i);
    if let Err(e) = fs::create_dir(&i) {
        cx.die(&err_text("mkdir", &i, &e));
    }
    // protocol lines gathered from here on
    cx.ob = Some(Vec::new());
    let (tx, rx) = mpsc::channel::<Ev>();
    let (ktx, krx) = mpsc::channel::<()>();
    {
        let (i, tx) = (i.clone(), tx.clone());
        std::thread::spawn(move || reader(i, tx, krx));
    }
    let boot = cx.boot().unwrap_or_default();
    let mut r: Vec<Req> = Vec::new();
    let mut rc: Vec<Req> = Vec::new();
    let mut pn = 0usize;
    let mut kw = false;
    let mut running = 0usize;
    let mut reader_gone = false;
    let mut nb = 0u64;
    let mut fin: Vec<(String, i32)> = Vec::new();
    // finishes whose record the home refused: written again a second later
    let mut retry: Vec<(String, i32)> = Vec::new();
    loop {
        if reader_gone && running == 0 {
            break;
        }
        let first = if retry.is_empty() {
            match rx.recv() {
                Ok(ev) => Some(ev),
                Err(_) => break,
            }
        } else {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(ev) => Some(ev),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    fin.append(&mut retry);
                    None
                }
                Err(_) => break,
            }
        };
        let mut evs: Vec<Ev> = first.into_iter().collect();
        while let Ok(ev) = rx.try_recv() {
            evs.push(ev);
        }
        for ev in evs {
            match ev {
                Ev::Req(id, len, dig, to) => r.push(Req { id, len, dig, to }),
                Ev::Unstored(id) => answer(
                    cx,
                    &id,
                    "refused",
                    &format!("cannot store the command in {} (disk full?)", i.display()),
                    None,
                ),
                Ev::Go => {
                    pn += r.len();
                    rc.append(&mut r);
                    if pn < 64 {
                        let _ = ktx.send(());
                    } else {
                        kw = true;
                    }
                }
                Ev::Quit(m) => {
                    reader_gone = true;
                    if let Some(m) = m {
                        cx.say_error(&m);
                    }
                }
                Ev::Finished(id, st) => fin.push((id, st)),
            }
        }
        if !fin.is_empty() {
            let group = std::mem::take(&mut fin);
            let n = group.len();
            let mut refused = finish_group(cx, &group);
            running -= n - refused.len();
            retry.append(&mut refused);
        }
        if !rc.is_empty() {
            nb += 1;
            let batch = std::mem::take(&mut rc);
            let started = run_batch(cx, &i, nb, &batch, epoch, &boot, me, &sst);
            for (id, to) in started {
                running += 1;
                let l = Launch {
                    id: id.clone(),
                    f: cx.x.join(&id),
                    cf: cx.x.join(format!("{id}.cmd")),
                    timeout: to,
                    secrets: Vec::new(),
                };
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let s = run_command(&l);
                    let _ = tx.send(Ev::Finished(l.id, s));
                });
            }
            pn = 0;
            if kw {
                kw = false;
                let _ = ktx.send(());
            }
        }
        cx.fl();
    }
    // requests never followed by "g" were not started
    let _ = fs::remove_dir_all(&i);
}

/// error, verdict, start (the record given, else the one on disk, if any), end
fn answer(cx: &mut Ctx, id: &str, verdict: &str, msg: &str, rec: Option<&str>) {
    if !msg.is_empty() {
        cx.say(&format!("={id} error {}", one_line(msg)));
    }
    cx.say(&format!("={id} verdict {verdict}"));
    match rec {
        Some(r) => cx.say(&format!("={id} start {r}")),
        None => {
            if verdict != "refused" {
                if let Some(l) = first_line(&cx.x.join(format!("{id}.start"))) {
                    cx.say(&format!("={id} start {l}"));
                }
            }
        }
    }
    if verdict != "started" {
        cx.say(&format!("={id} end"));
    }
}

/// stage, cross every guard, move into place, one flush; answer each. The winners.
// Long: follows cairn.sh's code for the same step line by line (the script is the reference),
// so that the two can be read side by side.
#[allow(clippy::too_many_arguments)]
fn run_batch(
    cx: &mut Ctx,
    i: &Path,
    nb: u64,
    batch: &[Req],
    epoch: &str,
    boot: &str,
    me: i32,
    sst: &u64,
) -> Vec<(String, u64)> {
    if nb % 64 == 1 {
        let _ = fs::remove_dir_all(i.join("b"));
    }
    let sb = i.join("b").join(nb.to_string());
    let refuse_all = |cx: &mut Ctx, m: &str| {
        for q in batch {
            let _ = fs::remove_file(i.join(format!("{}.cmd", q.id)));
            answer(cx, &q.id, "refused", m, None);
        }
    };
    if let Err(e) = fs::DirBuilder::new().recursive(true).create(&sb) {
        refuse_all(cx, &err_text("mkdir", &sb, &e));
        return Vec::new();
    }
    for q in batch {
        let d = sb.join(&q.id);
        let ok = fs::create_dir(&d).is_ok()
            && File::create(d.join("out")).is_ok()
            && File::create(d.join("err")).is_ok()
            && fs::write(d.join(format!("{}.done", q.id)), format!("{:512}\n", "")).is_ok();
        if !ok {
            refuse_all(cx, &format!("cannot write in {} (disk full?)", d.display()));
            return Vec::new();
        }
    }
    let t = now();
    let mut recs = Vec::new();
    for q in batch {
        let rec = format!(
            "v=1 id={} len={} digest={} epoch={epoch} boot={boot} sup_pid={me} sup_start={sst} started_at={t} timeout={}",
            q.id, q.len, q.dig, q.to
        );
        let p = sb.join(format!("{}.start", q.id));
        if fs::write(&p, format!("{rec}\n")).is_err() {
            refuse_all(cx, &format!("cannot write {}", p.display()));
            return Vec::new();
        }
        recs.push(rec);
    }
    // THE start guards: exclusive links of the complete started records
    let x = cx.x.clone();
    let mut won = Vec::new();
    for (q, rec) in batch.iter().zip(recs) {
        let guard = x.join(format!("{}.start", q.id));
        let cf = i.join(format!("{}.cmd", q.id));
        match fs::hard_link(sb.join(format!("{}.start", q.id)), &guard) {
            Ok(()) => {
                let moved = fs::rename(sb.join(&q.id), x.join(&q.id))
                    .and_then(|_| fs::rename(&cf, x.join(format!("{}.cmd", q.id))));
                match moved {
                    Ok(()) => won.push((q, rec)),
                    Err(e) => {
                        // nothing ran: give the guard back (a home made read-only for a
                        // moment gets up to 20 tries, a second apart: a "refused" while the
                        // guard stays would let the client record "never started" beside a
                        // started record)
                        let _ = fs::remove_file(&cf);
                        let mut m = format!("mv: {e}");
                        for i in 0..20 {
                            let _ = fs::remove_dir_all(x.join(&q.id));
                            let _ = fs::remove_file(x.join(format!("{}.cmd", q.id)));
                            let _ = fs::remove_file(&guard);
                            if !exists(&guard) {
                                break;
                            }
                            if i == 19 {
                                m.push_str("; the start guard could not be given back");
                            } else {
                                std::thread::sleep(Duration::from_secs(1));
                            }
                        }
                        answer(cx, &q.id, "refused", &m, None);
                    }
                }
            }
            Err(e) => {
                let _ = fs::remove_file(&cf);
                if exists(&guard) {
                    answer(cx, &q.id, "exists", "", None);
                } else {
                    answer(
                        cx,
                        &q.id,
                        "refused",
                        &format!("ln: failed to create hard link '{}': {e}", guard.display()),
                        None,
                    );
                }
            }
        }
    }
    if won.is_empty() {
        return Vec::new();
    }
    // one flush for every record and name before anything runs
    for (q, _) in &won {
        let _ = flush(&x.join(format!("{}.start", q.id)));
    }
    let _ = flush(&x);
    won.into_iter()
        .map(|(q, rec)| {
            answer(cx, &q.id, "started", "", Some(&rec));
            (q.id.clone(), q.to)
        })
        .collect()
}

/// the commands that ended together: their records in place, one flush, one link each into
/// place, one flush of the names; then each one's output (up to 1 MiB a stream), sizes,
/// record, end
/// ones whose record the home refused (made read-only): not reported, for the next round
fn finish_group(cx: &mut Ctx, group: &[(String, i32)]) -> Vec<(String, i32)> {
    let x = cx.x.clone();
    let mut recs = Vec::new();
    let mut refused = Vec::new();
    for (id, st) in group {
        let f = x.join(id);
        let o = size(&f.join("out")).unwrap_or(0);
        let e = size(&f.join("err")).unwrap_or(0);
        let t = exists(&f.join("timedout"));
        let k = exists(&x.join(format!("{id}.cancel")));
        let rec = finish_text(id, *st, o, e, t, k);
        if !write_in_place(&f.join(format!("{id}.done")), &rec) {
            refused.push((id.clone(), *st));
            continue;
        }
        if o > 0 {
            let _ = flush(&f.join("out"));
        }
        if e > 0 {
            let _ = flush(&f.join("err"));
        }
        let _ = flush(&f.join(format!("{id}.done")));
        recs.push((id.clone(), *st, o, e, rec));
    }
    for (id, ..) in &recs {
        let _ = fs::hard_link(
            x.join(id).join(format!("{id}.done")),
            x.join(format!("{id}.done")),
        );
    }
    let _ = flush(&x);
    for (id, st, o, e, rec) in recs {
        // only a record whose name is in place is reported
        if !exists(&x.join(format!("{id}.done"))) {
            refused.push((id, st));
            continue;
        }
        let f = x.join(&id);
        wake(&f);
        let mut so = 0;
        let mut se = 0;
        for (name, n, s) in [("out", o, &mut so), ("err", e, &mut se)] {
            if n > 0 && n <= 1048576 {
                cx.say(&format!("={id} {name} {n}"));
                cx.fl();
                let mut b = Vec::new();
                let ok = File::open(f.join(name))
                    .and_then(|h| h.take(n).read_to_end(&mut b))
                    .is_ok();
                // (a frame must hold exactly n bytes: pad what could not be read)
                b.resize(n as usize, 0);
                let _ = ok;
                put_fd(1, &b);
                *s = n;
            }
        }
        cx.say(&format!("={id} sizes out={so} err={se}"));
        cx.say(&format!("={id} done {rec}"));
        cx.say(&format!("={id} end"));
    }
    refused
}
