//! Who this pod is: its name, namespace and ServiceAccount, reported in every answer so tests
//! can tell which backend served them and under which identity.
//!
//! The node simulator gives each pod its own UTS namespace whose hostname is the pod name, and
//! mounts the projected ServiceAccount token as a kubelet would. Environment variables
//! (`POD_NAME`, `POD_NAMESPACE`, `SERVICE_ACCOUNT`) override both, for runs outside a pod.

use std::path::Path;

use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIdentity {
    pub hostname: String,
    pub namespace: String,
    pub service_account: String,
}

/// What [`PodIdentity::resolve`] reads from; each source may be missing.
#[derive(Debug, Default)]
pub struct Sources {
    pub env_pod_name: Option<String>,
    pub env_namespace: Option<String>,
    pub env_service_account: Option<String>,
    /// The UTS namespace's hostname.
    pub uts_hostname: Option<String>,
    pub token: Option<String>,
    /// The `namespace` file mounted next to the token.
    pub namespace_file: Option<String>,
}

impl PodIdentity {
    /// Reads the environment, the hostname and the ServiceAccount mount in `sa_dir`.
    pub fn load(sa_dir: &Path) -> PodIdentity {
        let env = |name: &str| std::env::var(name).ok();
        let file = |path: &Path| std::fs::read_to_string(path).ok();
        PodIdentity::resolve(Sources {
            env_pod_name: env("POD_NAME"),
            env_namespace: env("POD_NAMESPACE"),
            env_service_account: env("SERVICE_ACCOUNT"),
            // Per UTS namespace, unlike /etc/hostname which the pod shares with the machine.
            uts_hostname: file(Path::new("/proc/sys/kernel/hostname")),
            token: file(&sa_dir.join("token")),
            namespace_file: file(&sa_dir.join("namespace")),
        })
    }

    /// Picks each field from the first source that has it; blank values count as missing.
    pub fn resolve(sources: Sources) -> PodIdentity {
        let present = |value: Option<String>| {
            value
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let claims = sources.token.as_deref().and_then(token_claims);
        let (token_ns, token_sa) = match claims {
            Some(TokenClaims {
                namespace,
                service_account,
            }) => (Some(namespace), Some(service_account)),
            None => (None, None),
        };
        PodIdentity {
            hostname: present(sources.env_pod_name)
                .or(present(sources.uts_hostname))
                .unwrap_or_default(),
            namespace: present(sources.env_namespace)
                .or(present(token_ns))
                .or(present(sources.namespace_file))
                .unwrap_or_default(),
            service_account: present(sources.env_service_account)
                .or(present(token_sa))
                .unwrap_or_default(),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct TokenClaims {
    pub namespace: String,
    pub service_account: String,
}

/// The namespace and ServiceAccount a Kubernetes ServiceAccount JWT names. The signature is not
/// checked: the token is the pod's own, read from its own mount.
pub fn token_claims(token: &str) -> Option<TokenClaims> {
    let payload = token.trim().split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&base64url_decode(payload)?).ok()?;

    // Bound (projected) tokens carry a structured claim; `sub` is there for every token kind.
    let structured = claims.get("kubernetes.io").and_then(|k8s| {
        Some(TokenClaims {
            namespace: k8s.get("namespace")?.as_str()?.to_string(),
            service_account: k8s
                .get("serviceaccount")?
                .get("name")?
                .as_str()?
                .to_string(),
        })
    });
    structured.or_else(|| {
        let subject = claims.get("sub")?.as_str()?;
        let (namespace, service_account) = subject
            .strip_prefix("system:serviceaccount:")?
            .split_once(':')?;
        Some(TokenClaims {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        })
    })
}

/// Base64url (RFC 4648 §5) as JWTs use it; padding and the standard alphabet's `+`/`/` are
/// accepted too. `None` on any other character.
pub fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut buffer: u32 = 0;
    let mut bits = 0;
    for byte in text.trim_end_matches('=').bytes() {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => return None,
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Base64url without padding, for building test tokens.
    fn encode(data: &[u8]) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in data.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, b)| acc | u32::from(*b) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }

    fn jwt(claims: &str) -> String {
        format!(
            "{}.{}.signature",
            encode(br#"{"alg":"RS256"}"#),
            encode(claims.as_bytes())
        )
    }

    #[test]
    fn base64url_decodes_all_lengths_and_alphabets() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"\xff\xfe\xfd\x00"] {
            assert_eq!(base64url_decode(&encode(data)).as_deref(), Some(data));
        }
        assert_eq!(base64url_decode("Zm9vYg=="), Some(b"foob".to_vec()));
        assert_eq!(base64url_decode("-_+/"), base64url_decode("-_-_"));
        assert_eq!(base64url_decode("not base64!"), None);
    }

    #[test]
    fn reads_the_projected_token_claim() {
        let token = jwt(r#"{"sub":"system:serviceaccount:ignored:ignored",
                "kubernetes.io":{"namespace":"gateway-conformance-mesh",
                "serviceaccount":{"name":"echo-v1","uid":"u"}}}"#);
        assert_eq!(
            token_claims(&token),
            Some(TokenClaims {
                namespace: "gateway-conformance-mesh".into(),
                service_account: "echo-v1".into(),
            })
        );
    }

    #[test]
    fn falls_back_to_the_subject() {
        let token = jwt(r#"{"sub":"system:serviceaccount:ns-a:default"}"#);
        assert_eq!(
            token_claims(&format!("{token}\n")),
            Some(TokenClaims {
                namespace: "ns-a".into(),
                service_account: "default".into(),
            })
        );
    }

    #[test]
    fn garbage_tokens_give_nothing() {
        for token in [
            "",
            "onepart",
            "a.!!!.c",
            &jwt("not json"),
            &jwt(r#"{"sub":"user:alice"}"#),
            &jwt(r#"{"kubernetes.io":{"namespace":7}}"#),
        ] {
            assert_eq!(token_claims(token), None, "{token}");
        }
    }

    #[test]
    fn environment_overrides_files_and_files_fill_gaps() {
        let token = jwt(r#"{"sub":"system:serviceaccount:from-token:sa-token"}"#);
        let from_files = PodIdentity::resolve(Sources {
            uts_hostname: Some("echo-v1-abc\n".into()),
            token: Some(token.clone()),
            namespace_file: Some("from-file".into()),
            ..Sources::default()
        });
        assert_eq!(
            from_files,
            PodIdentity {
                hostname: "echo-v1-abc".into(),
                namespace: "from-token".into(),
                service_account: "sa-token".into(),
            }
        );

        let overridden = PodIdentity::resolve(Sources {
            env_pod_name: Some("pod".into()),
            env_namespace: Some("ns".into()),
            env_service_account: Some("sa".into()),
            uts_hostname: Some("host".into()),
            token: Some(token),
            ..Sources::default()
        });
        assert_eq!(overridden.hostname, "pod");
        assert_eq!(overridden.namespace, "ns");
        assert_eq!(overridden.service_account, "sa");

        let namespace_file_only = PodIdentity::resolve(Sources {
            env_namespace: Some("  ".into()),
            namespace_file: Some("from-file\n".into()),
            ..Sources::default()
        });
        assert_eq!(namespace_file_only.namespace, "from-file");
        assert_eq!(namespace_file_only.service_account, "");
    }

    #[test]
    fn load_reads_the_mount() {
        let dir = std::env::temp_dir().join(format!("aether-echo-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("namespace"), "mounted-ns").unwrap();
        let identity = PodIdentity::load(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        // The environment may set POD_NAMESPACE; only check the file when it does not.
        if std::env::var("POD_NAMESPACE").is_err() {
            assert_eq!(identity.namespace, "mounted-ns");
        }
    }
}
