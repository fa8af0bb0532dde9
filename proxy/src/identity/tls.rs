//! TLS of the mesh hop. Both sides present the SVID of their pod's ServiceAccount and verify
//! the peer's chain against the trust bundle; what a SPIFFE ID is *allowed* is decided by the
//! caller after the handshake (the outbound side knows which identities a backend may have).
//!
//! Certificates and roots live behind locks the configurations read at every handshake, so a
//! renewed SVID or a new root applies to the next connection while open ones keep going.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{
    CryptoProvider, WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ParsedCertificate, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    ClientConfig, DigitallySignedStruct, DistinguishedName, Error, RootCertStore, ServerConfig,
    SignatureScheme,
};

use super::{ServiceAccount, spiffe_ids};

/// ALPN of the mesh hop: always HTTP/2, so one connection carries every request between two
/// proxies for a pair of workloads.
pub const MESH_ALPN: &[u8] = b"h2";

/// How long a connection of a pod that has just been meshed waits for the pod's first SVID,
/// on either end, before it is refused: the SVID is issued a moment after the pod joins.
pub const FIRST_SVID_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("trust bundle: {0}")]
    Bundle(String),
    #[error("the trust bundle holds no certificate")]
    EmptyBundle,
    #[error("certificate chain: {0}")]
    Chain(String),
    #[error("private key: {0}")]
    Key(String),
}

/// The mesh's trust roots, replaceable at run time (root rotation publishes old and new roots
/// together, so both verify while certificates move over).
#[derive(Debug)]
pub struct TrustStore {
    trust_domain: String,
    provider: Arc<CryptoProvider>,
    state: RwLock<TrustState>,
}

#[derive(Debug)]
struct TrustState {
    roots: Arc<RootCertStore>,
    client_verifier: Option<Arc<dyn ClientCertVerifier>>,
    pem: String,
}

impl TrustStore {
    pub fn new(trust_domain: impl Into<String>) -> Arc<Self> {
        Arc::new(TrustStore {
            trust_domain: trust_domain.into(),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            state: RwLock::new(TrustState {
                roots: Arc::new(RootCertStore::empty()),
                client_verifier: None,
                pem: String::new(),
            }),
        })
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn provider(&self) -> &Arc<CryptoProvider> {
        &self.provider
    }

    fn algorithms(&self) -> &WebPkiSupportedAlgorithms {
        &self.provider.signature_verification_algorithms
    }

    /// Replaces the roots with the certificates of `pem`. Returns whether anything changed;
    /// on error the current roots stay.
    pub fn set_bundle(&self, pem: &str) -> Result<bool, TlsError> {
        if self.read().pem == pem {
            return Ok(false);
        }
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| TlsError::Bundle(e.to_string()))?;
            roots
                .add(cert)
                .map_err(|e| TlsError::Bundle(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(TlsError::EmptyBundle);
        }
        let roots = Arc::new(roots);
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), self.provider.clone())
                .build()
                .map_err(|e| TlsError::Bundle(e.to_string()))?;
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = TrustState {
            roots,
            client_verifier: Some(client_verifier),
            pem: pem.to_owned(),
        };
        Ok(true)
    }

    pub fn roots(&self) -> Arc<RootCertStore> {
        self.read().roots.clone()
    }

    pub fn has_roots(&self) -> bool {
        !self.read().roots.is_empty()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, TrustState> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The identity a verified peer certificate carries in this trust domain.
    fn peer_identity(&self, end_entity: &CertificateDer<'_>) -> Result<ServiceAccount, Error> {
        spiffe_ids(end_entity)
            .iter()
            .find_map(|id| ServiceAccount::from_spiffe_id(&self.trust_domain, id))
            .ok_or_else(|| {
                Error::General(format!(
                    "peer certificate has no SPIFFE ID of trust domain {}",
                    self.trust_domain
                ))
            })
    }
}

/// The identity the peer of an established mesh connection proved.
pub fn peer_service_account(
    trust: &TrustStore,
    certs: Option<&[CertificateDer<'static>]>,
) -> Option<ServiceAccount> {
    trust.peer_identity(certs?.first()?).ok()
}

/// The SVIDs of the ServiceAccounts with pods on this node, and the TLS configurations that
/// present them.
#[derive(Debug)]
pub struct Certs {
    trust: Arc<TrustStore>,
    slots: Mutex<HashMap<ServiceAccount, Arc<Slot>>>,
    /// Woken at every install, for connections waiting for a pod's first SVID.
    installed: tokio::sync::Notify,
}

/// One ServiceAccount's current certificate and the configurations that read it.
#[derive(Debug)]
struct Slot {
    key: RwLock<Option<Arc<CertifiedKey>>>,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl Certs {
    pub fn new(trust: Arc<TrustStore>) -> Arc<Self> {
        Arc::new(Certs {
            trust,
            slots: Mutex::default(),
            installed: tokio::sync::Notify::new(),
        })
    }

    pub fn trust(&self) -> &Arc<TrustStore> {
        &self.trust
    }

    /// Installs (or replaces) the SVID of `sa`; connections opened from now on present it.
    pub fn install(
        &self,
        sa: &ServiceAccount,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<(), TlsError> {
        if chain.is_empty() {
            return Err(TlsError::Chain("empty".into()));
        }
        let signing = self
            .trust
            .provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| TlsError::Key(e.to_string()))?;
        let certified = Arc::new(CertifiedKey::new(chain, signing));
        certified
            .keys_match()
            .map_err(|e| TlsError::Key(e.to_string()))?;
        *self.slot(sa).key.write().unwrap_or_else(|e| e.into_inner()) = Some(certified);
        self.installed.notify_waiters();
        Ok(())
    }

    /// Waits up to `within` for `sa` to have an SVID: a pod that has just been meshed
    /// (started, or joined with its namespace) gets its first one a moment later. Whether it has.
    pub async fn wait_for(&self, sa: &ServiceAccount, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let installed = self.installed.notified();
            if self.has(sa) {
                return true;
            }
            if tokio::time::timeout_at(deadline, installed).await.is_err() {
                return self.has(sa);
            }
        }
    }

    /// Forgets the SVID of `sa` (its last pod left the node).
    pub fn remove(&self, sa: &ServiceAccount) {
        self.lock().remove(sa);
    }

    pub fn has(&self, sa: &ServiceAccount) -> bool {
        self.lock()
            .get(sa)
            .is_some_and(|slot| slot.key.read().unwrap_or_else(|e| e.into_inner()).is_some())
    }

    /// The inbound side of `sa`'s pods: presents its SVID, requires a client SVID of the mesh.
    pub fn server_config(&self, sa: &ServiceAccount) -> Arc<ServerConfig> {
        self.slot(sa).server.clone()
    }

    /// The outbound side of `sa`'s pods: presents its SVID, requires a server SVID of the mesh.
    pub fn client_config(&self, sa: &ServiceAccount) -> Arc<ClientConfig> {
        self.slot(sa).client.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ServiceAccount, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(&self, sa: &ServiceAccount) -> Arc<Slot> {
        let mut slots = self.lock();
        if let Some(slot) = slots.get(sa) {
            return slot.clone();
        }
        let slot = Arc::new_cyclic(|weak: &std::sync::Weak<Slot>| {
            let resolver = Arc::new(SlotResolver(weak.clone()));
            Slot {
                key: RwLock::new(None),
                server: Arc::new(self.build_server(resolver.clone())),
                client: Arc::new(self.build_client(resolver)),
            }
        });
        slots.insert(sa.clone(), slot.clone());
        slot
    }

    fn build_server(&self, resolver: Arc<SlotResolver>) -> ServerConfig {
        let mut config = ServerConfig::builder_with_provider(self.trust.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .with_client_cert_verifier(Arc::new(MeshClientVerifier(self.trust.clone())))
            .with_cert_resolver(resolver);
        config.alpn_protocols = vec![MESH_ALPN.to_vec()];
        config
    }

    fn build_client(&self, resolver: Arc<SlotResolver>) -> ClientConfig {
        let mut config = ClientConfig::builder_with_provider(self.trust.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(MeshServerVerifier(self.trust.clone())))
            .with_client_cert_resolver(resolver);
        config.alpn_protocols = vec![MESH_ALPN.to_vec()];
        config
    }
}

/// Reads a slot's current key at each handshake. Weak, so the configurations a slot holds do
/// not keep it alive in a cycle.
#[derive(Debug)]
struct SlotResolver(std::sync::Weak<Slot>);

impl SlotResolver {
    fn current(&self) -> Option<Arc<CertifiedKey>> {
        let slot = self.0.upgrade()?;
        let key = slot.key.read().unwrap_or_else(|e| e.into_inner());
        key.clone()
    }
}

impl ResolvesServerCert for SlotResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

impl ResolvesClientCert for SlotResolver {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.current()
    }

    fn has_certs(&self) -> bool {
        self.current().is_some()
    }
}

/// The handshake-signature methods both verifier traits require, checked with the mesh's
/// crypto provider (`self.0` is the [`TrustStore`]).
macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls12_signature(message, cert, dss, self.0.algorithms())
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls13_signature(message, cert, dss, self.0.algorithms())
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.algorithms().supported_schemes()
        }
    };
}

/// Verifies a server's chain against the mesh roots and that it carries a SPIFFE ID of the
/// trust domain. Mesh certificates name workloads, not hosts, so there is no name to check.
#[derive(Debug)]
struct MeshServerVerifier(Arc<TrustStore>);

impl ServerCertVerifier for MeshServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        let roots = self.0.roots();
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &roots,
            intermediates,
            now,
            self.0.algorithms().all,
        )?;
        self.0.peer_identity(end_entity)?;
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

/// Requires a client certificate that chains to the current mesh roots and carries a SPIFFE
/// ID of the trust domain.
#[derive(Debug)]
struct MeshClientVerifier(Arc<TrustStore>);

impl MeshClientVerifier {
    fn current(&self) -> Result<Arc<dyn ClientCertVerifier>, Error> {
        self.0
            .read()
            .client_verifier
            .clone()
            .ok_or_else(|| Error::General("no trust bundle yet".into()))
    }
}

impl ClientCertVerifier for MeshClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self
            .current()?
            .verify_client_cert(end_entity, intermediates, now)?;
        self.0.peer_identity(end_entity)?;
        Ok(verified)
    }

    handshake_signatures!();
}
