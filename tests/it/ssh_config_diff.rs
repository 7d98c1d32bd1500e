//! `cairn config DEST` against `ssh -G DEST` over a corpus of ssh_config files
//! (`tests/corpus/ssh_config_match/`, each naming the destinations to try on its first line):
//! every keyword cairn uses must resolve as OpenSSH resolves it, `Match` blocks included.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_cairn");

fn lines(out: &[u8]) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in String::from_utf8_lossy(out).lines() {
        if let Some((k, v)) = l.split_once(' ') {
            m.entry(k.to_owned()).or_default().push(v.to_owned());
        }
    }
    m
}

/// What `ssh -G` prints unexpanded (IdentityFile, CertificateFile), expanded the way ssh
/// expands it when it uses the file.
fn expand(v: &str, ssh: &BTreeMap<String, Vec<String>>, alias: &str, home: &str) -> String {
    let one = |k: &str| {
        ssh.get(k)
            .and_then(|v| v.first())
            .cloned()
            .unwrap_or_default()
    };
    let v = match v.strip_prefix("~/") {
        Some(rest) => format!("{home}/{rest}"),
        None => v.to_owned(),
    };
    v.replace("%h", &one("hostname"))
        .replace("%r", &one("user"))
        .replace("%p", &one("port"))
        .replace("%n", alias)
        .replace("%d", home)
        .replace("%%", "%")
}

// Long: one scenario, its phases in order.
#[test]
fn match_corpus_resolves_as_ssh_g_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/ssh_config_match");
    let home = std::env::var("HOME").unwrap();
    let mut compared = 0;
    let mut failures = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "corpus {} is missing", dir.display());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let dests = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# destinations: "))
            .unwrap_or_else(|| panic!("{}: first line must name the destinations", file.display()));
        for dest in dests.split_whitespace() {
            let alias = dest.rsplit('@').next().unwrap();
            let ssh = Command::new("ssh")
                .arg("-G")
                .arg("-F")
                .arg(&file)
                .arg(dest)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                ssh.status.success(),
                "ssh -G {dest}: {}",
                String::from_utf8_lossy(&ssh.stderr)
            );
            let cairn = Command::new(BIN)
                .args(["config", "-F"])
                .arg(&file)
                .arg(dest)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                cairn.status.success(),
                "cairn config {dest}: {}",
                String::from_utf8_lossy(&cairn.stderr)
            );
            let (s, c) = (lines(&ssh.stdout), lines(&cairn.stdout));
            let mut check = |k: &str, want: Option<Vec<String>>| {
                let Some(want) = want else { return };
                compared += 1;
                let got = c.get(k).cloned().unwrap_or_default();
                if got != want {
                    failures.push(format!(
                        "{} {dest}: {k}: ssh -G {want:?}, cairn {got:?}",
                        file.file_name().unwrap().to_string_lossy()
                    ));
                }
            };
            for k in [
                "user",
                "hostname",
                "port",
                "identitiesonly",
                "userknownhostsfile",
                "globalknownhostsfile",
                "hostkeyalias",
                "serveralivecountmax",
                "identityagent",
                "proxyjump",
                "proxycommand",
            ] {
                check(k, s.get(k).cloned());
            }
            // Keywords where cairn's default differs from OpenSSH's (it never prompts, always
            // has a deadline and keepalives): compared when the config sets them.
            let set = |k: &str, unset: &[&str]| {
                s.get(k)
                    .cloned()
                    .filter(|v| !unset.contains(&v[0].as_str()))
            };
            check("connecttimeout", set("connecttimeout", &["none"]));
            check("serveraliveinterval", set("serveraliveinterval", &["0"]));
            check(
                "stricthostkeychecking",
                set("stricthostkeychecking", &["ask"]),
            );
            // Key and certificate files: compared when configured for this destination
            // (OpenSSH's default list of key names is longer than the three cairn tries).
            let openssh_defaults = [
                "id_rsa",
                "id_ecdsa",
                "id_ecdsa_sk",
                "id_ed25519",
                "id_ed25519_sk",
                "id_xmss",
                "id_dsa",
            ]
            .map(|n| format!("{home}/.ssh/{n}"))
            .to_vec();
            let configured = s.get("identityfile").is_some_and(|v| {
                v.iter()
                    .map(|f| expand(f, &s, alias, &home))
                    .collect::<Vec<_>>()
                    != openssh_defaults
            });
            if configured {
                check(
                    "identityfile",
                    s.get("identityfile")
                        .map(|v| v.iter().map(|f| expand(f, &s, alias, &home)).collect()),
                );
            }
            check(
                "certificatefile",
                s.get("certificatefile")
                    .map(|v| v.iter().map(|f| expand(f, &s, alias, &home)).collect()),
            );
        }
    }
    assert!(
        failures.is_empty(),
        "cairn and ssh -G disagree:\n{}",
        failures.join("\n")
    );
    assert!(compared > 100, "only {compared} keywords compared");
}

/// Bad configurations are refused with the file, line and a fix, before anything is contacted.
#[test]
fn config_refuses_what_it_cannot_honour() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("config");
    for (text, needle) in [
        (
            "Host x\n  StrictHostKeyChecking no\n",
            "StrictHostKeyChecking no would accept",
        ),
        ("Host x\n  ProxyJump a,,b\n", "Invalid ProxyJump \"a,,b\""),
        ("Match tagged prod\n  User u\n", "'tagged' is not supported"),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let out = Command::new(BIN)
            .args(["config", "-F"])
            .arg(&cfg)
            .arg("x")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text:?}");
        assert!(
            err.contains(needle) && err.contains(":2:") || err.contains(":1:"),
            "{text:?}: {err}"
        );
        assert!(err.contains(needle), "{text:?}: {err}");
    }
}
