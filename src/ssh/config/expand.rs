//! Expanding what a config line names: `~`, `Include` globs and `%%` tokens.

use std::path::{Path, PathBuf};

use super::{cfg_err, Loc};
use crate::ssh::known_hosts::wildcard_match;
use crate::ssh::SshError;

/// Include paths: `~` expanded, relative ones are relative to ~/.ssh, `*`/`?` in the last
/// path component are expanded (sorted, as glob(3) does).
pub(super) fn expand_include(arg: &str, home: &Path) -> Vec<PathBuf> {
    let p = expand_tilde(arg, home);
    let p = if p.is_absolute() {
        p
    } else {
        home.join(".ssh").join(p)
    };
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.contains(['*', '?']) {
        return vec![p];
    }
    let Some(dir) = p.parent() else {
        return vec![];
    };
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    !n.starts_with('.') && wildcard_match(&name, &n)
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

pub(crate) fn expand_tilde(s: &str, home: &Path) -> PathBuf {
    if s == "~" {
        home.to_path_buf()
    } else if let Some(rest) = s.strip_prefix("~/") {
        home.join(rest)
    } else {
        PathBuf::from(s)
    }
}

pub(super) struct Tokens<'a> {
    pub(super) alias: &'a str,
    pub(super) hostname: &'a str,
    pub(super) user: &'a str,
    pub(super) local_user: &'a str,
    pub(super) home: &'a str,
    pub(super) port: u16,
}

pub(super) fn expand_tokens(s: &str, t: &Tokens<'_>, loc: &Loc) -> Result<String, SshError> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('h') => out.push_str(t.hostname),
            Some('n') => out.push_str(t.alias),
            Some('r') => out.push_str(t.user),
            Some('u') => out.push_str(t.local_user),
            Some('d') => out.push_str(t.home),
            Some('p') => out.push_str(&t.port.to_string()),
            // SAFETY: getuid takes nothing, touches no memory and cannot fail.
            Some('i') => out.push_str(&unsafe { libc::getuid() }.to_string()),
            Some(other) => {
                return Err(cfg_err(loc, format!("unknown token %{other} in \"{s}\"")));
            }
            None => return Err(cfg_err(loc, format!("lone % at the end of \"{s}\""))),
        }
    }
    Ok(out)
}
