//! Container images are mapped to programs on this machine: the local cluster has no
//! container runtime, so "pulling" an image means finding the program that plays it.

use std::path::{Path, PathBuf};

/// Programs that stand for images, by image repository (the part before the tag).
const IMAGES: &[(&str, &str)] = &[
    // The Gateway API conformance echo image (and the Istio app it is built from) is
    // played by the project's own echo server, which accepts the same flags.
    ("registry.k8s.io/gateway-api/echo-advanced", "aether-echo"),
    (
        "registry.k8s.io/gateway-api/conformance/echo-advanced",
        "aether-echo",
    ),
    ("gcr.io/istio-release/app", "aether-echo"),
    ("registry.k8s.io/coredns/coredns", "coredns"),
    ("aether/operator", "aether-operator"),
    ("aether/proxy", "aether-proxy"),
    ("aether/cni", "aether-cni"),
];

/// What to execute for a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub path: PathBuf,
    pub args: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("image {0:?} is not in the local image table (tests/nodesim/src/images.rs)")]
    Unknown(String),
    #[error("program {program:?} for image {image:?} is not in any of {dirs:?}; build it first")]
    NotBuilt {
        image: String,
        program: String,
        dirs: Vec<PathBuf>,
    },
}

fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    // A tag follows the last ':' only when no '/' comes after it (registry ports have one).
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => &image[..i],
        _ => image,
    }
}

/// Resolves a container to a program. `command` replaces the image's entrypoint, as in
/// Kubernetes; its first element names a program by its file name.
pub fn resolve(
    image: &str,
    command: &[String],
    args: &[String],
    bin_dirs: &[PathBuf],
) -> Result<Program, ImageError> {
    let repo = repository(image);
    let default = IMAGES
        .iter()
        .find(|(r, _)| *r == repo)
        .map(|(_, program)| *program)
        .ok_or_else(|| ImageError::Unknown(image.to_owned()))?;
    let (program, mut argv) = match command.split_first() {
        Some((first, rest)) => {
            let name = Path::new(first)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or(first);
            (name.to_owned(), rest.to_vec())
        }
        None => (default.to_owned(), Vec::new()),
    };
    argv.extend(args.iter().cloned());
    let path = bin_dirs
        .iter()
        .map(|dir| dir.join(&program))
        .find(|p| p.is_file())
        .ok_or_else(|| ImageError::NotBuilt {
            image: image.to_owned(),
            program: program.clone(),
            dirs: bin_dirs.to_vec(),
        })?;
    Ok(Program { path, args: argv })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_drop_tags_and_digests_but_not_registry_ports() {
        assert_eq!(
            repository("registry.k8s.io/gateway-api/echo-advanced:v1.5.1"),
            "registry.k8s.io/gateway-api/echo-advanced"
        );
        assert_eq!(
            repository("localhost:5000/aether/proxy"),
            "localhost:5000/aether/proxy"
        );
        assert_eq!(repository("aether/proxy:0.1.0@sha256:abc"), "aether/proxy");
    }

    #[test]
    fn command_replaces_the_entrypoint_and_args_follow() {
        let dir = std::env::temp_dir().join(format!("nodesim-images-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["aether-echo", "coredns"] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        let dirs = vec![dir.clone()];
        let p = resolve(
            "registry.k8s.io/gateway-api/echo-advanced:v1.5.1",
            &[],
            &["--port=8080".into()],
            &dirs,
        )
        .unwrap();
        assert_eq!(
            (p.path, p.args),
            (dir.join("aether-echo"), vec!["--port=8080".to_owned()])
        );
        let p = resolve(
            "registry.k8s.io/coredns/coredns:v1.12.0",
            &["/coredns".into(), "-conf".into()],
            &["/etc/Corefile".into()],
            &dirs,
        )
        .unwrap();
        assert_eq!(p.args, ["-conf", "/etc/Corefile"]);
        assert!(matches!(
            resolve("nginx:latest", &[], &[], &dirs),
            Err(ImageError::Unknown(_))
        ));
        assert!(matches!(
            resolve("aether/proxy:1", &[], &[], &dirs),
            Err(ImageError::NotBuilt { .. })
        ));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
