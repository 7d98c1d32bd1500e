//! Library micro-benchmarks (criterion): `cargo bench --bench micro`.
//!
//! - journal: one durable event append (`Journal::append`: one transaction, one WAL fsync), as
//!   a note and as a transition (which the journal checks against the lifecycle), and one whole
//!   happy-path execution (accept + 5 appends).
//! - `StderrDemux`: throughput splitting the channel's stderr stream into command stderr and
//!   protocol lines, for plain stderr, stderr dense with `@` (boundary candidates), and a stream
//!   of protocol lines. (Output fingerprinting is not implemented in cairn yet: nothing to
//!   measure there.)

use std::time::Duration;

use cairn::journal::{ExecutionRecord, Journal};
use cairn::testing::marker::{self, Op, StderrDemux};
use cairn::{EventKind, ExecutionId, State};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

fn record(id: &ExecutionId) -> ExecutionRecord {
    ExecutionRecord {
        id: id.clone(),
        created_at: cairn::journal::now_rfc3339(),
        destination: "db-1".into(),
        host: "127.0.0.1".into(),
        port: 22,
        user: "ops".into(),
        command: b"true".to_vec(),
        command_digest: "b5bb9d8014a0f9b1d61e21e796d78dccdf1352f23cd32812f4850b878ae4944c".into(),
        remote_dir: ".cairn".into(),
        timeout_secs: 0,
        client: "1@bench".into(),
    }
}

fn journal(c: &mut Criterion) {
    // On the target directory's disk (not a tmpfs), so fsync costs what it costs.
    let dir = tempfile::Builder::new()
        .prefix("cairn-micro-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let mut j = Journal::open(&dir.path().join("j.db")).unwrap();
    let id = ExecutionId::generate();
    j.accept(&record(&id), serde_json::json!({})).unwrap();
    // (`running` again after `running`: a transition the lifecycle allows every time)
    for s in [State::Authorized, State::Dispatched, State::Running] {
        j.append(&id, EventKind::of_state(s), Some(s), serde_json::json!({}))
            .unwrap();
    }
    let mut g = c.benchmark_group("journal");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    // The same append as a note: no lifecycle check (the transition's row above pays for
    // reading the execution's state inside its transaction; the two side by side show it).
    g.bench_function("append one note (1 transaction, fsync)", |b| {
        b.iter(|| {
            j.append(
                &id,
                EventKind::Note,
                None,
                serde_json::json!({"start_record": "v=1 id=x len=4 digest=d epoch=e boot=b"}),
            )
            .unwrap()
        })
    });
    g.bench_function("append one event (1 transaction, fsync)", |b| {
        b.iter(|| {
            j.append(
                &id,
                EventKind::Running,
                Some(State::Running),
                serde_json::json!({"start_record": "v=1 id=x len=4 digest=d epoch=e boot=b"}),
            )
            .unwrap()
        })
    });
    g.bench_function("happy-path execution (accept + 5 appends)", |b| {
        b.iter(|| {
            let id = ExecutionId::generate();
            j.accept(&record(&id), serde_json::json!({})).unwrap();
            for s in [
                State::Authorized,
                State::Dispatched,
                State::Running,
                State::Completed,
                State::Delivered,
            ] {
                j.append(&id, EventKind::of_state(s), Some(s), serde_json::json!({}))
                    .unwrap();
            }
        })
    });
    g.finish();
}

fn demux(c: &mut Criterion) {
    let nonce = marker::new_nonce();
    const MB: usize = 1 << 20;
    let plain: Vec<u8> = b"warning: something happened in module x, line 42\n"
        .iter()
        .copied()
        .cycle()
        .take(MB)
        .collect();
    let ats: Vec<u8> = b"user@host @@ x@y @@c @@cairn- "
        .iter()
        .copied()
        .cycle()
        .take(MB)
        .collect();
    let mut lines = Vec::new();
    while lines.len() < MB {
        lines.extend_from_slice(
            format!("@@cairn-{nonce}@@ sizes out=123456 err=42\nsome stderr\n").as_bytes(),
        );
    }
    let mut g = c.benchmark_group("stderr_demux");
    g.sample_size(20).measurement_time(Duration::from_secs(2));
    for (name, data) in [
        ("plain stderr", &plain),
        ("stderr dense with '@'", &ats),
        ("protocol lines + stderr", &lines),
    ] {
        g.throughput(Throughput::Bytes(data.len() as u64));
        // 32 KiB chunks: the size of an SSH channel data packet.
        g.bench_function(format!("{name}, 32 KiB chunks"), |b| {
            b.iter_batched(
                || (StderrDemux::new(&nonce), Vec::new()),
                |(mut d, mut out)| {
                    for ch in data.chunks(32 * 1024) {
                        d.feed(ch, &mut out);
                        out.clear();
                    }
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
    let id = ExecutionId::generate();
    c.bench_function("marker::invocation (dispatch exec string)", |b| {
        b.iter(|| {
            marker::invocation(
                &Op::Dispatch {
                    id: &id,
                    len: 4,
                    digest: "b5bb9d8014a0f9b1d61e21e796d78dccdf1352f23cd32812f4850b878ae4944c",
                    timeout_secs: 0,
                    attach: true,
                },
                ".cairn",
                &nonce,
            )
        })
    });
}

fn fingerprint(c: &mut Criterion) {
    use cairn::intent::{Intent, IntentKey};
    let key = IntentKey::from_bytes(&[7u8; 32]);
    let mut intent = Intent {
        actor: "gateway:ops-bot".into(),
        cwd: Some("/srv/app".into()),
        scope: Some("change-4711".into()),
        ..Intent::default()
    };
    intent.env.insert("RAILS_ENV".into(), "production".into());
    intent.env.insert("LANG".into(), "C.UTF-8".into());
    let fp = "SHA256:0123456789abcdefghijklmnopqrstuvwxyzABCDEFG";
    let mut g = c.benchmark_group("intent fingerprint");
    for (name, cmd) in [
        (
            "short command, cwd and 2 env vars",
            b"./migrate.sh --step 7".to_vec(),
        ),
        ("64 KiB command", vec![b'x'; 64 * 1024]),
    ] {
        g.throughput(Throughput::Bytes(cmd.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                intent
                    .record(fp, "10.0.0.5:22", "deploy", &cmd)
                    .fingerprint(&key)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, journal, demux, fingerprint);
criterion_main!(benches);
