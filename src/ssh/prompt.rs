//! The passphrase of an encrypted key file, asked on the controlling terminal as ssh asks it.
//!
//! Only where the front end allows it ([`allow_prompts`]: the command line does, the servers
//! never do) and only when there is a terminal (`/dev/tty` opens): otherwise an encrypted key
//! that no agent holds stays [`super::SshError::EncryptedKey`]. One prompt at a time in a
//! process; an empty answer skips the key, as ssh does. The time spent at the prompt does not
//! count against the connect deadline. The passphrase is never logged or kept.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static ALLOWED: AtomicBool = AtomicBool::new(false);
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// Milliseconds spent at prompts in this process so far (see [`prompt_millis`]).
static PROMPTED_MS: AtomicU64 = AtomicU64::new(0);

/// Let key passphrases be asked on the terminal (the command line's commands do).
pub fn allow_prompts(yes: bool) {
    ALLOWED.store(yes, Ordering::SeqCst);
}

/// Milliseconds spent waiting at passphrase prompts in this process so far.
pub(crate) fn prompt_millis() -> u64 {
    PROMPTED_MS.load(Ordering::SeqCst)
}

/// Restores the terminal's settings when dropped.
struct Echo {
    fd: i32,
    saved: libc::termios,
}

impl Drop for Echo {
    fn drop(&mut self) {
        // SAFETY: fd is open for the guard's life; saved came from tcgetattr on it.
        unsafe {
            libc::tcsetattr(self.fd, libc::TCSAFLUSH, &self.saved);
        }
    }
}

/// Ask for the passphrase of `path`; `None` when prompts are not allowed, there is no
/// terminal, or the answer is empty.
pub(crate) fn passphrase(path: &Path, again: bool) -> Option<String> {
    if !ALLOWED.load(Ordering::SeqCst) {
        return None;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .ok()?;
    let t0 = Instant::now();
    use std::os::fd::AsRawFd;
    let fd = tty.as_raw_fd();
    // SAFETY: a zeroed termios is a valid buffer for tcgetattr to fill.
    let mut saved: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd is an open terminal (or tcgetattr fails and we stop).
    if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
        return None;
    }
    let mut quiet = saved;
    quiet.c_lflag &= !libc::ECHO;
    quiet.c_lflag |= libc::ECHONL;
    // SAFETY: as above; the guard restores `saved`.
    unsafe {
        libc::tcsetattr(fd, libc::TCSAFLUSH, &quiet);
    }
    let guard = Echo { fd, saved };
    if again {
        let _ = tty.write_all(b"Bad passphrase, try again.\n");
    }
    let _ = write!(tty, "Enter passphrase for key '{}': ", path.display());
    let _ = tty.flush();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 4096 {
        match tty.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' || byte[0] == b'\r' => break,
            Ok(1) => line.push(byte[0]),
            _ => break,
        }
    }
    drop(guard);
    PROMPTED_MS.fetch_add(t0.elapsed().as_millis() as u64, Ordering::SeqCst);
    let pass = String::from_utf8(line).ok()?;
    (!pass.is_empty()).then_some(pass)
}
