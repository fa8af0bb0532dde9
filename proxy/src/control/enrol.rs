//! Running pods joining and leaving the mesh with no restart: which of this node's pods to
//! mesh (their namespace was opted in after they started, or this proxy was installed after
//! them) and which to take out (their namespace was opted out, or they opted out), decided
//! from what the proxy sees. Pure; `enroller::Enroller` acts on it.

use std::net::IpAddr;

use aether_cni::decision::Meshing;
use aether_cni::protocol::PodRef;

use crate::state::registry::RegisteredPod;

/// One of this node's pods as the proxy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePod {
    pub pod: PodRef,
    pub ips: Vec<IpAddr>,
    /// Whether it is meshed by its namespace and annotations; `None` while the proxy cannot
    /// tell (its caches are filling), when nothing is decided about it.
    pub meshing: Option<Meshing>,
    /// Running in a network of its own: not host network, not finished, with an address.
    pub running: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Mesh this running pod.
    Enrol { pod: PodRef, ips: Vec<IpAddr> },
    /// Take this registered pod out of the mesh.
    Leave {
        container_id: String,
        pod: PodRef,
        reason: String,
    },
    /// Forget a pod the proxy enrolled, which is gone.
    Forget { container_id: String },
}

pub fn plan(pods: &[NodePod], registered: &[RegisteredPod]) -> Vec<Step> {
    let mut steps = Vec::new();
    for pod in pods {
        let known = registered.iter().any(|r| r.is_of(&pod.pod));
        if pod.running && !known && pod.meshing == Some(Meshing::Meshed) {
            steps.push(Step::Enrol {
                pod: pod.pod.clone(),
                ips: pod.ips.clone(),
            });
        }
    }
    for registration in registered {
        match pods.iter().find(|p| registration.is_of(&p.pod)) {
            Some(NodePod {
                meshing: Some(Meshing::Unmeshed { reason }),
                ..
            }) => steps.push(Step::Leave {
                container_id: registration.container_id.clone(),
                pod: registration.pod.clone(),
                reason: reason.clone(),
            }),
            // The runtime tells the plugin when a pod it registered goes.
            None if registration.enrolled() => steps.push(Step::Forget {
                container_id: registration.container_id.clone(),
            }),
            _ => {}
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::registry::enrolled_id;

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "shop".into(),
            name: name.into(),
            uid: Some(format!("uid-{name}")),
        }
    }

    fn node_pod(name: &str, meshing: Option<Meshing>, running: bool) -> NodePod {
        NodePod {
            pod: pod(name),
            ips: vec!["10.244.1.5".parse().unwrap()],
            meshing,
            running,
        }
    }

    fn registered(name: &str, container_id: &str) -> RegisteredPod {
        RegisteredPod {
            pod: pod(name),
            container_id: container_id.into(),
            ifname: "eth0".into(),
            netns: "/var/run/netns/cni-1".into(),
            ips: vec!["10.244.1.5".parse().unwrap()],
            capture_port: 15001,
            generation: 1,
            strict_inbound_port: None,
        }
    }

    fn unmeshed() -> Option<Meshing> {
        Some(Meshing::Unmeshed {
            reason: "namespace shop is not managed".into(),
        })
    }

    #[test]
    fn a_running_meshed_pod_that_nobody_registered_is_enrolled() {
        let pods = [
            node_pod("web", Some(Meshing::Meshed), true),
            node_pod("starting", Some(Meshing::Meshed), false),
            node_pod("plain", unmeshed(), true),
            node_pod("unknown", None, true),
        ];
        assert_eq!(
            plan(&pods, &[]),
            [Step::Enrol {
                pod: pod("web"),
                ips: pods[0].ips.clone()
            }]
        );
        // Registered by the plugin (or enrolled before): nothing to do.
        assert_eq!(plan(&pods[..1], &[registered("web", "abc123")]), []);
    }

    #[test]
    fn a_registered_pod_that_is_no_longer_meshed_leaves() {
        let pods = [node_pod("web", unmeshed(), true)];
        for id in ["abc123".to_owned(), enrolled_id("uid-web")] {
            assert_eq!(
                plan(&pods, &[registered("web", &id)]),
                [Step::Leave {
                    container_id: id.clone(),
                    pod: pod("web"),
                    reason: "namespace shop is not managed".into()
                }]
            );
        }
        // While the proxy cannot tell, nothing leaves.
        assert_eq!(
            plan(
                &[node_pod("web", None, true)],
                &[registered("web", "abc123")]
            ),
            []
        );
    }

    #[test]
    fn an_enrolled_pod_that_is_gone_is_forgotten_a_plugin_one_is_left_to_the_runtime() {
        let enrolled = enrolled_id("uid-web");
        assert_eq!(
            plan(
                &[],
                &[registered("web", &enrolled), registered("db", "abc123")]
            ),
            [Step::Forget {
                container_id: enrolled
            }]
        );
    }

    #[test]
    fn a_new_pod_of_the_same_name_is_another_pod() {
        let mut newer = node_pod("web", Some(Meshing::Meshed), true);
        newer.pod.uid = Some("uid-web-2".into());
        let old = registered("web", &enrolled_id("uid-web"));
        assert_eq!(
            plan(std::slice::from_ref(&newer), std::slice::from_ref(&old)),
            [
                Step::Enrol {
                    pod: newer.pod.clone(),
                    ips: newer.ips.clone()
                },
                Step::Forget {
                    container_id: old.container_id.clone()
                }
            ]
        );
    }
}
