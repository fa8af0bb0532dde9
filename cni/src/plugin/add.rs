use std::path::Path;

use serde_json::Value;

use crate::cni_io::{Attachment, CniError, ErrorCode, NetConf};
use crate::nft::{self, Families, Strict, TableSpec};
use crate::protocol::{Client, DEFAULT_TIMEOUT, Decision, PodRef, Request, Response};

use super::prev_result::pod_ips;
use super::proxy_down::{proxy_error, without_proxy};
use super::settings::Settings;
use super::{note, require_prev_result};

/// ADD: for a meshed pod, install the capture table and register the pod with the proxy.
/// Every other pod is passed through untouched. Returns the result to print: `prevResult`.
pub fn add(
    conf: &NetConf<Settings>,
    attachment: &Attachment,
    netns: &Path,
) -> Result<Value, CniError> {
    let prev = require_prev_result(conf)?;
    let Some(pod) = attachment.args.pod() else {
        note("no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS: not a Kubernetes pod, left alone");
        return Ok(prev.clone());
    };
    let ips = pod_ips(prev)?;
    let client = Client::new(&conf.plugin.proxy_socket, DEFAULT_TIMEOUT);
    let asked = client.connect().and_then(|mut conn| {
        let request = Request::Add {
            pod: pod.clone(),
            container_id: attachment.container_id.clone(),
            netns: netns.to_owned(),
            ips: ips.clone(),
        };
        match conn.call(&request)? {
            Response::Decision(decision) => Ok((conn, decision)),
            other => Err(conn.unexpected("add", other)),
        }
    });
    let (mut conn, plan) = match asked {
        Ok((_, Decision::Unmeshed { .. })) => return Ok(prev.clone()),
        Ok((conn, Decision::Meshed(plan))) => (conn, plan),
        Err(proxy) => {
            let reason = without_proxy(&conf.plugin, &pod, &proxy)?;
            note(&format!(
                "{proxy}; pod {pod} is not meshed ({reason}), so it starts without the proxy"
            ));
            return Ok(prev.clone());
        }
    };
    if plan.capture_port == 0 {
        return Err(CniError::new(
            ErrorCode::ProxyRefused,
            format!("aether node proxy gave pod {pod} capture port 0"),
            "the proxy's capture port setting is wrong; fix the DaemonSet's configuration",
        ));
    }
    let spec = TableSpec {
        capture_port: plan.capture_port,
        families: Families::for_pod(&ips),
        strict: plan.strict.map(|s| Strict {
            inbound_port: s.inbound_port,
            probe_ports: s.probe_ports,
            proxied_probe_ports: s.proxied_probe_ports,
        }),
    };
    let nft = conf.plugin.nft();
    if let Err(e) = nft::install(&nft, netns, &spec, &plan.targets) {
        return Err(CniError::new(
            ErrorCode::CaptureTable,
            format!("cannot install the capture table of pod {pod}"),
            format!("{e}{}", cleanup(&nft, netns, &pod)),
        ));
    }
    let registered = conn
        .call(&Request::Register {
            pod: pod.clone(),
            container_id: attachment.container_id.clone(),
            ifname: attachment.ifname.clone(),
            netns: netns.to_owned(),
            ips,
            generation: plan.generation,
        })
        .and_then(|response| match response {
            Response::Registered => Ok(()),
            other => Err(conn.unexpected("register", other)),
        });
    match registered {
        Ok(()) => Ok(prev.clone()),
        Err(proxy) => Err(proxy_error(
            &proxy,
            format!(
                "registering pod {pod} failed{}; the runtime will retry",
                cleanup(&nft, netns, &pod)
            ),
        )),
    }
}

/// Removes a table this ADD installed, so a failed ADD leaves nothing behind. Returns what to
/// add to the error message.
fn cleanup(nft: &nft::Nft, netns: &Path, pod: &PodRef) -> String {
    match nft::delete(nft, netns) {
        Ok(_) => String::from(" (nothing was left installed)"),
        Err(e) => format!(" (and removing pod {pod}'s capture table failed too: {e})"),
    }
}
