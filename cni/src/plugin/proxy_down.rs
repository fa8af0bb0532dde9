//! What the plugin does when the node proxy cannot answer: pods of unmanaged namespaces go
//! ahead, the others (and pods it cannot judge) fail closed, so the runtime retries and no meshed pod ever starts
//! uncaptured.

use std::fmt::Display;
use std::time::Duration;

use crate::cni_io::{CniError, ErrorCode};
use crate::decision::{self, LookupError, Meshing};
use crate::protocol::{ClientError, ErrorKind, PodRef};

use super::settings::Settings;

/// Bounds the API server fallback; with the proxy's own timeout, ADD gives up within ~4 s.
pub const API_TIMEOUT: Duration = Duration::from_secs(2);

/// Asks the API server (when a kubeconfig is configured) whether `pod` may start without the
/// proxy. `Ok(reason)`: it is not meshed. `Err`: fail closed.
pub fn without_proxy(
    settings: &Settings,
    pod: &PodRef,
    proxy: &ClientError,
) -> Result<String, CniError> {
    let Some(kubeconfig) = &settings.kubeconfig else {
        return Err(proxy_error(
            proxy,
            "aether-cni has no \"kubeconfig\" in its config, so without the proxy it cannot tell whether the pod is meshed; the runtime will retry",
        ));
    };
    judge(pod, proxy, decision::lookup(kubeconfig, pod, API_TIMEOUT))
}

/// The pure half of [`without_proxy`].
pub fn judge(
    pod: &PodRef,
    proxy: &ClientError,
    lookup: Result<Meshing, LookupError>,
) -> Result<String, CniError> {
    match lookup {
        Ok(Meshing::Unmeshed { reason }) => Ok(reason),
        Ok(Meshing::Meshed) => Err(proxy_error(
            proxy,
            format!(
                "pod {pod} is in a managed namespace, so it must not start uncaptured (an opt-out annotation is read by the proxy alone); the runtime will retry"
            ),
        )),
        Err(e) => Err(proxy_error(
            proxy,
            format!(
                "the API server lookup failed too ({e}), so aether-cni cannot tell whether pod {pod} is meshed and fails closed; the runtime will retry"
            ),
        )),
    }
}

/// The CNI error for a proxy that could not answer; `consequence` says what follows from it.
pub fn proxy_error(proxy: &ClientError, consequence: impl Display) -> CniError {
    match proxy {
        ClientError::Unreachable { socket, source } => CniError::new(
            ErrorCode::TryAgainLater,
            format!(
                "aether node proxy not reachable at {}: is the aether DaemonSet running on this node?",
                socket.display()
            ),
            format!("{source}; {consequence}"),
        ),
        ClientError::Timeout { .. } | ClientError::Io { .. } | ClientError::Closed { .. } => {
            CniError::new(
                ErrorCode::TryAgainLater,
                proxy.to_string(),
                consequence.to_string(),
            )
        }
        ClientError::Server { reply, .. } if reply.kind == ErrorKind::NotReady => CniError::new(
            ErrorCode::TryAgainLater,
            proxy.to_string(),
            consequence.to_string(),
        ),
        ClientError::Server { .. }
        | ClientError::Invalid { .. }
        | ClientError::VersionMismatch { .. }
        | ClientError::Unexpected { .. } => CniError::new(
            ErrorCode::ProxyRefused,
            proxy.to_string(),
            consequence.to_string(),
        ),
    }
}

/// Whether the proxy simply was not there to answer (as opposed to answering wrongly).
pub fn is_absent(proxy: &ClientError) -> bool {
    matches!(
        proxy,
        ClientError::Unreachable { .. }
            | ClientError::Timeout { .. }
            | ClientError::Io { .. }
            | ClientError::Closed { .. }
    )
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::path::PathBuf;

    use super::*;
    use crate::protocol::ErrorReply;

    fn pod() -> PodRef {
        PodRef {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: None,
        }
    }

    fn unreachable() -> ClientError {
        ClientError::Unreachable {
            socket: PathBuf::from("/var/run/aether/cni.sock"),
            source: io::Error::from(io::ErrorKind::NotFound),
        }
    }

    #[test]
    fn an_unreachable_proxy_gets_the_actionable_message() {
        let e = proxy_error(&unreachable(), "x");
        assert_eq!(e.code, ErrorCode::TryAgainLater);
        assert_eq!(
            e.msg,
            "aether node proxy not reachable at /var/run/aether/cni.sock: is the aether DaemonSet running on this node?"
        );
    }

    #[test]
    fn unmeshed_pods_go_ahead_without_the_proxy() {
        let reason = judge(
            &pod(),
            &unreachable(),
            Ok(Meshing::Unmeshed {
                reason: "namespace shop is not labelled".into(),
            }),
        );
        assert_eq!(reason.unwrap(), "namespace shop is not labelled");
    }

    #[test]
    fn meshed_pods_fail_closed() {
        let e = judge(&pod(), &unreachable(), Ok(Meshing::Meshed)).unwrap_err();
        assert_eq!(e.code, ErrorCode::TryAgainLater);
        assert!(
            e.details
                .contains("pod shop/web-0 is in a managed namespace"),
            "{e}"
        );
    }

    #[test]
    fn a_failed_lookup_fails_closed() {
        let e = judge(
            &pod(),
            &unreachable(),
            Err(LookupError::Timeout(Duration::from_secs(2))),
        )
        .unwrap_err();
        assert!(e.details.contains("API server lookup failed too"), "{e}");
        assert!(e.msg.contains("not reachable"), "{e}");
    }

    #[test]
    fn no_kubeconfig_fails_closed_and_says_so() {
        let e = without_proxy(&Settings::default(), &pod(), &unreachable()).unwrap_err();
        assert!(e.details.contains("no \"kubeconfig\""), "{e}");
    }

    #[test]
    fn error_answers_map_to_codes() {
        let server = |kind| ClientError::Server {
            socket: PathBuf::from("/s"),
            reply: ErrorReply {
                kind,
                message: "m".into(),
            },
        };
        assert_eq!(
            proxy_error(&server(ErrorKind::NotReady), "").code,
            ErrorCode::TryAgainLater
        );
        assert_eq!(
            proxy_error(&server(ErrorKind::Internal), "").code,
            ErrorCode::ProxyRefused
        );
        assert!(is_absent(&unreachable()));
        assert!(!is_absent(&server(ErrorKind::Internal)));
    }
}
