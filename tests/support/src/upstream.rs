//! The Gateway API release aether tests against: the modules `sigs.k8s.io/gateway-api` (its
//! CRDs) and `sigs.k8s.io/gateway-api/conformance` (the conformance manifests) at the versions
//! `tests/gateway-conformance/go.mod` pins, downloaded by `go mod download` into the module
//! cache the cluster scripts use (`$AETHER_CACHE/go/mod`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The directory of the Go module that pins the release (and runs the upstream suite).
pub fn module_dir() -> PathBuf {
    crate::repo_root().join("tests/gateway-conformance")
}

/// The mesh conformance cases, as data.
pub fn cases_file() -> PathBuf {
    module_dir().join("cases.yaml")
}

/// Where the release's files are.
#[derive(Debug, Clone)]
pub struct Release {
    /// `sigs.k8s.io/gateway-api`: `config/crd/` holds the CRDs of both channels.
    pub api: PathBuf,
    /// `sigs.k8s.io/gateway-api/conformance`: `mesh/manifests.yaml` (the mesh base) and
    /// `tests/mesh/*.yaml` (each test's routes).
    pub conformance: PathBuf,
}

impl Release {
    /// The Gateway API CRDs the local cluster runs: the experimental channel, a superset of
    /// the standard one, because HTTPRoute `retry` and the `CORS` filter are only in it
    /// (with the standard CRDs the API server drops those fields). A kustomization directory.
    pub fn crds(&self) -> PathBuf {
        self.api.join("config/crd/experimental")
    }

    /// The file of a test manifest named as `cases.yaml` names it (`manifests.yaml` is the
    /// mesh base).
    pub fn manifest(&self, name: &str) -> PathBuf {
        if name == "manifests.yaml" {
            self.conformance.join("mesh/manifests.yaml")
        } else {
            self.conformance.join("tests/mesh").join(name)
        }
    }
}

#[derive(Deserialize)]
struct Download {
    #[serde(rename = "Path")]
    path: String,
    #[serde(rename = "Dir", default)]
    dir: Option<PathBuf>,
    #[serde(rename = "Error", default)]
    error: Option<String>,
}

static RELEASE: OnceLock<Result<Release, String>> = OnceLock::new();

/// The release, downloaded once per process if it is not in the module cache yet.
pub fn release() -> Result<Release> {
    RELEASE
        .get_or_init(|| download().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn download() -> Result<Release> {
    let cache =
        std::env::var_os("AETHER_CACHE").map_or_else(|| "/var/cache/aether".into(), PathBuf::from);
    let go = ["/usr/local/go/bin/go", "go"]
        .into_iter()
        .find(|g| !g.starts_with('/') || Path::new(g).exists())
        .unwrap_or("go");
    let mut command = Command::new(go);
    command.current_dir(module_dir()).args([
        "mod",
        "download",
        "-json",
        "sigs.k8s.io/gateway-api",
        "sigs.k8s.io/gateway-api/conformance",
    ]);
    if std::env::var_os("GOMODCACHE").is_none() {
        command.env("GOMODCACHE", cache.join("go/mod"));
    }
    let output = command.output().with_context(|| {
        format!("running `{go} mod download` for the Gateway API release (is Go installed?)")
    })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut api = None;
    let mut conformance = None;
    for item in serde_json::Deserializer::from_str(&stdout).into_iter::<Download>() {
        let item = item.context("reading `go mod download -json`")?;
        if let Some(error) = item.error {
            bail!("cannot download {}: {error}", item.path);
        }
        match item.path.as_str() {
            "sigs.k8s.io/gateway-api" => api = item.dir,
            "sigs.k8s.io/gateway-api/conformance" => conformance = item.dir,
            _ => {}
        }
    }
    match (api, conformance) {
        (Some(api), Some(conformance)) => Ok(Release { api, conformance }),
        _ => bail!(
            "`go mod download` in {} did not give both Gateway API modules: {}{}",
            module_dir().display(),
            stdout,
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}
