//! Client side of the marker protocol (see `remote-scripts/PROTOCOL.md`).
//!
//! Builds the one exec string each operation sends (a bootstrap of a few hundred bytes that
//! runs the host script installed in the marker home, or reads it from stdin where it cannot
//! be installed, plus validated arguments, all single-quoted: never more than
//! [`MAX_EXEC_LEN`]), and splits what comes back: channel stdout is the command's
//! stdout, raw; channel stderr carries protocol lines `@@cairn-NONCE@@ KIND …\n` with the
//! command's raw stderr between them. The nonce is fresh per exec and never reaches the command,
//! so the command cannot forge a protocol line.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::id::ExecutionId;
use crate::recovery::Liveness;

/// Protocol version this client speaks.
pub const PROTOCOL_VERSION: &str = "1";

/// The host side, embedded at build time.
pub const SCRIPT_SOURCE: &str = include_str!("../remote-scripts/cairn.sh");

/// The script as sent for every mode but `session`: comment-only and blank lines removed (they
/// are for people reading the file, not for the wire; code lines never carry trailing
/// comments, so this is safe), and without the session mode's arm (a third of the script).
pub fn script() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| wire(false))
}

/// The script as sent for the `session` mode: all of it, comments removed.
pub fn session_script() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| wire(true))
}

fn wire(session: bool) -> String {
    let mut out = String::with_capacity(SCRIPT_SOURCE.len());
    let mut in_arm = false;
    for line in SCRIPT_SOURCE.lines() {
        let t = line.trim_start();
        if t.starts_with("# SESSION ARM BEGINS") {
            in_arm = true;
        } else if t.starts_with("# SESSION ARM ENDS") {
            in_arm = false;
        }
        if t.is_empty() || t.starts_with('#') || (in_arm && !session) {
            continue;
        }
        out.push_str(t);
        out.push('\n');
    }
    out
}

/// The longest command string cairn puts in an exec request. SSH servers cap it (Dropbear
/// closes the connection past 9,000 bytes), and wrappers behind `ForceCommand` log or filter
/// it; the host side never travels in it (`docs/HOST-HELPER.md`).
pub const MAX_EXEC_LEN: usize = 1024;

/// The SHA-256 of the host script as installed ([`session_script`]: every mode), lower-case hex.
pub fn script_sha256() -> &'static str {
    static S: OnceLock<String> = OnceLock::new();
    S.get_or_init(|| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(session_script().as_bytes()))
    })
}

/// The POSIX `cksum` of `data` (CRC-32/CKSUM over the bytes, then their length): how a host
/// without `sha256sum` checks the installed script.
pub fn cksum(data: &[u8]) -> u32 {
    let crc = crc::Crc::<u32>::new(&crc::CRC_32_CKSUM);
    let mut d = crc.digest();
    d.update(data);
    let mut n = data.len();
    while n > 0 {
        d.update(&[(n & 0xff) as u8]);
        n >>= 8;
    }
    d.finalize()
}

/// The installed script's path on the host, as shell words (`"$HOME"/'DIR/bin/…'` for a
/// relative DIR): its name carries its SHA-256.
pub fn script_path(dir: &str) -> String {
    let rel = format!("{dir}/bin/cairn-sh-{}", script_sha256());
    if dir.starts_with('/') {
        shell_quote(&rel)
    } else {
        format!("\"$HOME\"/{}", shell_quote(&rel))
    }
}

/// Whether an exec of the installed script that wrote no protocol line ran nothing: any exit
/// status says so (the script's first line, `hello`, comes before anything it does but make
/// the marker home; a missing file ends with 127, a shell's status for a missing command, a
/// corrupt one with the shell's syntax error, before any of it ran). No exit status: the
/// connection was lost.
pub fn script_did_not_run(exit: Option<u32>) -> bool {
    exit.is_some()
}

/// The bootstrap that installs the host script: its bytes on stdin, `LEN` of them, into
/// `DIR/tmp`, checked (length, then SHA-256 with `sha256sum`, else POSIX `cksum`), flushed,
/// and renamed into place as `DIR/bin/cairn-sh-SHA256`: the name never holds a partial or
/// unchecked file. Answers `installed`, or `error …`.
/// Arguments: DIR SHA256 LEN CKSUM NONCE.
pub const INSTALLER: &str = "umask 077;n=$5;d=$1;case $d in /*);;*)d=$HOME/$d;;esac;b=$d/bin;\
t=$d/tmp/i.$$;e(){ rm -f \"$t\";echo \"@@cairn-$n@@ error cannot install the host script \
in $b: $1\">&2;exit 1;};set -f;IFS=/;r=;for c in $b;do r=$r/$c;\
[ -L \"$r\" ]&&e \"$r is a symbolic link\";done;[ -L \"$d/tmp\" ]&&e \"$d/tmp is a symbolic link\";\
mkdir -p \"$d/tmp\" \"$b\"||e mkdir;cat>\"$t\"||e write;s=$(wc -c<\"$t\");\
[ \"${s##* }\" = \"$3\" ]||e \"stdin ended early\";if command -v sha256sum>/dev/null;\
then v=$(sha256sum<\"$t\");h=$2;else v=$(cksum<\"$t\");h=$4;fi;[ \"${v%% *}\" = \"$h\" ]||\
e \"checksum mismatch\";sync \"$t\" 2>/dev/null||sync;mv -f \"$t\" \"$b/cairn-sh-$2\"||e rename;\
sync \"$b\" 2>/dev/null;echo \"@@cairn-$n@@ installed\">&2";

/// The exec string that installs the host script into marker home `dir` (its bytes, the
/// [`session_script`], go on stdin), with `nonce` for its protocol lines.
pub fn install_invocation(dir: &str, nonce: &str) -> String {
    let text = session_script().as_bytes();
    let mut s = String::with_capacity(MAX_EXEC_LEN);
    s.push_str("exec /bin/sh -c ");
    s.push_str(&shell_quote(INSTALLER));
    s.push_str(" cairn");
    for a in [
        dir.to_owned(),
        script_sha256().to_owned(),
        text.len().to_string(),
        cksum(text).to_string(),
        nonce.to_owned(),
    ] {
        s.push(' ');
        s.push_str(&shell_quote(&a));
    }
    s
}

/// Quote bytes for a POSIX shell: `'…'`, with `'` written as `'\''`.
pub fn shell_quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('\'');
    for c in s.chars() {
        if c == '\'' {
            q.push_str("'\\''");
        } else {
            q.push(c);
        }
    }
    q.push('\'');
    q
}

/// A fresh 128-bit nonce in hex.
pub fn new_nonce() -> String {
    let n: u128 = rand::random();
    format!("{n:032x}")
}

/// The longest remote directory, shell-quoted, that an exec string carries.
pub const MAX_REMOTE_DIR: usize = 200;

/// Why a remote directory is refused before anything is sent.
pub fn validate_remote_dir(dir: &str) -> Result<(), String> {
    if dir.is_empty() {
        return Err("remote directory is empty".into());
    }
    if dir.contains(['\n', '\0']) {
        return Err("remote directory contains a newline or NUL".into());
    }
    if dir.split('/').any(|c| c == "..") {
        return Err(format!("remote directory {dir:?} contains '..'"));
    }
    // (it appears twice in an exec string, which stays within MAX_EXEC_LEN)
    if shell_quote(dir).len() > MAX_REMOTE_DIR {
        return Err(format!(
            "remote directory {dir:?} is too long: at most {MAX_REMOTE_DIR} bytes, quoted"
        ));
    }
    Ok(())
}

/// One operation on the host.
#[derive(Clone, Debug)]
pub enum Op<'a> {
    Hello,
    Dispatch {
        id: &'a ExecutionId,
        len: usize,
        digest: &'a str,
        timeout_secs: u64,
        attach: bool,
    },
    /// A dispatch whose stdin carries, after the command, `secrets_len` bytes of secret
    /// `export NAME='value'` lines, for the supervisor to pass to the command in memory. The
    /// extra argument needs a host script with secret support; one without refuses the call
    /// (`bad arguments`), so the command never runs without its secrets.
    DispatchWithSecrets {
        id: &'a ExecutionId,
        len: usize,
        digest: &'a str,
        timeout_secs: u64,
        attach: bool,
        secrets_len: usize,
    },
    Watch {
        id: &'a ExecutionId,
        out_off: u64,
        err_off: u64,
        wait: bool,
    },
    Cancel {
        id: &'a ExecutionId,
        grace_secs: u64,
    },
    /// Remove output past `output_age_secs` and records (the tombstone) past
    /// `tombstone_age_secs`, for finished executions only.
    Gc {
        output_age_secs: u64,
        tombstone_age_secs: u64,
        /// The SHA-256 of the native helper this client uses: helpers of other versions in
        /// the marker home are removed too.
        keep_helper: Option<&'a str>,
    },
    /// `hello` that also reports the host's architecture and the state of the native helper
    /// with this SHA-256 (`Hello::arch`, `Hello::helper`).
    Probe {
        helper_sha256: &'a str,
    },
    /// Store the native helper (its bytes on stdin) under the marker home, checked; answered
    /// by `helper STATE` ([`Line::Helper`]).
    Install {
        helper_sha256: &'a str,
        len: usize,
    },
    /// A long-lived exec that starts many dispatches, batched (see `SessionDemux` and
    /// `remote-scripts/PROTOCOL.md`, Session).
    Session,
}

/// The mode and the arguments after DIR NONCE, the same for both host implementations.
pub(crate) fn mode_args(op: &Op<'_>) -> (&'static str, Vec<String>) {
    let b = |v: bool| if v { "1" } else { "0" }.to_string();
    match op {
        Op::Hello => ("hello", vec![]),
        Op::Probe { helper_sha256 } => ("hello", vec![helper_sha256.to_string()]),
        Op::Install { helper_sha256, len } => {
            ("install", vec![helper_sha256.to_string(), len.to_string()])
        }
        Op::Session => ("session", vec![]),
        Op::Dispatch {
            id,
            len,
            digest,
            timeout_secs,
            attach,
        } => (
            "dispatch",
            vec![
                id.to_string(),
                len.to_string(),
                digest.to_string(),
                timeout_secs.to_string(),
                b(*attach),
            ],
        ),
        Op::DispatchWithSecrets {
            id,
            len,
            digest,
            timeout_secs,
            attach,
            secrets_len,
        } => (
            "dispatch",
            vec![
                id.to_string(),
                len.to_string(),
                digest.to_string(),
                timeout_secs.to_string(),
                b(*attach),
                secrets_len.to_string(),
            ],
        ),
        Op::Watch {
            id,
            out_off,
            err_off,
            wait,
        } => (
            "watch",
            vec![
                id.to_string(),
                out_off.to_string(),
                err_off.to_string(),
                b(*wait),
            ],
        ),
        Op::Cancel { id, grace_secs } => ("cancel", vec![id.to_string(), grace_secs.to_string()]),
        Op::Gc {
            output_age_secs,
            tombstone_age_secs,
            keep_helper,
        } => {
            let mut v = vec![output_age_secs.to_string(), tombstone_age_secs.to_string()];
            v.extend(keep_helper.map(str::to_owned));
            ("gc", v)
        }
    }
}

/// The exec string for `op` against marker home `dir`, with `nonce`: the sh script installed
/// in the marker home (`install_invocation`). Where it is not there, the exec ends with
/// status 127 (a shell's missing command) before anything else happens.
pub fn invocation(op: &Op<'_>, dir: &str, nonce: &str) -> String {
    let mut s = String::with_capacity(MAX_EXEC_LEN);
    s.push_str("exec /bin/sh -c '[ -f \"$1\" ]||exit 127;. \"$1\"' cairn ");
    s.push_str(&script_path(dir));
    push_args(&mut s, op, dir, nonce);
    s
}

/// The exec string for `op` when the script cannot be installed (a read-only marker home):
/// the script goes on the exec's stdin, as `LEN\n` and LEN bytes, ahead of the operation's
/// own stdin. Returns the exec string and those leading bytes.
pub fn streamed_invocation(op: &Op<'_>, dir: &str, nonce: &str) -> (String, Vec<u8>) {
    let text = match op {
        Op::Session => session_script(),
        _ => script(),
    };
    let mut s = String::with_capacity(MAX_EXEC_LEN);
    s.push_str(
        "exec /bin/sh -c 'IFS= read -r n||exit 127;s=$(dd bs=1 count=\"$n\" 2>/dev/null;echo .);\
         set -- \"${s%.}\" \"$@\";eval \"$1\"' cairn",
    );
    push_args(&mut s, op, dir, nonce);
    let mut lead = format!("{}\n", text.len()).into_bytes();
    lead.extend_from_slice(text.as_bytes());
    (s, lead)
}

fn push_args(s: &mut String, op: &Op<'_>, dir: &str, nonce: &str) {
    let (mode, args) = mode_args(op);
    for a in [mode.to_string(), dir.to_string(), nonce.to_string()]
        .into_iter()
        .chain(args)
    {
        s.push(' ');
        s.push_str(&shell_quote(&a));
    }
}

/// Why a reply of the marker protocol (a line the host wrote after the nonce's boundary, or a
/// record in it) cannot be read.
///
/// Layer: the marker protocol (`src/marker.rs`, and `src/session.rs`, which carries its lines
/// to the executions of a host session). The executor converts it at its boundary: a line that
/// does not parse makes the probe's verdict `unreadable` (`Probe::Unreadable`, its Display
/// quoted), and where it ends an operation (preparing the host: hello, probe, install) the host
/// link carries it as `LinkError::Host`, which the executor makes `ExecError::HostReported`.
/// Its Display is the message users see, quoted after what cairn was doing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MarkerError {
    /// A token of a `key=value …` record without its `=`.
    #[error("field {0:?} is not key=value")]
    NotKeyValue(String),
    /// A field the line or record must carry is not there.
    #[error("field {0} missing")]
    MissingField(String),
    /// A numeric field that is not a number.
    #[error("field {field}={value:?} is not a number")]
    NotANumber { field: String, value: String },
    /// The record was written by a protocol version this build does not speak.
    #[error("written by marker protocol version {0}; this cairn reads version {PROTOCOL_VERSION}")]
    Version(String),
    /// A finish record whose exit status is not 0-255.
    #[error("status {0} out of range")]
    StatusOutOfRange(u64),
    /// A `start` or `done` line whose record does not parse (`which`: `started record`,
    /// `finish record`).
    #[error("{which}: {source}")]
    Record {
        which: &'static str,
        source: Box<MarkerError>,
    },
    /// A `live` line with a state this build does not know.
    #[error("unknown liveness {0:?}")]
    UnknownLiveness(String),
    /// A line whose kind this build does not know.
    #[error("unknown protocol line {0:?}")]
    UnknownLine(String),
    /// A line longer than the protocol allows (no newline within 64 KiB).
    #[error("protocol line too long")]
    LineTooLong,
}

/// A parsed `key=value …` record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fields(BTreeMap<String, String>);

impl Fields {
    pub fn parse(text: &str) -> Result<Fields, MarkerError> {
        let mut m = BTreeMap::new();
        for tok in text.split_ascii_whitespace() {
            let (k, v) = tok
                .split_once('=')
                .ok_or_else(|| MarkerError::NotKeyValue(tok.to_owned()))?;
            m.insert(k.to_owned(), v.to_owned());
        }
        Ok(Fields(m))
    }
    pub fn get(&self, k: &str) -> Result<&str, MarkerError> {
        self.0
            .get(k)
            .map(|s| s.as_str())
            .ok_or_else(|| MarkerError::MissingField(k.to_owned()))
    }
    pub fn num(&self, k: &str) -> Result<u64, MarkerError> {
        let v = self.get(k)?;
        v.parse().map_err(|_| MarkerError::NotANumber {
            field: k.to_owned(),
            value: v.to_owned(),
        })
    }
    fn check_version(&self) -> Result<(), MarkerError> {
        match self.get("v")? {
            PROTOCOL_VERSION => Ok(()),
            other => Err(MarkerError::Version(other.to_owned())),
        }
    }
}

/// The host's answer to `hello` (first line of every reply).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Hello {
    pub epoch: String,
    pub boot: String,
    pub now: u64,
    /// The host's architecture (`uname -m`), when asked ([`Op::Probe`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// The native helper's state there (`ok`, `absent`, `mismatch`, `unrunnable`), when
    /// asked ([`Op::Probe`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub helper: Option<String>,
}

/// The started record: written and flushed on the host before the command started.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StartRecord {
    pub id: String,
    pub len: u64,
    pub digest: String,
    pub epoch: String,
    pub boot: String,
    pub sup_pid: u64,
    pub sup_start: u64,
    pub started_at: u64,
    pub timeout: u64,
}

impl StartRecord {
    pub fn parse(text: &str) -> Result<StartRecord, MarkerError> {
        let f = Fields::parse(text)?;
        f.check_version()?;
        Ok(StartRecord {
            id: f.get("id")?.to_owned(),
            len: f.num("len")?,
            digest: f.get("digest")?.to_owned(),
            epoch: f.get("epoch")?.to_owned(),
            boot: f.get("boot")?.to_owned(),
            sup_pid: f.num("sup_pid")?,
            sup_start: f.num("sup_start")?,
            started_at: f.num("started_at")?,
            timeout: f.num("timeout")?,
        })
    }
}

/// The finish record: flushed on the host before anyone is told the command finished.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FinishRecord {
    pub id: String,
    /// What the supervising shell's `wait` reported: 0-255, 128+N after signal N.
    pub status: u8,
    pub finished_at: u64,
    pub out: u64,
    pub err: u64,
    pub timed_out: bool,
    pub cancelled: bool,
}

impl FinishRecord {
    pub fn parse(text: &str) -> Result<FinishRecord, MarkerError> {
        let f = Fields::parse(text)?;
        f.check_version()?;
        let status = f.num("status")?;
        Ok(FinishRecord {
            id: f.get("id")?.to_owned(),
            status: u8::try_from(status).map_err(|_| MarkerError::StatusOutOfRange(status))?,
            finished_at: f.num("finished_at")?,
            out: f.num("out")?,
            err: f.num("err")?,
            timed_out: f.num("timed_out")? == 1,
            cancelled: f.num("cancelled")? == 1,
        })
    }

    /// The signal that ended the command, when the shell's status says so (129..=192).
    pub fn signal(&self) -> Option<String> {
        let n = self
            .status
            .checked_sub(128)
            .filter(|n| (1..=64).contains(n))?;
        Some(
            signal_name(n)
                .map(str::to_owned)
                .unwrap_or_else(|| n.to_string()),
        )
    }
}

fn signal_name(n: u8) -> Option<&'static str> {
    Some(match n {
        1 => "HUP",
        2 => "INT",
        3 => "QUIT",
        4 => "ILL",
        6 => "ABRT",
        8 => "FPE",
        9 => "KILL",
        11 => "SEGV",
        13 => "PIPE",
        14 => "ALRM",
        15 => "TERM",
        _ => return None,
    })
}

/// One protocol line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    Hello(Hello),
    Error(String),
    Verdict(String),
    Absent,
    Start(StartRecord),
    Live(Liveness),
    Sizes {
        out: u64,
        err: u64,
    },
    Done(FinishRecord),
    Cancel(String),
    /// The execution's output was removed by gc; only its records remain.
    OutputGone,
    /// What a gc pass did (`removed_output=N removed_tombstones=M unfinished=K`).
    Gc(String),
    /// `install`: the native helper's state after storing it (`ok`: in place and runs).
    Helper(String),
    /// The host script is in place in the marker home (`install_invocation`).
    Installed,
    End,
}

/// Parse the text of one protocol line (after the boundary, without the newline).
pub fn parse_line(text: &str) -> Result<Line, MarkerError> {
    let (kind, rest) = text.split_once(' ').unwrap_or((text, ""));
    Ok(match kind {
        "hello" => {
            let f = Fields::parse(rest)?;
            f.check_version()?;
            Line::Hello(Hello {
                epoch: f.get("epoch")?.to_owned(),
                boot: f.get("boot")?.to_owned(),
                now: f.num("now")?,
                arch: f.get("arch").ok().map(str::to_owned),
                helper: f.get("helper").ok().map(str::to_owned),
            })
        }
        "error" => Line::Error(rest.to_owned()),
        "verdict" => Line::Verdict(rest.trim().to_owned()),
        "absent" => Line::Absent,
        "start" => Line::Start(StartRecord::parse(rest).map_err(|e| record("started record", e))?),
        "live" => Line::Live(match rest.trim() {
            "alive" => Liveness::Alive,
            "dead" => Liveness::Dead,
            "rebooted" => Liveness::Rebooted,
            other => return Err(MarkerError::UnknownLiveness(other.to_owned())),
        }),
        "sizes" => {
            let f = Fields::parse(rest)?;
            Line::Sizes {
                out: f.num("out")?,
                err: f.num("err")?,
            }
        }
        "done" => Line::Done(FinishRecord::parse(rest).map_err(|e| record("finish record", e))?),
        "cancel" => Line::Cancel(rest.trim().to_owned()),
        "gone" => Line::OutputGone,
        "gc" => Line::Gc(rest.trim().to_owned()),
        "helper" => Line::Helper(rest.trim().to_owned()),
        "installed" => Line::Installed,
        "end" => Line::End,
        other => return Err(MarkerError::UnknownLine(other.to_owned())),
    })
}

fn record(which: &'static str, e: MarkerError) -> MarkerError {
    MarkerError::Record {
        which,
        source: Box::new(e),
    }
}

/// What the demultiplexer yields.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// Command stderr bytes.
    Stderr(Vec<u8>),
    /// A protocol line (or why it did not parse).
    Line(Result<Line, MarkerError>),
}

/// Splits the channel's stderr stream into command stderr and protocol lines.
///
/// Bytes that could be the start of a boundary are held back until it is clear whether they
/// are; everything else is released at once, so live stderr stays live.
pub struct StderrDemux {
    boundary: Vec<u8>,
    buf: Vec<u8>,
    /// Inside a protocol line (boundary seen, newline not yet).
    in_line: bool,
}

/// Longest protocol line accepted; a longer one is an error, not a memory sink.
const MAX_LINE: usize = 64 * 1024;

impl StderrDemux {
    pub fn new(nonce: &str) -> Self {
        StderrDemux {
            boundary: format!("@@cairn-{nonce}@@ ").into_bytes(),
            buf: Vec::new(),
            in_line: false,
        }
    }

    pub fn feed(&mut self, data: &[u8], out: &mut Vec<Piece>) {
        self.buf.extend_from_slice(data);
        loop {
            if self.in_line {
                match self.buf.iter().position(|&b| b == b'\n') {
                    Some(nl) => {
                        let line: Vec<u8> = self.buf.drain(..=nl).collect();
                        let text = String::from_utf8_lossy(&line[..nl]);
                        out.push(Piece::Line(parse_line(&text)));
                        self.in_line = false;
                    }
                    None => {
                        if self.buf.len() > MAX_LINE {
                            out.push(Piece::Line(Err(MarkerError::LineTooLong)));
                            self.buf.clear();
                            self.in_line = false;
                        }
                        return;
                    }
                }
            } else {
                match find(&self.buf, &self.boundary) {
                    Some(pos) => {
                        if pos > 0 {
                            out.push(Piece::Stderr(self.buf[..pos].to_vec()));
                        }
                        self.buf.drain(..pos + self.boundary.len());
                        self.in_line = true;
                    }
                    None => {
                        // Keep the longest suffix that is a prefix of the boundary.
                        let keep = partial_suffix(&self.buf, &self.boundary);
                        let release = self.buf.len() - keep;
                        if release > 0 {
                            out.push(Piece::Stderr(self.buf[..release].to_vec()));
                            self.buf.drain(..release);
                        }
                        return;
                    }
                }
            }
        }
    }

    /// Bytes held back when the stream ended (a stream that ends mid-boundary).
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// One dispatch request of a session: its header line, the command as whole lines (a newline
/// added after a last line without one, flagged so that the host leaves it out), and the line
/// after them that proves they all arrived (`e`). A batch of these is followed by `g\n`. The
/// host reads the lines with the shell's `read`, so a command with a NUL byte cannot go this
/// way (see `session_can_carry`).
pub fn session_request(
    id: &ExecutionId,
    digest: &str,
    timeout_secs: u64,
    command: &[u8],
) -> Vec<u8> {
    let open = !command.is_empty() && !command.ends_with(b"\n");
    let lines = command.iter().filter(|&&b| b == b'\n').count() + usize::from(open);
    let mut v = format!(
        "d {id} {} {digest} {timeout_secs} {lines} {}\n",
        command.len(),
        u8::from(open)
    )
    .into_bytes();
    v.extend_from_slice(command);
    if open {
        v.push(b'\n');
    }
    v.extend_from_slice(b"e\n");
    v
}

/// Whether a session can carry `command` byte for byte (no NUL byte: the host's `read` would
/// drop it).
pub fn session_can_carry(command: &[u8]) -> bool {
    !command.contains(&0)
}

/// What a session's stdout carries.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionItem {
    /// A line about the session itself (`hello`, `error`, `end`).
    Session(Result<Line, MarkerError>),
    /// A line about one execution of the session.
    For(String, Result<Line, MarkerError>),
    /// Output bytes of one execution (stdout when `stderr` is false).
    Output {
        id: String,
        stderr: bool,
        data: Vec<u8>,
    },
    /// The stream is not what the protocol says; nothing after this can be trusted.
    Broken(String),
}

/// Splits a session's stdout: protocol lines `B KIND …` (the session) and `B =ID KIND …`
/// (one execution), and output frames `B =ID out N` / `B =ID err N` followed by exactly N
/// bytes. Everything must be one of these: anything else breaks the stream.
pub struct SessionDemux {
    boundary: Vec<u8>,
    buf: Vec<u8>,
    /// Inside an output frame: (ID, stderr?, bytes still to come).
    frame: Option<(String, bool, usize)>,
    broken: bool,
}

impl SessionDemux {
    pub fn new(nonce: &str) -> Self {
        SessionDemux {
            boundary: format!("@@cairn-{nonce}@@ ").into_bytes(),
            buf: Vec::new(),
            frame: None,
            broken: false,
        }
    }

    pub fn feed(&mut self, data: &[u8], out: &mut Vec<SessionItem>) {
        if self.broken {
            return;
        }
        self.buf.extend_from_slice(data);
        let mut at = 0;
        loop {
            if let Some((id, stderr, left)) = &mut self.frame {
                let take = (*left).min(self.buf.len() - at);
                if take > 0 {
                    out.push(SessionItem::Output {
                        id: id.clone(),
                        stderr: *stderr,
                        data: self.buf[at..at + take].to_vec(),
                    });
                    at += take;
                    *left -= take;
                }
                if *left > 0 {
                    break;
                }
                self.frame = None;
                continue;
            }
            let rest = &self.buf[at..];
            let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                if rest.len() > MAX_LINE {
                    self.fail(out, "session protocol line too long".into());
                    return;
                }
                break;
            };
            if !rest.starts_with(&self.boundary) {
                let shown = String::from_utf8_lossy(&rest[..nl.min(80)]).into_owned();
                self.fail(out, format!("session stream out of step at {shown:?}"));
                return;
            }
            let text = String::from_utf8_lossy(&rest[self.boundary.len()..nl]).into_owned();
            at += nl + 1;
            let Some(tagged) = text.strip_prefix('=') else {
                out.push(SessionItem::Session(parse_line(&text)));
                continue;
            };
            let (id, line) = tagged.split_once(' ').unwrap_or((tagged, ""));
            if ExecutionId::parse(id).is_err() {
                self.fail(out, format!("session line for a malformed ID {id:?}"));
                return;
            }
            let (kind, n) = line.split_once(' ').unwrap_or((line, ""));
            if kind == "out" || kind == "err" {
                match n.parse::<usize>() {
                    Ok(n) => self.frame = Some((id.to_owned(), kind == "err", n)),
                    Err(_) => {
                        self.fail(out, format!("bad output frame length {n:?}"));
                        return;
                    }
                }
                continue;
            }
            out.push(SessionItem::For(id.to_owned(), parse_line(line)));
        }
        self.buf.drain(..at);
    }

    fn fail(&mut self, out: &mut Vec<SessionItem>, why: String) {
        self.broken = true;
        self.buf.clear();
        out.push(SessionItem::Broken(why));
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= hay.len() {
        match hay[i..].iter().position(|&b| b == first) {
            Some(off) => {
                i += off;
                if i + needle.len() <= hay.len() && &hay[i..i + needle.len()] == needle {
                    return Some(i);
                }
                i += 1;
            }
            None => return None,
        }
    }
    None
}

fn partial_suffix(hay: &[u8], needle: &[u8]) -> usize {
    let max = needle.len().saturating_sub(1).min(hay.len());
    (1..=max)
        .rev()
        .find(|&k| hay[hay.len() - k..] == needle[..k])
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages users read (quoted in probes and in "preparing the host failed") are the
    /// ones the protocol's parsers wrote as strings before they had a type.
    #[test]
    fn marker_errors_keep_their_messages() {
        let msg = |t: &str| parse_line(t).unwrap_err().to_string();
        assert_eq!(msg("frobnicate"), "unknown protocol line \"frobnicate\"");
        assert_eq!(msg("live odd"), "unknown liveness \"odd\"");
        assert_eq!(msg("hello v=1 x"), "field \"x\" is not key=value");
        assert_eq!(msg("hello v=1 epoch=e"), "field boot missing");
        assert_eq!(
            msg("hello v=1 epoch=e boot=b now=x"),
            "field now=\"x\" is not a number"
        );
        assert_eq!(
            msg("hello v=2 epoch=e boot=b now=1"),
            "written by marker protocol version 2; this cairn reads version 1"
        );
        assert_eq!(msg("start v=1 id=a"), "started record: field len missing");
        let done = "done v=1 id=a status=300 finished_at=1 out=0 err=0 timed_out=0 cancelled=0";
        assert_eq!(msg(done), "finish record: status 300 out of range");
        assert_eq!(
            MarkerError::LineTooLong.to_string(),
            "protocol line too long"
        );
    }

    const N: &str = "0123456789abcdef0123456789abcdef";

    fn b(line: &str) -> Vec<u8> {
        format!("@@cairn-{N}@@ {line}\n").into_bytes()
    }

    fn run(chunks: &[&[u8]]) -> (Vec<u8>, Vec<Line>) {
        let mut d = StderrDemux::new(N);
        let mut pieces = Vec::new();
        for c in chunks {
            d.feed(c, &mut pieces);
        }
        let mut err = Vec::new();
        let mut lines = Vec::new();
        for p in pieces {
            match p {
                Piece::Stderr(s) => err.extend(s),
                Piece::Line(l) => lines.push(l.unwrap()),
            }
        }
        (err, lines)
    }

    #[test]
    fn splits_lines_from_raw_stderr_at_any_chunking() {
        let mut all = b("hello v=1 epoch=e1 boot=b/1 now=5");
        all.extend_from_slice(b"oops\n@@cairn-not-ours@@ x\npartial @@cai");
        all.extend(b(
            "done v=1 id=a status=3 finished_at=9 out=1 err=2 timed_out=0 cancelled=0",
        ));
        all.extend(b("end"));
        for size in [1, 2, 3, 7, 50, all.len()] {
            let chunks: Vec<&[u8]> = all.chunks(size).collect();
            let (err, lines) = run(&chunks);
            assert_eq!(
                err, b"oops\n@@cairn-not-ours@@ x\npartial @@cai",
                "chunk {size}"
            );
            assert_eq!(lines.len(), 3);
            assert!(matches!(&lines[1], Line::Done(f) if f.status == 3 && f.err == 2));
            assert_eq!(lines[2], Line::End);
        }
    }

    #[test]
    fn session_stream_splits_lines_and_frames_at_any_chunking() {
        let mut all = b("hello v=1 epoch=e1 boot=b/1 now=5");
        all.extend(b("=a1 verdict started"));
        all.extend(b("=a1 out 5"));
        all.extend_from_slice(b"x\n\0@@");
        all.extend(b("=a1 err 0"));
        all.extend(b(
            "=a1 done v=1 id=a1 status=3 finished_at=9 out=5 err=0 timed_out=0 cancelled=0",
        ));
        all.extend(b("=a1 end"));
        all.extend(b("end"));
        for size in [1, 2, 3, 7, 50, all.len()] {
            let mut d = SessionDemux::new(N);
            let mut items = Vec::new();
            for c in all.chunks(size) {
                d.feed(c, &mut items);
            }
            let mut out = Vec::new();
            let mut kinds = Vec::new();
            for i in items {
                match i {
                    SessionItem::Output { id, stderr, data } => {
                        assert_eq!((id.as_str(), stderr), ("a1", false));
                        out.extend(data);
                    }
                    SessionItem::For(id, l) => kinds.push(format!("{id}:{:?}", l.unwrap())),
                    SessionItem::Session(l) => kinds.push(format!("{:?}", l.unwrap())),
                    SessionItem::Broken(w) => panic!("broken at chunk {size}: {w}"),
                }
            }
            assert_eq!(out, b"x\n\0@@", "chunk {size}");
            assert_eq!(kinds.len(), 5, "chunk {size}: {kinds:?}");
            assert!(kinds[1].starts_with("a1:Verdict"));
            assert!(kinds[2].starts_with("a1:Done"));
            assert_eq!(kinds[4], "End");
        }
    }

    #[test]
    fn a_session_stream_out_of_step_is_broken_not_guessed() {
        for bad in [
            b"stray bytes\n".to_vec(),
            b("=../x verdict started"),
            b("=a1 out many"),
        ] {
            let mut d = SessionDemux::new(N);
            let mut items = Vec::new();
            d.feed(&bad, &mut items);
            d.feed(&b("=a1 end"), &mut items);
            assert_eq!(items.len(), 1, "{items:?}");
            assert!(matches!(items[0], SessionItem::Broken(_)));
        }
    }

    #[test]
    fn a_session_request_carries_the_command_bytes_exactly() {
        let id = ExecutionId::parse("r1").unwrap();
        assert_eq!(
            session_request(&id, "ab", 7, b"a\nb'\\"),
            b"d r1 5 ab 7 2 1\na\nb'\\\ne\n"
        );
        assert_eq!(
            session_request(&id, "ab", 0, b"x\n\n"),
            b"d r1 3 ab 0 2 0\nx\n\ne\n"
        );
        assert_eq!(session_request(&id, "ab", 0, b""), b"d r1 0 ab 0 0 0\ne\n");
        assert!(!session_can_carry(b"a\0b"));
        assert!(session_can_carry("é\r\n".as_bytes()));
    }

    #[test]
    fn refuses_other_protocol_versions() {
        assert!(parse_line("hello v=2 epoch=e boot=b now=1").is_err());
        assert!(parse_line("start v=0 id=a").is_err());
        assert!(parse_line("frobnicate").is_err());
    }

    #[test]
    fn signal_is_derived_from_shell_status() {
        let mut f = FinishRecord::parse(
            "v=1 id=a status=143 finished_at=1 out=0 err=0 timed_out=1 cancelled=0   ",
        )
        .unwrap();
        assert_eq!(f.signal().as_deref(), Some("TERM"));
        f.status = 3;
        assert_eq!(f.signal(), None);
    }

    #[test]
    fn quoting_survives_hostile_text() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
        assert_eq!(shell_quote(""), "''");
    }

    /// Every operation at its longest arguments: an ID of 128 bytes, a remote directory at
    /// its quoted limit, numbers of 15 digits.
    fn longest_ops(id: &ExecutionId) -> Vec<Op<'_>> {
        let big = 999_999_999_999_999;
        let d = "f".repeat(64);
        let d: &'static str = Box::leak(d.into_boxed_str());
        vec![
            Op::Hello,
            Op::Probe { helper_sha256: d },
            Op::Install {
                helper_sha256: d,
                len: big,
            },
            Op::Session,
            Op::DispatchWithSecrets {
                id,
                len: big,
                digest: d,
                timeout_secs: big as u64,
                attach: true,
                secrets_len: big,
            },
            Op::Watch {
                id,
                out_off: big as u64,
                err_off: big as u64,
                wait: true,
            },
            Op::Cancel {
                id,
                grace_secs: big as u64,
            },
            Op::Gc {
                output_age_secs: big as u64,
                tombstone_age_secs: big as u64,
                keep_helper: Some(d),
            },
        ]
    }

    #[test]
    fn no_exec_string_exceeds_one_kib_first_contact_included() {
        let id = ExecutionId::parse(&"i".repeat(128)).unwrap();
        let rel = "d".repeat(MAX_REMOTE_DIR - 2);
        let abs = format!("/{}", "d".repeat(MAX_REMOTE_DIR - 3));
        let quotes = "'".repeat(MAX_REMOTE_DIR / 4 - 1);
        let mut longest = 0;
        for dir in [rel.as_str(), abs.as_str(), quotes.as_str()] {
            assert!(validate_remote_dir(dir).is_ok(), "{}", dir.len());
            let mut all = vec![install_invocation(dir, N)];
            for op in longest_ops(&id) {
                all.push(invocation(&op, dir, N));
                all.push(streamed_invocation(&op, dir, N).0);
                all.push(crate::host_helper::invocation(&op, dir, N));
            }
            for s in all {
                longest = longest.max(s.len());
                assert!(s.len() <= MAX_EXEC_LEN, "{} bytes: {s}", s.len());
            }
        }
        assert!(validate_remote_dir(&"d".repeat(MAX_REMOTE_DIR - 1)).is_err());
        // the script itself is far larger: it is installed or streamed, never inlined
        assert!(session_script().len() > 20 * MAX_EXEC_LEN);
        assert!(longest > MAX_EXEC_LEN / 2, "{longest}");
        eprintln!("the longest exec string: {longest} bytes");
    }

    #[test]
    fn the_streamed_script_is_length_framed_ahead_of_the_operation_stdin() {
        let id = ExecutionId::parse("a1").unwrap();
        let (_, lead) = streamed_invocation(&Op::Hello, "/d", N);
        let nl = lead.iter().position(|&b| b == b'\n').unwrap();
        let n: usize = std::str::from_utf8(&lead[..nl]).unwrap().parse().unwrap();
        assert_eq!(&lead[nl + 1..], script().as_bytes());
        assert_eq!(n, script().len());
        let (_, lead) = streamed_invocation(&Op::Session, "/d", N);
        assert!(lead.ends_with(session_script().as_bytes()));
        let (s, _) = streamed_invocation(
            &Op::Cancel {
                id: &id,
                grace_secs: 2,
            },
            "/d",
            N,
        );
        assert!(s.ends_with(" 'cancel' '/d' '0123456789abcdef0123456789abcdef' 'a1' '2'"));
    }

    #[test]
    fn the_installed_script_is_named_by_its_hash() {
        assert_eq!(script_sha256().len(), 64);
        let p = script_path(".cairn");
        assert_eq!(
            p,
            format!("\"$HOME\"/'.cairn/bin/cairn-sh-{}'", script_sha256())
        );
        assert!(invocation(&Op::Hello, ".cairn", N).contains(&p));
        let i = install_invocation("/d", N);
        assert!(i.contains(&format!(" '{}' ", script_sha256())));
        assert!(i.contains(&format!(" '{}' ", cksum(session_script().as_bytes()))));
    }

    #[test]
    fn cksum_is_the_posix_one() {
        // the values coreutils' and busybox's cksum print
        assert_eq!(cksum(b""), 4_294_967_295);
        assert_eq!(cksum(b"hello\n"), 3_015_617_425);
        assert_eq!(cksum(&[0; 100_000]), 1_260_869_142);
    }

    #[test]
    fn the_wire_script_has_no_comment_lines() {
        assert!(!script().lines().any(|l| l.starts_with('#')));
        assert!(!session_script().lines().any(|l| l.starts_with('#')));
    }

    #[test]
    fn only_the_session_exec_carries_the_session_arm() {
        assert!(session_script().contains("\nsession)\n"));
        assert!(!script().contains("\nsession)\n"));
        assert!(
            script().len() * 10 < session_script().len() * 8,
            "{}",
            script().len()
        );
        // both are whole scripts: the case statement still closes
        assert!(script().contains("\nesac\nsay end\n"));
        assert!(session_script().contains("\nesac\nsay end\n"));
    }

    #[test]
    fn remote_dir_validation() {
        assert!(validate_remote_dir(".cairn").is_ok());
        assert!(validate_remote_dir("/var/lib/cairn").is_ok());
        assert!(validate_remote_dir("../x").is_err());
        assert!(validate_remote_dir("a\nb").is_err());
        assert!(validate_remote_dir("").is_err());
    }
}
