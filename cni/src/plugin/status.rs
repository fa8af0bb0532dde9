use crate::cni_io::{CniError, ErrorCode, NetConf};
use crate::protocol::{Client, DEFAULT_TIMEOUT, Request, Response};

use super::note;
use super::settings::Settings;

/// STATUS: ready unless no ADD at all could succeed, i.e. the proxy is unreachable and there is
/// no kubeconfig to let unmeshed pods start without it.
///
/// A failed STATUS marks the node's network not ready (and, if it lasts, evicts its pods), so
/// a proxy outage alone must not fail it when unmeshed pods can still start.
pub fn status(conf: &NetConf<Settings>) -> Result<(), CniError> {
    let client = Client::new(&conf.plugin.proxy_socket, DEFAULT_TIMEOUT);
    let pinged = client
        .connect()
        .and_then(|mut conn| match conn.call(&Request::Ping)? {
            Response::Pong => Ok(()),
            other => Err(conn.unexpected("ping", other)),
        });
    match (pinged, &conf.plugin.kubeconfig) {
        (Ok(()), _) => Ok(()),
        (Err(proxy), Some(_)) => {
            note(&format!(
                "{proxy}; meshed pods cannot start until it is back, others can"
            ));
            Ok(())
        }
        (Err(proxy), None) => Err(CniError::new(
            ErrorCode::NotAvailable,
            format!("aether-cni cannot set up any pod: {proxy}"),
            "is the aether DaemonSet running on this node? With \"kubeconfig\" in the plugin config, unmeshed pods could start without it",
        )),
    }
}
