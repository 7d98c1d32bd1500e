//! A subset of OpenSSH `ssh_config` (see [`super::resolve`] for the keywords honoured).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::known_hosts::wildcard_match;
use super::{ConnectOptions, SshError, Target};

mod expand;
mod jump;
mod parse;

pub(crate) use expand::expand_tilde;
use expand::{expand_include, expand_tokens, Tokens};
pub(crate) use jump::{parse_jump_list, JumpHop, MAX_HOPS};
use parse::{is_none, raw_rest};

/// Where a value came from, for error messages.
#[derive(Debug, Clone)]
struct Loc {
    file: PathBuf,
    line: usize,
}

#[derive(Debug, Clone)]
struct Val {
    value: String,
    loc: Loc,
}

/// Settings collected for one host, first value wins (IdentityFile accumulates).
#[derive(Debug, Default)]
struct Collected {
    hostname: Option<Val>,
    user: Option<Val>,
    port: Option<Val>,
    identity_files: Vec<Val>,
    user_known_hosts: Option<(Vec<String>, Loc)>,
    global_known_hosts: Option<(Vec<String>, Loc)>,
    connect_timeout: Option<Val>,
    alive_interval: Option<Val>,
    alive_count: Option<Val>,
    strict: Option<Val>,
    hash_known_hosts: Option<Val>,
    identity_agent: Option<Val>,
    host_key_alias: Option<Val>,
    identities_only: Option<Val>,
    certificate_files: Vec<Val>,
    /// ProxyJump as given (`none` or a list of hops); `-J` presets it.
    proxy_jump: Option<Val>,
    /// ProxyCommand as given (`none` or a command).
    proxy_command: Option<Val>,
}

const MAX_INCLUDE_DEPTH: usize = 16;

fn cfg_err(loc: &Loc, message: impl Into<String>) -> SshError {
    SshError::Config {
        file: loc.file.clone(),
        line: loc.line,
        message: message.into(),
    }
}

/// Split a config line into words, honouring double quotes. Handles `Keyword=value`.
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut first_eq_done = false;
    for c in line.chars() {
        if quoted {
            if c == '"' {
                quoted = false;
            } else {
                cur.push(c);
            }
            continue;
        }
        match c {
            '"' => {
                quoted = true;
                in_word = true;
            }
            '=' if !first_eq_done && words.is_empty() => {
                // "Keyword=value" or "Keyword = value"
                first_eq_done = true;
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                if words.len() == 1 && !first_eq_done && !in_word && c == '=' {
                    first_eq_done = true;
                    continue;
                }
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    if in_word {
        words.push(cur);
    }
    // "Keyword = value": a lone "=" as second word.
    if words.len() >= 2 && words[1] == "=" {
        words.remove(1);
    }
    Ok(words)
}

fn host_matches(patterns: &[String], alias: &str) -> bool {
    let mut positive = false;
    for p in patterns {
        if let Some(neg) = p.strip_prefix('!') {
            if wildcard_match(neg, alias) {
                return false;
            }
        } else if wildcard_match(p, alias) {
            positive = true;
        }
    }
    positive
}

impl Collected {
    /// One setting of an active block (`kw` lower-cased, `line` the whole line): the first
    /// value wins, as in OpenSSH; `IdentityFile` and `CertificateFile` add up.
    fn set(&mut self, kw: &str, args: &[String], loc: &Loc, line: &str) -> Result<(), SshError> {
        let first = |slot: &mut Option<Val>| {
            if slot.is_none() {
                if let Some(v) = args.first() {
                    *slot = Some(Val {
                        value: v.clone(),
                        loc: loc.clone(),
                    });
                }
            }
        };
        if args.is_empty() {
            return Err(cfg_err(loc, format!("{kw} needs a value")));
        }
        let o = self;
        match kw {
            "hostname" => first(&mut o.hostname),
            "user" => first(&mut o.user),
            "port" => first(&mut o.port),
            "identityfile" => o.identity_files.push(Val {
                value: args[0].clone(),
                loc: loc.clone(),
            }),
            "userknownhostsfile" if o.user_known_hosts.is_none() => {
                o.user_known_hosts = Some((args.to_vec(), loc.clone()));
            }
            "globalknownhostsfile" if o.global_known_hosts.is_none() => {
                o.global_known_hosts = Some((args.to_vec(), loc.clone()));
            }
            "connecttimeout" => first(&mut o.connect_timeout),
            "serveraliveinterval" => first(&mut o.alive_interval),
            "serveralivecountmax" => first(&mut o.alive_count),
            "stricthostkeychecking" => first(&mut o.strict),
            "hashknownhosts" => first(&mut o.hash_known_hosts),
            "identityagent" => first(&mut o.identity_agent),
            "hostkeyalias" => first(&mut o.host_key_alias),
            "identitiesonly" => first(&mut o.identities_only),
            "certificatefile" => o.certificate_files.push(Val {
                value: args[0].clone(),
                loc: loc.clone(),
            }),
            // As OpenSSH 9 reads them: the first ProxyJump wins unless a ProxyCommand
            // (even `none`) came first; a ProxyCommand is ignored once a ProxyJump other
            // than `none` is set. `-J` counts as a ProxyJump read before the files.
            "proxyjump" if o.proxy_jump.is_none() && o.proxy_command.is_none() => {
                let value = args.join(" ");
                if !value.eq_ignore_ascii_case("none") {
                    parse_jump_list(&value)
                        .map_err(|m| cfg_err(loc, format!("Invalid ProxyJump \"{value}\": {m}")))?;
                }
                o.proxy_jump = Some(Val {
                    value,
                    loc: loc.clone(),
                });
            }
            "proxycommand"
                if o.proxy_command.is_none()
                    && o.proxy_jump.as_ref().is_none_or(|v| is_none(&v.value)) =>
            {
                o.proxy_command = Some(Val {
                    value: raw_rest(line),
                    loc: loc.clone(),
                });
            }
            _ => {}
        }
        Ok(())
    }
}

struct Parser<'a> {
    /// The name as given (`Match originalhost`, `%n`).
    alias: &'a str,
    /// The same, lower-cased as OpenSSH does for `Host` lines, `Match host` and `%h`.
    host: &'a str,
    home: &'a Path,
    out: Collected,
    files_read: usize,
    /// The user of `user@host`, which (as in OpenSSH) is known before any config is read.
    dest_user: Option<&'a str>,
    local_user: &'a str,
    /// The second pass that `Match final` asks for, where the HostName is settled.
    final_pass: bool,
    /// A `Match final` or `Match canonical` was seen: run the final pass.
    want_final: bool,
}

/// How the configuration says a destination is reached.
enum Route {
    Direct,
    /// ProxyCommand, tokens not yet expanded.
    Command(Val),
    Jump(Vec<JumpHop>),
}

fn route_of(c: &Collected) -> Result<Route, SshError> {
    if let Some(v) = c.proxy_jump.as_ref().filter(|v| !is_none(&v.value)) {
        return parse_jump_list(&v.value)
            .map(Route::Jump)
            .map_err(|m| cfg_err(&v.loc, format!("Invalid ProxyJump \"{}\": {m}", v.value)));
    }
    if let Some(v) = c.proxy_command.as_ref().filter(|v| !is_none(&v.value)) {
        return Ok(Route::Command(v.clone()));
    }
    Ok(Route::Direct)
}

/// The `ssh -G` line for the route as configured for this destination.
fn route_g_line(c: &Collected) -> Option<(&'static str, String)> {
    if let Some(v) = c.proxy_jump.as_ref().filter(|v| !is_none(&v.value)) {
        let hops = parse_jump_list(&v.value).ok()?;
        let list: Vec<String> = hops.iter().map(JumpHop::display).collect();
        return Some(("proxyjump", list.join(",")));
    }
    c.proxy_command
        .as_ref()
        .filter(|v| !is_none(&v.value))
        .map(|v| ("proxycommand", v.value.clone()))
}

fn parse_secs(v: &Val, what: &str) -> Result<u64, SshError> {
    v.value.parse::<u64>().map_err(|_| {
        cfg_err(
            &v.loc,
            format!("{what} must be a number of seconds, not \"{}\"", v.value),
        )
    })
}

fn yes_no(v: &Val) -> bool {
    matches!(v.value.to_ascii_lowercase().as_str(), "yes" | "true")
}

/// The current user's name and home directory.
pub(crate) fn local_user_and_home() -> (String, PathBuf) {
    let (pw_name, pw_dir) = passwd_entry();
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .or(pw_name)
        // SAFETY: getuid takes nothing, touches no memory and cannot fail.
        .unwrap_or_else(|| unsafe { libc::getuid() }.to_string());
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or(pw_dir)
        .unwrap_or_else(|| PathBuf::from("/"));
    (user, home)
}

fn passwd_entry() -> (Option<String>, Option<PathBuf>) {
    use std::ffi::CStr;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: a zeroed passwd (null pointers, zero ids) is a valid buffer for getpwuid_r to fill.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: buffers are valid for the given sizes; result is checked before use.
    let rc = unsafe {
        libc::getpwuid_r(
            libc::getuid(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return (None, None);
    }
    // SAFETY: getpwuid_r succeeded, so the fields point into buf as NUL-terminated strings.
    unsafe {
        let name = (!pwd.pw_name.is_null())
            .then(|| CStr::from_ptr(pwd.pw_name).to_string_lossy().into_owned());
        let dir = (!pwd.pw_dir.is_null())
            .then(|| PathBuf::from(CStr::from_ptr(pwd.pw_dir).to_string_lossy().into_owned()));
        (name, dir)
    }
}

pub(crate) fn resolve(destination: &str, opts: &ConnectOptions) -> Result<Target, SshError> {
    resolve_depth(destination, opts, 0)
}

/// One destination through ssh_config, ignoring any ProxyJump or ProxyCommand it has (a hop
/// whose way there is already known, as recorded with an execution).
pub(crate) fn resolve_plain(destination: &str, opts: &ConnectOptions) -> Result<Target, SshError> {
    let o = ConnectOptions {
        jump: None,
        ..opts.clone()
    };
    Ok(resolve_one(destination, &o)?.0)
}

/// The options a jump host is resolved with: the same ssh_config, known_hosts and liveness
/// settings, but not the destination's `-p` and `-i` (OpenSSH passes neither to a jump host).
fn hop_options(opts: &ConnectOptions, hop: &JumpHop) -> ConnectOptions {
    ConnectOptions {
        port: hop.port,
        identity: Vec::new(),
        jump: None,
        ..opts.clone()
    }
}

/// Resolve `destination` and the chain of jump hosts before it, flattened: `jump[0]` is
/// reached first (through `proxy_command` if one is set), each later hop through the one
/// before it. As `ssh -J a,b` does, the first hop's own ProxyJump or ProxyCommand applies
/// (it is reached the way `ssh a` reaches it); a later hop's own are ignored.
fn resolve_depth(
    destination: &str,
    opts: &ConnectOptions,
    depth: usize,
) -> Result<Target, SshError> {
    let (mut t, route) = resolve_one(destination, opts)?;
    match route {
        ResolvedRoute::Direct => {}
        ResolvedRoute::Command(cmd) => t.proxy_command = Some(cmd),
        ResolvedRoute::Jump(hops, origin) => {
            let too_long = || {
                let message = format!(
                    "more than {MAX_HOPS} jump hosts on the way to {destination}: does a jump \
                     host's own ProxyJump lead back to itself? (give the jump host \
                     `ProxyJump none`)"
                );
                match &origin {
                    Some(loc) => cfg_err(loc, message),
                    None => SshError::InvalidJump(message),
                }
            };
            let mut chain: Vec<Target> = Vec::new();
            let mut proxy = None;
            for (i, hop) in hops.iter().enumerate() {
                let mut o = hop_options(opts, hop);
                let h = if i == 0 {
                    if depth + 1 >= MAX_HOPS {
                        return Err(too_long());
                    }
                    let mut first = resolve_depth(&hop.destination(), &o, depth + 1)?;
                    chain = std::mem::take(&mut first.jump);
                    proxy = first.proxy_command.take();
                    first
                } else {
                    // `ssh -J a b` for hop b: the hops before it win over its own config.
                    let before: Vec<String> = hops[..i].iter().map(JumpHop::display).collect();
                    o.jump = Some(before.join(","));
                    resolve_one(&hop.destination(), &o)?.0
                };
                chain.push(h);
            }
            if chain.len() > MAX_HOPS {
                return Err(too_long());
            }
            t.jump = chain;
            t.proxy_command = proxy;
        }
    }
    Ok(t)
}

/// How a destination is reached, with a ProxyCommand's tokens expanded; for a ProxyJump, where
/// it was set (`None`: `-J`).
enum ResolvedRoute {
    Direct,
    Command(String),
    Jump(Vec<JumpHop>, Option<Loc>),
}

/// `[user@]host` (the host may be in brackets) as the user given, if any, and the host.
fn split_destination(destination: &str) -> Result<(Option<String>, &str), SshError> {
    let (dest_user, host) = match destination.rsplit_once('@') {
        Some((u, h)) => (Some(u.to_string()), h),
        None => (None, destination),
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() || dest_user.as_deref() == Some("") || host.starts_with('-') {
        return Err(SshError::InvalidDestination(destination.to_string()));
    }
    Ok((dest_user, host))
}

/// The port: `-p`, else the config's `Port`, else 22.
fn port(opts: &ConnectOptions, c: &Collected) -> Result<u16, SshError> {
    Ok(match (opts.port, &c.port) {
        (Some(p), _) => p,
        (None, Some(v)) => v
            .value
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| cfg_err(&v.loc, format!("Port must be 1-65535, not \"{}\"", v.value)))?,
        (None, None) => 22,
    })
}

/// One destination through ssh_config, without following its route.
fn resolve_one(
    destination: &str,
    opts: &ConnectOptions,
) -> Result<(Target, ResolvedRoute), SshError> {
    let (dest_user, host) = split_destination(destination)?;
    let alias = host.to_string();
    // OpenSSH lower-cases the host name before matching `Host` lines and expanding `%h`; the
    // name as typed stays for `Match originalhost` and `%n`.
    let lower = host.to_ascii_lowercase();
    let (local_user, home) = local_user_and_home();
    let c = collect(
        &alias,
        &lower,
        &home,
        dest_user.as_deref(),
        &local_user,
        opts,
    )?;
    let route = route_of(&c)?;
    let route_line = route_g_line(&c);

    let hostname = match &c.hostname {
        Some(v) => expand_hostname(v, &lower)?,
        None => lower.clone(),
    };
    let port = port(opts, &c)?;
    let user = match (&dest_user, &c.user) {
        (Some(u), _) => u.clone(),
        (None, Some(v)) => v.value.clone(),
        (None, None) => local_user.clone(),
    };
    let home_s = home.to_string_lossy().into_owned();
    let tokens = Tokens {
        alias: &alias,
        hostname: &hostname,
        user: &user,
        local_user: &local_user,
        home: &home_s,
        port,
    };

    let identity_files = identity_files(&c, opts, &tokens, &home)?;
    let (known_hosts, known_hosts_read, global_known_hosts) =
        known_hosts_files(&c, opts, &tokens, &home)?;

    let (connect_timeout, keepalive_interval, keepalive_max) = liveness(&c, opts)?;
    let accept_new = opts.accept_new || strict_accepts_new(c.strict.as_ref())?;
    let identities_only = c.identities_only.as_ref().is_some_and(yes_no);
    let certificate_files = certificate_files(&c, &tokens, &home)?;
    let hash_known_hosts = c.hash_known_hosts.as_ref().is_some_and(yes_no);
    let identity_agent = identity_agent(&c, &tokens, &home)?;
    let route = resolve_route(route, &c, &tokens)?;

    let target = Target {
        alias,
        hostname,
        port,
        user,
        identity_files,
        known_hosts,
        known_hosts_read,
        accept_new,
        hash_known_hosts,
        connect_timeout,
        keepalive_interval,
        keepalive_max,
        identity_agent,
        host_key_alias: c.host_key_alias.as_ref().map(|v| v.value.clone()),
        pinned_host_key: None,
        identities_only,
        certificate_files,
        global_known_hosts,
        jump: Vec::new(),
        proxy_command: None,
        route_line,
    };
    Ok((target, route))
}

/// What ssh_config (and `-J`) says for one destination: the files read once or, when a
/// `Match final` asks for it, twice.
fn collect(
    alias: &str,
    host: &str,
    home: &Path,
    dest_user: Option<&str>,
    local_user: &str,
    opts: &ConnectOptions,
) -> Result<Collected, SshError> {
    let mut parser = Parser {
        alias,
        host,
        home,
        out: Collected::default(),
        files_read: 0,
        dest_user,
        local_user,
        final_pass: false,
        want_final: false,
    };
    if let Some(j) = &opts.jump {
        // `-J` is read before the files, as OpenSSH reads its command line first.
        if !is_none(j) {
            parse_jump_list(j).map_err(|m| {
                SshError::InvalidJump(format!(
                    "invalid -J argument \"{j}\": {m}; expected [user@]host[:port][,...] or none"
                ))
            })?;
        }
        parser.out.proxy_jump = Some(Val {
            value: j.clone(),
            loc: Loc {
                file: PathBuf::from("-J"),
                line: 0,
            },
        });
    }
    parser.parse_all(opts.ssh_config.as_deref())?;
    if parser.want_final {
        // As OpenSSH: read the files again with the HostName settled; values already set
        // stay (the first value wins), `Match final` blocks now apply.
        parser.final_pass = true;
        parser.files_read = 0;
        parser.parse_all(opts.ssh_config.as_deref())?;
    }
    Ok(parser.out)
}

/// Put the route through its tokens; a jump keeps where its `ProxyJump` line was, if in a file.
fn resolve_route(
    route: Route,
    c: &Collected,
    tokens: &Tokens<'_>,
) -> Result<ResolvedRoute, SshError> {
    Ok(match route {
        Route::Direct => ResolvedRoute::Direct,
        Route::Command(v) => ResolvedRoute::Command(expand_tokens(&v.value, tokens, &v.loc)?),
        Route::Jump(hops) => {
            let origin = c
                .proxy_jump
                .as_ref()
                .map(|v| v.loc.clone())
                .filter(|l| l.line > 0);
            ResolvedRoute::Jump(hops, origin)
        }
    })
}

/// The identity files to try: `-i` first, then the config's (tokens and `~` expanded, `none`
/// skipped, each once); OpenSSH's default key names only when neither named any.
fn identity_files(
    c: &Collected,
    opts: &ConnectOptions,
    tokens: &Tokens<'_>,
    home: &Path,
) -> Result<Vec<PathBuf>, SshError> {
    let mut identity_files: Vec<PathBuf> = opts.identity.clone();
    for v in &c.identity_files {
        if v.value.eq_ignore_ascii_case("none") {
            continue;
        }
        let s = expand_tokens(&v.value, tokens, &v.loc)?;
        let p = expand_tilde(&s, home);
        if !identity_files.contains(&p) {
            identity_files.push(p);
        }
    }
    let mut default_identities = true;
    if !c.identity_files.is_empty() || !opts.identity.is_empty() {
        // OpenSSH only falls back to the default key names when none was configured.
        default_identities = false;
    }
    if default_identities {
        for name in ["id_ed25519", "id_ecdsa", "id_rsa"] {
            identity_files.push(home.join(".ssh").join(name));
        }
    }
    Ok(identity_files)
}

/// The certificate files, tokens and `~` expanded, each once.
fn certificate_files(
    c: &Collected,
    tokens: &Tokens<'_>,
    home: &Path,
) -> Result<Vec<PathBuf>, SshError> {
    let mut certificate_files = Vec::new();
    for v in &c.certificate_files {
        let p = expand_tilde(&expand_tokens(&v.value, tokens, &v.loc)?, home);
        if !certificate_files.contains(&p) {
            certificate_files.push(p);
        }
    }
    Ok(certificate_files)
}

/// HostName with `%h` (the lower-cased name given) and `%%`, the only tokens it knows.
fn expand_hostname(v: &Val, host: &str) -> Result<String, SshError> {
    let mut s = String::new();
    let mut it = v.value.chars();
    while let Some(ch) = it.next() {
        if ch != '%' {
            s.push(ch);
            continue;
        }
        match it.next() {
            Some('h') => s.push_str(host),
            Some('%') => s.push('%'),
            other => {
                return Err(cfg_err(
                    &v.loc,
                    format!(
                        "HostName only understands %h and %%, not %{}",
                        other.map(String::from).unwrap_or_default()
                    ),
                ))
            }
        }
    }
    Ok(s)
}

/// The known_hosts file written by accept-new, the further files only read, and the global
/// ones among those: `--known-hosts` alone when given, else UserKnownHostsFile (default
/// ~/.ssh/known_hosts, ~/.ssh/known_hosts2) then GlobalKnownHostsFile.
fn known_hosts_files(
    c: &Collected,
    opts: &ConnectOptions,
    tokens: &Tokens<'_>,
    home: &Path,
) -> Result<(PathBuf, Vec<PathBuf>, Vec<PathBuf>), SshError> {
    let expand_list = |list: &(Vec<String>, Loc)| -> Result<Vec<PathBuf>, SshError> {
        list.0
            .iter()
            .filter(|s| !s.eq_ignore_ascii_case("none"))
            .map(|s| Ok(expand_tilde(&expand_tokens(s, tokens, &list.1)?, home)))
            .collect()
    };
    let mut global_known_hosts = Vec::new();
    let (known_hosts, known_hosts_read) = match &opts.known_hosts {
        Some(p) => (p.clone(), Vec::new()),
        None => {
            let mut user_files = match &c.user_known_hosts {
                Some(l) => expand_list(l)?,
                None => vec![
                    home.join(".ssh/known_hosts"),
                    home.join(".ssh/known_hosts2"),
                ],
            };
            let global = match &c.global_known_hosts {
                Some(l) => expand_list(l)?,
                None => vec![
                    PathBuf::from("/etc/ssh/ssh_known_hosts"),
                    PathBuf::from("/etc/ssh/ssh_known_hosts2"),
                ],
            };
            if user_files.is_empty() {
                user_files.push(home.join(".ssh/known_hosts"));
            }
            let first = user_files.remove(0);
            global_known_hosts = global.clone();
            user_files.extend(global);
            (first, user_files)
        }
    };
    Ok((known_hosts, known_hosts_read, global_known_hosts))
}

/// ConnectTimeout, ServerAliveInterval and ServerAliveCountMax, where the flags win when given.
fn liveness(c: &Collected, opts: &ConnectOptions) -> Result<(Duration, Duration, usize), SshError> {
    let connect_timeout = match &c.connect_timeout {
        _ if opts.connect_timeout_explicit => opts.connect_timeout,
        Some(v) => match parse_secs(v, "ConnectTimeout")? {
            0 => opts.connect_timeout,
            s => Duration::from_secs(s),
        },
        None => opts.connect_timeout,
    };
    // ServerAliveInterval 0 would disable dead-link detection, which cairn relies on: keep ours.
    let keepalive_interval = match &c.alive_interval {
        _ if opts.keepalive_explicit => opts.keepalive_interval,
        Some(v) => match parse_secs(v, "ServerAliveInterval")? {
            0 => opts.keepalive_interval,
            s => Duration::from_secs(s),
        },
        None => opts.keepalive_interval,
    };
    let keepalive_max = match &c.alive_count {
        Some(v) => v
            .value
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                cfg_err(
                    &v.loc,
                    format!(
                        "ServerAliveCountMax must be a positive number, not \"{}\"",
                        v.value
                    ),
                )
            })?,
        None => opts.keepalive_max,
    };
    Ok((connect_timeout, keepalive_interval, keepalive_max))
}

/// IdentityAgent: `SSH_AUTH_SOCK` (the default), `none`, `$VAR`, or a socket path.
fn identity_agent(
    c: &Collected,
    tokens: &Tokens<'_>,
    home: &Path,
) -> Result<AgentSetting, SshError> {
    Ok(match &c.identity_agent {
        None => AgentSetting::Env,
        Some(v) if v.value.eq_ignore_ascii_case("none") => AgentSetting::None,
        Some(v) if v.value == "SSH_AUTH_SOCK" => AgentSetting::Env,
        Some(v) => {
            let s = expand_tokens(&v.value, tokens, &v.loc)?;
            if let Some(var) = s.strip_prefix('$') {
                match std::env::var_os(var) {
                    Some(p) => AgentSetting::Path(PathBuf::from(p)),
                    None => AgentSetting::None,
                }
            } else {
                AgentSetting::Path(expand_tilde(&s, home))
            }
        }
    })
}

/// `StrictHostKeyChecking`: `yes` and `ask` check strictly (cairn never prompts), `accept-new`
/// records the keys of hosts not yet known, and `no`/`off` are refused: they would accept a
/// changed key, and cairn's guarantees rest on knowing which host answered.
fn strict_accepts_new(v: Option<&Val>) -> Result<bool, SshError> {
    let Some(v) = v else { return Ok(false) };
    match v.value.to_ascii_lowercase().as_str() {
        "yes" | "true" | "ask" => Ok(false),
        "accept-new" => Ok(true),
        "no" | "off" | "false" => Err(cfg_err(
            &v.loc,
            format!(
                "StrictHostKeyChecking {} would accept a host whose key changed; cairn's \
                 guarantees rest on knowing which host answered, so it refuses. Use \
                 `accept-new` (records keys of hosts not yet known, never a changed one) or `yes`",
                v.value
            ),
        )),
        other => Err(cfg_err(
            &v.loc,
            format!("StrictHostKeyChecking must be yes, ask, accept-new or no, not \"{other}\""),
        )),
    }
}

/// The resolved options in the format `ssh -G` prints them (lower-case keyword, a space, the
/// value), for the keywords cairn honours; `cairn config DEST` prints these lines.
pub fn ssh_g_lines(t: &Target) -> Vec<(&'static str, String)> {
    let join = |v: &[PathBuf]| {
        v.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let user_files: Vec<PathBuf> = std::iter::once(t.known_hosts.clone())
        .chain(
            t.known_hosts_read
                .iter()
                .filter(|p| !t.global_known_hosts.contains(p))
                .cloned(),
        )
        .collect();
    let mut out = vec![
        ("user", t.user.clone()),
        ("hostname", t.hostname.clone()),
        ("port", t.port.to_string()),
        (
            "identitiesonly",
            if t.identities_only { "yes" } else { "no" }.into(),
        ),
        (
            "stricthostkeychecking",
            if t.accept_new { "accept-new" } else { "true" }.into(),
        ),
        ("connecttimeout", t.connect_timeout.as_secs().to_string()),
        (
            "serveraliveinterval",
            t.keepalive_interval.as_secs().to_string(),
        ),
        ("serveralivecountmax", t.keepalive_max.to_string()),
    ];
    out.extend(
        t.identity_files
            .iter()
            .map(|p| ("identityfile", p.display().to_string())),
    );
    out.extend(
        t.certificate_files
            .iter()
            .map(|p| ("certificatefile", p.display().to_string())),
    );
    if !t.global_known_hosts.is_empty() {
        out.push(("globalknownhostsfile", join(&t.global_known_hosts)));
    }
    out.push(("userknownhostsfile", join(&user_files)));
    if let Some((keyword, value)) = &t.route_line {
        out.push((keyword, value.clone()));
    }
    if let Some(a) = &t.host_key_alias {
        out.push(("hostkeyalias", a.clone()));
    }
    match &t.identity_agent {
        AgentSetting::Env => {}
        AgentSetting::None => out.push(("identityagent", "none".into())),
        AgentSetting::Path(p) => out.push(("identityagent", p.display().to_string())),
    }
    out
}

/// Which ssh-agent to use (IdentityAgent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSetting {
    /// `SSH_AUTH_SOCK` from the environment (default).
    Env,
    /// No agent.
    None,
    /// A specific socket.
    Path(PathBuf),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts_with(config: &str) -> (tempfile::TempDir, ConnectOptions) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config");
        std::fs::write(&p, config).unwrap();
        let o = ConnectOptions {
            ssh_config: Some(p),
            ..Default::default()
        };
        (d, o)
    }

    #[test]
    fn words() {
        assert_eq!(split_words("Host a b").unwrap(), vec!["Host", "a", "b"]);
        assert_eq!(split_words("Port=2222").unwrap(), vec!["Port", "2222"]);
        assert_eq!(split_words("Port = 2222").unwrap(), vec!["Port", "2222"]);
        assert_eq!(
            split_words("IdentityFile \"/a b/c\"").unwrap(),
            vec!["IdentityFile", "/a b/c"]
        );
        assert!(split_words("User \"x").is_err());
    }

    #[test]
    fn first_value_wins_and_patterns() {
        let (_d, o) = opts_with(
            "Host web*\n  HostName %h.example.com\n  User alice\n  Port 2200\n  IdentityFile ~/.ssh/%r@%h\n\
             Host * !webx\n  User bob\n  Port 2300\n  IdentityFile /k/%n-%p\n  ConnectTimeout 7\n\
             \tServerAliveInterval 2\n  ServerAliveCountMax 4\n  StrictHostKeyChecking accept-new\n",
        );
        let t = resolve("web1", &o).unwrap();
        assert_eq!(t.hostname, "web1.example.com");
        assert_eq!(t.user, "alice");
        assert_eq!(t.port, 2200);
        let (_, home) = local_user_and_home();
        assert_eq!(
            t.identity_files,
            vec![
                home.join(".ssh/alice@web1.example.com"),
                PathBuf::from("/k/web1-2200")
            ]
        );
        assert_eq!(t.connect_timeout, Duration::from_secs(7));
        assert_eq!(t.keepalive_interval, Duration::from_secs(2));
        assert_eq!(t.keepalive_max, 4);
        assert!(t.accept_new);
        assert_eq!(t.display(), "alice@web1:2200");

        // Negation: webx matches web* but is excluded from "*".
        let t = resolve("carol@webx", &o).unwrap();
        assert_eq!(t.user, "carol");
        assert_eq!(t.port, 2200);
        assert!(!t.accept_new);

        let o2 = ConnectOptions {
            port: Some(9),
            identity: vec![PathBuf::from("/cli/key")],
            ..o
        };
        let t = resolve("other", &o2).unwrap();
        assert_eq!(t.port, 9);
        assert_eq!(t.user, "bob");
        assert_eq!(t.hostname, "other");
        assert_eq!(t.identity_files[0], PathBuf::from("/cli/key"));
    }

    #[test]
    fn defaults_and_errors() {
        let (_d, o) = opts_with("Host bad\n Port nope\nHost tok\n IdentityFile /x/%z\n");
        let t = resolve("plain", &o).unwrap();
        let (user, home) = local_user_and_home();
        assert_eq!(t.user, user);
        assert_eq!(t.port, 22);
        assert_eq!(t.identity_files.len(), 3);
        assert_eq!(t.identity_files[0], home.join(".ssh/id_ed25519"));
        assert_eq!(t.known_hosts, home.join(".ssh/known_hosts"));
        match resolve("bad", &o) {
            Err(SshError::Config { line: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
        match resolve("tok", &o) {
            Err(SshError::Config { line: 4, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            resolve("", &o),
            Err(SshError::InvalidDestination(_))
        ));
        assert!(matches!(
            resolve("u@", &o),
            Err(SshError::InvalidDestination(_))
        ));
    }

    #[test]
    fn include_and_known_hosts() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("inc.conf"),
            "Host h\n UserKnownHostsFile ~/kh1 /x/kh2\n",
        )
        .unwrap();
        let p = d.path().join("config");
        std::fs::write(
            &p,
            format!(
                "Include {}/inc*.conf\nHost *\n User z\n",
                d.path().display()
            ),
        )
        .unwrap();
        let o = ConnectOptions {
            ssh_config: Some(p),
            ..Default::default()
        };
        let t = resolve("h", &o).unwrap();
        let (_, home) = local_user_and_home();
        assert_eq!(t.known_hosts, home.join("kh1"));
        assert_eq!(t.known_hosts_read[0], PathBuf::from("/x/kh2"));
        assert_eq!(t.user, "z");
        let o = ConnectOptions {
            known_hosts: Some(PathBuf::from("/explicit")),
            ..o
        };
        let t = resolve("h", &o).unwrap();
        assert_eq!(t.known_hosts, PathBuf::from("/explicit"));
        assert!(t.known_hosts_read.is_empty());
    }

    #[test]
    fn match_blocks_as_openssh_reads_them() {
        let (_d, o) = opts_with(
            "Match originalhost web* user alice\n  Port 2201\n\
             Match host !db* exec \"test %h = web1\"\n  User carol\n\
             Match host db*,!db-9 !user root\n  Port 2202\n\
             Host web*\n  HostName %h.example.com\n\
             Match host *.example.com\n  ConnectTimeout 9\n\
             Match exec \"test %n = web2\" originalhost web*\n  User dave\n\
             Match localuser nobody-here-xyz\n  User never\n\
             Match all\n  ServerAliveInterval 3\n",
        );
        // `!db*` alone never matches (a list of negations only), so carol is not set for web1.
        let t = resolve("web1", &o).unwrap();
        assert_eq!(t.hostname, "web1.example.com");
        assert_eq!(t.port, 22);
        assert_eq!(t.connect_timeout, Duration::from_secs(9));
        assert_eq!(t.keepalive_interval, Duration::from_secs(3));
        let (local, _) = local_user_and_home();
        assert_eq!(t.user, local);
        // user@ is known before the config: Match user sees it.
        let t = resolve("alice@web2", &o).unwrap();
        assert_eq!((t.user.as_str(), t.port), ("alice", 2201));
        let t = resolve("web2", &o).unwrap();
        assert_eq!(t.user, "dave", "exec ran with %n expanded");
        assert_eq!(resolve("ops@db-1", &o).unwrap().port, 2202);
        assert_eq!(resolve("ops@db-9", &o).unwrap().port, 22);
        assert_eq!(resolve("root@db-1", &o).unwrap().port, 22);
    }

    #[test]
    fn match_final_sees_the_settled_hostname_and_bad_matches_name_their_line() {
        let (_d, o) = opts_with(
            "Host short\n  HostName short.corp\nMatch final host *.corp\n  User finaluser\n",
        );
        assert_eq!(resolve("short", &o).unwrap().user, "finaluser");
        for (cfg, needle) in [
            ("Match\n", "Match needs criteria"),
            ("Match host\n", "Match host needs an argument"),
            ("Match all host x\n", "cannot be combined"),
            ("Match tagged x\n", "'tagged' is not supported"),
            ("Host x\n StrictHostKeyChecking no\n", "refuses"),
            ("Host x\n StrictHostKeyChecking maybe\n", "must be yes"),
            ("Host x\n ProxyJump a,,b\n", "Invalid ProxyJump \"a,,b\""),
            ("Host x\n ProxyJump u@@b\n", "Invalid ProxyJump"),
            ("Host x\n ProxyJump b:0\n", "bad port"),
            ("Host x\n ProxyCommand nc %h %z\n", "unknown token %z"),
            ("Host *\n ProxyJump x\n", "more than 16 jump hosts"),
        ] {
            let (_d, o) = opts_with(cfg);
            match resolve("x", &o) {
                Err(SshError::Config { line, message, .. }) => {
                    assert!(message.contains(needle), "{cfg:?}: {message}");
                    assert!(line >= 1, "{cfg:?}");
                }
                other => panic!("{cfg:?}: {other:?}"),
            }
        }
        let (_d, o) = opts_with("Host x\n ProxyJump none\n StrictHostKeyChecking ask\n");
        assert!(!resolve("x", &o).unwrap().accept_new);
    }

    #[test]
    fn jump_lists_parse_as_openssh_parses_them() {
        let h = parse_jump_list("ops@b1:2222,[::1]:23,ssh://u@h:5,b3,10.0.0.1").unwrap();
        let shown: Vec<String> = h.iter().map(JumpHop::display).collect();
        assert_eq!(
            shown,
            ["ops@b1:2222", "[::1]:23", "u@h:5", "b3", "[10.0.0.1]"]
        );
        assert_eq!(h[0].destination(), "ops@b1");
        assert_eq!(h[1].host, "::1");
        for bad in [
            "",
            "a,",
            ",a",
            "a:x",
            "a:0",
            "a:70000",
            "@a",
            "[::1",
            "-oProxyCommand=x",
        ] {
            assert!(parse_jump_list(bad).is_err(), "{bad:?}");
        }
    }

    // Long: one scenario, its phases in order.
    #[test]
    fn proxy_jump_chains_resolve_each_hop_through_the_config() {
        let (_d, o) = opts_with(
            "Host t1\n ProxyJump ops@b1:2222,b2\n HostName 10.9.0.1\n\
             Host t2\n ProxyCommand ssh -W %h:%p %r@gw %% %n\n User tu\n Port 2022\n\
             Host t3\n ProxyJump none\n ProxyCommand late %h\n\
             Host t4\n ProxyCommand none\n ProxyJump b1\n\
             Host t5\n ProxyJump b1\n ProxyCommand ignored\n\
             Host b1\n HostName bastion.one\n User b1user\n IdentityFile /k/b1\n \
             UserKnownHostsFile /kh/b1\n ProxyJump b0\n\
             Host b2\n HostName bastion.two\n ProxyCommand never-used\n ProxyJump never-either\n\
             Host b0\n ProxyCommand connect-b0 %h %p\n\
             Host *\n IdentityFile /k/default\n",
        );
        let t = resolve("t1", &o).unwrap();
        let hops: Vec<(&str, &str, u16, &str)> = t
            .jump
            .iter()
            .map(|h| {
                (
                    h.alias.as_str(),
                    h.hostname.as_str(),
                    h.port,
                    h.user.as_str(),
                )
            })
            .collect();
        let (me, _) = local_user_and_home();
        // b1's own ProxyJump b0 applies (it is the first hop); b2's own route is ignored.
        assert_eq!(
            hops,
            [
                ("b0", "b0", 22, me.as_str()),
                ("b1", "bastion.one", 2222, "ops"),
                ("b2", "bastion.two", 22, me.as_str()),
            ]
        );
        assert_eq!(t.proxy_command.as_deref(), Some("connect-b0 b0 22"));
        assert_eq!(t.jump[1].identity_files[0], PathBuf::from("/k/b1"));
        assert_eq!(t.jump[1].known_hosts, PathBuf::from("/kh/b1"));
        assert!(t
            .jump
            .iter()
            .all(|h| h.jump.is_empty() && h.proxy_command.is_none()));
        assert_eq!(
            t.route_line,
            Some(("proxyjump", "ops@b1:2222,b2".to_owned()))
        );

        let t = resolve("t2", &o).unwrap();
        assert!(t.jump.is_empty());
        assert_eq!(
            t.proxy_command.as_deref(),
            Some("ssh -W t2:2022 tu@gw % t2")
        );
        assert_eq!(
            t.route_line,
            Some(("proxycommand", "ssh -W %h:%p %r@gw %% %n".to_owned()))
        );
        // ProxyJump none leaves room for a later ProxyCommand; ProxyCommand none does not
        // for a later ProxyJump; a ProxyJump wins over a later ProxyCommand (OpenSSH 9).
        assert_eq!(
            resolve("t3", &o).unwrap().proxy_command.as_deref(),
            Some("late t3")
        );
        let t4 = resolve("t4", &o).unwrap();
        assert!(t4.jump.is_empty() && t4.proxy_command.is_none());
        let t5 = resolve("t5", &o).unwrap();
        assert_eq!(t5.jump.len(), 2);
        assert_eq!(t5.proxy_command.as_deref(), Some("connect-b0 b0 22"));

        // -J wins over the config; `-J none` drops the ProxyJump but keeps a ProxyCommand.
        let j = |spec: &str| ConnectOptions {
            jump: Some(spec.to_owned()),
            port: Some(2),
            identity: vec![PathBuf::from("/cli/key")],
            ..o.clone()
        };
        let t = resolve("t2", &j("x@b2:7")).unwrap();
        // b2 is now the first hop: reached as `ssh b2` would reach it, by its ProxyCommand.
        assert_eq!(t.proxy_command.as_deref(), Some("never-used"));
        assert_eq!(t.jump.len(), 1);
        assert_eq!((t.jump[0].user.as_str(), t.jump[0].port), ("x", 7));
        assert_eq!(t.port, 2);
        // -p and -i are the destination's alone, as ssh passes neither to a jump host.
        assert_eq!(t.jump[0].identity_files, [PathBuf::from("/k/default")]);
        let t = resolve("t1", &j("none")).unwrap();
        assert!(t.jump.is_empty() && t.proxy_command.is_none());
        assert_eq!(
            resolve("t5", &j("none")).unwrap().proxy_command.as_deref(),
            Some("ignored")
        );
        match resolve("t1", &j("a,,b")) {
            Err(SshError::InvalidJump(m)) => assert!(m.contains("invalid -J argument"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn identities_only_and_certificate_files() {
        let (_d, o) = opts_with(
            "Host c\n IdentitiesOnly yes\n CertificateFile ~/.ssh/%r-cert.pub\n \
             CertificateFile /c/two\n IdentityFile /k/id\n",
        );
        let t = resolve("ops@c", &o).unwrap();
        let (_, home) = local_user_and_home();
        assert!(t.identities_only);
        assert_eq!(
            t.certificate_files,
            vec![home.join(".ssh/ops-cert.pub"), PathBuf::from("/c/two")]
        );
        assert!(!resolve("other", &o).unwrap().identities_only);
    }
}
