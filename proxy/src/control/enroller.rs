//! Meshing and unmeshing the node's running pods, as their namespace's label and their
//! annotations say.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use aether_cni::protocol::PodRef;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::warn;

use super::view::{ClusterView, MANAGER};
use crate::control::enrol::{self, Step};
use crate::dataplane::Workloads;
use crate::identity::tls::Certs;
use crate::inpod::agent::{Agent, Enrolment, LEAVE_LINGER};
use crate::metrics::Metrics;

/// Where the container runtime mounts the pods' network namespaces (the plugin is given paths
/// under it), as the proxy's container sees it.
const NETNS_DIR: &str = "/var/run/netns";
/// A pod that could not be meshed is tried again after this long.
const ENROL_RETRY: Duration = Duration::from_secs(5);
/// How often a running pod waiting for its SVID to join is looked at again.
const SVID_POLL: Duration = Duration::from_millis(200);

/// Brings this node's running pods in and out of the mesh as their namespace's label and their
/// annotations say (`enrol::plan`), with an Event on each pod and a metric; a pod that cannot
/// be meshed says why once per cause and is tried again after [`ENROL_RETRY`]. A running pod
/// joins only once its ServiceAccount's SVID is on the node: captured before, its connections
/// would fail until the SVID came (after an install the CA may still be starting).
pub struct Enroller {
    recorder: Recorder,
    node: String,
    /// Pods (by uid) that could not be meshed: when to try again, and why they failed.
    failed: std::collections::HashMap<String, (tokio::time::Instant, String)>,
}

impl Enroller {
    pub fn new(client: kube::Client, node: &str) -> Self {
        Enroller {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: MANAGER.into(),
                    instance: Some(node.to_owned()),
                },
            ),
            node: node.to_owned(),
            failed: std::collections::HashMap::new(),
        }
    }

    /// One pass; returns when a failed pod is due again, if one is.
    pub async fn pass(
        &mut self,
        view: &ClusterView,
        agent: &Arc<Agent>,
        certs: &Certs,
        metrics: &Metrics,
    ) -> Option<tokio::time::Instant> {
        let pods = view.node_pods()?;
        let now = tokio::time::Instant::now();
        let mut awaiting_svid = None;
        self.failed
            .retain(|uid, _| pods.iter().any(|p| p.pod.uid.as_deref() == Some(uid)));
        let (mut joining, mut leaving, mut gone) = (Vec::new(), Vec::new(), Vec::new());
        for step in enrol::plan(&pods, &agent.registered()) {
            match step {
                Step::Enrol { pod, ips } => {
                    let due = pod
                        .uid
                        .as_ref()
                        .and_then(|uid| self.failed.get(uid))
                        .is_none_or(|(at, _)| *at <= now);
                    let has_svid = view.service_account(&pod).is_some_and(|sa| certs.has(&sa));
                    if !has_svid {
                        awaiting_svid = Some(now + SVID_POLL);
                    } else if due {
                        joining.push((pod, ips));
                    }
                }
                Step::Leave {
                    container_id,
                    pod,
                    reason,
                } => leaving.push((container_id, pod, reason)),
                Step::Forget { container_id } => gone.push(container_id),
            }
        }
        if !joining.is_empty() {
            self.join(view, agent, metrics, joining).await;
        }
        if !leaving.is_empty() {
            let ids: Vec<String> = leaving.iter().map(|(id, _, _)| id.clone()).collect();
            let agent_ = agent.clone();
            if let Ok(results) =
                tokio::task::spawn_blocking(move || agent_.leave(&ids, LEAVE_LINGER)).await
            {
                for (pod, result) in results {
                    let reason = leaving
                        .iter()
                        .find(|(_, p, _)| *p == pod)
                        .map(|(_, _, r)| r.clone())
                        .unwrap_or_default();
                    let note = match &result {
                        Ok(()) => format!(
                            "aether-proxy on {} took the running pod out of the mesh ({reason}): new connections go direct",
                            self.node
                        ),
                        Err(e) => format!(
                            "aether-proxy on {} cannot take the pod out of the mesh: {e}",
                            self.node
                        ),
                    };
                    metrics.enrolment("leave", result.is_ok());
                    self.event(view, &pod, result.is_ok(), "Unmeshed", "UnmeshFailed", note)
                        .await;
                }
            }
        }
        if !gone.is_empty() {
            let agent_ = agent.clone();
            let _ = tokio::task::spawn_blocking(move || agent_.forget(&gone)).await;
        }
        self.failed
            .values()
            .map(|(at, _)| *at)
            .chain(awaiting_svid)
            .min()
    }

    async fn join(
        &mut self,
        view: &ClusterView,
        agent: &Arc<Agent>,
        metrics: &Metrics,
        joining: Vec<(PodRef, Vec<IpAddr>)>,
    ) {
        let wanted: Vec<IpAddr> = joining.iter().flat_map(|(_, ips)| ips.clone()).collect();
        let found = tokio::task::spawn_blocking(move || {
            crate::inpod::netns::holding(std::path::Path::new(NETNS_DIR), &wanted)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| format!("cannot read {NETNS_DIR}: {e}")));
        let mut enrolments = Vec::new();
        let mut results = Vec::new();
        for (pod, ips) in joining {
            let netns =
                match &found {
                    Ok(found) => ips.iter().find_map(|ip| found.get(ip)).cloned().ok_or_else(
                        || {
                            format!(
                                "no network namespace under {NETNS_DIR} holds the pod's address {}",
                                ips.iter()
                                    .map(ToString::to_string)
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        },
                    ),
                    Err(e) => Err(e.clone()),
                };
            match netns {
                Ok(netns) => enrolments.push(Enrolment { pod, netns, ips }),
                Err(e) => results.push((pod, Err(e))),
            }
        }
        if !enrolments.is_empty() {
            let agent_ = agent.clone();
            match tokio::task::spawn_blocking(move || agent_.enrol(enrolments)).await {
                Ok(done) => results.extend(done),
                Err(e) => warn!(error = %e, "enrolling running pods failed"),
            }
        }
        let retry = tokio::time::Instant::now() + ENROL_RETRY;
        for (pod, result) in results {
            metrics.enrolment("enrol", result.is_ok());
            let uid = pod.uid.clone().unwrap_or_default();
            match result {
                Ok(()) => {
                    self.failed.remove(&uid);
                    let note = format!(
                        "aether-proxy on {} meshed the running pod: capture table installed, listeners open; new connections are captured, open ones are left as they are",
                        self.node
                    );
                    self.event(view, &pod, true, "Meshed", "", note).await;
                }
                Err(e) => {
                    let repeated = self.failed.get(&uid).is_some_and(|(_, last)| *last == e);
                    self.failed.insert(uid, (retry, e.clone()));
                    if !repeated {
                        warn!(pod = %pod, error = %e, "cannot mesh a running pod; retrying");
                        let note = format!(
                            "aether-proxy on {} cannot mesh the running pod: {e}",
                            self.node
                        );
                        self.event(view, &pod, false, "", "MeshFailed", note).await;
                    }
                }
            }
        }
    }

    async fn event(
        &self,
        view: &ClusterView,
        pod: &PodRef,
        ok: bool,
        done: &str,
        failed: &str,
        note: String,
    ) {
        let Some(object) = view.pod(pod) else {
            return;
        };
        let event = Event {
            type_: if ok {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: if ok { done } else { failed }.into(),
            note: Some(note),
            action: "Enrol".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &object.object_ref(&())).await {
            warn!(error = %e, "cannot publish an enrolment Event");
        }
    }
}
