use std::path::Path;

use crate::cni_io::{Attachment, CniError, ErrorCode, NetConf};
use crate::nft::{self, NftError};
use crate::protocol::{Client, DEFAULT_TIMEOUT, Request, Response};

use super::note;
use super::proxy_down::{is_absent, proxy_error};
use super::settings::Settings;

/// DEL: remove the table and the proxy's registration. Idempotent; succeeds when the netns is
/// gone or nothing was installed.
///
/// A proxy that is down does not fail DEL: failing would leave pods stuck terminating for as
/// long as the proxy is down. The proxy forgets the registration at the next GC instead.
pub fn del(
    conf: &NetConf<Settings>,
    attachment: &Attachment,
    netns: Option<&Path>,
) -> Result<(), CniError> {
    if let Some(netns) = netns {
        match nft::delete(&conf.plugin.nft(), netns) {
            Ok(_) => {}
            // Without an nft program nothing can have been installed with it.
            Err(e @ NftError::Spawn { .. }) => note(&format!("{e}; no capture table to remove")),
            Err(e) => {
                return Err(CniError::new(
                    ErrorCode::CaptureTable,
                    format!(
                        "cannot remove the capture table of container {}",
                        attachment.container_id
                    ),
                    e.to_string(),
                ));
            }
        }
    }
    let client = Client::new(&conf.plugin.proxy_socket, DEFAULT_TIMEOUT);
    let unregistered = client.connect().and_then(|mut conn| {
        let request = Request::Unregister {
            container_id: attachment.container_id.clone(),
            ifname: attachment.ifname.clone(),
        };
        match conn.call(&request)? {
            Response::Unregistered { .. } => Ok(()),
            other => Err(conn.unexpected("unregister", other)),
        }
    });
    match unregistered {
        Ok(()) => Ok(()),
        Err(proxy) if is_absent(&proxy) => {
            note(&format!(
                "{proxy}; container {} is unregistered at the proxy's next GC",
                attachment.container_id
            ));
            Ok(())
        }
        Err(proxy) => Err(proxy_error(&proxy, "the runtime will retry DEL")),
    }
}
