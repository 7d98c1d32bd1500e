//! The rules an operations file must pass before anything uses it (`cairn ops check FILE`; the
//! servers and `cairn op` run the same checks when they load it). Each finding names its line
//! and says how to fix it.
//!
//! Refused:
//! - an operation without `class`; an `irreversible` one without an approval rule (`policy` or
//!   `prompt`); a retention outside what its class allows ([`retention_bounds`]), or shorter
//!   than its timeout (a retry while the first still runs would start a second one);
//! - a placeholder that is not an argument, one that is not a whole word, an argument that
//!   nothing uses while it is in the fingerprint (it would split executions without changing
//!   the command; an argument outside the fingerprint that nothing uses is a note, recorded in
//!   the journal only), an optional argument without a default in the command;
//! - a free string (no `pattern`, no `enum`) that reaches the command or the environment, and a
//!   pattern not anchored with `^…$` (a partial match lets anything around it through);
//! - a secret given by value (in `secrets` as a table, or a variable named like a secret with a
//!   literal value in `env`): secrets are named, and their values come from cairn's environment;
//! - no destination, a host pattern that nothing names, a host argument that is not a string
//!   argument, an unknown group, an empty argv, invalid variable names, and the like.

use std::time::Duration;

use super::contract::{ArgType, Destination, Operation, OperationsFile, Word, EXECUTION_ID};
use crate::intent::{valid_env_name, OpClass};

pub use super::contract::Finding;

impl OperationsFile {
    /// Parse and check `text` (from `source`). Every check finding is returned, sorted by line.
    pub fn parse(text: &str, source: &str) -> Result<OperationsFile, Vec<Finding>> {
        let file = OperationsFile::read_unchecked(text, source)?;
        let findings = check(&file);
        if findings.is_empty() {
            Ok(file)
        } else {
            Err(findings)
        }
    }
}

/// Findings as people read them: `FILE:LINE: operation NAME: message` and `  fix: …`.
pub fn render(source: &str, findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let op = f
            .operation
            .as_deref()
            .map(|o| format!("operation {o}: "))
            .unwrap_or_default();
        out.push_str(&format!(
            "{source}:{}: {op}{}\n    fix: {}\n",
            f.line, f.message, f.fix
        ));
    }
    out.trim_end().to_owned()
}

/// The retention a class allows: `(min, max)`. At most 30 days for every class (the default
/// tombstone retention of `cairn gc`); read-only at most an hour (a status may be asked again);
/// irreversible at least a day (a retry of a payment must still find the first one).
pub fn retention_bounds(class: OpClass) -> (Duration, Duration) {
    let (h, d) = (3600, 86_400);
    let (min, max) = match class {
        OpClass::ReadOnly => (0, h),
        OpClass::Idempotent | OpClass::Conditional => (60, 7 * d),
        OpClass::RemoteCommand => (60, 30 * d),
        OpClass::Irreversible => (d, 30 * d),
    };
    (Duration::from_secs(min), Duration::from_secs(max))
}

/// `90s`, `5m`, `24h`, `7d`: the largest unit that divides it (days from two days on).
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    for (unit, n, from) in [("d", 86_400, 2 * 86_400), ("h", 3600, 3600), ("m", 60, 60)] {
        if s >= from && s.is_multiple_of(n) {
            return format!("{}{unit}", s / n);
        }
    }
    format!("{s}s")
}

/// Words that name secrets, for the `env` rule.
const SECRET_WORDS: [&str; 7] = [
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "SECRET",
    "API_KEY",
    "PRIVATE_KEY",
    "CREDENTIAL",
];

/// Every finding in `file`, sorted by line.
pub fn check(file: &OperationsFile) -> Vec<Finding> {
    let mut out = Vec::new();
    for op in file.operations.values() {
        out.extend(op.read_findings.iter().cloned());
        check_op(file, op, &mut out);
    }
    out.sort_by(|a, b| (a.line, &a.operation).cmp(&(b.line, &b.operation)));
    out
}

struct Out<'a> {
    op: &'a str,
    out: &'a mut Vec<Finding>,
}

impl Out<'_> {
    fn add(&mut self, line: usize, message: String, fix: impl Into<String>) {
        self.out.push(Finding {
            line,
            operation: Some(self.op.to_owned()),
            message,
            fix: fix.into(),
        });
    }
}

fn check_op(file: &OperationsFile, op: &Operation, out: &mut Vec<Finding>) {
    let mut f = Out { op: &op.name, out };
    let l = &op.lines;
    if !op
        .name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        || op.name.len() > 64
    {
        f.add(
            l.op,
            format!("the name {:?} is not a tool name", op.name),
            "use letters, digits, _ and - (at most 64)",
        );
    }
    if op.description.trim().is_empty() {
        f.add(
            l.op,
            "no description".into(),
            "description = \"what it does, for the people and agents who call it\"",
        );
    }
    check_class(op, &mut f);
    check_words(op, &mut f);
    check_args(op, &mut f);
    check_destination(file, op, &mut f);
    check_env_and_secrets(op, &mut f);
}

fn check_class(op: &Operation, f: &mut Out<'_>) {
    let l = &op.lines;
    let Some(class) = op.class else {
        if l.class.is_none() {
            f.add(
                l.op,
                "no class: what a retry may do after a lost response is undefined".into(),
                "class = \"read-only\" | \"idempotent\" | \"conditional\" | \"irreversible\" | \"remote-command\"",
            );
        }
        return;
    };
    if class == OpClass::Irreversible && op.approval == super::contract::Approval::Caller {
        f.add(
            l.approval.or(l.class).unwrap_or(l.op),
            "irreversible without an approval rule".into(),
            "approval = \"policy\" (the server's --policy decides) or \"prompt\" (a person confirms)",
        );
    }
    let (min, max) = retention_bounds(class);
    let r = op.retention();
    if r < min || r > max {
        f.add(
            l.retention.or(l.class).unwrap_or(l.op),
            format!(
                "retention {} is outside what class {class} allows ({} to {})",
                human(r),
                human(min),
                human(max)
            ),
            format!(
                "retention = \"{}\" (or leave it out: {} for {class})",
                human(r.clamp(min, max)),
                human(class.default_retention())
            ),
        );
    }
    if let Some(t) = op.timeout {
        if t.is_zero() {
            f.add(
                l.timeout.unwrap_or(l.op),
                "timeout 0".into(),
                "leave timeout out for none, or give one such as \"10m\"",
            );
        } else if t > r {
            f.add(
                l.retention.or(l.timeout).unwrap_or(l.op),
                format!(
                    "retention {} is shorter than the timeout {}: a retry while the first still runs would start a second execution",
                    human(r),
                    human(t)
                ),
                format!("retention = \"{}\" at least", human(t)),
            );
        }
    }
}

fn check_words(op: &Operation, f: &mut Out<'_>) {
    let l = &op.lines;
    if op.argv.is_empty() {
        f.add(
            l.argv.unwrap_or(l.op),
            "no argv: the command to run is missing".into(),
            "argv = [\"/path/to/program\", \"--flag\", \"{argument}\"]",
        );
    }
    let words = op
        .argv
        .iter()
        .enumerate()
        .map(|(i, w)| (l.words.get(i).copied().unwrap_or(l.op), w, "argv"));
    let env = op
        .env
        .iter()
        .map(|(k, w)| (l.env.get(k).copied().unwrap_or(l.op), w, "env"));
    for (line, w, place) in words.chain(env) {
        match w {
            Word::Mixed(s) => f.add(
                line,
                format!("{place} word {s:?} has a placeholder that is not the whole word"),
                "make the placeholder its own word: [\"--version\", \"{version}\"], not \"--version={version}\" (write {{ and }} for literal braces)",
            ),
            Word::Arg(a) if op.arg(a).is_none() => f.add(
                line,
                format!("placeholder {{{a}}} is not an argument"),
                format!("declare it under [operations.{}.args], or correct the name", op.name),
            ),
            Word::Arg(a) => {
                let arg = op.arg(a).expect("checked above");
                if !arg.required && arg.default.is_none() {
                    f.add(
                        line,
                        format!("{{{a}}} is optional without a default, so the {place} would have a hole"),
                        format!("give {a} a default, or make it required"),
                    );
                }
            }
            Word::ExecutionId if place == "env" => f.add(
                line,
                "{execution_id} in env: the command already has it as CAIRN_EXECUTION_ID".into(),
                "remove it; read $CAIRN_EXECUTION_ID, or pass {execution_id} in argv",
            ),
            _ => {}
        }
    }
}

fn check_args(op: &Operation, f: &mut Out<'_>) {
    let used = op.used_args();
    let in_command = op.command_args();
    for a in &op.args {
        if a.name == EXECUTION_ID || !valid_env_name(&a.name) {
            f.add(
                a.line,
                format!("{:?} cannot be an argument name", a.name),
                "use letters, digits and _ (execution_id is reserved)",
            );
        }
        let reaches = used.contains(&a.name);
        if !reaches && a.fingerprint {
            f.add(
                a.line,
                format!("argument {} is never used", a.name),
                format!(
                    "use {{{}}} in argv or env; if it is a note for the journal (a reason), add fingerprint = false",
                    a.name
                ),
            );
        }
        if in_command.contains(&a.name) && a.ty.is_free_string() {
            f.add(
                a.line,
                format!(
                    "argument {} is a free string (no pattern, no enum) that reaches the command",
                    a.name
                ),
                format!(
                    "add pattern = \"^…$\" (what a valid {} looks like) or enum = [...]",
                    a.name
                ),
            );
        }
        if let ArgType::Str {
            pattern: Some((p, _)),
            ..
        } = &a.ty
        {
            if !(p.starts_with('^') || p.starts_with("\\A"))
                || !(p.ends_with('$') || p.ends_with("\\z"))
            {
                f.add(
                    a.line,
                    format!("pattern {p:?} of {} is not anchored: a partial match lets anything around it through", a.name),
                    format!("write it as \"^{}$\"", p.trim_start_matches('^').trim_end_matches('$')),
                );
            }
        }
    }
}

fn check_destination(file: &OperationsFile, op: &Operation, f: &mut Out<'_>) {
    let l = &op.lines;
    let line = l.destination.unwrap_or(l.op);
    match &op.destination {
        Destination::Missing => f.add(
            l.op,
            "no destination: where it may run is undefined".into(),
            "hosts = [\"web-1\"], host_pattern = \"^web-[0-9]+$\" (with host_arg), or group = \"web\" (with [groups])",
        ),
        Destination::Hosts(h) if h.is_empty() => f.add(line, "hosts is empty".into(), "list at least one destination"),
        Destination::Group(g) if !file.groups.contains_key(g) => f.add(
            line,
            format!("group {g:?} is not defined"),
            format!("add [groups] {g} = [\"host-1\", …], or correct the name"),
        ),
        Destination::Pattern(p, _) => {
            if !p.starts_with('^') || !p.ends_with('$') {
                f.add(line, format!("host_pattern {p:?} is not anchored"), "write it as \"^…$\"");
            }
            if op.host_arg.is_none() {
                f.add(
                    line,
                    "host_pattern without host_arg: a pattern names no host by itself".into(),
                    "host_arg = \"host\", with a string argument host",
                );
            }
        }
        _ => {}
    }
    if let Some(h) = &op.host_arg {
        let hl = l.host_arg.unwrap_or(l.op);
        match op.arg(h) {
            None => f.add(
                hl,
                format!("host_arg {h:?} is not an argument"),
                format!("declare {h} under [operations.{}.args]", op.name),
            ),
            Some(a) if !matches!(a.ty, ArgType::Str { .. }) => f.add(
                hl,
                format!("host_arg {h} is not a string argument"),
                "type = \"string\"",
            ),
            _ => {}
        }
    }
}

fn check_env_and_secrets(op: &Operation, f: &mut Out<'_>) {
    let l = &op.lines;
    let sl = l.secrets.unwrap_or(l.op);
    if op.secret_values {
        f.add(
            sl,
            "a secret given by value: the file would hold the credential".into(),
            format!(
                "secrets = [{}] (names only); set the values in cairn's environment",
                op.secrets
                    .iter()
                    .map(|s| format!("{s:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    for s in &op.secrets {
        if !valid_env_name(s) {
            f.add(
                sl,
                format!("secret name {s:?} is not a variable name"),
                "use [A-Za-z_][A-Za-z0-9_]*",
            );
        }
        if op.env.contains_key(s) {
            f.add(
                sl,
                format!("{s} is both in env and in secrets"),
                "keep it in secrets only",
            );
        }
    }
    for (k, w) in &op.env {
        let line = l.env.get(k).copied().unwrap_or(l.op);
        if !valid_env_name(k) || k.starts_with("CAIRN_") {
            f.add(
                line,
                format!("{k:?} cannot be set in env"),
                "use [A-Za-z_][A-Za-z0-9_]* (CAIRN_ is reserved)",
            );
        }
        let upper = k.to_ascii_uppercase();
        if matches!(w, Word::Lit(_)) && SECRET_WORDS.iter().any(|s| upper.contains(s)) {
            f.add(
                line,
                format!("a secret given by value: env {k} holds a literal"),
                format!("move it to secrets = [\"{k}\"] and set {k} in cairn's environment"),
            );
        }
    }
    if let Some(c) = &op.cwd {
        if c.contains(['\n', '\0']) || c.contains(['{', '}']) {
            f.add(
                l.cwd.unwrap_or(l.op),
                "cwd holds a newline, NUL or placeholder".into(),
                "give a fixed directory (cwd = \"/srv/app\")",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::OperationsFile;

    const GOOD: &str = r#"
[operations.op]
description = "An operation"
class = "idempotent"
hosts = ["h"]
argv = ["/bin/tool", "{name}"]
[operations.op.args]
name = { type = "string", pattern = "^[a-z]+$" }
"#;

    /// Each unsafe contract, and the line and words its finding must have.
    // Long: one scenario, its phases in order.
    #[test]
    fn each_unsafe_contract_is_refused_with_its_line_and_a_fix() {
        let cases: &[(&str, &str, usize, &str)] = &[
            ("class = \"idempotent\"\n", "", 2, "no class"),
            (
                "\"{name}\"]",
                "\"{nmae}\"]",
                6,
                "placeholder {nmae} is not an argument",
            ),
            (
                "argv = [\"/bin/tool\", \"{name}\"]",
                "argv = [\"/bin/tool\"]",
                8,
                "argument name is never used",
            ),
            (
                "pattern = \"^[a-z]+$\" ",
                "",
                8,
                "free string (no pattern, no enum) that reaches the command",
            ),
            (
                "class = \"idempotent\"",
                "class = \"irreversible\"",
                4,
                "irreversible without an approval rule",
            ),
            (
                "class = \"idempotent\"",
                "class = \"read-only\"\nretention = \"7d\"",
                5,
                "retention 7d is outside what class read-only allows",
            ),
            (
                "hosts = [\"h\"]",
                "hosts = [\"h\"]\nsecrets = { DB_PASSWORD = \"hunter2\" }",
                6,
                "a secret given by value",
            ),
            (
                "hosts = [\"h\"]",
                "hosts = [\"h\"]\nenv = { API_TOKEN = \"abc\" }",
                6,
                "a secret given by value: env API_TOKEN",
            ),
            ("\"{name}\"]", "\"--name={name}\"]", 6, "not the whole word"),
            ("^[a-z]+$", "[a-z]+", 8, "is not anchored"),
            ("hosts = [\"h\"]", "", 2, "no destination"),
            (
                "class = \"idempotent\"",
                "class = \"idempotent\"\ntimeout = \"2h\"\nretention = \"1h\"",
                6,
                "shorter than the timeout",
            ),
            (
                "hosts = [\"h\"]",
                "host_pattern = \"^web-[0-9]+$\"",
                5,
                "host_pattern without host_arg",
            ),
            (
                "class = \"idempotent\"",
                "class = \"idempotnet\"",
                4,
                "unknown operation class",
            ),
            (
                "type = \"string\"",
                "type = \"strnig\"",
                8,
                "is not string, integer or boolean",
            ),
            (
                "description = \"An operation\"",
                "descriptoin = \"An operation\"",
                3,
                "unknown field",
            ),
        ];
        assert!(OperationsFile::parse(GOOD, "g.toml").is_ok());
        for (from, to, line, words) in cases {
            assert!(GOOD.contains(from), "{from}");
            let text = GOOD.replacen(from, to, 1);
            let findings = OperationsFile::parse(&text, "bad.toml")
                .err()
                .unwrap_or_else(|| panic!("accepted: {text}"));
            let f = findings
                .iter()
                .find(|f| f.message.contains(words))
                .unwrap_or_else(|| panic!("{words:?} not in {findings:#?}\n{text}"));
            assert_eq!(f.line, *line, "{words}: {findings:#?}\n{text}");
            assert!(!f.fix.is_empty());
        }
    }

    #[test]
    fn a_note_outside_the_fingerprint_may_go_unused_and_free() {
        let text = GOOD.replace(
            "name = {",
            "reason = { type = \"string\", required = false, fingerprint = false }\nname = {",
        );
        assert!(OperationsFile::parse(&text, "n.toml").is_ok());
    }
}
