//! Fuzz smoke for everything that parses bytes from outside: the marker protocol's reply
//! demultiplexer and record parser (bytes from the host), the known_hosts parser and the
//! ssh_config parser (files). Seeds live in `tests/corpus/`; each seed is mutated with a seeded
//! RNG, and proptest adds arbitrary inputs. Properties: no panic, no hang (every input is timed),
//! bounded memory (the demultiplexer never holds more than one protocol line).
//!
//! `CAIRN_FUZZ_ITERATIONS` (default 300 per seed) scales the run; CI runs the default.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cairn::testing::marker::{parse_line, Piece, StderrDemux};
use proptest::prelude::*;

const NONCE: &str = "0123456789abcdef0123456789abcdef";

fn corpus(kind: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(kind);
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "empty corpus {}", dir.display());
    v
}

fn iterations() -> usize {
    std::env::var("CAIRN_FUZZ_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
}

/// xorshift64*: deterministic mutations without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(v.len() + 1);
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] = rng.next() as u8;
            }
            1 => v.insert(at, rng.next() as u8),
            2 if at < v.len() => {
                v.remove(at);
            }
            3 => {
                // Splice a piece of the seed elsewhere (duplicated lines, boundaries).
                let a = rng.below(seed.len());
                let b = (a + rng.below(64)).min(seed.len());
                let piece = seed[a..b].to_vec();
                v.splice(at..at, piece);
            }
            4 => {
                v.splice(
                    at..at,
                    b"=".iter().copied().chain(std::iter::repeat_n(b'9', 30)),
                );
            }
            _ => v.truncate(at),
        }
    }
    v
}

fn timed<T>(what: &str, input: &[u8], f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let r = f();
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "{what} took {took:?} on input {:?}",
        String::from_utf8_lossy(input)
    );
    r
}

/// Feed `data` in chunks of the given sizes; check memory stays bounded and nothing is lost.
fn demux(data: &[u8], chunk_sizes: &[usize]) {
    let mut d = StderrDemux::new(NONCE);
    let mut pieces = Vec::new();
    let mut rest = data;
    let mut i = 0;
    while !rest.is_empty() {
        let n = chunk_sizes
            .get(i % chunk_sizes.len().max(1))
            .copied()
            .unwrap_or(7)
            .clamp(1, rest.len());
        d.feed(&rest[..n], &mut pieces);
        rest = &rest[n..];
        i += 1;
    }
    let held = d.finish();
    assert!(
        held.len() <= 64 * 1024 + 64,
        "demux held {} bytes",
        held.len()
    );
    // Nothing lost, nothing invented: the pieces are exactly what the whole input splits
    // into (command stderr outside the protocol lines, the lines in order, the held tail).
    let mut stderr = Vec::new();
    let mut lines = Vec::new();
    for p in pieces {
        match p {
            Piece::Stderr(s) => stderr.extend_from_slice(&s),
            Piece::Line(l) => lines.push(l),
        }
    }
    let want = split_whole(data);
    if want.longest_line <= 64 * 1024 {
        assert!(stderr == want.stderr, "command stderr differs for {data:?}");
        assert_eq!(lines, want.lines, "protocol lines differ for {data:?}");
        assert_eq!(held, want.held, "held tail differs for {data:?}");
    } else {
        // (a line past the demultiplexer's limit is dropped where the limit is hit, which
        // depends on the chunks; only conservation holds then)
        assert!(stderr.len() + held.len() <= data.len());
    }
}

/// How the protocol splits a whole stderr stream, written out plainly: every
/// `BOUNDARY line\n` is a protocol line, everything else command stderr; a stream that ends
/// inside a line, or inside what could still become a boundary, leaves that tail held.
struct Split {
    stderr: Vec<u8>,
    lines: Vec<Result<cairn::testing::marker::Line, cairn::testing::marker::MarkerError>>,
    held: Vec<u8>,
    longest_line: usize,
}

fn split_whole(data: &[u8]) -> Split {
    let boundary = format!("@@cairn-{NONCE}@@ ").into_bytes();
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    let mut out = Split {
        stderr: Vec::new(),
        lines: Vec::new(),
        held: Vec::new(),
        longest_line: 0,
    };
    let mut rest = data;
    loop {
        match find(rest, &boundary) {
            Some(pos) => {
                out.stderr.extend_from_slice(&rest[..pos]);
                let after = &rest[pos + boundary.len()..];
                match after.iter().position(|&b| b == b'\n') {
                    Some(nl) => {
                        out.longest_line = out.longest_line.max(nl);
                        out.lines
                            .push(parse_line(&String::from_utf8_lossy(&after[..nl])));
                        rest = &after[nl + 1..];
                    }
                    None => {
                        out.longest_line = out.longest_line.max(after.len());
                        out.held = after.to_vec();
                        return out;
                    }
                }
            }
            None => {
                let keep = (1..boundary.len().min(rest.len() + 1))
                    .rev()
                    .find(|&k| rest.ends_with(&boundary[..k]))
                    .unwrap_or(0);
                out.stderr.extend_from_slice(&rest[..rest.len() - keep]);
                out.held = rest[rest.len() - keep..].to_vec();
                return out;
            }
        }
    }
}

#[test]
fn marker_replies_survive_mutation() {
    let mut rng = Rng(0x5eed_cafe);
    for seed in corpus("marker") {
        for _ in 0..iterations() {
            let m = mutate(&seed, &mut rng);
            let sizes = [1 + rng.below(40), 1 + rng.below(4000)];
            timed("demux", &m, || demux(&m, &sizes));
            for line in String::from_utf8_lossy(&m).lines() {
                let text = line.split("@@ ").last().unwrap_or(line);
                timed("parse_line", line.as_bytes(), || {
                    let _ = parse_line(text);
                });
            }
        }
    }
}

#[test]
fn a_protocol_line_that_never_ends_does_not_grow_without_bound() {
    let mut d = StderrDemux::new(NONCE);
    let mut pieces = Vec::new();
    d.feed(format!("@@cairn-{NONCE}@@ start ").as_bytes(), &mut pieces);
    let chunk = vec![b'x'; 1 << 16];
    for _ in 0..64 {
        d.feed(&chunk, &mut pieces);
    }
    assert!(d.finish().len() <= 1 << 17);
    assert!(pieces.iter().any(|p| matches!(p, Piece::Line(Err(_)))));
}

#[test]
fn known_hosts_files_survive_mutation() {
    let mut rng = Rng(0xbeef);
    for seed in corpus("known_hosts") {
        for _ in 0..iterations() {
            let m = mutate(&seed, &mut rng);
            let text = String::from_utf8_lossy(&m);
            let entries = timed("known_hosts::parse", &m, || {
                cairn::ssh::known_hosts::parse(&text)
            });
            for e in &entries {
                timed("matches", &m, || {
                    let _ = e.matches("db-1.prod");
                    let _ = e.matches(&"a".repeat(300));
                });
            }
        }
    }
}

fn resolve_with(config: &Path) {
    let opts = cairn::ssh::ConnectOptions {
        ssh_config: Some(config.to_path_buf()),
        known_hosts: Some(PathBuf::from("/dev/null")),
        ..Default::default()
    };
    for dest in ["db-1", "ops@db-9", "x"] {
        let _ = cairn::ssh::resolve(dest, &opts);
    }
}

#[test]
fn ssh_config_files_survive_mutation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    let mut rng = Rng(0xc0f1);
    for seed in corpus("ssh_config") {
        for _ in 0..iterations() {
            let m = mutate(&seed, &mut rng);
            std::fs::write(&path, &m).unwrap();
            timed("ssh_config resolve", &m, || resolve_with(&path));
        }
    }
}

#[test]
fn ssh_config_including_an_endless_file_or_itself_terminates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    for body in [
        "Include /dev/zero\nHost *\n  User x\n".to_string(),
        format!("Include {}\n", path.display()),
    ] {
        std::fs::write(&path, &body).unwrap();
        timed("ssh_config include", body.as_bytes(), || {
            resolve_with(&path)
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    #[test]
    fn demux_never_panics_on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..4096),
                                             a in 1usize..64, b in 1usize..4096) {
        demux(&data, &[a, b]);
    }

    #[test]
    fn parse_line_never_panics(s in ".{0,300}") {
        let _ = parse_line(&s);
    }

    #[test]
    fn known_hosts_parse_never_panics(s in "(.{0,80}\n){0,8}") {
        for e in cairn::ssh::known_hosts::parse(&s) {
            let _ = e.matches("host.example");
        }
    }
}

/// `decode_line` on one input line: never panics, is timed, and every outcome is well-formed —
/// a request with a method, or a JSON-RPC 2.0 error (-32700 / -32600) that echoes the `id`
/// when the line had one.
fn decode_jsonrpc(line: &str) {
    let r = timed("serve::decode_line", line.as_bytes(), || {
        cairn::testing::serve::decode_line(line)
    });
    match r {
        Ok(req) => {
            // A decoded request round-trips: its own JSON decodes to the same request.
            let mut again =
                serde_json::json!({"jsonrpc": "2.0", "method": req.method, "params": req.params});
            if let Some(id) = &req.id {
                again["id"] = id.clone();
            }
            assert_eq!(
                cairn::testing::serve::decode_line(&again.to_string()).as_ref(),
                Ok(&req)
            );
        }
        Err(resp) => {
            assert_eq!(resp["jsonrpc"], "2.0", "{resp}");
            let code = resp["error"]["code"].as_i64();
            assert!(matches!(code, Some(-32700 | -32600)), "{resp}");
            assert!(resp["error"]["message"].is_string(), "{resp}");
            assert!(resp.get("id").is_some(), "{resp}");
            // The response is itself one line of JSON.
            assert!(!resp.to_string().contains('\n'));
        }
    }
}

#[test]
fn jsonrpc_lines_survive_mutation() {
    let mut rng = Rng(0x1eaf);
    for seed in corpus("jsonrpc") {
        for _ in 0..iterations() {
            let m = mutate(&seed, &mut rng);
            let text = String::from_utf8_lossy(&m);
            for line in text.lines() {
                decode_jsonrpc(line);
            }
            // And the whole mutated file as a single line.
            decode_jsonrpc(&text.replace('\n', " "));
        }
    }
}

#[test]
fn jsonrpc_deep_nesting_and_huge_lines_are_bounded() {
    let deep = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"status\",\"params\":{}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    decode_jsonrpc(&deep);
    let open_only = "{\"a\":".repeat(200_000);
    decode_jsonrpc(&open_only);
    let long = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":\"{}\",\"method\":\"review\"}}",
        "x".repeat(8 << 20)
    );
    decode_jsonrpc(&long);
}

/// A numeric id is echoed as the same number. The first input is the one the property below
/// found: without serde_json's `float_roundtrip`, it came back one ulp off.
#[test]
fn jsonrpc_float_ids_are_echoed_exactly() {
    for text in [
        "6.768395305344992e+165",
        "0.1",
        "1e-320",
        "1.7976931348623157e308",
        "-2.2250738585072014e-308",
    ] {
        let want: f64 = text.parse().unwrap();
        let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":{text},\"method\":\"status\"}}");
        let req = cairn::testing::serve::decode_line(&line).unwrap();
        assert_eq!(
            req.id.as_ref().and_then(|v| v.as_f64()),
            Some(want),
            "{text}"
        );
        decode_jsonrpc(&line);
        // And an invalid request's error response echoes it too.
        let bad = line.replace("2.0", "1.0");
        let resp = cairn::testing::serve::decode_line(&bad).unwrap_err();
        let echoed: serde_json::Value = serde_json::from_str(&resp.to_string()).unwrap();
        assert_eq!(echoed["id"].as_f64(), Some(want), "{text}: {resp}");
    }
}

/// A JSON-RPC-shaped line built from arbitrary parts (so that most inputs get past the JSON
/// parser and exercise the request validation).
fn jsonrpc_line() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        Just("null".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| serde_json::json!(f).to_string()),
        ".{0,20}".prop_map(|s| serde_json::json!(s).to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("true".to_string()),
    ];
    let key = prop_oneof![
        Just("jsonrpc"),
        Just("id"),
        Just("method"),
        Just("params"),
        Just("x")
    ];
    proptest::collection::vec((key, value), 0..6).prop_map(|fields| {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", body.join(","))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn jsonrpc_decode_never_panics_on_arbitrary_text(s in ".{0,400}") {
        decode_jsonrpc(&s);
    }

    #[test]
    fn jsonrpc_decode_never_panics_on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..1024)) {
        decode_jsonrpc(&String::from_utf8_lossy(&data));
    }

    #[test]
    fn jsonrpc_decode_handles_request_shaped_lines(line in jsonrpc_line(), version in prop_oneof![Just("2.0"), Just("1.0"), Just("")]) {
        decode_jsonrpc(&line);
        let with_version = line.replacen('{', &format!("{{\"jsonrpc\":\"{version}\","), 1);
        decode_jsonrpc(&with_version);
    }
}
