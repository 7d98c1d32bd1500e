use clap::Parser;

fn main() {
    let cli = match cairn::cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 255 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    // cairn's own messages go to stderr as `cairn: …`; CAIRN_LOG=debug shows more.
    let filter = tracing_subscriber::EnvFilter::try_from_env("CAIRN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("cairn=info,russh=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: logs that go to a file or a collector stay plain.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_level(false)
        .without_time()
        .init();
    // The process's one runtime (see `cairn::rt`): the command runs on this thread, its I/O on
    // the runtime's workers.
    let code = cairn::rt::block_on(cairn::cli::main(cli));
    // `exit` runs no destructor: stop the runtime first, so that what it holds ends as it
    // would (a ProxyCommand is hung up and stops holding our stderr).
    cairn::rt::shutdown();
    std::process::exit(code);
}
