use std::path::Path;

use crate::cni_io::{Attachment, CniError, ErrorCode, NetConf};
use crate::nft::{self, Families, Strict, TableSpec};
use crate::protocol::{CheckStatus, Client, DEFAULT_TIMEOUT, Request, Response};

use super::prev_result::pod_ips;
use super::proxy_down::without_proxy;
use super::require_prev_result;
use super::settings::Settings;

/// CHECK: a meshed pod must be registered with the proxy and have its table exactly as ADD
/// installed it. Every difference is reported.
pub fn check(
    conf: &NetConf<Settings>,
    attachment: &Attachment,
    netns: &Path,
) -> Result<(), CniError> {
    let prev = require_prev_result(conf)?;
    let Some(pod) = attachment.args.pod() else {
        return Ok(());
    };
    let ips = pod_ips(prev)?;
    let client = Client::new(&conf.plugin.proxy_socket, DEFAULT_TIMEOUT);
    let asked = client.connect().and_then(|mut conn| {
        let request = Request::Check {
            pod: pod.clone(),
            container_id: attachment.container_id.clone(),
        };
        match conn.call(&request)? {
            Response::Checked(status) => Ok(status),
            other => Err(conn.unexpected("check", other)),
        }
    });
    let (registered, capture_port, strict_inbound_port) = match asked {
        Ok(CheckStatus::Unmeshed { .. }) => return Ok(()),
        Ok(CheckStatus::Meshed {
            registered,
            capture_port,
            strict_inbound_port,
        }) => (registered, capture_port, strict_inbound_port),
        Err(proxy) => return without_proxy(&conf.plugin, &pod, &proxy).map(drop),
    };
    // The probe ports are set elements, which CHECK does not compare.
    let spec = TableSpec {
        capture_port,
        families: Families::for_pod(&ips),
        strict: strict_inbound_port.map(|inbound_port| Strict {
            inbound_port,
            probe_ports: Vec::new(),
            proxied_probe_ports: Vec::new(),
        }),
    };
    let drift = nft::verify(&conf.plugin.nft(), netns, &spec).map_err(|e| {
        CniError::new(
            ErrorCode::CaptureTable,
            format!("cannot read the capture table of pod {pod}"),
            e.to_string(),
        )
    })?;
    let mut problems: Vec<String> = drift.iter().map(ToString::to_string).collect();
    if !registered {
        problems.push("the aether node proxy has no registration for it".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::CaptureDrift,
            format!("the capture of pod {pod} is not as installed"),
            format!(
                "{}; the aether node proxy repairs drift on its periodic check, or delete the pod to recreate it",
                problems.join("; ")
            ),
        ))
    }
}
