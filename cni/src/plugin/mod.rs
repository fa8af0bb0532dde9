//! The CNI commands. Each is a thin shell over the pure parts (config, decision, ruleset) and
//! the I/O parts (proxy client, `nft`, API server).

mod add;
mod check;
mod del;
mod gc;
mod prev_result;
mod proxy_down;
mod settings;
mod status;

pub use settings::Settings;

use serde_json::Value;

use crate::cni_io::{
    CniError, ErrorCode, Invocation, NetConf, declared_version, parse_config, version_reply,
};

/// Runs one invocation with `stdin` as its input. `Ok(Some(json))` is printed on stdout.
pub fn run(invocation: &Invocation, stdin: &[u8]) -> Result<Option<Value>, CniError> {
    match invocation {
        Invocation::Version => Ok(Some(version_reply(declared_version(stdin).as_deref()))),
        Invocation::Add { attachment, netns } => {
            add::add(&parse_config(stdin)?, attachment, netns).map(Some)
        }
        Invocation::Del { attachment, netns } => {
            del::del(&parse_config(stdin)?, attachment, netns.as_deref()).map(|()| None)
        }
        Invocation::Check { attachment, netns } => {
            check::check(&parse_config(stdin)?, attachment, netns).map(|()| None)
        }
        Invocation::Status => {
            let conf = parse_config(stdin)?;
            require_1_1(&conf, "STATUS")?;
            status::status(&conf).map(|()| None)
        }
        Invocation::Gc => {
            let conf = parse_config(stdin)?;
            require_1_1(&conf, "GC")?;
            gc::gc(&conf).map(|()| None)
        }
    }
}

/// STATUS and GC exist from spec 1.1.0 on, and 1.1.0 is the newest version we support.
fn require_1_1(conf: &NetConf<Settings>, command: &str) -> Result<(), CniError> {
    if conf.cni_version == "1.1.0" {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            format!(
                "config version {} does not allow {command}",
                conf.cni_version
            ),
            format!("{command} was added in CNI spec 1.1.0"),
        ))
    }
}

fn require_prev_result(conf: &NetConf<Settings>) -> Result<&Value, CniError> {
    conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidConfig,
            "aether-cni got no prevResult",
            "it is a chained plugin: list it after the primary network plugin in the \"plugins\" of the network config list",
        )
    })
}

/// A line for the runtime's log: plugins' stderr ends up there.
fn note(message: &str) {
    eprintln!("aether-cni: {message}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni_io::{RawEnv, parse_env};

    fn invocation(command: &str) -> Invocation {
        parse_env(&RawEnv {
            command: Some(command.into()),
            container_id: Some("c1".into()),
            netns: Some("/var/run/netns/none".into()),
            ifname: Some("eth0".into()),
            args: None,
        })
        .unwrap()
    }

    #[test]
    fn version_needs_no_valid_config() {
        let reply = run(&Invocation::Version, b"").unwrap().unwrap();
        assert_eq!(
            reply["supportedVersions"],
            serde_json::json!(["0.4.0", "1.0.0", "1.1.0"])
        );
    }

    #[test]
    fn status_and_gc_need_a_1_1_config() {
        for command in ["STATUS", "GC"] {
            let err = run(
                &invocation(command),
                br#"{"cniVersion":"1.0.0","name":"k8s","type":"aether-cni"}"#,
            )
            .unwrap_err();
            assert_eq!(err.code, ErrorCode::IncompatibleVersion, "{command}");
        }
    }

    #[test]
    fn add_without_prev_result_is_invalid_config() {
        let err = run(
            &invocation("ADD"),
            br#"{"cniVersion":"1.0.0","name":"k8s","type":"aether-cni"}"#,
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidConfig);
        assert!(err.details.contains("chained plugin"), "{err}");
    }

    #[test]
    fn add_for_a_non_kubernetes_container_passes_prev_result_through() {
        let prev = serde_json::json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]});
        let stdin = serde_json::json!({
            "cniVersion": "1.0.0", "name": "k8s", "type": "aether-cni",
            "proxySocket": "/nonexistent.sock", "prevResult": prev
        });
        let out = run(&invocation("ADD"), stdin.to_string().as_bytes()).unwrap();
        assert_eq!(out, Some(prev));
    }

    #[test]
    fn gc_without_valid_attachments_is_refused() {
        let err = run(
            &invocation("GC"),
            br#"{"cniVersion":"1.1.0","name":"k8s","type":"aether-cni"}"#,
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidConfig);
    }
}
