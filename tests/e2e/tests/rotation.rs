//! The mesh's root rotated under a steady stream of requests, as an operator of the cluster
//! would do it: a new root is announced (`next.crt` in the CA Secret) and reaches the trust
//! bundle and the proxies; then it signs (`tls.crt`/`tls.key`, the old root kept as
//! `previous.crt` until the SVIDs it signed expire). Every SVID is renewed from the new root
//! while requests keep flowing, and none fails.
//!
//! SVIDs live 60 s here (the chart's minimum), so the proxies renew them about every 30 s.

use std::time::{Duration, Instant};

use aether_e2e::Cluster;
use aether_e2e::mesh::{Accounts, MESH_NS, install, mesh_workloads, uninstall, unmesh_workloads};
use aether_e2e::stream::{Stream, apply_split};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const SVID_TTL_SECONDS: u64 = 60;
const STREAM: Duration = Duration::from_secs(150);
const QPS: u64 = 10;
const CA_NAMESPACE: &str = "aether-system";
const CA_SECRET: &str = "aether-ca";
const TRUST_BUNDLE: &str = "aether-trust-bundle";
const NEW_ROOT_CN: &str = "aether e2e rotated root";
/// The operator re-reads its root Secret every 30 s.
const CA_RELOAD: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_survives_a_root_rotation() -> Result<()> {
    let cluster = Cluster::get().await?;
    let ttl = format!("ca.svidTTLSeconds={SVID_TTL_SECONDS}");
    install(&cluster, &["--set", &ttl]).await?;
    mesh_workloads(&cluster, Accounts::PerVersion).await?;
    let split = apply_split(&cluster).await?;
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), CA_NAMESPACE);
    let text = |secret: &Secret, key: &str| -> Result<String> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .with_context(|| format!("the CA Secret has no {key}"))?;
        Ok(String::from_utf8(bytes.0.clone())?)
    };
    let old_root = text(&secrets.get(CA_SECRET).await?, "tls.crt")?;
    let (new_cert, new_key) = new_root()?;
    let stream = Stream::start(&cluster, STREAM, QPS).await?;
    let started = Instant::now();

    let patch = |body: serde_json::Value| {
        let secrets = secrets.clone();
        async move {
            secrets
                .patch(CA_SECRET, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .context("patching the CA Secret")
        }
    };
    patch(json!({"stringData": {"next.crt": new_cert}})).await?;
    let bundles: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), CA_NAMESPACE);
    let deadline = Instant::now() + 2 * CA_RELOAD;
    loop {
        let bundle = bundles.get(TRUST_BUNDLE).await?;
        let pem = bundle.data.as_ref().and_then(|d| d.get("ca.crt"));
        if pem.is_some_and(|pem| pem.contains(new_cert.trim())) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the announced root never reached the trust bundle");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "the new root is in the trust bundle after {:?}",
        started.elapsed()
    );
    // The proxies watch the bundle; give them a moment before anything is signed by it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    patch(json!({
        "stringData": {"tls.crt": new_cert, "tls.key": new_key, "previous.crt": old_root},
        "data": {"next.crt": null},
    }))
    .await?;
    eprintln!("the new root signs from now on ({:?})", started.elapsed());

    // Every echo pod of the stream's path presents an SVID of the new root once renewed.
    let deadline = Instant::now() + 2 * CA_RELOAD + Duration::from_secs(SVID_TTL_SECONDS);
    loop {
        let issuers = presented_issuers(&cluster).await?;
        if !issuers.is_empty() && issuers.iter().all(|(_, i)| i.contains(NEW_ROOT_CN)) {
            break;
        }
        if Instant::now() > deadline {
            bail!("SVIDs still issued by the old root: {issuers:?}");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!(
        "every SVID on the path is issued by the new root ({:?})",
        started.elapsed()
    );
    if started.elapsed() > STREAM {
        bail!("the rotation outlasted the stream; it proves nothing about traffic during it");
    }
    let served = stream.expect_all_served(&cluster).await?;
    eprintln!("{served} requests, none failed, through a root rotation");

    cluster.kubectl(&["delete", "--wait", "-f", &split.to_string_lossy()])?;
    uninstall(&cluster).await?;
    unmesh_workloads(&cluster)?;
    Ok(())
}

/// A new ECDSA P-256 root, as an administrator would make it with openssl: (cert, key) PEM.
fn new_root() -> Result<(String, String)> {
    let dir = std::env::temp_dir().join(format!("aether-rotation-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (cert, key) = (dir.join("root.crt"), dir.join("root.key"));
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args([
            "-nodes",
            "-days",
            "30",
            "-subj",
            &format!("/CN={NEW_ROOT_CN}"),
        ])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .context("running openssl")?;
    if !status.success() {
        bail!("openssl could not make a root");
    }
    let pems = (
        std::fs::read_to_string(&cert)?,
        std::fs::read_to_string(&key)?,
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(pems)
}

/// The issuer of the SVID each echo pod of the mesh namespace presents on its inbound port,
/// read with `openssl s_client` from a node (the handshake itself then fails: the port wants
/// a client SVID).
async fn presented_issuers(cluster: &Cluster) -> Result<Vec<(String, String)>> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MESH_NS);
    let mut out = Vec::new();
    for pod in pods.list(&ListParams::default().labels("app=echo")).await? {
        let (Some(name), Some(ip)) = (
            pod.metadata.name.clone(),
            pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
        ) else {
            continue;
        };
        let script = format!(
            "openssl s_client -connect {ip}:15008 </dev/null 2>/dev/null | openssl x509 -noout -issuer"
        );
        let output = cluster.on_node("node-1", &["sh", "-c", &script])?;
        out.push((
            name,
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        ));
    }
    Ok(out)
}
