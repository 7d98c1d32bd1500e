//! ProxyJump lists: parsing `[user@]host[:port]` and `ssh://` hops.

/// One hop of a ProxyJump list: `[user@]host[:port]` or `ssh://[user@]host[:port]`, with
/// `[addr]` for IPv6 addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JumpHop {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

impl JumpHop {
    /// `[user@]host`, the destination this hop is resolved as.
    pub(crate) fn destination(&self) -> String {
        match &self.user {
            Some(u) => format!("{u}@{}", self.host),
            None => self.host.clone(),
        }
    }

    /// As `ssh -G` prints a hop: numeric hosts in brackets, `:port` when given.
    pub(super) fn display(&self) -> String {
        let numeric =
            self.host.contains(':') || self.host.chars().all(|c| c.is_ascii_digit() || c == '.');
        let mut s = String::new();
        if let Some(u) = &self.user {
            s.push_str(u);
            s.push('@');
        }
        if numeric {
            s.push_str(&format!("[{}]", self.host));
        } else {
            s.push_str(&self.host);
        }
        if let Some(p) = self.port {
            s.push_str(&format!(":{p}"));
        }
        s
    }
}

/// Most jump hosts on the way to one destination (a jump host's own ProxyJump included).
pub(crate) const MAX_HOPS: usize = 16;

/// Parse a ProxyJump list (`a,ops@b:2222,ssh://c`), as OpenSSH's `parse_jump` accepts it.
pub(crate) fn parse_jump_list(s: &str) -> Result<Vec<JumpHop>, String> {
    let mut hops = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err("an empty hop".into());
        }
        hops.push(parse_hop(part)?);
    }
    if hops.len() > MAX_HOPS {
        return Err(format!("more than {MAX_HOPS} hops"));
    }
    Ok(hops)
}

fn parse_hop(part: &str) -> Result<JumpHop, String> {
    let body = match part.strip_prefix("ssh://") {
        Some(rest) => rest.strip_suffix('/').unwrap_or(rest),
        None => part,
    };
    let (user, hostport) = match body.rsplit_once('@') {
        Some((u, h)) if !u.is_empty() && !u.contains('@') => (Some(u.to_owned()), h),
        Some(_) => return Err(format!("bad user in \"{part}\"")),
        None => (None, body),
    };
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("unclosed [ in \"{part}\""))?;
        match after {
            "" => (h, None),
            p => (
                h,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("bad port in \"{part}\""))?,
                ),
            ),
        }
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() || host.starts_with('-') || host.contains(['/', ' ', '\t']) {
        return Err(format!("bad host in \"{part}\""));
    }
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("bad port in \"{part}\""))?,
        ),
    };
    Ok(JumpHop {
        user,
        host: host.to_owned(),
        port,
    })
}
