//! The HTTP front's listener: plain TCP, or TLS (rustls on the ring provider) with a
//! certificate chain and key from PEM files. TLS handshakes run as tasks of their own, so a
//! slow or broken client never holds up the others; a failed handshake is logged and dropped.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

/// One accepted connection: plain or TLS.
pub type Io = Either<TcpStream, TlsStream<TcpStream>>;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The peer of a connection (for refusals' evidence).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>> for Peer {
    fn connect_info(s: axum::serve::IncomingStream<'_, Listener>) -> Self {
        Peer(*s.remote_addr())
    }
}

/// A TLS server configuration from a PEM certificate chain and a PEM private key.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, super::HttpError> {
    use super::HttpError;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|source| HttpError::TlsCert {
            path: cert.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(HttpError::NoCertificate(cert.to_owned()));
    }
    // (the key's error never shows the key: the parser's messages name the problem only)
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| HttpError::TlsKey {
        path: key.to_owned(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(HttpError::Tls)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(HttpError::CertAndKey)?;
    Ok(Arc::new(cfg))
}

/// Accepted (and, with TLS, handshaken) connections.
pub struct Listener {
    rx: tokio::sync::mpsc::Receiver<(Io, SocketAddr)>,
    addr: SocketAddr,
}

impl Listener {
    pub fn new(tcp: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) -> std::io::Result<Self> {
        let addr = tcp.local_addr()?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        tokio::spawn(async move {
            loop {
                let (s, peer) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        // (EMFILE and the like: wait a little rather than spin)
                        tracing::warn!("cairn: accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = s.set_nodelay(true);
                match &acceptor {
                    None => {
                        if tx.send((Either::Left(s), peer)).await.is_err() {
                            return;
                        }
                    }
                    Some(a) => {
                        let (a, tx) = (a.clone(), tx.clone());
                        tokio::spawn(async move {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, a.accept(s)).await {
                                Ok(Ok(t)) => {
                                    let _ = tx.send((Either::Right(t), peer)).await;
                                }
                                Ok(Err(e)) => {
                                    tracing::info!("cairn: TLS handshake with {peer}: {e}")
                                }
                                Err(_) => {
                                    tracing::info!("cairn: TLS handshake with {peer} timed out")
                                }
                            }
                        });
                    }
                }
            }
        });
        Ok(Listener { rx, addr })
    }
}

impl axum::serve::Listener for Listener {
    type Io = Io;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task is gone (the runtime is shutting down): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
