//! The TLS acceptor for `--tls` ports, from the `--crt`/`--key` PEM files (ring provider only,
//! as the workspace configures rustls).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("no --crt/--key given")]
    NotConfigured,
    #[error("reading certificates from {path}: {source}")]
    Certs { path: PathBuf, source: pem::Error },
    #[error("{path} holds no certificate")]
    NoCerts { path: PathBuf },
    #[error("reading the private key from {path}: {source}")]
    Key { path: PathBuf, source: pem::Error },
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Offers h2 and HTTP/1.1 by ALPN, as the Istio echo app does on its TLS ports.
pub fn acceptor(crt: Option<&Path>, key: Option<&Path>) -> Result<TlsAcceptor, TlsSetupError> {
    let (Some(crt), Some(key)) = (crt, key) else {
        return Err(TlsSetupError::NotConfigured);
    };
    let certs = CertificateDer::pem_file_iter(crt)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsSetupError::Certs {
            path: crt.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsSetupError::NoCerts {
            path: crt.to_path_buf(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsSetupError::Key {
        path: key.to_path_buf(),
        source,
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_are_reported_not_panicked_on() {
        let missing = Path::new("/nonexistent/aether-echo/cert.crt");
        assert!(matches!(
            acceptor(Some(missing), Some(missing)),
            Err(TlsSetupError::Certs { .. })
        ));
        assert!(matches!(
            acceptor(None, Some(missing)),
            Err(TlsSetupError::NotConfigured)
        ));
    }

    #[test]
    fn a_file_without_certificates_is_rejected() {
        let path =
            std::env::temp_dir().join(format!("aether-echo-empty-{}.pem", std::process::id()));
        std::fs::write(&path, "not a pem file\n").unwrap();
        let result = acceptor(Some(&path), Some(&path));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(result, Err(TlsSetupError::NoCerts { .. })));
    }
}
