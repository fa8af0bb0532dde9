//! The certificate authority against the real API server, run in-process on 127.0.0.1 with
//! a token of the operator's ServiceAccount bound to exactly the chart's RBAC.
//!
//! Each test uses its own root Secret and trust-bundle ConfigMap names in the install
//! namespace, and its own workload namespace, and removes them when it ends.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aether_core::identity::ServiceAccount as Identity;
use aether_e2e::Cluster;
use aether_operator::ca::{self, CaConfig, RunningCa};
use anyhow::{Context, Result, bail, ensure};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::{OnceCell, watch};
use tokio_rustls::TlsConnector;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

const INSTALL: &str = "aether-system";
const SERVER_NAME: &str = "aether-operator.aether-system.svc";
const ECHO_IMAGE: &str = "registry.k8s.io/gateway-api/echo-advanced:v1.5.1";

// ---------------------------------------------------------------------------------------
// Test environment
// ---------------------------------------------------------------------------------------

static RBAC: OnceCell<()> = OnceCell::const_new();

/// The cluster, with the install namespace and the operator's RBAC from the chart applied.
async fn cluster() -> Result<Cluster> {
    // The CA's log lines, shown for failing tests (`RUST_LOG=aether_operator=info`).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cluster = Cluster::get().await?;
    RBAC.get_or_try_init(|| async {
        // Another test binary may have created it already.
        let _ = cluster.kubectl(&["create", "namespace", INSTALL]);
        cluster.apply_text(&cluster.chart_template(INSTALL, "templates/operator-rbac.yaml")?)?;
        // The chart lets the operator read one Secret, `aether-ca`. Each test's CA has a root
        // Secret of its own name so that the tests run side by side: reading those is granted
        // here, for the tests alone.
        cluster.apply_text(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n\
             metadata: {{name: aether-ca-tests, namespace: {INSTALL}}}\n\
             rules: [{{apiGroups: [\"\"], resources: [secrets], verbs: [get]}}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
             metadata: {{name: aether-ca-tests, namespace: {INSTALL}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: aether-ca-tests}}\n\
             subjects: [{{kind: ServiceAccount, name: aether-operator, namespace: {INSTALL}}}]\n"
        ))
    })
    .await?;
    Ok(cluster)
}

/// A name unique to this test run.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}-{:x}",
        std::process::id(),
        nanos & 0xff_ffff_ffff
    )
}

/// What a test created; removed when the test ends, passed or not.
struct Cleanup {
    cluster: Cluster,
    namespace: Option<String>,
    secret: String,
    config_map: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = self.cluster.kubectl(&[
            "-n",
            INSTALL,
            "delete",
            "--ignore-not-found",
            "--wait=false",
            &format!("secret/{}", self.secret),
            &format!("configmap/{}", self.config_map),
        ]);
        if let Some(ns) = &self.namespace {
            let _ = self.cluster.kubectl(&[
                "delete",
                "namespace",
                ns,
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
    }
}

/// A CA configuration with names of its own, listening on a random local port.
fn test_config(id: &str, proxy: Identity) -> CaConfig {
    CaConfig {
        namespace: INSTALL.into(),
        secret_name: format!("aether-ca-{id}"),
        bundle_config_map: format!("aether-trust-bundle-{id}"),
        proxy_service_account: proxy,
        bind: SocketAddr::from(([127, 0, 0, 1], 0)),
        reload_interval: Duration::from_millis(500),
        ..CaConfig::default()
    }
}

fn cleanup_for(cluster: &Cluster, config: &CaConfig, namespace: Option<&str>) -> Cleanup {
    Cleanup {
        cluster: Cluster {
            paths: cluster.paths.clone(),
            client: cluster.client.clone(),
        },
        namespace: namespace.map(str::to_owned),
        secret: config.secret_name.clone(),
        config_map: config.bundle_config_map.clone(),
    }
}

/// The CA as the operator runs it: with the operator ServiceAccount's token, not as admin.
/// As the leader: it publishes the trust bundle.
async fn start_ca(cluster: &Cluster, config: CaConfig) -> Result<RunningCa> {
    start_replica(cluster, config, watch::channel(true).1).await
}

async fn start_replica(
    cluster: &Cluster,
    config: CaConfig,
    leading: watch::Receiver<bool>,
) -> Result<RunningCa> {
    let client = cluster.client_as(INSTALL, "aether-operator").await?;
    Ok(ca::start(client, config, leading).await?)
}

async fn bundle_config_map(cluster: &Cluster, config: &CaConfig) -> Result<Option<String>> {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), INSTALL);
    Ok(api
        .get_opt(&config.bundle_config_map)
        .await?
        .and_then(|cm| cm.data)
        .and_then(|d| d.get("ca.crt").cloned()))
}

/// The published bundle once it is `expected` (the leader publishes it just after it starts).
async fn published_bundle(cluster: &Cluster, config: &CaConfig, expected: &str) -> Result<()> {
    eventually("the trust bundle to be published", || async {
        Ok((bundle_config_map(cluster, config).await?.as_deref() == Some(expected)).then_some(()))
    })
    .await
}

/// Polls `check` every 200 ms for up to 30 s.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    for _ in 0..150 {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("timed out waiting for {what}")
}

// ---------------------------------------------------------------------------------------
// HTTPS client
// ---------------------------------------------------------------------------------------

fn certs(pem: &str) -> Result<Vec<CertificateDer<'static>>> {
    Ok(CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<Vec<_>, _>>()?)
}

fn root_store(bundle_pem: &str) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certs(bundle_pem)? {
        roots.add(cert)?;
    }
    Ok(roots)
}

/// One request to the CA endpoint over TLS, trusting only `trusted_pem`; returns the status
/// and the JSON body.
async fn call(
    addr: SocketAddr,
    trusted_pem: &str,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Result<(StatusCode, Value)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(root_store(trusted_pem)?)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await?;
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from(SERVER_NAME)?, tcp)
        .await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", SERVER_NAME);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let response = sender
        .send_request(
            request
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(bytes)))?,
        )
        .await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let json =
        serde_json::from_slice(&body).with_context(|| format!("non-JSON answer: {body:?}"))?;
    Ok((status, json))
}

/// A CSR for a fresh key that asks for an identity it must not get.
fn greedy_csr() -> Result<(KeyPair, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["evil.example".to_string()])?;
    params.distinguished_name.push(DnType::CommonName, "admin");
    params.subject_alt_names.push(SanType::URI(
        "spiffe://cluster.local/ns/kube-system/sa/admin".try_into()?,
    ));
    let pem = params.serialize_request(&key)?.pem()?;
    Ok((key, pem))
}

fn svid_request(namespace: &str, service_account: &str, csr: &str) -> Value {
    json!({"namespace": namespace, "serviceAccount": service_account, "csr": csr})
}

// ---------------------------------------------------------------------------------------
// Cluster objects and tokens
// ---------------------------------------------------------------------------------------

async fn create_service_account(client: &kube::Client, ns: &str, name: &str) -> Result<()> {
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await?;
    Ok(())
}

async fn create_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    sa: &str,
    node: &str,
) -> Result<Pod> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": sa,
            "containers": [{"name": "echo", "image": ECHO_IMAGE}],
        }
    }))?;
    Ok(Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await?)
}

/// A token of `sa` bound to `pod`, as a projected volume would hold it.
async fn pod_token(
    client: &kube::Client,
    ns: &str,
    sa: &str,
    pod: &Pod,
    audience: &str,
) -> Result<String> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.into()]),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(600),
        }),
        ..TokenRequest::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await?;
    issued
        .status
        .and_then(|s| s.token)
        .context("TokenRequest answered without a token")
}

const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn b64url_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(B64URL[((n >> (18 - 6 * i)) & 0x3f) as usize]));
        }
    }
    out
}

fn b64url_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes() {
        let v = B64URL
            .iter()
            .position(|&a| a == c)
            .context("not base64url")? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

/// The claims of `token` edited by `edit`, signed RS256 with the cluster's real
/// ServiceAccount signing key: a token the API server would have issued itself.
fn resign(cluster: &Cluster, token: &str, edit: impl FnOnce(&mut Value)) -> Result<String> {
    let mut parts = token.split('.');
    let (header, payload) = (
        parts.next().context("no header")?,
        parts.next().context("no payload")?,
    );
    let mut claims: Value = serde_json::from_slice(&b64url_decode(payload)?)?;
    edit(&mut claims);
    let signed = format!(
        "{header}.{}",
        b64url_encode(serde_json::to_string(&claims)?.as_bytes())
    );
    let key = PrivateKeyDer::from_pem_file(cluster.paths.state.join("pki/sa.key"))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)?
        .choose_scheme(&[rustls::SignatureScheme::RSA_PKCS1_SHA256])
        .context("the ServiceAccount key cannot sign RS256")?;
    Ok(format!(
        "{signed}.{}",
        b64url_encode(&signer.sign(signed.as_bytes())?)
    ))
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Checks on issued certificates
// ---------------------------------------------------------------------------------------

/// The SVID chains to the bundle as both a TLS client and server certificate, names exactly
/// `spiffe_id`, carries `key`, is no CA and lives 24 h.
fn check_svid(chain_pem: &str, bundle_pem: &str, spiffe_id: &str, key: &KeyPair) -> Result<()> {
    use rcgen::PublicKeyData;
    let chain = certs(chain_pem)?;
    let leaf = chain.first().context("empty chain")?;
    let roots = Arc::new(root_store(bundle_pem)?);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()?
        .verify_client_cert(leaf, &chain[1..], UnixTime::now())?;
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &rustls::server::ParsedCertificate::try_from(leaf)?,
        &roots,
        &chain[1..],
        UnixTime::now(),
        provider.signature_verification_algorithms.all,
    )?;

    let (_, x509) = X509Certificate::from_der(leaf)?;
    let sans = x509.subject_alternative_name()?.context("no SAN")?.value;
    ensure!(
        sans.general_names == vec![GeneralName::URI(spiffe_id)],
        "SANs {:?}",
        sans.general_names
    );
    ensure!(!x509.is_ca(), "SVID is a CA");
    ensure!(
        x509.public_key().raw == key.subject_public_key_info().as_slice(),
        "SVID does not carry the CSR's key"
    );
    let life = x509.validity().not_after.timestamp() - x509.validity().not_before.timestamp();
    ensure!(
        life == 24 * 3600 + 5 * 60,
        "SVID lifetime {life}s (24 h + 5 min backdating expected)"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn svids_only_for_the_proxy_and_workloads_on_its_node() -> Result<()> {
    let cluster = cluster().await?;
    let id = unique("svid");
    let ns = format!("aether-ca-{id}");
    let config = test_config(&id, Identity::new(&ns, "aether-proxy"));
    let _cleanup = cleanup_for(&cluster, &config, Some(&ns));
    let client = cluster.client.clone();

    cluster.kubectl(&["create", "namespace", &ns])?;
    cluster.kubectl(&["label", "namespace", &ns, "aether.io/managed=true"])?;
    for sa in ["aether-proxy", "on-node-1", "on-node-2"] {
        create_service_account(&client, &ns, sa).await?;
    }
    let proxy_pod = create_pod(&client, &ns, "proxy", "aether-proxy", "node-1").await?;
    let workload_pod = create_pod(&client, &ns, "workload-1", "on-node-1", "node-1").await?;
    create_pod(&client, &ns, "workload-2", "on-node-2", "node-2").await?;

    let running = start_ca(&cluster, config.clone()).await?;
    let (addr, bundle) = (running.local_addr(), running.trust_bundle_pem());
    published_bundle(&cluster, &config, &bundle).await?;

    let proxy_token = pod_token(&client, &ns, "aether-proxy", &proxy_pod, "aether").await?;
    let (key, csr) = greedy_csr()?;
    let post = |token: Option<String>, body: Value| {
        let bundle = bundle.clone();
        async move {
            call(
                addr,
                &bundle,
                Method::POST,
                "/v1/svid",
                token.as_deref(),
                Some(&body),
            )
            .await
        }
    };

    // The proxy on node-1 gets an SVID for a ServiceAccount with a pod on node-1, and only
    // the identity the CA decides on, whatever the CSR asked for.
    let (status, body) = post(
        Some(proxy_token.clone()),
        svid_request(&ns, "on-node-1", &csr),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    let spiffe_id = format!("spiffe://cluster.local/ns/{ns}/sa/on-node-1");
    assert_eq!(body["spiffeId"], spiffe_id.as_str());
    assert_eq!(body["trustBundle"], bundle.as_str());
    check_svid(
        body["certChain"].as_str().context("no certChain")?,
        &bundle,
        &spiffe_id,
        &key,
    )?;

    // A ServiceAccount whose only pod runs on node-2.
    let (status, body) = post(
        Some(proxy_token.clone()),
        svid_request(&ns, "on-node-2", &csr),
    )
    .await?;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("NoPodOnNode")),
        "{body}"
    );

    // The same ServiceAccount once its namespace has left the mesh: no SVID, whatever pods
    // it has.
    cluster.kubectl(&["label", "namespace", &ns, "aether.io/managed-"])?;
    let (status, body) = post(
        Some(proxy_token.clone()),
        svid_request(&ns, "on-node-1", &csr),
    )
    .await?;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("NamespaceNotManaged")),
        "{body}"
    );
    cluster.kubectl(&["label", "namespace", &ns, "aether.io/managed=true"])?;

    // A ServiceAccount that does not exist at all.
    let (status, _) = post(Some(proxy_token.clone()), svid_request(&ns, "nobody", &csr)).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // A pod-bound token of another ServiceAccount on the same node.
    let workload_token = pod_token(&client, &ns, "on-node-1", &workload_pod, "aether").await?;
    let (status, body) = post(Some(workload_token), svid_request(&ns, "on-node-1", &csr)).await?;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("NotProxy")),
        "{body}"
    );

    // The proxy's token for another audience, and one not bound to a pod (no node).
    let api_token = pod_token(
        &client,
        &ns,
        "aether-proxy",
        &proxy_pod,
        "https://kubernetes.default.svc.cluster.local",
    )
    .await?;
    let (status, body) = post(Some(api_token), svid_request(&ns, "on-node-1", &csr)).await?;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let unbound = cluster.kubectl(&[
        "-n",
        &ns,
        "create",
        "token",
        "aether-proxy",
        "--audience",
        "aether",
    ])?;
    let (status, body) = post(
        Some(unbound.trim().to_owned()),
        svid_request(&ns, "on-node-1", &csr),
    )
    .await?;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("TokenNotNodeBound")),
        "{body}"
    );

    // An expired token: the proxy's real claims, signed with the cluster's real key, but with
    // `exp` in the past. The same token with a future `exp` is accepted, so the refusal is
    // due to the expiry alone.
    let now = unix_now();
    let fresh = resign(&cluster, &proxy_token, |c| {
        c["iat"] = json!(now - 60);
        c["nbf"] = json!(now - 60);
        c["exp"] = json!(now + 600);
    })?;
    let (status, body) = post(Some(fresh), svid_request(&ns, "on-node-1", &csr)).await?;
    assert_eq!(
        status,
        StatusCode::OK,
        "re-signed live token refused: {body}"
    );
    let expired = resign(&cluster, &proxy_token, |c| {
        c["iat"] = json!(now - 7200);
        c["nbf"] = json!(now - 7200);
        c["exp"] = json!(now - 3600);
    })?;
    let (status, body) = post(Some(expired), svid_request(&ns, "on-node-1", &csr)).await?;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("TokenRejected")),
        "{body}"
    );

    // Malformed requests, and no token at all.
    let (status, body) = post(
        Some(proxy_token.clone()),
        svid_request(
            &ns,
            "on-node-1",
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
        ),
    )
    .await?;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("InvalidCsr")),
        "{body}"
    );
    let (status, _) = post(Some(proxy_token.clone()), json!({"namespace": ns})).await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = post(
        Some(proxy_token.clone()),
        svid_request(&ns, "../on-node-1", &csr),
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) = post(None, svid_request(&ns, "on-node-1", &csr)).await?;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("MissingToken"))
    );

    // The bundle, for anyone.
    let (status, body) = call(addr, &bundle, Method::GET, "/v1/trust-bundle", None, None).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["trustBundle"], bundle.as_str());
    assert_eq!(body["trustDomain"], "cluster.local");

    running.shutdown().await;
    Ok(())
}

/// A proxy reads no pod from the API server; the CA endpoint gives it its own node's, as the
/// API server lists and watches them (kube's own client reads it), and nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn the_pod_feed_gives_a_proxy_its_own_nodes_pods_only() -> Result<()> {
    let cluster = cluster().await?;
    let id = unique("feed");
    let ns = format!("aether-ca-{id}");
    let config = test_config(&id, Identity::new(&ns, "aether-proxy"));
    let _cleanup = cleanup_for(&cluster, &config, Some(&ns));
    let client = cluster.client.clone();
    cluster.kubectl(&["create", "namespace", &ns])?;
    for sa in ["aether-proxy", "workload"] {
        create_service_account(&client, &ns, sa).await?;
    }
    let proxy_pod = create_pod(&client, &ns, "proxy", "aether-proxy", "node-1").await?;
    let workload_pod = create_pod(&client, &ns, "workload-1", "workload", "node-1").await?;
    create_pod(&client, &ns, "workload-2", "workload", "node-2").await?;

    let running = start_ca(&cluster, config.clone()).await?;
    let (addr, bundle) = (running.local_addr(), running.trust_bundle_pem());
    let proxy_token = pod_token(&client, &ns, "aether-proxy", &proxy_pod, "aether").await?;
    let get = |token: Option<String>, query: &str| {
        let (bundle, path) = (bundle.clone(), format!("/api/v1/pods?{query}"));
        async move { call(addr, &bundle, Method::GET, &path, token.as_deref(), None).await }
    };

    let (status, list) = get(
        Some(proxy_token.clone()),
        "fieldSelector=spec.nodeName%3Dnode-1",
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["kind"], "PodList");
    let items = list["items"].as_array().context("a PodList has items")?;
    let names: Vec<&str> = items
        .iter()
        .filter(|p| p["metadata"]["namespace"] == ns.as_str())
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&"proxy") && names.contains(&"workload-1"));
    assert!(items.iter().all(|p| p["spec"]["nodeName"] == "node-1"));

    for (what, query) in [
        ("another node's", "fieldSelector=spec.nodeName%3Dnode-2"),
        ("every", ""),
        ("every", "watch=true"),
        (
            "a wider selection of",
            "fieldSelector=spec.nodeName%21%3Dnode-2",
        ),
    ] {
        let (status, body) = get(Some(proxy_token.clone()), query).await?;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("OtherNode")),
            "{what} pods, {query:?}: {body}"
        );
    }
    let (status, body) = get(
        Some(proxy_token.clone()),
        "fieldSelector=spec.nodeName%3Dnode-1&labelSelector=app",
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // Only the proxies' ServiceAccount, with a token bound to a pod on the node.
    let workload_token = pod_token(&client, &ns, "workload", &workload_pod, "aether").await?;
    let (status, body) = get(Some(workload_token), "fieldSelector=spec.nodeName%3Dnode-1").await?;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = get(None, "fieldSelector=spec.nodeName%3Dnode-1").await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // kube's watcher, as the proxy runs it: the initial list, then a pod created on the node.
    let mut feed_config = kube::Config::new(format!("https://{addr}").parse()?);
    feed_config.root_cert = Some(certs(&bundle)?.iter().map(|c| c.to_vec()).collect());
    feed_config.tls_server_name = Some(SERVER_NAME.into());
    feed_config.auth_info.token = Some(proxy_token.into());
    let feed: Api<Pod> = Api::all(kube::Client::try_from(feed_config)?);
    let selector = kube::runtime::watcher::Config::default().fields("spec.nodeName=node-1");
    let mut events = std::pin::pin!(kube::runtime::watcher(feed, selector));
    let mut seen = Vec::new();
    let watched = tokio::time::timeout(Duration::from_secs(30), async {
        use futures::StreamExt;
        while let Some(event) = events.next().await {
            match event? {
                kube::runtime::watcher::Event::InitDone => {
                    create_pod(&client, &ns, "later", "workload", "node-1").await?;
                }
                kube::runtime::watcher::Event::InitApply(pod)
                | kube::runtime::watcher::Event::Apply(pod) => {
                    ensure!(
                        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("node-1")
                    );
                    if pod.metadata.namespace.as_deref() == Some(&ns) {
                        seen.extend(pod.metadata.name);
                    }
                    if seen.iter().any(|n| n == "later") {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        bail!("the watch ended")
    })
    .await;
    watched.context("no watch event for a new pod within 30 s")??;
    assert!(seen.iter().any(|n| n == "proxy"), "{seen:?}");
    assert!(!seen.iter().any(|n| n == "workload-2"), "{seen:?}");

    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn racing_starts_agree_and_a_restart_reuses_the_root() -> Result<()> {
    let cluster = cluster().await?;
    let id = unique("restart");
    let config = test_config(&id, Identity::new(INSTALL, "aether-proxy"));
    let _cleanup = cleanup_for(&cluster, &config, None);

    // Two replicas starting at once with no Secret: one root wins, both use it.
    let (a, b) = tokio::join!(
        start_ca(&cluster, config.clone()),
        start_ca(&cluster, config.clone())
    );
    let (a, b) = (a?, b?);
    let bundle = a.trust_bundle_pem();
    assert_eq!(b.trust_bundle_pem(), bundle);
    assert_eq!(certs(&bundle)?.len(), 1);
    published_bundle(&cluster, &config, &bundle).await?;

    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), INSTALL);
    let secret = secrets.get(&config.secret_name).await?;
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("aether.io/ca-origin"))
            .map(String::as_str),
        Some("generated")
    );
    tokio::join!(a.shutdown(), b.shutdown());

    // Restarted with the Secret present: same root, Secret untouched.
    let again = start_ca(&cluster, config.clone()).await?;
    assert_eq!(again.trust_bundle_pem(), bundle);
    let (status, _) = call(
        again.local_addr(),
        &bundle,
        Method::GET,
        "/v1/trust-bundle",
        None,
        None,
    )
    .await?;
    assert_eq!(
        status,
        StatusCode::OK,
        "the new serving certificate chains to the same root"
    );
    assert_eq!(
        secrets
            .get(&config.secret_name)
            .await?
            .metadata
            .resource_version,
        secret.metadata.resource_version
    );
    again.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_bogus_tokens_is_limited_per_source() -> Result<()> {
    let cluster = cluster().await?;
    let id = unique("flood");
    let config = test_config(&id, Identity::new(INSTALL, "aether-proxy"));
    let _cleanup = cleanup_for(&cluster, &config, None);
    let running = start_ca(&cluster, config.clone()).await?;
    let (addr, bundle) = (running.local_addr(), running.trust_bundle_pem());
    let (_, csr) = greedy_csr()?;
    let request = svid_request(INSTALL, "default", &csr);

    const FLOOD: u32 = 150;
    let started = std::time::Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..FLOOD {
        let (bundle, request) = (bundle.clone(), request.clone());
        flood.spawn(async move {
            call(
                addr,
                &bundle,
                Method::POST,
                "/v1/svid",
                Some("bogus"),
                Some(&request),
            )
            .await
            .map(|(status, _)| status)
        });
    }
    let (mut reviewed, mut limited) = (0u32, 0u32);
    while let Some(status) = flood.join_next().await {
        match status?? {
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            StatusCode::FORBIDDEN => reviewed += 1,
            other => bail!("a bogus token got {other}"),
        }
    }
    // Only the burst and what the rate refilled meanwhile reached the API server.
    let allowed = ca::limit::BURST + ca::limit::RATE * started.elapsed().as_secs_f64();
    ensure!(
        f64::from(reviewed) <= allowed.ceil(),
        "{reviewed} of {FLOOD} bogus requests were reviewed, more than {allowed:.0}"
    );
    ensure!(
        limited + reviewed == FLOOD,
        "{limited} limited + {reviewed} reviewed"
    );
    eprintln!("{FLOOD} bogus requests: {reviewed} reviewed, {limited} refused with 429");
    // The allowance comes back at the rate.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, body) = call(
        addr,
        &bundle,
        Method::POST,
        "/v1/svid",
        Some("bogus"),
        Some(&request),
    )
    .await?;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("TokenRejected")),
        "{body}"
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_leader_publishes_the_bundle() -> Result<()> {
    let cluster = cluster().await?;
    let id = unique("leader");
    let config = test_config(&id, Identity::new(INSTALL, "aether-proxy"));
    let _cleanup = cleanup_for(&cluster, &config, None);

    let (leading, follower) = watch::channel(false);
    let running = start_replica(&cluster, config.clone(), follower).await?;
    tokio::time::sleep(config.reload_interval * 4).await;
    assert_eq!(
        bundle_config_map(&cluster, &config).await?,
        None,
        "a replica that does not lead published the bundle"
    );
    leading.send_replace(true);
    published_bundle(&cluster, &config, &running.trust_bundle_pem()).await?;
    running.shutdown().await;
    Ok(())
}

/// A CA root made outside the operator.
fn user_root(name: &str) -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok((params.self_signed(&key)?.pem(), key.serialize_pem()))
}

fn secret_data(entries: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_supplied_root_is_used_as_is_and_rotation_is_followed() -> Result<()> {
    let cluster = cluster().await?;
    let id = unique("user");
    let config = test_config(&id, Identity::new(INSTALL, "aether-proxy"));
    let _cleanup = cleanup_for(&cluster, &config, None);

    let (current_cert, current_key) = user_root("user root")?;
    let (next_cert, next_key) = user_root("user next root")?;
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), INSTALL);
    let supplied = Secret {
        metadata: ObjectMeta {
            name: Some(config.secret_name.clone()),
            ..ObjectMeta::default()
        },
        data: Some(secret_data(&[
            ("tls.crt", &current_cert),
            ("tls.key", &current_key),
            ("next.crt", &next_cert),
        ])),
        ..Secret::default()
    };
    let created = secrets.create(&PostParams::default(), &supplied).await?;

    let running = start_ca(&cluster, config.clone()).await?;
    let bundle = running.trust_bundle_pem();
    assert_eq!(
        certs(&bundle)?,
        [certs(&current_cert)?, certs(&next_cert)?].concat()
    );
    published_bundle(&cluster, &config, &bundle).await?;
    // The endpoint's certificate is signed by the user's root: trusting only it suffices.
    call(
        running.local_addr(),
        &current_cert,
        Method::GET,
        "/v1/trust-bundle",
        None,
        None,
    )
    .await?;
    let stored = secrets.get(&config.secret_name).await?;
    assert_eq!(
        stored.metadata.resource_version, created.metadata.resource_version,
        "user Secret was written"
    );
    assert_eq!(stored.data, supplied.data);

    // Rotation step 2: the next root signs, the old one stays trusted as previous.
    let mut rotated = stored.clone();
    rotated.data = Some(secret_data(&[
        ("tls.crt", &next_cert),
        ("tls.key", &next_key),
        ("previous.crt", &current_cert),
    ]));
    secrets
        .replace(&config.secret_name, &PostParams::default(), &rotated)
        .await?;
    let expected = [certs(&next_cert)?, certs(&current_cert)?].concat();
    eventually("the ConfigMap to carry the rotated bundle", || async {
        let published = bundle_config_map(&cluster, &config)
            .await?
            .unwrap_or_default();
        Ok((certs(&published)? == expected).then_some(()))
    })
    .await?;
    assert_eq!(certs(&running.trust_bundle_pem())?, expected);
    // The serving certificate now comes from the new root.
    call(
        running.local_addr(),
        &next_cert,
        Method::GET,
        "/v1/trust-bundle",
        None,
        None,
    )
    .await?;

    // A broken edit is ignored: the last good roots stay in use.
    let mut broken = rotated.clone();
    broken.metadata.resource_version = None;
    broken.data = Some(secret_data(&[
        ("tls.crt", "garbage"),
        ("tls.key", &next_key),
    ]));
    secrets
        .replace(&config.secret_name, &PostParams::default(), &broken)
        .await?;
    tokio::time::sleep(config.reload_interval * 3).await;
    assert_eq!(certs(&running.trust_bundle_pem())?, expected);
    let published = bundle_config_map(&cluster, &config)
        .await?
        .unwrap_or_default();
    assert_eq!(
        certs(&published)?,
        expected,
        "an unusable Secret republished nothing"
    );
    running.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unusable_root_secret_stops_the_start() -> Result<()> {
    let cluster = cluster().await?;
    let id = unique("broken");
    let config = test_config(&id, Identity::new(INSTALL, "aether-proxy"));
    let _cleanup = cleanup_for(&cluster, &config, None);
    let (_, key) = user_root("orphan key")?;
    let (other_cert, _) = user_root("someone else")?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(config.secret_name.clone()),
            ..ObjectMeta::default()
        },
        data: Some(secret_data(&[("tls.crt", &other_cert), ("tls.key", &key)])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(cluster.client.clone(), INSTALL)
        .create(&PostParams::default(), &secret)
        .await?;
    let Err(error) = start_ca(&cluster, config).await else {
        bail!("started with a key that is not the root's")
    };
    let message = format!("{error:#}");
    assert!(
        message.contains("does not belong to the certificate"),
        "{message}"
    );
    Ok(())
}
