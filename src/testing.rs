//! **Not API.** What cairn's own binary (`src/main.rs`), integration tests (`tests/it`) and
//! benches (`benches/`) reach inside the crate, and nothing else. There is no stability promise:
//! any item here may change or go in any release. A library user builds an
//! [`Executor`](crate::Executor) with [`ExecutorBuilder`](crate::ExecutorBuilder) and never
//! needs this module.
//!
//! The modules these items come from are crate-private; each is re-exported here item by item,
//! grouped by origin, so that the surface the tests hold stays small and visible in one place.

/// The binary's whole `main`: parse the command line, run the command, exit with its code.
/// It lives in the command line's module, the only one that knows clap.
pub use crate::cli::binary as main;

/// The marker protocol's client side: the host script, exec strings, reply parsing.
pub mod marker {
    pub use crate::marker::{
        cksum, invocation, new_nonce, parse_line, script_path, script_sha256, session_request,
        session_script, shell_quote, Line, MarkerError, Op, Piece, StderrDemux, INSTALLER,
        MAX_EXEC_LEN,
    };
}

/// The host helper binary embedded at build time, and how it is invoked.
pub mod host_helper {
    pub use crate::host_helper::{available, invocation, Side, BINARY, SHA256};
}

/// Host sessions: one long-lived exec per connection starting dispatches in batches.
pub mod session {
    pub use crate::session::{Event, HostSession, Request};
}

/// The JSON-RPC front's request decoding (`cairn serve --stdio`, `POST /rpc`).
pub mod serve {
    pub use crate::front::rpc::decode_line;
}

/// The process's one async runtime.
pub mod rt {
    pub use crate::rt::block_on;
}
