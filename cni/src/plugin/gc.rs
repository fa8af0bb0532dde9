use crate::cni_io::{CniError, ErrorCode, NetConf};
use crate::protocol::{Client, DEFAULT_TIMEOUT, Request, Response};

use super::note;
use super::proxy_down::proxy_error;
use super::settings::Settings;

/// GC: the proxy forgets every registration whose container the runtime no longer has. The
/// tables themselves went away with their pods' network namespaces.
///
/// With the proxy down, GC fails with "try again later": nothing was collected, and saying
/// otherwise would hide that. Runtimes log GC errors and run GC again later.
pub fn gc(conf: &NetConf<Settings>) -> Result<(), CniError> {
    let Some(valid) = &conf.valid_attachments else {
        return Err(CniError::new(
            ErrorCode::InvalidConfig,
            "GC without \"cni.dev/valid-attachments\"",
            "the runtime must list the attachments still in use; aether-cni will not guess and drop them all",
        ));
    };
    let mut ids: Vec<String> = valid.iter().map(|a| a.container_id.clone()).collect();
    ids.sort();
    ids.dedup();
    let client = Client::new(&conf.plugin.proxy_socket, DEFAULT_TIMEOUT);
    let collected = client.connect().and_then(|mut conn| {
        match conn.call(&Request::Gc {
            valid_container_ids: ids,
        })? {
            Response::Collected { removed } => Ok(removed),
            other => Err(conn.unexpected("gc", other)),
        }
    });
    match collected {
        Ok(removed) => {
            if !removed.is_empty() {
                note(&format!(
                    "GC: the proxy forgot containers {}",
                    removed.join(", ")
                ));
            }
            Ok(())
        }
        Err(proxy) => Err(proxy_error(
            &proxy,
            "no registrations of removed pods were dropped; the runtime runs GC again later",
        )),
    }
}
