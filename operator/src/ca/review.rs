//! What the API server says about an SVID request: the caller's token, the requested
//! namespace's labels, and the pods on the caller's node. Thin calls; the decisions are in
//! `authz`.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};

/// Asks the API server to validate `token` for `audience`.
pub async fn review_token(
    client: &kube::Client,
    token: &str,
    audience: &str,
) -> Result<TokenReviewStatus, kube::Error> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_owned(),
            audiences: Some(vec![audience.to_owned()]),
        },
        ..TokenReview::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(reviewed.status.unwrap_or_default())
}

/// The pods of `namespace` bound to `node`: the field selector keeps the answer as small as
/// one node's share of one namespace.
pub async fn pods_on_node(
    client: &kube::Client,
    namespace: &str,
    node: &str,
) -> Result<Vec<Pod>, kube::Error> {
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&params)
        .await?
        .items)
}

/// The labels of `namespace`; none when it does not exist.
pub async fn namespace_labels(
    client: &kube::Client,
    namespace: &str,
) -> Result<BTreeMap<String, String>, kube::Error> {
    Ok(Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await?
        .and_then(|ns| ns.metadata.labels)
        .unwrap_or_default())
}
