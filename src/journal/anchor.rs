//! The journal's anchor: the chain heads written outside the database after each commit.
//!
//! After each commit the newest `(seq, hash)` of each chain is written to an anchor file next to
//! the journal (replaced atomically, never moved backwards), with an HMAC-SHA256 under a key kept
//! in a separate 0600 file. The journal moves it; `cairn audit verify` checks it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// What keeps the anchor from being read or moved: the journal's anchor layer. An append
/// logs it and goes on (the event stays unanchored, which `cairn audit verify` reports);
/// `audit verify` turns it into a finding. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum AnchorError {
    #[error("anchor key {} is too short", .0.display())]
    KeyTooShort(PathBuf),
    #[error("creating anchor key {}: {source}", path.display())]
    CreatingKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading anchor key {}: {source}", path.display())]
    ReadingKey {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("anchor {} does not parse: {source}", path.display())]
    DoesNotParse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("reading anchor {}: {source}", path.display())]
    Reading {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("anchor lock {}: {source}", path.display())]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("locking the anchor: {0}")]
    Locking(std::io::Error),
    #[error("{0}")]
    Encoding(serde_json::Error),
    #[error("writing anchor {}: {source}", path.display())]
    Writing {
        path: PathBuf,
        source: std::io::Error,
    },
}

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

    pub(crate) fn key(&self, create: bool) -> Result<Option<Vec<u8>>, AnchorError> {
        match fs::read(&self.key_path) {
            Ok(k) if k.len() >= 32 => Ok(Some(k)),
            Ok(_) => Err(AnchorError::KeyTooShort(self.key_path.clone())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                let key: [u8; 32] = rand::random();
                write_private(&self.key_path, &key, true).map_err(|source| {
                    AnchorError::CreatingKey {
                        path: self.key_path.clone(),
                        source,
                    }
                })?;
                // Another process may have won the race: use whatever is on disk.
                self.key(false)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(AnchorError::ReadingKey {
                path: self.key_path.clone(),
                source,
            }),
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

    pub fn read(&self) -> Result<Option<AnchorRecord>, AnchorError> {
        match fs::read_to_string(&self.path) {
            Ok(s) => serde_json::from_str(s.trim()).map(Some).map_err(|source| {
                AnchorError::DoesNotParse {
                    path: self.path.clone(),
                    source,
                }
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(AnchorError::Reading {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Move the activity chain's anchor forward to `(seq, hash)`; never backwards (two writers
    /// may finish their commits in either order). Serialised with an advisory lock.
    pub fn advance(&self, seq: i64, hash: &str) -> Result<(), AnchorError> {
        self.update(|a| {
            (a.seq < seq).then(|| {
                a.seq = seq;
                a.hash = hash.to_owned();
            })
        })
    }

    /// The same for the sessions chain.
    pub fn advance_sessions(&self, seq: i64, hash: &str) -> Result<(), AnchorError> {
        self.update(|a| {
            (a.sessions_seq < seq).then(|| {
                a.sessions_seq = seq;
                a.sessions_hash = hash.to_owned();
            })
        })
    }

    /// Read, change (when `change` returns `Some`), MAC and atomically replace the anchor.
    fn update(
        &self,
        change: impl FnOnce(&mut AnchorRecord) -> Option<()>,
    ) -> Result<(), AnchorError> {
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
            .map_err(|source| AnchorError::Lock {
                path: lock_path.clone(),
                source,
            })?;
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
        let text = serde_json::to_string(&rec).map_err(AnchorError::Encoding)? + "\n";
        let tmp = {
            let mut p = self.path.as_os_str().to_owned();
            p.push(format!(".tmp{}", std::process::id()));
            PathBuf::from(p)
        };
        write_private(&tmp, text.as_bytes(), false)
            .and_then(|_| fs::rename(&tmp, &self.path))
            .map_err(|source| AnchorError::Writing {
                path: self.path.clone(),
                source,
            })
    }
}

struct FileLock<'a>(&'a fs::File);

impl<'a> FileLock<'a> {
    fn exclusive(f: &'a fs::File) -> Result<Self, AnchorError> {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a valid, open file descriptor.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if r != 0 {
            return Err(AnchorError::Locking(std::io::Error::last_os_error()));
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
        assert!(matches!(e, AnchorError::DoesNotParse { .. }), "{e:?}");
        assert!(e.to_string().contains("does not parse"), "{e}");
        assert_eq!(std::fs::read(&a.path).unwrap(), b"{not an anchor");
        let e = a.advance_sessions(1, "cc").unwrap_err();
        assert!(matches!(e, AnchorError::DoesNotParse { .. }), "{e:?}");
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
        assert!(matches!(e, AnchorError::KeyTooShort(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("anchor key {} is too short", a.key_path.display())
        );
        assert_eq!(std::fs::read(&a.path).unwrap(), before);
    }
}
