//! The journal's anchor: the chain heads written outside the database after each commit.
//!
//! After each commit the newest `(seq, hash)` of each chain is written to an anchor file next to
//! the journal (replaced atomically, never moved backwards), with an HMAC-SHA256 under a key kept
//! in a separate 0600 file. The journal moves it; [`crate::audit`] checks it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Where a journal's anchor and its key live.
#[derive(Clone, Debug)]
pub struct Anchor {
    pub path: PathBuf,
    pub key_path: PathBuf,
}

/// The anchor file's content.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AnchorRecord {
    pub v: u32,
    /// Head of the activity chain (events).
    pub seq: i64,
    pub hash: String,
    /// Head of the sessions chain.
    #[serde(default)]
    pub sessions_seq: i64,
    #[serde(default)]
    pub sessions_hash: String,
    /// HMAC-SHA256 over both heads, hex; empty when no key is available.
    pub mac: String,
}

impl Anchor {
    /// The anchor of the journal at `journal`: `$CAIRN_ANCHOR`, else `<journal>.anchor`;
    /// the key is `<anchor>.key`.
    pub fn for_journal(journal: &Path) -> Anchor {
        let path = std::env::var_os("CAIRN_ANCHOR")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let mut p = journal.as_os_str().to_owned();
                p.push(".anchor");
                PathBuf::from(p)
            });
        Anchor::at(path)
    }

    pub fn at(path: PathBuf) -> Anchor {
        let mut k = path.as_os_str().to_owned();
        k.push(".key");
        Anchor {
            path,
            key_path: PathBuf::from(k),
        }
    }

    pub(crate) fn key(&self, create: bool) -> Result<Option<Vec<u8>>, String> {
        match fs::read(&self.key_path) {
            Ok(k) if k.len() >= 32 => Ok(Some(k)),
            Ok(_) => Err(format!(
                "anchor key {} is too short",
                self.key_path.display()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                let key: [u8; 32] = rand::random();
                write_private(&self.key_path, &key, true)
                    .map_err(|e| format!("creating anchor key {}: {e}", self.key_path.display()))?;
                // Another process may have won the race: use whatever is on disk.
                self.key(false)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!(
                "reading anchor key {}: {e}",
                self.key_path.display()
            )),
        }
    }

    pub(crate) fn mac(key: &[u8], a: &AnchorRecord) -> String {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
        m.update(
            format!(
                "cairn-anchor-v1\n{}\n{}\n{}\n{}\n",
                a.seq, a.hash, a.sessions_seq, a.sessions_hash
            )
            .as_bytes(),
        );
        hex::encode(m.finalize().into_bytes())
    }

    pub fn read(&self) -> Result<Option<AnchorRecord>, String> {
        match fs::read_to_string(&self.path) {
            Ok(s) => serde_json::from_str(s.trim())
                .map(Some)
                .map_err(|e| format!("anchor {} does not parse: {e}", self.path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading anchor {}: {e}", self.path.display())),
        }
    }

    /// Move the activity chain's anchor forward to `(seq, hash)`; never backwards (two writers
    /// may finish their commits in either order). Serialised with an advisory lock.
    pub fn advance(&self, seq: i64, hash: &str) -> Result<(), String> {
        self.update(|a| {
            (a.seq < seq).then(|| {
                a.seq = seq;
                a.hash = hash.to_owned();
            })
        })
    }

    /// The same for the sessions chain.
    pub fn advance_sessions(&self, seq: i64, hash: &str) -> Result<(), String> {
        self.update(|a| {
            (a.sessions_seq < seq).then(|| {
                a.sessions_seq = seq;
                a.sessions_hash = hash.to_owned();
            })
        })
    }

    /// Read, change (when `change` returns `Some`), MAC and atomically replace the anchor.
    fn update(&self, change: impl FnOnce(&mut AnchorRecord) -> Option<()>) -> Result<(), String> {
        let lock_path = {
            let mut p = self.path.as_os_str().to_owned();
            p.push(".lock");
            PathBuf::from(p)
        };
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("anchor lock {}: {e}", lock_path.display()))?;
        let _guard = FileLock::exclusive(&lock)?;
        // An anchor that does not parse (or cannot be read) is evidence of damage: it is left as
        // it is for `cairn audit verify` to report, never replaced by a fresh one.
        let mut rec = self.read()?.unwrap_or(AnchorRecord {
            v: 1,
            seq: 0,
            hash: String::new(),
            sessions_seq: 0,
            sessions_hash: String::new(),
            mac: String::new(),
        });
        if change(&mut rec).is_none() {
            return Ok(());
        }
        let key = self.key(true)?;
        rec.mac = key.map(|k| Anchor::mac(&k, &rec)).unwrap_or_default();
        let text = serde_json::to_string(&rec).map_err(|e| e.to_string())? + "\n";
        let tmp = {
            let mut p = self.path.as_os_str().to_owned();
            p.push(format!(".tmp{}", std::process::id()));
            PathBuf::from(p)
        };
        write_private(&tmp, text.as_bytes(), false)
            .and_then(|_| fs::rename(&tmp, &self.path))
            .map_err(|e| format!("writing anchor {}: {e}", self.path.display()))
    }
}

struct FileLock<'a>(&'a fs::File);

impl<'a> FileLock<'a> {
    fn exclusive(f: &'a fs::File) -> Result<Self, String> {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a valid, open file descriptor.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if r != 0 {
            return Err(format!(
                "locking the anchor: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(FileLock(f))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: as above.
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

fn write_private(path: &Path, data: &[u8], exclusive: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = fs::OpenOptions::new();
    o.write(true).mode(0o600);
    if exclusive {
        o.create_new(true);
    } else {
        o.create(true).truncate(true);
    }
    let mut f = o.open(path)?;
    f.write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An anchor that does not parse is never overwritten by a later commit: the next advance
    /// fails and leaves its bytes as they were (the journal logs it; `audit verify` reports it).
    #[test]
    fn an_unparseable_anchor_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let a = Anchor::at(dir.path().join("j.db.anchor"));
        a.advance(1, "aa").unwrap();
        std::fs::write(&a.path, b"{not an anchor").unwrap();
        let e = a.advance(2, "bb").unwrap_err();
        assert!(e.contains("does not parse"), "{e}");
        assert_eq!(std::fs::read(&a.path).unwrap(), b"{not an anchor");
        let e = a.advance_sessions(1, "cc").unwrap_err();
        assert!(e.contains("does not parse"), "{e}");
        assert_eq!(std::fs::read(&a.path).unwrap(), b"{not an anchor");
    }

    /// A short key is refused for writing as for checking: the anchor is not moved under it.
    #[test]
    fn a_short_key_moves_no_anchor() {
        let dir = tempfile::tempdir().unwrap();
        let a = Anchor::at(dir.path().join("j.db.anchor"));
        a.advance(1, "aa").unwrap();
        let before = std::fs::read(&a.path).unwrap();
        std::fs::write(&a.key_path, b"short").unwrap();
        let e = a.advance(2, "bb").unwrap_err();
        assert!(e.contains("too short"), "{e}");
        assert_eq!(std::fs::read(&a.path).unwrap(), before);
    }
}
