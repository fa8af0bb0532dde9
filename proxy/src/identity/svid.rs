//! SVIDs from the operator's certificate authority: a fresh key and CSR per ServiceAccount with
//! pods on this node, exchanged with the proxy's projected token (audience `aether`) for a
//! short-lived certificate, renewed at half its life. Private keys never leave the proxy's pod
//! (they are kept for a restart in its memory, [`super::kept`]).

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aether_core::ca_api::{ErrorBody, SVID_PATH, SvidRequest, SvidResponse};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rcgen::{CertificateParams, KeyPair, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::sync::watch;
use tracing::{info, warn};

use super::ServiceAccount;
use super::kept::KeptSvids;
use super::tls::{Certs, TlsError, TrustStore};

/// Longest wait for one exchange with the certificate authority.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Retry delays after a failed request, doubling up to the last.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// The shortest time between two renewals of one SVID.
const MIN_RENEWAL: Duration = Duration::from_secs(5);
/// How often the manager looks at what needs renewing when nothing else wakes it.
const TICK: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum SvidError {
    #[error("cannot read the proxy's token {}: {source}", path.display())]
    Token {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode the request: {0}")]
    Request(String),
    #[error("cannot build a CSR: {0}")]
    Csr(#[from] rcgen::Error),
    #[error("certificate authority {address} cannot be resolved: {reason}")]
    Resolve { address: String, reason: String },
    #[error("no trust bundle yet to verify the certificate authority")]
    NoTrust,
    #[error("certificate authority {address}: {reason}")]
    Transport { address: String, reason: String },
    #[error("certificate authority refused the request ({status}): {message}")]
    Refused { status: u16, message: String },
    #[error("certificate authority answered something unexpected: {0}")]
    Answer(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Finds the address of the certificate authority's host (a Service name is looked up in the
/// proxy's view of Services; other names through the system resolver).
pub type Resolver = Arc<dyn Fn(&str) -> Option<std::net::IpAddr> + Send + Sync>;

/// Talks to the operator's `/v1/svid` endpoint.
pub struct CaClient {
    /// `host:port`; the host is also the name the endpoint's certificate must carry.
    pub address: String,
    pub token_file: PathBuf,
    pub trust: Arc<TrustStore>,
    pub resolve: Resolver,
}

/// What the certificate authority issued.
pub struct Issued {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub not_after: SystemTime,
    /// The chain and the key as PEM, the form they are kept in.
    pub pem: String,
}

impl Issued {
    /// An SVID from its PEM: the chain, leaf first, and a PKCS#8 private key.
    pub fn from_pem(pem: String) -> Result<Issued, SvidError> {
        let chain = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| SvidError::Answer(format!("certificate chain: {e}")))?;
        let leaf = chain
            .first()
            .ok_or_else(|| SvidError::Answer("the certificate chain is empty".into()))?;
        let not_after = not_after(leaf)?;
        let key = PrivateKeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| SvidError::Answer(format!("private key: {e}")))?;
        Ok(Issued {
            chain,
            key,
            not_after,
            pem,
        })
    }

    /// When to renew, given the certificate arrived at `received`: half-way through the time
    /// it has left. Not from `not_before`, which the CA backdates for clock skew (with a short
    /// lifetime, half of the nominal life may already be over on arrival). Never sooner than
    /// [`MIN_RENEWAL`], so a certificate that arrives nearly expired cannot make a busy loop.
    pub fn renew_at(&self, received: SystemTime) -> SystemTime {
        let left = self.not_after.duration_since(received).unwrap_or_default();
        received + (left / 2).max(MIN_RENEWAL)
    }
}

impl CaClient {
    /// Requests an SVID for `sa` with a new key.
    pub async fn issue(&self, sa: &ServiceAccount) -> Result<Issued, SvidError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![SanType::URI(
            sa.spiffe_id(self.trust.trust_domain()).try_into()?,
        )];
        let csr = params.serialize_request(&key)?.pem()?;
        let token =
            std::fs::read_to_string(&self.token_file).map_err(|source| SvidError::Token {
                path: self.token_file.clone(),
                source,
            })?;
        let body = SvidRequest {
            namespace: sa.namespace.clone(),
            service_account: sa.name.clone(),
            csr,
        };
        let body = serde_json::to_string(&body).map_err(|e| SvidError::Request(e.to_string()))?;
        let (status, answer) =
            tokio::time::timeout(REQUEST_TIMEOUT, self.post(SVID_PATH, token.trim(), body))
                .await
                .map_err(|_| self.transport(format!("no answer within {REQUEST_TIMEOUT:?}")))??;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<ErrorBody>(&answer)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&answer).into_owned());
            return Err(SvidError::Refused { status, message });
        }
        // Its `trustBundle` is not taken: the published ConfigMap is the one source of the
        // bundle, so an answer from a replica with stale roots cannot undo a rotation.
        let answer: SvidResponse =
            serde_json::from_slice(&answer).map_err(|e| SvidError::Answer(e.to_string()))?;
        let mut pem = answer.cert_chain;
        if !pem.ends_with('\n') {
            pem.push('\n');
        }
        pem.push_str(&key.serialize_pem());
        Issued::from_pem(pem)
    }

    fn transport(&self, reason: impl Into<String>) -> SvidError {
        SvidError::Transport {
            address: self.address.clone(),
            reason: reason.into(),
        }
    }

    async fn post(&self, path: &str, token: &str, body: String) -> Result<(u16, Bytes), SvidError> {
        let (host, port) = self
            .address
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| SvidError::Resolve {
                address: self.address.clone(),
                reason: "expected host:port".into(),
            })?;
        let ip = (self.resolve)(host).ok_or_else(|| SvidError::Resolve {
            address: self.address.clone(),
            reason: "no such Service or host".into(),
        })?;
        if !self.trust.has_roots() {
            return Err(SvidError::NoTrust);
        }
        let config = rustls::ClientConfig::builder_with_provider(self.trust.provider().clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| self.transport(e.to_string()))?
            .with_root_certificates(self.trust.roots())
            .with_no_client_auth();
        let name = ServerName::try_from(host.to_owned()).map_err(|e| SvidError::Resolve {
            address: self.address.clone(),
            reason: e.to_string(),
        })?;
        let tcp = tokio::net::TcpStream::connect(SocketAddr::new(ip, port))
            .await
            .map_err(|e| self.transport(e.to_string()))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| self.transport(format!("TLS: {e}")))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .map_err(|e| self.transport(e.to_string()))?;
        tokio::spawn(connection);
        let request = http::Request::post(path)
            .header(http::header::HOST, host)
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| self.transport(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| self.transport(e.to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.transport(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    }
}

fn not_after(der: &CertificateDer<'_>) -> Result<SystemTime, SvidError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| SvidError::Answer(format!("leaf certificate: {e}")))?;
    let seconds = cert.validity().not_after.timestamp().max(0) as u64;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
}

/// Keeps an SVID installed in `certs` (and in `kept`) for exactly the ServiceAccounts in
/// `wanted`, renewing each at half its life; those `restored` from `kept` are renewed when
/// they say. Runs until `wanted`'s sender is dropped.
pub async fn maintain(
    ca: CaClient,
    certs: Arc<Certs>,
    mut wanted: watch::Receiver<BTreeSet<ServiceAccount>>,
    metrics: Arc<crate::metrics::Metrics>,
    kept: KeptSvids,
    restored: Vec<(ServiceAccount, SystemTime)>,
) {
    struct State {
        due: Instant,
        failures: u32,
    }
    let wall = SystemTime::now();
    let mut states: HashMap<ServiceAccount, State> = restored
        .into_iter()
        .map(|(sa, renew_at)| {
            let due = Instant::now() + renew_at.duration_since(wall).unwrap_or_default();
            (sa, State { due, failures: 0 })
        })
        .collect();
    // Until the config loop first says which are wanted, the restored SVIDs are not dropped.
    let mut heard = false;
    loop {
        let current = {
            let current = wanted.borrow_and_update();
            heard |= current.has_changed();
            current.clone()
        };
        states.retain(|sa, _| {
            let keep = !heard || current.contains(sa);
            if !keep {
                certs.remove(sa);
                kept.forget(sa);
                info!(service_account = %sa, "removed the SVID: no pod of this ServiceAccount is left on the node");
            }
            keep
        });
        let now = Instant::now();
        for sa in &current {
            let state = states.entry(sa.clone()).or_insert(State {
                due: now,
                failures: 0,
            });
            if state.due > now {
                continue;
            }
            match ca.issue(sa).await {
                Ok(issued) => {
                    let wall = SystemTime::now();
                    let renew_in = issued
                        .renew_at(wall)
                        .duration_since(wall)
                        .unwrap_or_default();
                    match certs.install(sa, issued.chain.clone(), issued.key.clone_key()) {
                        Ok(()) => {
                            kept.keep(sa, &issued);
                            metrics.svid_issued(true);
                            info!(service_account = %sa, renew_in = ?renew_in, "installed an SVID");
                            state.due = Instant::now() + renew_in;
                            state.failures = 0;
                        }
                        Err(e) => {
                            metrics.svid_issued(false);
                            warn!(service_account = %sa, error = %e, "the issued SVID is unusable");
                            state.due = Instant::now() + backoff(&mut state.failures);
                        }
                    }
                }
                Err(e) => {
                    metrics.svid_issued(false);
                    warn!(service_account = %sa, error = %e, "cannot obtain an SVID; retrying");
                    state.due = Instant::now() + backoff(&mut state.failures);
                }
            }
        }
        let next = states
            .values()
            .map(|s| s.due)
            .min()
            .map_or(TICK, |due| due.saturating_duration_since(Instant::now()))
            .min(TICK);
        tokio::select! {
            changed = wanted.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(next) => {}
        }
    }
}

fn backoff(failures: &mut u32) -> Duration {
    let delay = RETRY_MIN
        .saturating_mul(1 << (*failures).min(16))
        .min(RETRY_MAX);
    *failures += 1;
    delay
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::PrivatePkcs8KeyDer;

    #[test]
    fn renewal_is_half_way_through_the_time_left_and_never_immediate() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        // A 4-minute lifetime (the CA also backdates its start, which must not matter).
        let issued = Issued {
            chain: vec![],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(vec![])),
            not_after: now + Duration::from_secs(240),
            pem: String::new(),
        };
        assert_eq!(issued.renew_at(now), now + Duration::from_secs(120));
        let late = now + Duration::from_secs(236);
        assert_eq!(issued.renew_at(late), late + MIN_RENEWAL);
        let expired = now + Duration::from_secs(1_000);
        assert_eq!(issued.renew_at(expired), expired + MIN_RENEWAL);
    }

    #[test]
    fn retries_back_off_to_a_ceiling() {
        let mut failures = 0;
        let delays: Vec<_> = (0..10).map(|_| backoff(&mut failures)).collect();
        assert_eq!(delays[0], RETRY_MIN);
        assert_eq!(delays[1], RETRY_MIN * 2);
        assert_eq!(*delays.last().unwrap(), RETRY_MAX);
    }
}
