//! OpenSSH `known_hosts` parsing, matching and appending.
//!
//! Supported: comma-separated host patterns with `*`/`?` wildcards and `!` negation,
//! `[host]:port` entries, hashed entries (`|1|salt|hash`, HMAC-SHA1), `@revoked` markers
//! (a matching key is refused), `@cert-authority` lines (host certificates, see
//! [`check_certificate`]), comments, blank lines, tabs and runs of spaces.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use russh::keys::ssh_key::certificate::CertType;
use russh::keys::ssh_key::{Algorithm, Certificate, HashAlg, PublicKey};

/// The name OpenSSH looks up in known_hosts for a host and port.
pub fn lookup_name(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    None,
    Revoked,
    CertAuthority,
}

/// One parsed line of a known_hosts file.
#[derive(Debug, Clone)]
pub struct Entry {
    pub line: usize,
    pub marker: Marker,
    hosts: HostPatterns,
    /// `None` when the key does not parse: such a line is listed by a lookup but, as in
    /// OpenSSH, neither vouches for nor contradicts a presented key.
    pub key: Option<PublicKey>,
    pub key_type: String,
}

#[derive(Debug, Clone)]
enum HostPatterns {
    Hashed { salt: Vec<u8>, hash: Vec<u8> },
    Plain(Vec<String>),
}

impl Entry {
    /// Whether this line's host field matches the lookup name (see [`lookup_name`]).
    pub fn matches(&self, name: &str) -> bool {
        match &self.hosts {
            HostPatterns::Hashed { salt, hash } => {
                let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, salt);
                ring::hmac::verify(&key, name.as_bytes(), hash).is_ok()
            }
            HostPatterns::Plain(patterns) => {
                let mut positive = false;
                for p in patterns {
                    if let Some(neg) = p.strip_prefix('!') {
                        if wildcard_match(neg, name) {
                            return false;
                        }
                    } else if wildcard_match(p, name) {
                        positive = true;
                    }
                }
                positive
            }
        }
    }
}

/// Largest known_hosts file read (64 MiB: hundreds of thousands of hosts).
const MAX_KNOWN_HOSTS_BYTES: u64 = 64 << 20;

/// Case-insensitive glob match with `*` and `?` over the whole string.
pub fn wildcard_match(pattern: &str, s: &str) -> bool {
    let p: Vec<char> = pattern.to_lowercase().chars().collect();
    let s: Vec<char> = s.to_lowercase().chars().collect();
    let (mut pi, mut si) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// Parse the contents of a known_hosts file. Malformed lines are skipped (as OpenSSH does).
pub fn parse(content: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for (idx, raw) in content.lines().enumerate() {
        if let Some(e) = parse_line(raw, idx + 1) {
            out.push(e);
        }
    }
    out
}

fn parse_line(raw: &str, line: usize) -> Option<Entry> {
    let trimmed = raw.trim();
    if trimmed.is_empty() || trimmed.starts_with('#') {
        return None;
    }
    let mut fields = trimmed.split_ascii_whitespace();
    let mut first = fields.next()?;
    let marker = if first.starts_with('@') {
        let m = match first {
            "@revoked" => Marker::Revoked,
            "@cert-authority" => Marker::CertAuthority,
            _ => return None,
        };
        first = fields.next()?;
        m
    } else {
        Marker::None
    };
    let key_type = fields.next()?;
    // OpenSSH skips lines whose key type it does not know (`ssh-keygen -F` does not list them).
    Algorithm::new(key_type).ok()?;
    let key_b64 = fields.next()?;
    let hosts = if let Some(rest) = first.strip_prefix("|1|") {
        let (salt, hash) = rest.split_once('|')?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let salt = b64.decode(salt).ok()?;
        let hash = b64.decode(hash).ok()?;
        if hash.len() != 20 {
            return None;
        }
        HostPatterns::Hashed { salt, hash }
    } else {
        HostPatterns::Plain(
            first
                .split(',')
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect(),
        )
    };
    let key = PublicKey::from_openssh(&format!("{key_type} {key_b64}")).ok();
    Some(Entry {
        line,
        marker,
        hosts,
        key,
        key_type: key_type.to_string(),
    })
}

/// Result of checking a presented host key against known_hosts files.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The key is recorded for this host.
    Known { file: PathBuf, line: usize },
    /// Nothing is recorded for this host.
    Unknown,
    /// A different key is recorded for this host (first such line).
    Changed { file: PathBuf, line: usize },
    /// The key is marked `@revoked`.
    Revoked { file: PathBuf, line: usize },
}

/// Check `key` for any of `names` (lookup names, see [`lookup_name`]) in `files`.
/// Missing files count as empty. Revocation wins over everything, then a match, then a mismatch.
pub fn check(files: &[PathBuf], names: &[String], key: &PublicKey) -> std::io::Result<Verdict> {
    let mut known = None;
    let mut changed = None;
    for file in files {
        let content = match super::read_text_capped(file, MAX_KNOWN_HOSTS_BYTES) {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in parse(&content) {
            if !names.iter().any(|n| entry.matches(n)) {
                continue;
            }
            // A line whose key does not parse is ignored, as OpenSSH does (not "changed").
            let Some(recorded) = entry.key.as_ref() else {
                continue;
            };
            let same = recorded.key_data() == key.key_data();
            match entry.marker {
                Marker::Revoked if same => {
                    return Ok(Verdict::Revoked {
                        file: file.clone(),
                        line: entry.line,
                    })
                }
                Marker::Revoked | Marker::CertAuthority => {}
                Marker::None => {
                    if same {
                        known.get_or_insert((file.clone(), entry.line));
                    } else {
                        changed.get_or_insert((file.clone(), entry.line));
                    }
                }
            }
        }
    }
    Ok(match (known, changed) {
        (Some((file, line)), _) => Verdict::Known { file, line },
        (None, Some((file, line))) => Verdict::Changed { file, line },
        (None, None) => Verdict::Unknown,
    })
}

/// Whether a `@cert-authority` line applies to any of `names`: only then is a host
/// certificate asked for (a certificate no authority vouches for is checked as a plain key).
pub fn has_cert_authority(files: &[PathBuf], names: &[String]) -> bool {
    files.iter().any(|file| {
        super::read_text_capped(file, MAX_KNOWN_HOSTS_BYTES).is_ok_and(|content| {
            parse(&content).iter().any(|e| {
                e.marker == Marker::CertAuthority
                    && e.key.is_some()
                    && names.iter().any(|n| e.matches(n))
            })
        })
    })
}

/// Result of checking a host certificate against `@cert-authority` lines.
#[derive(Debug, PartialEq, Eq)]
pub enum CertVerdict {
    /// Signed by the authority on this line, valid now, for this host.
    Trusted { file: PathBuf, line: usize },
    /// The certificate's key or its authority's key is marked `@revoked`.
    Revoked { file: PathBuf, line: usize },
    /// Not vouched for (the reason says why): OpenSSH then checks the certified key as a
    /// plain host key.
    Untrusted(String),
}

/// Check a host certificate as OpenSSH does: an `@cert-authority` line matching any of
/// `names` must hold the signing key, the signature must verify, `now` (Unix seconds) must be
/// inside the validity window, the type must be host, the principals must be empty or contain
/// `principal` (HostKeyAlias, else the HostName), and there must be no critical options.
/// A `@revoked` certificate key or authority key refuses.
pub fn check_certificate(
    files: &[PathBuf],
    names: &[String],
    cert: &Certificate,
    principal: &str,
    now: u64,
) -> std::io::Result<CertVerdict> {
    let cert_key = cert.public_key();
    let ca_key = cert.signature_key();
    let mut authorities: Vec<(PathBuf, usize, PublicKey)> = Vec::new();
    for file in files {
        let content = match super::read_text_capped(file, MAX_KNOWN_HOSTS_BYTES) {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in parse(&content) {
            if !names.iter().any(|n| entry.matches(n)) {
                continue;
            }
            let Some(key) = entry.key else {
                continue;
            };
            match entry.marker {
                Marker::Revoked if key.key_data() == cert_key || key.key_data() == ca_key => {
                    return Ok(CertVerdict::Revoked {
                        file: file.clone(),
                        line: entry.line,
                    });
                }
                Marker::CertAuthority => authorities.push((file.clone(), entry.line, key)),
                _ => {}
            }
        }
    }
    let Some((file, line, _)) = authorities.iter().find(|(_, _, k)| k.key_data() == ca_key) else {
        return Ok(CertVerdict::Untrusted(
            "no @cert-authority line for this host holds the signing key".into(),
        ));
    };
    let fingerprint = ca_key.fingerprint(HashAlg::Sha256);
    if let Err(e) = cert.validate_at(now, [&fingerprint]) {
        return Ok(CertVerdict::Untrusted(format!(
            "bad signature or outside the validity window ({e})"
        )));
    }
    if cert.cert_type() != CertType::Host {
        return Ok(CertVerdict::Untrusted("not a host certificate".into()));
    }
    let principals = cert.valid_principals();
    if !principals.is_empty() && !principals.iter().any(|p| p == principal) {
        return Ok(CertVerdict::Untrusted(format!(
            "{principal:?} is not among the certificate's principals {principals:?}"
        )));
    }
    if !cert.critical_options().is_empty() {
        return Ok(CertVerdict::Untrusted(
            "the certificate has critical options".into(),
        ));
    }
    Ok(CertVerdict::Trusted {
        file: file.clone(),
        line: *line,
    })
}

/// Key algorithms recorded (non-revoked, plain lines) for any of `names`, in file order.
/// Used to prefer those host key algorithms in negotiation, as OpenSSH does.
pub fn recorded_algorithms(files: &[PathBuf], names: &[String]) -> Vec<Algorithm> {
    let mut out: Vec<Algorithm> = Vec::new();
    for file in files {
        let Ok(content) = super::read_text_capped(file, MAX_KNOWN_HOSTS_BYTES) else {
            continue;
        };
        for entry in parse(&content) {
            if entry.marker != Marker::None || !names.iter().any(|n| entry.matches(n)) {
                continue;
            }
            if let Some(k) = &entry.key {
                let alg = k.algorithm();
                if !out.contains(&alg) {
                    out.push(alg);
                }
            }
        }
    }
    out
}

/// The hashed form of a lookup name (`|1|salt|hash`), as `ssh-keygen -H` / HashKnownHosts write.
pub fn hash_name(name: &str) -> String {
    use ring::rand::SecureRandom;
    let mut salt = [0u8; 20];
    // SystemRandom only fails if the OS RNG is unavailable; fall back to the plain name then.
    if ring::rand::SystemRandom::new().fill(&mut salt).is_err() {
        return name.to_string();
    }
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &salt);
    let tag = ring::hmac::sign(&key, name.as_bytes());
    let b64 = base64::engine::general_purpose::STANDARD;
    format!("|1|{}|{}", b64.encode(salt), b64.encode(tag.as_ref()))
}

/// Append `name key` to `file`, creating it 0600 (and its parent 0700) if needed.
pub fn append(file: &Path, name: &str, key: &PublicKey) -> std::io::Result<()> {
    if let Some(parent) = file.parent() {
        if !parent.as_os_str().is_empty() && !parent.exists() {
            let mut b = fs::DirBuilder::new();
            b.recursive(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::DirBuilderExt;
                b.mode(0o700);
            }
            b.create(parent)?;
        }
    }
    let mut opts = fs::OpenOptions::new();
    opts.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(file)?;
    // Make sure we start on a fresh line even if the file lacks a trailing newline.
    let len = f.metadata()?.len();
    let needs_nl = if len > 0 {
        let content = super::read_capped(file, MAX_KNOWN_HOSTS_BYTES)?;
        !content.ends_with(b"\n")
    } else {
        false
    };
    let key_text = key
        .to_openssh()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // to_openssh includes the comment, if any; known_hosts wants "type base64".
    let mut parts = key_text.split_ascii_whitespace();
    let (t, b) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut line = String::new();
    if needs_nl {
        line.push('\n');
    }
    line.push_str(&format!("{name} {t} {b}\n"));
    f.write_all(line.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMhhHDtOuraupEz1Gw2brxrbkkBi57eCmTMpFJKjy7Xj";
    const ED2: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFc7Yvh0pLZ91TwWcxVXI23yiDCYENDqcuVpBdkCjGEs";

    fn key(s: &str) -> PublicKey {
        PublicKey::from_openssh(s).unwrap()
    }

    fn tmpfile(content: &str) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("known_hosts");
        fs::write(&p, content).unwrap();
        (d, p)
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match("*.example.com", "a.example.com"));
        assert!(!wildcard_match("*.example.com", "example.com"));
        assert!(wildcard_match("h?st", "HOST"));
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("a*b*c", "aXXbYYc"));
        assert!(!wildcard_match("a*b*c", "aXXbYY"));
        assert!(wildcard_match("[127.0.0.1]:*", "[127.0.0.1]:2222"));
    }

    #[test]
    fn parses_whitespace_comments_markers() {
        let c = format!(
            "# comment\n\n  host1,host2\t\t{ED} comment here\n@revoked * {ED2}\n@cert-authority *.x {ED}\n@bogus h {ED}\nbroken-line\n"
        );
        let e = parse(&c);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].line, 3);
        assert!(e[0].matches("host1") && e[0].matches("HOST2") && !e[0].matches("host3"));
        assert_eq!(e[1].marker, Marker::Revoked);
        assert_eq!(e[2].marker, Marker::CertAuthority);
        assert!(e[0].key.is_some());
    }

    #[test]
    fn negation_and_ports() {
        let c = format!("*.example.com,!bad.example.com {ED}\n[h.example.org]:2222 {ED}\n");
        let e = parse(&c);
        assert!(e[0].matches("good.example.com"));
        assert!(!e[0].matches("bad.example.com"));
        assert!(e[1].matches(&lookup_name("h.example.org", 2222)));
        assert!(!e[1].matches(&lookup_name("h.example.org", 22)));
        assert!(!e[1].matches("h.example.org"));
    }

    #[test]
    fn hashed_entry() {
        // Same construction as `ssh-keygen -H`: HMAC-SHA1(salt, name).
        let salt = b"0123456789abcdefghij";
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, salt);
        let tag = ring::hmac::sign(&k, b"[127.0.0.1]:2222");
        let b64 = base64::engine::general_purpose::STANDARD;
        let line = format!(
            "|1|{}|{} {ED}\n",
            b64.encode(salt),
            b64.encode(tag.as_ref())
        );
        let e = parse(&line);
        assert_eq!(e.len(), 1);
        assert!(e[0].matches("[127.0.0.1]:2222"));
        assert!(!e[0].matches("[127.0.0.1]:2223"));
        let hashed = hash_name("host.example");
        let e = parse(&format!("{hashed} {ED}"));
        assert!(e[0].matches("host.example") && !e[0].matches("other"));
    }

    #[test]
    fn verdicts() {
        let (_d, p) = tmpfile(&format!("other {ED2}\nhost {ED2}\nhost {ED}\n"));
        let files = vec![p.clone()];
        let names = vec!["host".to_string()];
        assert_eq!(
            check(&files, &names, &key(ED)).unwrap(),
            Verdict::Known {
                file: p.clone(),
                line: 3
            }
        );
        let (_d2, p2) = tmpfile(&format!("host {ED2}\n"));
        assert_eq!(
            check(std::slice::from_ref(&p2), &names, &key(ED)).unwrap(),
            Verdict::Changed {
                file: p2.clone(),
                line: 1
            }
        );
        assert_eq!(
            check(
                std::slice::from_ref(&p2),
                &["nothere".to_string()],
                &key(ED)
            )
            .unwrap(),
            Verdict::Unknown
        );
        let (_d3, p3) = tmpfile(&format!("host {ED}\n@revoked * {ED}\n"));
        assert_eq!(
            check(std::slice::from_ref(&p3), &names, &key(ED)).unwrap(),
            Verdict::Revoked {
                file: p3.clone(),
                line: 2
            }
        );
        // Missing file: unknown.
        assert_eq!(
            check(&[p3.with_file_name("nope")], &names, &key(ED)).unwrap(),
            Verdict::Unknown
        );
    }

    #[test]
    fn unparsable_and_unknown_keys_are_ignored_as_openssh_does() {
        // A bad key of a known type is listed by a lookup but decides nothing.
        let (_d, p) = tmpfile("host ssh-ed25519 AAAAnot-base64!!\n");
        let names = vec!["host".to_string()];
        assert_eq!(parse(&std::fs::read_to_string(&p).unwrap()).len(), 1);
        assert_eq!(
            check(std::slice::from_ref(&p), &names, &key(ED)).unwrap(),
            Verdict::Unknown
        );
        // An unknown key type is skipped entirely (`ssh-keygen -F` does not list it).
        assert!(parse("host ssh-bogus AAAA\n").is_empty());
    }

    #[test]
    fn append_creates_file_and_matches() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/known_hosts");
        append(&p, "[h]:2222", &key(ED)).unwrap();
        let content = fs::read_to_string(&p).unwrap();
        assert_eq!(content, format!("[h]:2222 {ED}\n"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
            assert_eq!(
                fs::metadata(p.parent().unwrap())
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777,
                0o700
            );
        }
        assert_eq!(
            check(
                std::slice::from_ref(&p),
                &["[h]:2222".to_string()],
                &key(ED)
            )
            .unwrap(),
            Verdict::Known { file: p, line: 1 }
        );
    }
}
