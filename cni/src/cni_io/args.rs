use crate::protocol::PodRef;

use super::error::{CniError, ErrorCode};

/// `CNI_ARGS`: `;`-separated `KEY=VALUE` pairs. The kubelet's runtime passes the pod's identity here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pairs: Vec<(String, String)>,
}

impl CniArgs {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The Kubernetes pod these args name, if they name one. `K8S_POD_UID` is optional: runtimes
    /// older than containerd 1.5 do not pass it.
    pub fn pod(&self) -> Option<PodRef> {
        let non_empty = |key| self.get(key).filter(|v| !v.is_empty());
        Some(PodRef {
            namespace: non_empty("K8S_POD_NAMESPACE")?.to_owned(),
            name: non_empty("K8S_POD_NAME")?.to_owned(),
            uid: non_empty("K8S_POD_UID").map(str::to_owned),
        })
    }
}

pub fn parse_cni_args(raw: &str) -> Result<CniArgs, CniError> {
    let mut pairs = Vec::new();
    for item in raw.split(';').filter(|item| !item.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(CniError::new(
                ErrorCode::InvalidEnv,
                format!("CNI_ARGS has an entry without '=': {item:?}"),
                "CNI_ARGS must be KEY=VALUE pairs separated by ';'",
            ));
        };
        if key.is_empty() {
            return Err(CniError::new(
                ErrorCode::InvalidEnv,
                format!("CNI_ARGS has an entry with an empty key: {item:?}"),
                "CNI_ARGS must be KEY=VALUE pairs separated by ';'",
            ));
        }
        pairs.push((key.to_owned(), value.to_owned()));
    }
    Ok(CniArgs { pairs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_args_give_the_pod() {
        let args = parse_cni_args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1234-5",
        )
        .unwrap();
        assert_eq!(
            args.pod(),
            Some(PodRef {
                namespace: "shop".into(),
                name: "web-0".into(),
                uid: Some("1234-5".into())
            })
        );
    }

    #[test]
    fn uid_is_optional_but_namespace_and_name_are_not() {
        let args = parse_cni_args("K8S_POD_NAMESPACE=a;K8S_POD_NAME=b").unwrap();
        assert_eq!(args.pod().unwrap().uid, None);
        assert_eq!(parse_cni_args("K8S_POD_NAMESPACE=a").unwrap().pod(), None);
        assert_eq!(
            parse_cni_args("K8S_POD_NAMESPACE=;K8S_POD_NAME=b")
                .unwrap()
                .pod(),
            None
        );
    }

    #[test]
    fn empty_args_and_trailing_separators_are_fine() {
        assert_eq!(parse_cni_args("").unwrap(), CniArgs::default());
        assert_eq!(parse_cni_args("A=1;;").unwrap().get("A"), Some("1"));
    }

    #[test]
    fn values_may_contain_equals_signs() {
        assert_eq!(parse_cni_args("A=b=c").unwrap().get("A"), Some("b=c"));
    }

    #[test]
    fn malformed_pairs_are_invalid_env() {
        for raw in ["K8S_POD_NAME", "=x", "A=1;B"] {
            assert_eq!(
                parse_cni_args(raw).unwrap_err().code,
                ErrorCode::InvalidEnv,
                "{raw}"
            );
        }
    }
}
