//! The native host helper: the same marker protocol as the sh script, in one static binary
//! that cairn uploads into the marker home on first contact (`docs/HOST-HELPER.md`).
//!
//! `build.rs` compiles `remote-scripts/cairn-host.rs` with the rustc that builds this crate,
//! for the host triple, statically linked, and records its SHA-256; both are embedded here.
//! Per connection and marker home the executor asks the host once (a `hello` that names the
//! hash, [`crate::marker::Op::Probe`]) for its architecture and the helper's state, uploads
//! the helper if it is absent or not that file ([`crate::marker::Op::Install`]), and from then
//! runs every operation with it. The helper hashes its own file before every use and refuses
//! to run (exit 125, before any protocol line) when the hash is not the one named on its
//! command line; a helper that cannot run at all (a home mounted `noexec`) fails the same way
//! (126/127). Either way the executor runs that operation, and every later one on the
//! connection, with the script: nothing can have happened on the host before the helper's
//! first protocol line.

use crate::marker::{self, shell_quote, Op};

/// The helper binary (empty where `build.rs` could not build it: the script is used then).
pub const BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cairn-host"));

/// Its SHA-256, lower-case hex (empty with [`BINARY`]).
pub const SHA256: &str = include_str!(concat!(env!("OUT_DIR"), "/cairn-host.sha256"));

/// Whether this build carries a helper.
pub fn available() -> bool {
    !BINARY.is_empty() && SHA256.len() == 64
}

/// The architecture the helper runs on, as `uname -m` names it.
pub fn arch() -> &'static str {
    std::env::consts::ARCH
}

/// Which host implementation runs the marker protocol (`--host-helper`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HostHelper {
    /// The helper where it can run (uploaded if missing), the sh script elsewhere.
    #[default]
    Auto,
    /// Always the sh script; nothing is uploaded.
    Never,
    /// The helper or nothing: a host where it cannot run is an error.
    Always,
}

impl std::str::FromStr for HostHelper {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(HostHelper::Auto),
            "never" => Ok(HostHelper::Never),
            "always" => Ok(HostHelper::Always),
            _ => Err(format!("'{s}' is not one of auto, never, always")),
        }
    }
}

/// Which side ran an operation, as recorded in the journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Helper,
    Script,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Helper => "helper",
            Side::Script => "sh",
        }
    }
}

/// The helper's path on the host, as shell words (`"$HOME"/'DIR/bin/…'` for a relative DIR).
pub fn host_path(dir: &str) -> String {
    let rel = format!("{dir}/bin/cairn-host-{SHA256}");
    if dir.starts_with('/') {
        shell_quote(&rel)
    } else {
        format!("\"$HOME\"/{}", shell_quote(&rel))
    }
}

/// The exec string for `op` run by the helper: `exec HELPER SHA256 MODE DIR NONCE ARG...`.
pub fn invocation(op: &Op<'_>, dir: &str, nonce: &str) -> String {
    let (mode, args) = marker::mode_args(op);
    let mut s = String::with_capacity(256);
    s.push_str("exec ");
    s.push_str(&host_path(dir));
    for a in [SHA256, mode, dir, nonce]
        .into_iter()
        .map(str::to_owned)
        .chain(args)
    {
        s.push(' ');
        s.push_str(&shell_quote(&a));
    }
    s
}

/// The exit statuses of a helper that did not run (125: not the expected file; 126/127: the
/// shell could not execute it). With no protocol line before them, nothing was done.
pub fn did_not_run(exit: Option<u32>) -> bool {
    matches!(exit, Some(125..=127))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_embeds_a_static_helper_and_its_hash() {
        assert!(available(), "build.rs did not build the helper");
        assert_eq!(&BINARY[..4], b"\x7fELF");
        use sha2::Digest;
        assert_eq!(hex::encode(sha2::Sha256::digest(BINARY)), SHA256);
    }

    #[test]
    fn a_relative_marker_home_is_under_home_and_every_word_is_quoted() {
        let id = crate::id::ExecutionId::parse("a1").unwrap();
        let op = Op::Watch {
            id: &id,
            out_off: 3,
            err_off: 0,
            wait: true,
        };
        let s = invocation(&op, ".cairn", "0123456789abcdef0123456789abcdef");
        assert!(s.starts_with(&format!("exec \"$HOME\"/'.cairn/bin/cairn-host-{SHA256}' ")));
        assert!(
            s.ends_with(" 'watch' '.cairn' '0123456789abcdef0123456789abcdef' 'a1' '3' '0' '1'")
        );
        let s = invocation(&Op::Hello, "/var/c", "0123456789abcdef0123456789abcdef");
        assert!(s.starts_with("exec '/var/c/bin/cairn-host-"));
    }
}
