//! A node proxy's view of its own node's pods. The proxy may not read pods from the API server
//! (RBAC cannot scope a read to one node), so it lists and watches them here, with the same
//! pod-bound token it uses for SVIDs. The request is the API server's own list/watch of pods,
//! forwarded as is with the operator's credentials, once its field selector is checked to be
//! the caller's node: the answer (lists, watch events, `410 Gone`) is the API server's, so a
//! standard client (kube's watcher) consumes it unchanged.

use super::api::ApiError;

/// Where the feed is served: the API server's path for all pods, so a client needs only a
/// different base URL.
pub const PODS_PATH: &str = "/api/v1/pods";

/// The query parameters a list or watch may carry; anything else is refused rather than
/// passed on. `fieldSelector` is required and checked.
const PASSED: &[&str] = &[
    "watch",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
    "allowWatchBookmarks",
    "sendInitialEvents",
    "limit",
    "continue",
];
const FIELD_SELECTOR: &str = "fieldSelector";

/// The query to send the API server for a caller on `node`, or why the request is refused:
/// 403 for a selector that is not exactly `spec.nodeName=<node>` (another node, or all), 400
/// for a parameter the feed does not take.
pub fn upstream_query(query: Option<&str>, node: &str) -> Result<String, ApiError> {
    let wanted = format!("spec.nodeName={node}");
    let mut selector = None;
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if key == FIELD_SELECTOR {
            if selector.replace(value.clone()).is_some() {
                return Err(ApiError::PodFeed(
                    "fieldSelector given more than once".into(),
                ));
            }
        } else if PASSED.contains(&&*key) {
            out.append_pair(&key, &value);
        } else {
            return Err(ApiError::PodFeed(format!(
                "query parameter {key:?} is not taken"
            )));
        }
    }
    match selector {
        Some(s) if s == wanted => {
            out.append_pair(FIELD_SELECTOR, &wanted);
            Ok(out.finish())
        }
        other => Err(ApiError::OtherNode {
            node: node.to_owned(),
            selector: other.map(|s| s.into_owned()).unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn passes_a_watch_of_the_callers_node() {
        let query = "fieldSelector=spec.nodeName%3Dnode-1&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=42";
        assert_eq!(
            upstream_query(Some(query), "node-1").unwrap(),
            "watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=42&fieldSelector=spec.nodeName%3Dnode-1"
        );
        assert_eq!(
            upstream_query(
                Some("fieldSelector=spec.nodeName=node-1&limit=500"),
                "node-1"
            )
            .unwrap(),
            "limit=500&fieldSelector=spec.nodeName%3Dnode-1"
        );
    }

    #[test]
    fn refuses_other_nodes_and_wider_selectors() {
        for query in [
            None,
            Some("watch=true"),
            Some("fieldSelector=spec.nodeName%3Dnode-2"),
            Some("fieldSelector=spec.nodeName%3Dnode-1,metadata.namespace%3Dx"),
            Some("fieldSelector=spec.nodeName%21%3Dnode-1"),
            Some("fieldSelector="),
        ] {
            let refused = upstream_query(query, "node-1").unwrap_err();
            assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{query:?}");
        }
    }

    #[test]
    fn refuses_parameters_it_does_not_know() {
        for query in [
            "fieldSelector=spec.nodeName%3Dnode-1&labelSelector=app",
            "fieldSelector=spec.nodeName%3Dnode-1&fieldSelector=spec.nodeName%3Dnode-1",
            "fieldSelector=spec.nodeName%3Dnode-1&pretty=true",
        ] {
            let refused = upstream_query(Some(query), "node-1").unwrap_err();
            assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{query}");
        }
    }
}
