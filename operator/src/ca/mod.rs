//! The mesh certificate authority.
//!
//! Node proxies exchange their pod-bound ServiceAccount token (audience `aether`) and a CSR
//! for a short-lived X509-SVID `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`, for ServiceAccounts
//! that have a pod on the proxy's own node. The private key never leaves the proxy.
//!
//! # Root Secret (`<install-namespace>/aether-ca`, type `kubernetes.io/tls`)
//!
//! | key            | content                                                        |
//! |----------------|----------------------------------------------------------------|
//! | `tls.crt`      | the signing root: exactly one PEM CA certificate               |
//! | `tls.key`      | its private key, PEM PKCS#8 (`BEGIN PRIVATE KEY`)              |
//! | `previous.crt` | optional: PEM CA certificates retired by a rotation, trusted   |
//! | `next.crt`     | optional: PEM CA certificates announced for a rotation, trusted |
//!
//! If the Secret is missing at start, an ECDSA P-256 root (CA:true, path length 0, 10 years)
//! is generated and the Secret created (annotated `aether.io/ca-origin: generated`); when
//! several replicas race, the first create wins and the others use its root. A Secret that
//! exists (made by an earlier start, or supplied by the user before install) is used as is
//! and **never written** by the operator. It is re-read every `reload_interval`: edits take
//! effect without a restart; an unusable edit is logged and the last good roots are kept.
//!
//! Root rotation with no window of failed handshakes:
//! 1. put the new root's certificate in `next.crt`; wait until every proxy has the new bundle;
//! 2. move the new certificate and key to `tls.crt`/`tls.key`, the old certificate to
//!    `previous.crt`, and empty `next.crt`: new SVIDs chain to the new root, old ones still
//!    verify;
//! 3. once every SVID signed by the old root has expired (the SVID lifetime), remove
//!    `previous.crt`.
//!
//! # Trust bundle ConfigMap (`<install-namespace>/aether-trust-bundle`)
//!
//! Key `ca.crt`: the PEM certificates of every trusted root (signing root first, then
//! `previous.crt` and `next.crt`, duplicates and expired ones left out). Public data only;
//! written by the leader alone, right after it read the root Secret, and only when it changes.
//!
//! # HTTPS endpoint
//!
//! See [`api`] for the wire format. Every SVID request gets exactly one log line with the
//! caller, its node, the requested identity and the outcome.
//!
//! # Kubernetes permissions the CA needs
//!
//! `create tokenreviews`; `list, watch pods` and `get namespaces` (all namespaces); in the install
//! namespace: `get` of its own root Secret only, `create secrets` (to generate the root), and
//! `get, create, patch configmaps`.
//!
//! # Limits
//!
//! An SVID is signed only for a ServiceAccount of a managed namespace with a meshed pod on the
//! caller's node. The pod feed answers only the caller's node's pods. Each source address gets a
//! burst of 50 requests (SVIDs and pod feed together), then 10 a second (429 and
//! `Retry-After` beyond), and at most 32 requests are checked with the API server at once.

pub mod api;
pub mod authority;
pub mod authz;
pub mod bundle;
pub mod cert;
pub mod config;
pub mod csr;
pub mod error;
pub mod handler;
pub mod issue;
pub mod limit;
pub mod pem;
pub mod pod_feed;
pub mod reload;
pub mod review;
pub mod root;
pub mod secret;
pub mod server;
pub mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::info;

pub use config::CaConfig;
pub use error::CaError;

use authority::Authority;
use handler::Handler;
use store::RootOrigin;

/// A started certificate authority: its endpoint serves and its reload loop runs until
/// [`RunningCa::shutdown`].
pub struct RunningCa {
    local_addr: SocketAddr,
    authority: watch::Receiver<Arc<Authority>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningCa {
    /// The address the endpoint listens on (the real port when configured with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The PEM trust bundle currently published.
    pub fn trust_bundle_pem(&self) -> String {
        self.authority.borrow().bundle_pem().to_owned()
    }

    /// Stops accepting, lets open requests finish (bounded), stops the reload loop.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        for task in self.tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "CA task ended abnormally");
            }
        }
    }
}

/// Loads (or creates) the root, binds the endpoint and starts serving in the background; the
/// trust bundle is published while `leading` says this replica leads. Fails if any of that
/// fails, so a broken setup is loud at start.
pub async fn start(
    client: kube::Client,
    config: CaConfig,
    leading: watch::Receiver<bool>,
) -> Result<RunningCa, CaError> {
    config.validate()?;
    let config = Arc::new(config);

    let (material, origin) = store::load_or_create_root(&client, &config).await?;
    let (authority, skipped) =
        Authority::build(material, &config, SystemTime::now()).map_err(|source| CaError::Root {
            namespace: config.namespace.clone(),
            name: config.secret_name.clone(),
            source,
        })?;
    reload::log_skipped(&skipped);
    info!(
        secret = %format!("{}/{}", config.namespace, config.secret_name),
        generated = origin == RootOrigin::Generated,
        signing_root = authority.signing_root().subject(),
        trusted_roots = authority.bundle().roots().len(),
        "certificate authority root loaded"
    );

    let (authority_tx, authority_rx) = watch::channel(Arc::new(authority));
    let acceptor = server::tls_acceptor(authority_rx.clone())?;
    let listener = TcpListener::bind(config.bind)
        .await
        .map_err(|source| CaError::Bind {
            addr: config.bind,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| CaError::Bind {
        addr: config.bind,
        source,
    })?;
    info!(%local_addr, trust_domain = config.trust_domain, "CA endpoint listening");

    let (stop, stopped) = watch::channel(false);
    let handler = Handler::new(client.clone(), config.clone(), authority_rx.clone());
    let tasks = vec![
        tokio::spawn(server::serve(listener, acceptor, handler, stopped.clone())),
        tokio::spawn(reload::reload_loop(
            client,
            config,
            authority_tx,
            leading,
            stopped,
        )),
    ];
    Ok(RunningCa {
        local_addr,
        authority: authority_rx,
        stop,
        tasks,
    })
}

/// Resolves once the stop flag is set (or its sender is gone). Returns nothing, so no watch
/// guard (which is not `Send`) is held across the caller's next await.
async fn until_stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}
