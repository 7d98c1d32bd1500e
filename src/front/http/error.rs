//! The error of the HTTP front.

use std::path::PathBuf;

use crate::journal::JournalError;

/// What went wrong in the HTTP front (`src/front/http/**`): a request whose routing headers
/// cannot stand with its body, the journal behind a session, an event stream or a scrape, or
/// the TLS certificate and key the server is started with.
///
/// Layer: the HTTP front. Who converts it: `serve_mcp` turns a TLS error into
/// [`ExecError::Setup`](crate::error::ExecError::Setup) (`From<HttpError> for ExecError`);
/// the request handlers turn the others into the HTTP or JSON-RPC answer (the message is the
/// text the client reads: `-32020` for a header, `-32602` for a `taskId`, 503 for the journal);
/// the event store boxes it into rmcp's `EventStoreError`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The journal could not be opened or read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A blocking task of the front died before it answered.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
    /// A failpoint made this step fail (tests only; the text says which step).
    #[error("{0}")]
    Failpoint(&'static str),
    /// Two or more of one routing header (`name` is the header as the client sent it).
    #[error("more than one {name} header")]
    DuplicateHeader { name: String },
    /// A routing header that is neither visible ASCII nor `=?base64?…?=`.
    #[error("{name} header is not valid (visible ASCII, or =?base64?…?=)")]
    InvalidHeader { name: String },
    /// A routing header that disagrees with the body (`what` names the body's value).
    #[error(
        "{name} header {given:?} does not match {what}: the body is the request, the header \
         only a hint about it"
    )]
    HeaderMismatch {
        name: String,
        given: String,
        what: String,
    },
    /// A `tasks/*` request whose `taskId` is not a string (`found` is what it is).
    #[error("{method}: taskId must be a string, not {found}")]
    TaskIdNotAString { method: String, found: String },
    /// A `tasks/*` request with no `taskId`.
    #[error("{method}: taskId is required")]
    TaskIdMissing { method: String },
    /// The `--tls-cert` file cannot be read as PEM certificates.
    #[error("--tls-cert {}: {source}", path.display())]
    TlsCert {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    /// The `--tls-cert` file holds no certificate.
    #[error("--tls-cert {}: no certificate in the file", .0.display())]
    NoCertificate(PathBuf),
    /// The `--tls-key` file cannot be read as a PEM private key (the message never shows the
    /// key).
    #[error("--tls-key {}: {source}", path.display())]
    TlsKey {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    /// rustls refused its own protocol versions.
    #[error("TLS: {0}")]
    Tls(rustls::Error),
    /// The certificate chain and the key do not make a server configuration.
    #[error("--tls-cert/--tls-key: {0}")]
    CertAndKey(rustls::Error),
    /// The metrics could not be written as text.
    #[error(transparent)]
    Encode(#[from] std::fmt::Error),
}

impl From<HttpError> for crate::error::ExecError {
    fn from(e: HttpError) -> Self {
        crate::error::ExecError::Setup(e.to_string())
    }
}
