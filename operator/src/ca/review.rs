//! What the API server says about an SVID request: the caller's token, and the pods on the
//! caller's node. Thin calls; the decisions are in `authz`.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::Pod;
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
