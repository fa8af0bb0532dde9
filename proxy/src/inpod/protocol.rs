//! The CNI plugin's requests (`aether_cni::protocol`) answered by the agent: the wire apart
//! from the pods' state, which the agent keeps.

use aether_cni::protocol::{ErrorKind, ErrorReply, Request, Response};
use tracing::debug;

use crate::inpod::agent::{Agent, RegisterError, Registration};

/// Answers one request of the CNI plugin.
pub fn handle(agent: &Agent, request: Request) -> Response {
    debug!(?request, "CNI request");
    let answer = match request {
        Request::Ping => Ok(Response::Pong),
        Request::Add { pod, ips, .. } => agent.plan(&pod, &ips).map(Response::Decision),
        Request::Register {
            pod,
            container_id,
            ifname,
            netns,
            ips,
            generation,
        } => agent
            .register(Registration {
                pod,
                container_id,
                ifname,
                netns,
                ips,
                generation,
            })
            .map(|()| Response::Registered),
        Request::Unregister {
            container_id,
            ifname,
        } => {
            (agent.unregister(&container_id, &ifname)).map(|known| Response::Unregistered { known })
        }
        Request::Check { pod, container_id } => {
            agent.check(&pod, &container_id).map(Response::Checked)
        }
        Request::Gc {
            valid_container_ids,
        } => (agent.gc(&valid_container_ids)).map(|removed| Response::Collected { removed }),
    };
    answer.unwrap_or_else(|e| error_reply(&e))
}

/// The plugin's error reply: its kind decides whether the plugin retries, falls back to the
/// API server, or fails the pod's setup.
fn error_reply(error: &RegisterError) -> Response {
    let kind = match error {
        RegisterError::NotReady(_) => ErrorKind::NotReady,
        RegisterError::Refused { .. } => ErrorKind::BadRequest,
        RegisterError::Failed(_) => ErrorKind::Internal,
    };
    Response::Error(ErrorReply {
        kind,
        message: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use aether_cni::protocol::PodRef;

    use super::*;
    use crate::control::pod_view::ViewError;

    #[test]
    fn each_failure_gets_the_reply_kind_the_plugin_acts_on() {
        let pod = PodRef {
            namespace: "shop".into(),
            name: "web-0".into(),
            uid: None,
        };
        for (error, kind) in [
            (
                RegisterError::NotReady(ViewError::UnknownPod(pod.clone())),
                ErrorKind::NotReady,
            ),
            (
                RegisterError::Refused {
                    pod,
                    why: "network namespace /x does not hold [10.0.0.1]".into(),
                },
                ErrorKind::BadRequest,
            ),
            (
                RegisterError::Failed("disk full".into()),
                ErrorKind::Internal,
            ),
        ] {
            let message = error.to_string();
            assert_eq!(
                error_reply(&error),
                Response::Error(ErrorReply { kind, message })
            );
        }
    }
}
