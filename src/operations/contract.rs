//! The operations file: its format, parsing, and what one call of an operation becomes.
//!
//! Parsing keeps the line of every key, so [`super::check`] can point at the line to fix. A
//! file is handed out ([`OperationsFile::parse`]) only when no check finds anything.
//!
//! A call ([`Operation::call`]) turns the caller's arguments into canonical values: unknown
//! arguments are refused, each value is checked against its type (pattern, enum, range) before
//! anything is contacted, defaults are filled in, enum values and booleans take one spelling.
//! From those values come the bytes sent to the host ([`Call::command`]: every argv word quoted
//! for the shell as one word) and the record the fingerprint is computed over
//! ([`Call::operation_ref`], [`Call::canonical_argv`]).

use std::collections::BTreeMap;
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use toml::Spanned;

use crate::intent::{quote_word, Intent, OpClass, OperationRef};

/// The placeholder for the execution ID.
pub const EXECUTION_ID: &str = "execution_id";

/// Longest string value accepted when an argument sets no `max_len`.
pub const DEFAULT_MAX_LEN: usize = 4096;

/// Longest `max_len` an argument may set (the host reads the command as a script).
pub const MAX_MAX_LEN: usize = 1 << 20;

// ----- the file as written ------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    groups: BTreeMap<Spanned<String>, Vec<String>>,
    #[serde(default)]
    operations: BTreeMap<Spanned<String>, RawOp>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOp {
    description: Option<String>,
    class: Option<Spanned<String>>,
    retention: Option<Spanned<toml::Value>>,
    timeout: Option<Spanned<toml::Value>>,
    approval: Option<Spanned<String>>,
    hosts: Option<Spanned<Vec<String>>>,
    host_pattern: Option<Spanned<String>>,
    group: Option<Spanned<String>>,
    host_arg: Option<Spanned<String>>,
    argv: Option<Spanned<Vec<Spanned<String>>>>,
    cwd: Option<Spanned<String>>,
    #[serde(default)]
    env: BTreeMap<Spanned<String>, Spanned<String>>,
    secrets: Option<Spanned<toml::Value>>,
    #[serde(default)]
    args: BTreeMap<Spanned<String>, RawArg>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawArg {
    #[serde(rename = "type")]
    ty: Option<String>,
    description: Option<String>,
    pattern: Option<String>,
    #[serde(rename = "enum")]
    choices: Option<Vec<String>>,
    #[serde(default)]
    aliases: BTreeMap<String, String>,
    max_len: Option<usize>,
    min: Option<i64>,
    max: Option<i64>,
    default: Option<toml::Value>,
    required: Option<bool>,
    fingerprint: Option<bool>,
}

// ----- the file as understood ---------------------------------------------------------------

/// A checked operations file.
#[derive(Clone, Debug)]
pub struct OperationsFile {
    /// Where it came from (a path, for messages).
    pub source: String,
    /// Inventory groups: name → destinations.
    pub groups: BTreeMap<String, Vec<String>>,
    /// The operations, by name.
    pub operations: BTreeMap<String, Operation>,
}

/// How a new execution of an operation is authorized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Approval {
    /// The caller's request is the approval (within the server's own `--approve`/`--policy`).
    Caller,
    /// The server's policy file must allow it; without one it is refused.
    Policy,
    /// A person confirms on the terminal; a server without one refuses.
    Prompt,
}

impl Approval {
    pub fn as_str(self) -> &'static str {
        match self {
            Approval::Caller => "caller",
            Approval::Policy => "policy",
            Approval::Prompt => "prompt",
        }
    }
}

/// Where an operation may run.
#[derive(Clone, Debug)]
pub enum Destination {
    /// Exactly these destinations.
    Hosts(Vec<String>),
    /// Any destination matching this (anchored) pattern; an argument names it.
    Pattern(String, Regex),
    /// The members of an inventory group of the file.
    Group(String),
    /// None was given (a check finding).
    Missing,
}

/// One word of an argv template, or one environment value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Word {
    Lit(String),
    /// `{name}`: the whole word is the argument's value.
    Arg(String),
    /// `{execution_id}`.
    ExecutionId,
    /// Braces that are not one whole placeholder (a check finding).
    Mixed(String),
}

/// An argument's type.
#[derive(Clone, Debug)]
pub enum ArgType {
    Str {
        /// The pattern as written, and compiled.
        pattern: Option<(String, Regex)>,
        choices: Option<Vec<String>>,
        aliases: BTreeMap<String, String>,
        max_len: usize,
    },
    Int {
        min: Option<i64>,
        max: Option<i64>,
    },
    Bool,
}

impl ArgType {
    pub fn name(&self) -> &'static str {
        match self {
            ArgType::Str { .. } => "string",
            ArgType::Int { .. } => "integer",
            ArgType::Bool => "boolean",
        }
    }

    /// A string with neither pattern nor enum.
    pub fn is_free_string(&self) -> bool {
        matches!(
            self,
            ArgType::Str {
                pattern: None,
                choices: None,
                ..
            }
        )
    }
}

/// One argument of an operation.
#[derive(Clone, Debug)]
pub struct Arg {
    pub name: String,
    pub description: Option<String>,
    pub ty: ArgType,
    /// Canonical default.
    pub default: Option<Value>,
    pub required: bool,
    /// Part of the intent fingerprint (default true).
    pub fingerprint: bool,
    pub line: usize,
}

/// Lines of the parts of an operation, for check findings.
#[derive(Clone, Debug, Default)]
pub struct Lines {
    pub op: usize,
    pub class: Option<usize>,
    pub retention: Option<usize>,
    pub timeout: Option<usize>,
    pub approval: Option<usize>,
    pub destination: Option<usize>,
    pub host_arg: Option<usize>,
    pub argv: Option<usize>,
    pub words: Vec<usize>,
    pub cwd: Option<usize>,
    pub env: BTreeMap<String, usize>,
    pub secrets: Option<usize>,
}

/// One operation's contract.
#[derive(Clone, Debug)]
pub struct Operation {
    pub name: String,
    pub description: String,
    /// `None` only in a file that fails its checks.
    pub class: Option<OpClass>,
    /// As written; [`Operation::retention`] gives the effective one.
    pub retention_given: Option<Duration>,
    pub timeout: Option<Duration>,
    pub approval: Approval,
    pub destination: Destination,
    pub host_arg: Option<String>,
    pub argv: Vec<Word>,
    pub argv_raw: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, Word>,
    pub env_raw: BTreeMap<String, String>,
    pub secrets: Vec<String>,
    /// `secrets` was written as a table of values instead of a list of names.
    pub secret_values: bool,
    /// The arguments, in the file's order.
    pub args: Vec<Arg>,
    /// Problems found while reading (before the safety rules), as findings.
    pub read_findings: Vec<Finding>,
    pub lines: Lines,
}

/// One problem in an operations file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub line: usize,
    pub operation: Option<String>,
    pub message: String,
    pub fix: String,
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Parse `90`, `90s`, `5m`, `2h`, `7d` (a string) or seconds (an integer).
fn duration(v: &toml::Value) -> Result<Duration, String> {
    match v {
        toml::Value::Integer(n) if *n >= 0 => Ok(Duration::from_secs(*n as u64)),
        toml::Value::String(s) => crate::options::parse_duration(s),
        other => Err(format!(
            "{other} is not a duration (write \"30s\", \"10m\", \"24h\" or seconds)"
        )),
    }
}

/// Split a template word into literal, whole placeholder, or a mix (refused by the checks).
/// `{{` and `}}` are literal braces.
pub fn parse_word(w: &str) -> Word {
    if let Some(inner) = w.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        if !inner.is_empty() && !inner.contains(['{', '}']) {
            return if inner == EXECUTION_ID {
                Word::ExecutionId
            } else {
                Word::Arg(inner.to_owned())
            };
        }
    }
    let unescaped = w.replace("{{", "").replace("}}", "");
    if unescaped.contains(['{', '}']) {
        return Word::Mixed(w.to_owned());
    }
    Word::Lit(w.replace("{{", "{").replace("}}", "}"))
}

/// Shorten a caller's value for a message: at most 40 characters, escaped.
pub fn shown(s: &str) -> String {
    let cut: String = s.chars().take(40).collect();
    if cut.len() < s.len() {
        format!("{cut:?}… ({} bytes)", s.len())
    } else {
        format!("{s:?}")
    }
}

impl OperationsFile {
    /// Read `text` (from `source`) without the safety rules: only [`OperationsFile::parse`]
    /// (in `check`, which runs them) hands a file to anyone who runs it.
    pub(super) fn read_unchecked(text: &str, source: &str) -> Result<OperationsFile, Vec<Finding>> {
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            vec![Finding {
                line: e.span().map(|s| line_of(text, s.start)).unwrap_or(1),
                operation: None,
                message: e.message().trim().to_owned(),
                fix: "write valid TOML with the keys of docs/OPERATIONS.md".into(),
            }]
        })?;
        let groups: BTreeMap<String, Vec<String>> = raw
            .groups
            .into_iter()
            .map(|(k, v)| (k.into_inner(), v))
            .collect();
        let mut operations = BTreeMap::new();
        for (name, op) in raw.operations {
            let line = line_of(text, name.span().start);
            let op = Operation::read(name.into_inner(), op, text, line);
            operations.insert(op.name.clone(), op);
        }
        let file = OperationsFile {
            source: source.to_owned(),
            groups,
            operations,
        };
        Ok(file)
    }

    /// The operations file with no operations (a server started without `--operations`).
    pub fn empty() -> OperationsFile {
        OperationsFile {
            source: String::new(),
            groups: BTreeMap::new(),
            operations: BTreeMap::new(),
        }
    }

    pub fn get(&self, name: &str) -> Result<&Operation, String> {
        self.operations.get(name).ok_or_else(|| {
            let names: Vec<&str> = self.operations.keys().map(String::as_str).collect();
            if names.is_empty() {
                format!("no operation {name:?}: no operations file is loaded (--operations FILE)")
            } else {
                format!(
                    "no operation {name:?} in {}; operations: {}",
                    self.source,
                    names.join(", ")
                )
            }
        })
    }
}

/// One operation being read: where each field was written, and what could not be understood.
struct Reader<'a> {
    text: &'a str,
    name: &'a str,
    found: Vec<Finding>,
    lines: Lines,
}

impl Reader<'_> {
    /// The line a span of the file starts on.
    fn at(&self, s: std::ops::Range<usize>) -> usize {
        line_of(self.text, s.start)
    }

    fn finding(&mut self, s: std::ops::Range<usize>, message: String, fix: &str) {
        let line = self.at(s);
        self.finding_at(line, message, fix);
    }

    fn finding_at(&mut self, line: usize, message: String, fix: &str) {
        self.found.push(Finding {
            line,
            operation: Some(self.name.to_owned()),
            message,
            fix: fix.to_owned(),
        })
    }

    /// A duration field (`retention`, `timeout`), noting its line in the slot `slot` picks.
    fn duration(
        &mut self,
        v: &Option<Spanned<toml::Value>>,
        what: &str,
        slot: impl FnOnce(&mut Lines) -> &mut Option<usize>,
    ) -> Option<Duration> {
        let v = v.as_ref()?;
        *slot(&mut self.lines) = Some(self.at(v.span()));
        match duration(v.get_ref()) {
            Ok(d) => Some(d),
            Err(e) => {
                self.finding(
                    v.span(),
                    format!("{what}: {e}"),
                    "write a duration such as \"10m\" or \"24h\"",
                );
                None
            }
        }
    }

    fn approval(&mut self, a: &Option<Spanned<String>>) -> Approval {
        let Some(a) = a else {
            return Approval::Caller;
        };
        self.lines.approval = Some(self.at(a.span()));
        match a.get_ref().as_str() {
            "caller" => Approval::Caller,
            "policy" => Approval::Policy,
            "prompt" => Approval::Prompt,
            other => {
                self.finding(
                    a.span(),
                    format!("approval {other:?} is not an approval rule"),
                    "approval = \"caller\", \"policy\" or \"prompt\"",
                );
                Approval::Caller
            }
        }
    }

    /// Exactly one of `hosts`, `host_pattern` and `group`.
    fn destination(&mut self, raw: &RawOp, line: usize) -> Destination {
        let mut kinds = 0;
        let mut destination = Destination::Missing;
        if let Some(h) = &raw.hosts {
            kinds += 1;
            self.lines.destination = Some(self.at(h.span()));
            destination = Destination::Hosts(h.get_ref().clone());
        }
        if let Some(p) = &raw.host_pattern {
            kinds += 1;
            self.lines.destination = Some(self.at(p.span()));
            match Regex::new(p.get_ref()) {
                Ok(r) => destination = Destination::Pattern(p.get_ref().clone(), r),
                Err(e) => self.finding(
                    p.span(),
                    format!("host_pattern is not a valid pattern: {e}"),
                    "write a regular expression such as \"^web-[0-9]+$\"",
                ),
            }
        }
        if let Some(g) = &raw.group {
            kinds += 1;
            self.lines.destination = Some(self.at(g.span()));
            destination = Destination::Group(g.get_ref().clone());
        }
        if kinds > 1 {
            self.finding_at(
                self.lines.destination.unwrap_or(line),
                "more than one destination rule (hosts, host_pattern, group)".into(),
                "keep exactly one of hosts, host_pattern and group",
            );
        }
        destination
    }

    /// `secrets`: names only (a list), or a table whose values are refused later by the checks.
    fn secrets(&mut self, s: &Option<Spanned<toml::Value>>) -> (Vec<String>, bool) {
        let (mut secrets, mut secret_values) = (Vec::new(), false);
        let Some(s) = s else {
            return (secrets, secret_values);
        };
        self.lines.secrets = Some(self.at(s.span()));
        match s.get_ref() {
            toml::Value::Array(a) => {
                for v in a {
                    match v {
                        toml::Value::String(n) => secrets.push(n.clone()),
                        other => self.finding(
                            s.span(),
                            format!("secrets lists {other}, not a variable name"),
                            "secrets = [\"DEPLOY_TOKEN\"] (names only)",
                        ),
                    }
                }
            }
            toml::Value::Table(t) => {
                secret_values = true;
                secrets.extend(t.keys().cloned());
            }
            other => self.finding(
                s.span(),
                format!("secrets is {other}, not a list of names"),
                "secrets = [\"DEPLOY_TOKEN\"] (names only)",
            ),
        }
        (secrets, secret_values)
    }
}

impl Operation {
    /// Read one operation as written, recording what cannot be understood as findings.
    fn read(name: String, raw: RawOp, text: &str, line: usize) -> Operation {
        let mut r = Reader {
            text,
            name: &name,
            found: Vec::new(),
            lines: Lines {
                op: line,
                ..Lines::default()
            },
        };
        let class = raw.class.as_ref().and_then(|c| {
            r.lines.class = Some(r.at(c.span()));
            match c.get_ref().parse::<OpClass>() {
                Ok(c) => Some(c),
                Err(e) => {
                    r.finding(c.span(), e, "class = \"read-only\" (or idempotent, conditional, irreversible, remote-command)");
                    None
                }
            }
        });
        let retention_given = r.duration(&raw.retention, "retention", |l| &mut l.retention);
        let timeout = r.duration(&raw.timeout, "timeout", |l| &mut l.timeout);
        let approval = r.approval(&raw.approval);
        let destination = r.destination(&raw, line);
        if let Some(h) = &raw.host_arg {
            r.lines.host_arg = Some(r.at(h.span()));
        }
        let (argv, argv_raw) = match &raw.argv {
            Some(a) => {
                r.lines.argv = Some(r.at(a.span()));
                r.lines.words = a.get_ref().iter().map(|w| r.at(w.span())).collect();
                let raw: Vec<String> = a.get_ref().iter().map(|w| w.get_ref().clone()).collect();
                (raw.iter().map(|w| parse_word(w)).collect(), raw)
            }
            None => (Vec::new(), Vec::new()),
        };
        let mut env = BTreeMap::new();
        let mut env_raw = BTreeMap::new();
        for (k, v) in &raw.env {
            r.lines.env.insert(k.get_ref().clone(), r.at(k.span()));
            env.insert(k.get_ref().clone(), parse_word(v.get_ref()));
            env_raw.insert(k.get_ref().clone(), v.get_ref().clone());
        }
        let (secrets, secret_values) = r.secrets(&raw.secrets);
        let mut args: Vec<Arg> = Vec::new();
        for (k, a) in raw.args {
            let line = r.at(k.span());
            match Arg::read(k.into_inner(), a, line) {
                Ok(a) => args.push(a),
                Err((m, fix)) => r.finding_at(line, m, fix),
            }
        }
        args.sort_by_key(|a| a.line);
        if let Some(c) = &raw.cwd {
            r.lines.cwd = Some(r.at(c.span()));
        }
        let Reader { found, lines, .. } = r;
        Operation {
            description: raw.description.unwrap_or_default(),
            class,
            retention_given,
            timeout,
            approval,
            destination,
            host_arg: raw.host_arg.map(Spanned::into_inner),
            argv,
            argv_raw,
            cwd: raw.cwd.map(Spanned::into_inner),
            env,
            env_raw,
            secrets,
            secret_values,
            args,
            read_findings: found,
            lines,
            name,
        }
    }

    /// The class (a checked file always has one).
    pub fn class(&self) -> OpClass {
        self.class.unwrap_or_default()
    }

    /// How long a matching call attaches to an earlier execution.
    pub fn retention(&self) -> Duration {
        self.retention_given
            .unwrap_or_else(|| self.class().default_retention())
    }

    pub fn arg(&self, name: &str) -> Option<&Arg> {
        self.args.iter().find(|a| a.name == name)
    }

    /// The definition that decides the effect, as canonical JSON (descriptions left out: they
    /// change no effect). Its SHA-256 is the contract digest.
    pub fn definition(&self) -> Value {
        let args: serde_json::Map<String, Value> = self
            .args
            .iter()
            .map(|a| (a.name.clone(), a.definition()))
            .collect();
        serde_json::json!({
            "name": self.name,
            "class": self.class(),
            "retention_secs": self.retention().as_secs(),
            "timeout_secs": self.timeout.map(|t| t.as_secs()),
            "approval": self.approval.as_str(),
            "destination": self.destination_json(),
            "host_arg": self.host_arg,
            "argv": self.argv_raw,
            "cwd": self.cwd,
            "env": self.env_raw,
            "secrets": self.secrets,
            "args": args,
        })
    }

    /// `sha256:…` of [`Operation::definition`].
    pub fn digest(&self) -> String {
        let text = serde_json::to_string(&self.definition()).unwrap_or_default();
        format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
    }

    pub fn destination_json(&self) -> Value {
        match &self.destination {
            Destination::Hosts(h) => serde_json::json!({"hosts": h}),
            Destination::Pattern(p, _) => serde_json::json!({"host_pattern": p}),
            Destination::Group(g) => serde_json::json!({"group": g}),
            Destination::Missing => Value::Null,
        }
    }

    /// The argument names that reach the command (argv or environment).
    pub fn command_args(&self) -> std::collections::BTreeSet<String> {
        self.argv
            .iter()
            .chain(self.env.values())
            .filter_map(|w| match w {
                Word::Arg(a) => Some(a.clone()),
                _ => None,
            })
            .collect()
    }

    /// The argument names that decide anything: the command's, and the host argument.
    pub fn used_args(&self) -> std::collections::BTreeSet<String> {
        let mut used = self.command_args();
        used.extend(self.host_arg.clone());
        used
    }

    /// Check the caller's arguments and make them canonical. Nothing is contacted.
    pub fn call(&self, input: &serde_json::Map<String, Value>) -> Result<Call<'_>, String> {
        let mut unknown: Vec<&str> = input
            .keys()
            .filter(|k| self.arg(k).is_none())
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            unknown.sort();
            let known: Vec<&str> = self.args.iter().map(|a| a.name.as_str()).collect();
            return Err(format!(
                "operation {}: unknown argument{} {}; its arguments are: {}",
                self.name,
                if unknown.len() == 1 { "" } else { "s" },
                unknown.join(", "),
                if known.is_empty() {
                    "(none)".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        }
        let mut values = BTreeMap::new();
        for a in &self.args {
            let given = input.get(&a.name).filter(|v| !v.is_null());
            let v = match (given, &a.default) {
                (Some(v), _) => a
                    .canonical(v)
                    .map_err(|e| format!("operation {}: argument {}: {e}", self.name, a.name))?,
                (None, Some(d)) => d.clone(),
                (None, None) if a.required => {
                    return Err(format!(
                        "operation {}: argument {} is required ({})",
                        self.name,
                        a.name,
                        a.ty.name()
                    ))
                }
                (None, None) => continue,
            };
            values.insert(a.name.clone(), v);
        }
        Ok(Call { op: self, values })
    }

    /// [`Operation::call`] from `key=value` words (the CLI): every value is text, converted by
    /// the argument's type; a key given twice is refused.
    pub fn call_from_pairs(&self, pairs: &[String]) -> Result<Call<'_>, String> {
        let mut input = serde_json::Map::new();
        for p in pairs {
            let (k, v) = p.split_once('=').ok_or_else(|| {
                format!(
                    "{}: expected key=value (an argument of {})",
                    shown(p),
                    self.name
                )
            })?;
            let k = k.trim();
            if input
                .insert(k.to_owned(), Value::String(v.to_owned()))
                .is_some()
            {
                return Err(format!("argument {k} is given twice"));
            }
        }
        self.call(&input)
    }
}

impl Arg {
    // Long: one match over the argument types, each arm checking the keys that type allows; the
    // table reads best whole.
    fn read(name: String, a: RawArg, line: usize) -> Result<Arg, (String, &'static str)> {
        let ty = match a.ty.as_deref().unwrap_or("string") {
            "string" => {
                if a.min.is_some() || a.max.is_some() {
                    return Err((
                        format!("argument {name}: min/max apply to integers"),
                        "remove min/max, or type = \"integer\"",
                    ));
                }
                let pattern = match a.pattern {
                    Some(p) => match Regex::new(&p) {
                        Ok(r) => Some((p, r)),
                        Err(e) => {
                            return Err((
                                format!("argument {name}: pattern is not valid: {e}"),
                                "write a regular expression such as \"^[a-z][a-z0-9-]{0,40}$\"",
                            ))
                        }
                    },
                    None => None,
                };
                if pattern.is_some() && a.choices.is_some() {
                    return Err((
                        format!("argument {name}: both pattern and enum"),
                        "keep one: enum for a fixed set, pattern otherwise",
                    ));
                }
                if !a.aliases.is_empty() && a.choices.is_none() {
                    return Err((
                        format!("argument {name}: aliases without enum"),
                        "aliases map other spellings to enum values: add enum = [...]",
                    ));
                }
                if let Some(c) = &a.choices {
                    if c.is_empty() {
                        return Err((
                            format!("argument {name}: enum is empty"),
                            "list the allowed values",
                        ));
                    }
                    if let Some((k, v)) = a.aliases.iter().find(|(_, v)| !c.contains(v)) {
                        return Err((
                            format!(
                                "argument {name}: alias {k:?} maps to {v:?}, which is not in enum"
                            ),
                            "map each alias to one of the enum values",
                        ));
                    }
                }
                let max_len = a.max_len.unwrap_or(DEFAULT_MAX_LEN);
                if max_len > MAX_MAX_LEN {
                    return Err((
                        format!("argument {name}: max_len {max_len} is over {MAX_MAX_LEN}"),
                        "max_len = 1048576 at most",
                    ));
                }
                ArgType::Str {
                    pattern,
                    choices: a.choices,
                    aliases: a.aliases,
                    max_len,
                }
            }
            t @ ("integer" | "boolean") => {
                if a.pattern.is_some() || a.choices.is_some() || a.max_len.is_some() {
                    return Err((
                        format!("argument {name}: pattern, enum and max_len apply to strings"),
                        "remove them, or type = \"string\"",
                    ));
                }
                if t == "integer" {
                    ArgType::Int {
                        min: a.min,
                        max: a.max,
                    }
                } else {
                    ArgType::Bool
                }
            }
            other => {
                return Err((
                    format!("argument {name}: type {other:?} is not string, integer or boolean"),
                    "type = \"string\", \"integer\" or \"boolean\"",
                ))
            }
        };
        let mut arg = Arg {
            required: a.required.unwrap_or(a.default.is_none()),
            fingerprint: a.fingerprint.unwrap_or(true),
            description: a.description,
            default: None,
            ty,
            line,
            name,
        };
        if let Some(d) = a.default {
            let v = serde_json::to_value(&d).unwrap_or(Value::Null);
            arg.default = Some(arg.canonical(&v).map_err(|e| {
                (
                    format!("argument {}: default {d}: {e}", arg.name),
                    "give a default the argument's own type accepts",
                )
            })?);
            if arg.required && a.required == Some(true) {
                return Err((
                    format!("argument {}: required = true with a default", arg.name),
                    "drop one: a default makes the argument optional",
                ));
            }
        }
        Ok(arg)
    }

    fn definition(&self) -> Value {
        let mut v = serde_json::json!({
            "type": self.ty.name(),
            "default": self.default,
            "required": self.required,
            "fingerprint": self.fingerprint,
        });
        match &self.ty {
            ArgType::Str {
                pattern,
                choices,
                aliases,
                max_len,
            } => {
                v["pattern"] = serde_json::json!(pattern.as_ref().map(|p| &p.0));
                v["enum"] = serde_json::json!(choices);
                v["aliases"] = serde_json::json!(aliases);
                v["max_len"] = (*max_len).into();
            }
            ArgType::Int { min, max } => {
                v["min"] = serde_json::json!(min);
                v["max"] = serde_json::json!(max);
            }
            ArgType::Bool => {}
        }
        v
    }

    /// The canonical value of `v` for this argument, or why it is refused.
    pub fn canonical(&self, v: &Value) -> Result<Value, String> {
        match &self.ty {
            ArgType::Str {
                pattern,
                choices,
                aliases,
                max_len,
            } => {
                let s = v.as_str().ok_or_else(|| format!("{v} is not a string"))?;
                if let Some(c) = choices {
                    if c.iter().any(|x| x == s) {
                        return Ok(s.into());
                    }
                    if let Some(x) = aliases.get(s) {
                        return Ok(x.clone().into());
                    }
                    let t = s.trim();
                    if let Some(x) = c.iter().find(|x| x.eq_ignore_ascii_case(t)) {
                        return Ok(x.clone().into());
                    }
                    if let Some((_, x)) = aliases.iter().find(|(k, _)| k.eq_ignore_ascii_case(t)) {
                        return Ok(x.clone().into());
                    }
                    return Err(format!("{} is not one of {}", shown(s), c.join(", ")));
                }
                if s.len() > *max_len {
                    return Err(format!("{} is longer than {max_len} bytes", shown(s)));
                }
                if s.contains('\0') {
                    return Err(
                        "the value contains a NUL byte, which no command can receive".into(),
                    );
                }
                if let Some((p, r)) = pattern {
                    if !r.is_match(s) {
                        return Err(format!("{} does not match {p}", shown(s)));
                    }
                }
                Ok(s.into())
            }
            ArgType::Int { min, max } => {
                let n = match v {
                    Value::Number(n) => n
                        .as_i64()
                        .ok_or_else(|| format!("{n} is not a whole number"))?,
                    Value::String(s) => s
                        .trim()
                        .parse::<i64>()
                        .map_err(|_| format!("{} is not a whole number", shown(s)))?,
                    other => return Err(format!("{other} is not a whole number")),
                };
                if min.is_some_and(|m| n < m) || max.is_some_and(|m| n > m) {
                    return Err(format!(
                        "{n} is outside {}..={}",
                        min.map(|m| m.to_string()).unwrap_or_default(),
                        max.map(|m| m.to_string()).unwrap_or_default()
                    ));
                }
                Ok(n.into())
            }
            ArgType::Bool => match v {
                Value::Bool(b) => Ok((*b).into()),
                Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                    "true" | "yes" | "on" | "1" => Ok(true.into()),
                    "false" | "no" | "off" | "0" => Ok(false.into()),
                    _ => Err(format!("{} is not true or false", shown(s))),
                },
                other => Err(format!("{other} is not true or false")),
            },
        }
    }
}

/// The text a canonical value puts into a command word.
pub fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One call of an operation: canonical values for every argument that has one.
#[derive(Clone, Debug)]
pub struct Call<'a> {
    pub op: &'a Operation,
    pub values: BTreeMap<String, Value>,
}

impl Call<'_> {
    /// The text of an argument's value (a checked file never puts an argument without a value
    /// into a word; an empty word would be the answer).
    fn text(&self, name: &str) -> String {
        self.values.get(name).map(value_text).unwrap_or_default()
    }

    fn in_fingerprint(&self, name: &str) -> bool {
        self.op.arg(name).is_some_and(|a| a.fingerprint)
    }

    /// A word as sent: the value of its argument, `"$CAIRN_EXECUTION_ID"` for the execution ID
    /// (set by the host's supervisor for the command, so it is the ID the host runs under,
    /// also after a re-dispatch), each quoted as one shell word.
    fn sent_word(&self, w: &Word) -> Vec<u8> {
        match w {
            Word::Lit(s) | Word::Mixed(s) => quote_word(s.as_bytes()),
            Word::Arg(a) => quote_word(self.text(a).as_bytes()),
            Word::ExecutionId => b"\"$CAIRN_EXECUTION_ID\"".to_vec(),
        }
    }

    /// The bytes for the host's shell: the contract's environment exported, then the argv,
    /// each word quoted as one word (never shell syntax, whatever the value holds).
    pub fn command(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, w) in &self.op.env {
            out.extend_from_slice(format!("export {k}=").as_bytes());
            out.extend_from_slice(&self.sent_word(w));
            out.push(b'\n');
        }
        for (i, w) in self.op.argv.iter().enumerate() {
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(&self.sent_word(w));
        }
        out
    }

    /// A word as the fingerprint sees it: fingerprint arguments filled in; other arguments and
    /// the execution ID stay `{name}`.
    fn canonical_word(&self, w: &Word) -> String {
        match w {
            Word::Lit(s) | Word::Mixed(s) => s.clone(),
            Word::Arg(a) if self.in_fingerprint(a) => self.text(a),
            Word::Arg(a) => format!("{{{a}}}"),
            Word::ExecutionId => format!("{{{EXECUTION_ID}}}"),
        }
    }

    /// The argv as the fingerprint sees it.
    pub fn canonical_argv(&self) -> Vec<Vec<u8>> {
        self.op
            .argv
            .iter()
            .map(|w| self.canonical_word(w).into_bytes())
            .collect()
    }

    /// The operation, its contract digest and the canonical arguments, for the record.
    pub fn operation_ref(&self) -> OperationRef {
        let (mut arguments, mut notes) = (BTreeMap::new(), BTreeMap::new());
        for (k, v) in &self.values {
            if self.in_fingerprint(k) {
                arguments.insert(k.clone(), v.clone());
            } else {
                notes.insert(k.clone(), v.clone());
            }
        }
        OperationRef {
            name: self.op.name.clone(),
            contract: self.op.digest(),
            arguments,
            notes,
            env: self
                .op
                .env
                .iter()
                .map(|(k, w)| (k.clone(), self.canonical_word(w)))
                .collect(),
        }
    }

    /// The intent of this call for `actor`: class, retention, working directory, secret names
    /// and the operation record. The environment travels inside [`Call::command`] (so that an
    /// argument outside the fingerprint can set it) and is in the record through the contract.
    pub fn intent(&self, actor: &str, scope: Option<String>) -> Intent {
        Intent {
            actor: actor.to_owned(),
            command: Some(crate::intent::CommandForm::Argv(self.canonical_argv())),
            cwd: self.op.cwd.clone(),
            secret_env: self.op.secrets.iter().cloned().collect(),
            credential_ref: None,
            class: self.op.class(),
            scope,
            retention: Some(self.op.retention()),
            operation: Some(self.operation_ref()),
            ..Intent::default()
        }
    }

    /// Host-enforced timeout in seconds (0: none).
    pub fn timeout_secs(&self) -> u64 {
        self.op.timeout.map(|t| t.as_secs().max(1)).unwrap_or(0)
    }

    /// The destinations this call runs on: the host argument's value (checked against the
    /// rule), else every destination of the rule; `requested` (the CLI's `--hosts` /
    /// `--inventory`) narrows that to some of them, each checked against the rule.
    pub fn destinations(
        &self,
        file: &OperationsFile,
        requested: Option<&[String]>,
    ) -> Result<Vec<String>, String> {
        let op = self.op;
        let allowed = |h: &str| -> Result<(), String> {
            let ok = match &op.destination {
                Destination::Hosts(l) => l.iter().any(|x| x == h),
                Destination::Group(g) => {
                    file.groups.get(g).is_some_and(|l| l.iter().any(|x| x == h))
                }
                Destination::Pattern(_, r) => valid_destination(h) && r.is_match(h),
                Destination::Missing => false,
            };
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "operation {}: {} is not a destination it may run on ({})",
                    op.name,
                    shown(h),
                    op.destination_json()
                ))
            }
        };
        if let Some(a) = &op.host_arg {
            if requested.is_some() {
                return Err(format!(
                    "operation {}: the argument {a} names the host; --hosts/--inventory do not apply",
                    op.name
                ));
            }
            let h = value_text(self.values.get(a).ok_or_else(|| {
                format!("operation {}: argument {a} (the host) is required", op.name)
            })?);
            allowed(&h)?;
            return Ok(vec![h]);
        }
        let all: Vec<String> = match &op.destination {
            Destination::Hosts(l) => l.clone(),
            Destination::Group(g) => file.groups.get(g).cloned().unwrap_or_default(),
            Destination::Pattern(..) | Destination::Missing => Vec::new(),
        };
        let hosts = match requested {
            Some(r) => {
                for h in r {
                    allowed(h)?;
                }
                r.to_vec()
            }
            None => all,
        };
        if hosts.is_empty() {
            return Err(format!("operation {}: no destination to run on", op.name));
        }
        Ok(hosts)
    }
}

/// A destination an argument may name: a host name or alias, no user, port or options.
pub fn valid_destination(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && !h.starts_with('-')
        && h.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::IntentKey;

    /// The seed's example, as the issue writes it.
    pub(crate) const SEED: &str = r#"
[operations.deploy_release]
description = "Deploy one release of a service"
class = "idempotent"
retention = "24h"
hosts = ["deploy-1"]
argv = ["/opt/deploy/bin/deploy", "--service", "{service}", "--version", "{version}",
        "--region", "{region}", "--idempotency-key", "{execution_id}"]

[operations.deploy_release.args]
service = { type = "string", pattern = "^[a-z][a-z0-9-]{0,40}$" }
version = { type = "string", pattern = "^[0-9]{4}[.][0-9]{2}[.][0-9]{2}$" }
region  = { type = "string", enum = ["us-east-1", "eu-west-1"], default = "us-east-1" }
reason  = { type = "string", required = false, fingerprint = false }
"#;

    fn file(text: &str) -> OperationsFile {
        OperationsFile::parse(text, "t.toml").unwrap_or_else(|f| panic!("{f:?}"))
    }

    fn fp(f: &OperationsFile, json_text: &str) -> Result<String, String> {
        let v: Value = serde_json::from_str(json_text).unwrap();
        let c = f.get("deploy_release")?.call(v.as_object().unwrap())?;
        let intent = c.intent("mcp:agent", None);
        let key = IntentKey::from_bytes(b"0123456789abcdef0123456789abcdef");
        Ok(intent
            .record("SHA256:hostkey", "deploy-1:22", "deploy", &c.command())
            .fingerprint(&key))
    }

    #[test]
    fn the_seed_fingerprints_the_same_however_the_call_is_spelled() {
        let f = file(SEED);
        let base = fp(&f, r#"{"service":"web","version":"2026.01.02"}"#).unwrap();
        for same in [
            r#"{"version":"2026.01.02","service":"web"}"#,
            "{ \"service\" :\n \"web\" ,\t\"version\": \"2026.01.02\" }",
            r#"{"service":"web","version":"2026.01.02","region":"us-east-1"}"#,
            r#"{"region":"US-EAST-1 ","service":"web","version":"2026.01.02"}"#,
            r#"{"service":"web","version":"2026.01.02","region":null}"#,
            r#"{"service":"web","version":"2026.01.02","reason":"ticket 42"}"#,
            r#"{"service":"web","version":"2026.01.02","reason":"another reason"}"#,
        ] {
            assert_eq!(fp(&f, same).unwrap(), base, "{same}");
        }
        for other in [
            r#"{"service":"web","version":"2026.01.03"}"#,
            r#"{"service":"web","version":"2026.01.02","region":"eu-west-1"}"#,
            r#"{"service":"api","version":"2026.01.02"}"#,
        ] {
            assert_ne!(fp(&f, other).unwrap(), base, "{other}");
        }
        // A changed contract never matches an execution of the old one.
        let changed = file(&SEED.replace("retention = \"24h\"", "retention = \"12h\""));
        assert_ne!(
            fp(&changed, r#"{"service":"web","version":"2026.01.02"}"#).unwrap(),
            base
        );
        // Prose is not part of the contract.
        let reworded = file(&SEED.replace("Deploy one release", "Roll out one release"));
        assert_eq!(
            fp(&reworded, r#"{"service":"web","version":"2026.01.02"}"#).unwrap(),
            base
        );
    }

    #[test]
    fn unknown_missing_and_hostile_arguments_are_refused() {
        let f = file(SEED);
        let e = fp(&f, r#"{"service":"web","version":"2026.01.02","host":"x"}"#).unwrap_err();
        assert!(e.contains("unknown argument host"), "{e}");
        let e = fp(&f, r#"{"service":"web"}"#).unwrap_err();
        assert!(e.contains("version is required"), "{e}");
        let big = "a".repeat(100 * 1024);
        for bad in [
            "; rm -rf /",
            "$(id)",
            "web\nid",
            "`id`",
            "web'",
            big.as_str(),
            "WEB",
            "",
        ] {
            let call = serde_json::json!({"service": bad, "version": "2026.01.02"}).to_string();
            let e = fp(&f, &call).unwrap_err();
            assert!(e.contains("argument service"), "{e}");
            assert!(
                e.len() < 300,
                "the message does not echo the value: {}",
                e.len()
            );
        }
        let e = fp(
            &f,
            r#"{"service":"web","version":"2026.01.02","region":"mars-1"}"#,
        )
        .unwrap_err();
        assert!(e.contains("not one of us-east-1, eu-west-1"), "{e}");
        let e = fp(&f, r#"{"service":7,"version":"2026.01.02"}"#).unwrap_err();
        assert!(e.contains("not a string"), "{e}");
    }

    #[test]
    fn the_command_quotes_every_word_and_reads_the_execution_id_on_the_host() {
        let f = file(SEED);
        let v =
            serde_json::json!({"service": "web", "version": "2026.01.02", "reason": "it's $(id)"});
        let c = f
            .get("deploy_release")
            .unwrap()
            .call(v.as_object().unwrap())
            .unwrap();
        assert_eq!(
            String::from_utf8(c.command()).unwrap(),
            "/opt/deploy/bin/deploy --service web --version 2026.01.02 --region us-east-1 \
             --idempotency-key \"$CAIRN_EXECUTION_ID\""
        );
        let canon: Vec<String> = c
            .canonical_argv()
            .into_iter()
            .map(|w| String::from_utf8(w).unwrap())
            .collect();
        assert_eq!(canon.last().unwrap(), "{execution_id}");
        let r = c.operation_ref();
        assert_eq!(r.name, "deploy_release");
        assert!(r.contract.starts_with("sha256:"));
        assert_eq!(r.arguments.len(), 3);
        assert_eq!(r.notes["reason"], "it's $(id)");
    }

    /// Hostile values that the type allows reach a real POSIX shell as one word, byte for byte.
    #[test]
    fn allowed_hostile_values_are_one_word_for_a_real_shell() {
        let f = file(
            r#"
[operations.echo]
description = "Print a note"
class = "read-only"
hosts = ["h"]
argv = ["sh", "-c", "printf '%s|' \"$#\"; printf '%s' \"$1\"", "echo", "{note}"]
env = { NOTE = "{note}" }
[operations.echo.args]
note = { type = "string", pattern = "^[\\s\\S]*$", max_len = 200000 }
"#,
        );
        let big: String = (0..100 * 1024)
            .map(|i| (b'a' + (i % 26) as u8) as char)
            .collect();
        for v in [
            "; rm -rf /",
            "$(id)",
            "a\nb",
            "it's",
            "\"$HOME\"",
            "`id`",
            "",
            " x ",
            "ü\t*",
            &big,
        ] {
            let args = serde_json::json!({ "note": v });
            let c = f
                .get("echo")
                .unwrap()
                .call(args.as_object().unwrap())
                .unwrap();
            // As the host runs it: the login shell reads the command as a script file.
            let script = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(script.path(), c.command()).unwrap();
            let out = std::process::Command::new("/bin/sh")
                .arg(script.path())
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("1|{v}"));
        }
    }

    #[test]
    fn destinations_follow_the_rule() {
        let f = file(include_str!(
            "../../tests/fixtures/operations/web-fleet.toml"
        ));
        let call = |name: &str, v: Value| {
            let op = f.get(name).unwrap();
            op.call(v.as_object().unwrap())
                .map(|c| c.destinations(&f, None))
        };
        let r = call(
            "restart_service",
            serde_json::json!({"host": "web-2", "unit": "App.Service"}),
        );
        assert_eq!(r.unwrap().unwrap(), vec!["web-2"]);
        let r = call(
            "restart_service",
            serde_json::json!({"host": "db-1", "unit": "nginx"}),
        );
        assert!(r.unwrap().unwrap_err().contains("not a destination"));
        let op = f.get("service_status").unwrap();
        let c = op
            .call(serde_json::json!({"unit": "nginx"}).as_object().unwrap())
            .unwrap();
        assert_eq!(
            c.destinations(&f, None).unwrap(),
            vec!["web-1", "web-2", "web-3"]
        );
        let some = vec!["web-3".to_string()];
        assert_eq!(c.destinations(&f, Some(&some)).unwrap(), some);
        let evil = vec!["evil.example".to_string()];
        assert!(c.destinations(&f, Some(&evil)).is_err());
        assert_eq!(c.values["lines"], 20);
        let c = op
            .call_from_pairs(&["unit=nginx".into(), "lines=007".into()])
            .unwrap();
        assert_eq!(c.values["lines"], 7);
        assert!(op
            .call_from_pairs(&["unit=nginx".into(), "unit=app".into()])
            .is_err());
        assert!(op
            .call_from_pairs(&["lines=999".into(), "unit=app".into()])
            .is_err());
    }

    #[test]
    fn ops_doc_matches_its_fixture() {
        let f = OperationsFile::parse(
            include_str!("../../tests/fixtures/operations/web-fleet.toml"),
            "web-fleet.toml",
        )
        .unwrap();
        let want = include_str!("../../tests/fixtures/operations/web-fleet.md");
        let got = super::super::doc::markdown(&f);
        if got != want && std::env::var_os("CAIRN_BLESS").is_some() {
            std::fs::write(
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/operations/web-fleet.md"
                ),
                &got,
            )
            .unwrap();
            return;
        }
        assert_eq!(
            got, want,
            "set CAIRN_BLESS=1 to rewrite the fixture after a deliberate change"
        );
    }
}
