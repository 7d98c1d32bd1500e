//! Reading config files: `Host` and `Match` blocks (with `Match exec` and the final pass),
//! `Include`, and the keywords collected for one destination.

use std::path::Path;
use std::time::Duration;

use super::{
    cfg_err, expand_include, expand_tokens, host_matches, split_words, Loc, Parser, SshError,
    Tokens, MAX_INCLUDE_DEPTH,
};
use crate::ssh::known_hosts::wildcard_match;

/// Most files one resolution reads through `Include`.
const MAX_FILES: usize = 256;
/// Largest config file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl Parser<'_> {
    fn parse_file(&mut self, path: &Path, depth: usize, required: bool) -> Result<(), SshError> {
        // Bounded work whatever the files say: a size cap (an Include of /dev/zero must not eat
        // memory) and a cap on files read (a file including itself twice per level would
        // otherwise mean 2^16 parses).
        self.files_read += 1;
        if self.files_read > MAX_FILES {
            return Err(SshError::Config {
                file: path.to_path_buf(),
                line: 0,
                message: format!(
                    "more than {MAX_FILES} files read through Include; is a file including itself?"
                ),
            });
        }
        let content = match crate::ssh::read_text_capped(path, MAX_CONFIG_BYTES) {
            Ok(c) => c,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(SshError::Config {
                    file: path.to_path_buf(),
                    line: 0,
                    message: format!("cannot read the file: {e}"),
                })
            }
        };
        let mut active = true;
        for (idx, raw) in content.lines().enumerate() {
            let loc = Loc {
                file: path.to_path_buf(),
                line: idx + 1,
            };
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let words = split_words(trimmed).map_err(|m| cfg_err(&loc, m))?;
            let Some((kw, args)) = words.split_first() else {
                continue;
            };
            let kw = kw.to_ascii_lowercase();
            match kw.as_str() {
                "host" => {
                    if args.is_empty() {
                        return Err(cfg_err(&loc, "Host needs at least one pattern"));
                    }
                    active = host_matches(args, self.host);
                    continue;
                }
                "match" => {
                    active = self.match_line(args, &loc)?;
                    continue;
                }
                _ => {}
            }
            if !active {
                continue;
            }
            if kw == "include" {
                if depth >= MAX_INCLUDE_DEPTH {
                    return Err(cfg_err(&loc, "Include nested too deeply"));
                }
                for arg in args {
                    for inc in expand_include(arg, self.home) {
                        self.parse_file(&inc, depth + 1, false)?;
                    }
                }
                continue;
            }
            self.out.set(&kw, args, &loc, trimmed)?;
        }
        Ok(())
    }

    /// The host name `Match host` tests: the HostName set so far (with `%h` expanded), else
    /// the name given; in the final pass, the HostName as resolved. Lower-cased, as OpenSSH does.
    fn current_host(&self) -> String {
        match &self.out.hostname {
            Some(v) => v.value.replace("%h", self.host).replace("%%", "%"),
            None => self.host.to_owned(),
        }
        .to_ascii_lowercase()
    }

    /// The remote user `Match user` tests: `user@` of the destination, else the first `User`
    /// seen so far, else the local user (OpenSSH's order).
    fn current_user(&self) -> String {
        self.dest_user
            .map(str::to_owned)
            .or_else(|| self.out.user.as_ref().map(|v| v.value.clone()))
            .unwrap_or_else(|| self.local_user.to_owned())
    }

    fn current_port(&self) -> u16 {
        self.out
            .port
            .as_ref()
            .and_then(|v| v.value.parse().ok())
            .unwrap_or(22)
    }

    /// Evaluate one `Match` line as OpenSSH's client does: every criterion must hold (`!`
    /// negates one); `exec` runs only while the line still holds; `all` stands alone (beside
    /// `canonical`/`final`); `canonical` and `final` hold only in the final pass, and `final`
    /// asks for one.
    fn match_line(&mut self, args: &[String], loc: &Loc) -> Result<bool, SshError> {
        if args.is_empty() {
            return Err(cfg_err(
                loc,
                "Match needs criteria (for example `Match host web-*` or `Match all`)",
            ));
        }
        let mut result = true;
        let (mut saw_all, mut with_argument) = (false, 0usize);
        let mut words = args.iter();
        while let Some(word) = words.next() {
            let (negate, attr) = match word.strip_prefix('!') {
                Some(a) => (true, a),
                None => (false, word.as_str()),
            };
            let attr = attr.to_ascii_lowercase();
            let holds = match attr.as_str() {
                "all" => {
                    saw_all = true;
                    true
                }
                "canonical" | "final" => {
                    self.want_final |= attr == "final";
                    self.final_pass
                }
                "host" | "originalhost" | "user" | "localuser" | "exec" => {
                    let Some(arg) = words.next() else {
                        return Err(cfg_err(loc, format!("Match {attr} needs an argument")));
                    };
                    with_argument += 1;
                    match attr.as_str() {
                        "host" => pattern_list(&self.current_host(), arg, true),
                        "originalhost" => pattern_list(&self.alias.to_ascii_lowercase(), arg, true),
                        "user" => pattern_list(&self.current_user(), arg, false),
                        "localuser" => pattern_list(self.local_user, arg, false),
                        // OpenSSH skips the command once an earlier criterion failed.
                        _ if !result => false,
                        _ => self.match_exec(arg, loc)?,
                    }
                }
                other => {
                    return Err(cfg_err(
                        loc,
                        format!(
                            "Match criterion '{other}' is not supported by cairn (it understands \
                             all, host, originalhost, user, localuser, exec, canonical and final, \
                             each negated with '!')"
                        ),
                    ))
                }
            };
            if holds == negate {
                result = false;
            }
        }
        if saw_all && with_argument > 0 {
            return Err(cfg_err(
                loc,
                "Match all cannot be combined with other criteria",
            ));
        }
        Ok(result)
    }

    /// `Match exec CMD`: the command (tokens expanded) runs through `$SHELL -c` (else
    /// `/bin/sh`), stdin and stdout on /dev/null, stderr passed through, as OpenSSH runs it;
    /// it holds when the command exits 0. A command that runs past a minute is an error
    /// rather than a hang.
    fn match_exec(&self, command: &str, loc: &Loc) -> Result<bool, SshError> {
        let host = self.current_host();
        let user = self.current_user();
        let home = self.home.to_string_lossy();
        let tokens = Tokens {
            alias: self.alias,
            hostname: &host,
            user: &user,
            local_user: self.local_user,
            home: &home,
            port: self.current_port(),
        };
        let command = expand_tokens(command, &tokens, loc)?;
        let shell = std::env::var_os("SHELL")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "/bin/sh".into());
        let mut child = std::process::Command::new(&shell)
            .arg("-c")
            .arg(&command)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| {
                cfg_err(
                    loc,
                    format!(
                        "Match exec: cannot run {}: {e}",
                        Path::new(&shell).display()
                    ),
                )
            })?;
        let deadline = std::time::Instant::now() + MATCH_EXEC_LIMIT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status.success()),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(cfg_err(
                        loc,
                        format!(
                            "Match exec \"{command}\" ran for more than {}s; stopped it",
                            MATCH_EXEC_LIMIT.as_secs()
                        ),
                    ));
                }
                Err(e) => return Err(cfg_err(loc, format!("Match exec: {e}"))),
            }
        }
    }
}

/// The longest a `Match exec` command may run.
const MATCH_EXEC_LIMIT: Duration = Duration::from_secs(60);

/// OpenSSH's pattern lists (`a,b*,!c`): true when some pattern matches and no negated one
/// does; a list of negations alone never matches.
fn pattern_list(subject: &str, list: &str, lower: bool) -> bool {
    let mut positive = false;
    for pattern in list.split(',').filter(|p| !p.is_empty()) {
        let pattern = if lower {
            pattern.to_ascii_lowercase()
        } else {
            pattern.to_owned()
        };
        match pattern.strip_prefix('!') {
            Some(neg) if wildcard_match(neg, subject) => return false,
            Some(_) => {}
            None => positive |= wildcard_match(&pattern, subject),
        }
    }
    positive
}

impl Parser<'_> {
    pub(super) fn parse_all(&mut self, config: Option<&Path>) -> Result<(), SshError> {
        match config {
            Some(p) => self.parse_file(p, 0, true),
            None => {
                self.parse_file(&self.home.join(".ssh/config"), 0, false)?;
                self.parse_file(Path::new("/etc/ssh/ssh_config"), 0, false)
            }
        }
    }
}

pub(super) fn is_none(v: &str) -> bool {
    v.eq_ignore_ascii_case("none")
}

/// The rest of a config line after its keyword, as OpenSSH keeps it for ProxyCommand (quotes
/// and spacing are the shell's business).
pub(super) fn raw_rest(line: &str) -> String {
    let kw_end = line
        .find(|c: char| c.is_whitespace() || c == '=')
        .unwrap_or(line.len());
    let rest = line[kw_end..].trim_start();
    rest.strip_prefix('=').unwrap_or(rest).trim().to_owned()
}
