//! The layout of the root Secret (documented in `ca/mod.rs`) and its translation to and from
//! [`RootMaterial`].

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;

use super::root::GeneratedRoot;

/// The signing root's certificate (exactly one PEM certificate).
pub const CERT_KEY: &str = "tls.crt";
/// The signing root's private key (PEM PKCS#8).
pub const KEY_KEY: &str = "tls.key";
/// Roots retired by a rotation, still trusted until the SVIDs they signed have expired.
pub const PREVIOUS_KEY: &str = "previous.crt";
/// Roots announced for the next rotation, trusted before they sign anything.
pub const NEXT_KEY: &str = "next.crt";

/// The PEM texts of a root Secret, as stored. Compared as a whole to notice a rotation.
#[derive(Clone, PartialEq, Eq)]
pub struct RootMaterial {
    pub cert_pem: String,
    pub key_pem: String,
    pub previous_pem: Option<String>,
    pub next_pem: Option<String>,
}

impl std::fmt::Debug for RootMaterial {
    // Never print the private key, whoever logs this.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootMaterial")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .field("previous_pem", &self.previous_pem)
            .field("next_pem", &self.next_pem)
            .finish()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("key {0:?} is missing")]
    Missing(&'static str),
    #[error("key {0:?} is not UTF-8 text")]
    NotText(&'static str),
}

/// Reads the root material out of a Secret. Only presence and text are checked here; what
/// the PEM means is checked when the authority is built from it.
pub fn decode(secret: &Secret) -> Result<RootMaterial, SecretError> {
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    let text = |key: &'static str| -> Result<Option<String>, SecretError> {
        data.get(key)
            .filter(|v| !v.0.is_empty())
            .map(|v| String::from_utf8(v.0.clone()).map_err(|_| SecretError::NotText(key)))
            .transpose()
    };
    Ok(RootMaterial {
        cert_pem: text(CERT_KEY)?.ok_or(SecretError::Missing(CERT_KEY))?,
        key_pem: text(KEY_KEY)?.ok_or(SecretError::Missing(KEY_KEY))?,
        previous_pem: text(PREVIOUS_KEY)?,
        next_pem: text(NEXT_KEY)?,
    })
}

/// The Secret holding a root generated at first start. Typed `kubernetes.io/tls` so tools
/// that understand TLS Secrets (and cert-manager's CA issuer) can use it as is.
pub fn encode(namespace: &str, name: &str, root: &GeneratedRoot) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_owned(),
                "aether".to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                "aether.io/ca-origin".to_owned(),
                "generated".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(BTreeMap::from([
            (
                CERT_KEY.to_owned(),
                ByteString(root.cert_pem.clone().into_bytes()),
            ),
            (
                KEY_KEY.to_owned(),
                ByteString(root.key_pem.clone().into_bytes()),
            ),
        ])),
        ..Secret::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generated() -> GeneratedRoot {
        GeneratedRoot {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        }
    }

    #[test]
    fn round_trips() {
        let secret = encode("ns", "aether-ca", &generated());
        let material = decode(&secret).unwrap();
        assert_eq!(material.cert_pem, "CERT");
        assert_eq!(material.key_pem, "KEY");
        assert_eq!(material.previous_pem, None);
        assert!(!format!("{material:?}").contains("KEY\""));
    }

    #[test]
    fn reads_previous_and_next_and_reports_missing_keys() {
        let mut secret = encode("ns", "aether-ca", &generated());
        let data = secret.data.as_mut().unwrap();
        data.insert(PREVIOUS_KEY.into(), ByteString(b"OLD".to_vec()));
        data.insert(NEXT_KEY.into(), ByteString(Vec::new()));
        let material = decode(&secret).unwrap();
        assert_eq!(material.previous_pem.as_deref(), Some("OLD"));
        assert_eq!(material.next_pem, None, "an empty key counts as absent");

        secret.data.as_mut().unwrap().remove(KEY_KEY);
        assert_eq!(decode(&secret), Err(SecretError::Missing(KEY_KEY)));
        secret
            .data
            .as_mut()
            .unwrap()
            .insert(KEY_KEY.into(), ByteString(vec![0xff]));
        assert_eq!(decode(&secret), Err(SecretError::NotText(KEY_KEY)));
    }
}
