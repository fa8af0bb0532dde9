//! Errors that stop the certificate authority from starting.

use std::net::SocketAddr;

use super::authority::AuthorityError;
use super::config::ConfigError;
use super::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("invalid CA configuration: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("root Secret {namespace}/{name} cannot be used: {source}")]
    Root {
        namespace: String,
        name: String,
        source: AuthorityError,
    },
    #[error("TLS setup of the CA endpoint: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}
