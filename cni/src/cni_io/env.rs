use std::path::PathBuf;

use super::args::{CniArgs, parse_cni_args};
use super::error::{CniError, ErrorCode};

/// The `CNI_*` environment variables as the runtime set them; `None` when unset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawEnv {
    pub command: Option<String>,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: Option<String>,
}

impl RawEnv {
    pub fn from_process() -> Self {
        let var = |name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        RawEnv {
            command: var("CNI_COMMAND"),
            container_id: var("CNI_CONTAINERID"),
            netns: var("CNI_NETNS"),
            ifname: var("CNI_IFNAME"),
            args: var("CNI_ARGS"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

/// One attachment of a container to the network: what ADD, DEL and CHECK act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
    pub args: CniArgs,
}

/// A checked invocation: every variable its command requires is present and well formed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invocation {
    Add {
        attachment: Attachment,
        netns: PathBuf,
    },
    Check {
        attachment: Attachment,
        netns: PathBuf,
    },
    /// The spec lets DEL come without a netns (the runtime may have lost it already).
    Del {
        attachment: Attachment,
        netns: Option<PathBuf>,
    },
    Version,
    Status,
    Gc,
}

impl Invocation {
    pub fn command(&self) -> Command {
        match self {
            Invocation::Add { .. } => Command::Add,
            Invocation::Check { .. } => Command::Check,
            Invocation::Del { .. } => Command::Del,
            Invocation::Version => Command::Version,
            Invocation::Status => Command::Status,
            Invocation::Gc => Command::Gc,
        }
    }
}

pub fn parse_env(env: &RawEnv) -> Result<Invocation, CniError> {
    let command = match env.command.as_deref() {
        None | Some("") => {
            return Err(invalid(
                "CNI_COMMAND is not set",
                "aether-cni is run by the container runtime as a CNI plugin; to put it on a node, run `aether-cni install`",
            ));
        }
        Some("ADD") => Command::Add,
        Some("DEL") => Command::Del,
        Some("CHECK") => Command::Check,
        Some("VERSION") => Command::Version,
        Some("STATUS") => Command::Status,
        Some("GC") => Command::Gc,
        Some(other) => {
            return Err(invalid(
                format!("CNI_COMMAND {other:?} is not a CNI command"),
                "it must be one of ADD, DEL, CHECK, VERSION, STATUS, GC",
            ));
        }
    };
    Ok(match command {
        Command::Version => Invocation::Version,
        Command::Status => Invocation::Status,
        Command::Gc => Invocation::Gc,
        Command::Add => Invocation::Add {
            attachment: attachment(env)?,
            netns: required_netns(env)?,
        },
        Command::Check => Invocation::Check {
            attachment: attachment(env)?,
            netns: required_netns(env)?,
        },
        Command::Del => Invocation::Del {
            attachment: attachment(env)?,
            netns: match env.netns.as_deref() {
                None | Some("") => None,
                Some(_) => Some(required_netns(env)?),
            },
        },
    })
}

fn attachment(env: &RawEnv) -> Result<Attachment, CniError> {
    let container_id = required(&env.container_id, "CNI_CONTAINERID")?;
    if !valid_container_id(container_id) {
        return Err(invalid(
            format!("CNI_CONTAINERID {container_id:?} is not a valid container id"),
            "it must start with a letter or digit and contain only letters, digits, '_', '.' and '-'",
        ));
    }
    let ifname = required(&env.ifname, "CNI_IFNAME")?;
    if !valid_ifname(ifname) {
        return Err(invalid(
            format!("CNI_IFNAME {ifname:?} is not a valid interface name"),
            "it must be 1 to 15 bytes, not '.' or '..', without '/', ':' or whitespace",
        ));
    }
    Ok(Attachment {
        container_id: container_id.to_owned(),
        ifname: ifname.to_owned(),
        args: parse_cni_args(env.args.as_deref().unwrap_or(""))?,
    })
}

fn required_netns(env: &RawEnv) -> Result<PathBuf, CniError> {
    let netns = required(&env.netns, "CNI_NETNS")?;
    if !netns.starts_with('/') {
        return Err(invalid(
            format!("CNI_NETNS {netns:?} is not an absolute path"),
            "it must be the path of the container's network namespace, e.g. /var/run/netns/cni-…",
        ));
    }
    Ok(PathBuf::from(netns))
}

fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, CniError> {
    match value.as_deref() {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(invalid(
            format!("{name} is not set"),
            "the container runtime must set it for this command (CNI spec, section \"Parameters\")",
        )),
    }
}

fn invalid(msg: impl Into<String>, details: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::InvalidEnv, msg, details)
}

/// The spec's rule: alphanumeric first, then alphanumerics, '_', '.', '-'. Upper case is allowed.
fn valid_container_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Linux's rule for interface names (IFNAMSIZ is 16 with the terminating NUL).
fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(command: &str) -> RawEnv {
        RawEnv {
            command: Some(command.into()),
            container_id: Some("ABC123def".into()),
            netns: Some("/var/run/netns/cni-1".into()),
            ifname: Some("eth0".into()),
            args: Some("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p".into()),
        }
    }

    #[test]
    fn add_with_upper_case_container_id_parses() {
        let Invocation::Add { attachment, netns } = parse_env(&env("ADD")).unwrap() else {
            panic!("not an ADD");
        };
        assert_eq!(attachment.container_id, "ABC123def");
        assert_eq!(attachment.ifname, "eth0");
        assert_eq!(netns, PathBuf::from("/var/run/netns/cni-1"));
        assert_eq!(attachment.args.pod().unwrap().name, "p");
    }

    #[test]
    fn every_command_is_recognised() {
        for (name, command) in [
            ("ADD", Command::Add),
            ("DEL", Command::Del),
            ("CHECK", Command::Check),
            ("VERSION", Command::Version),
            ("STATUS", Command::Status),
            ("GC", Command::Gc),
        ] {
            assert_eq!(parse_env(&env(name)).unwrap().command(), command);
        }
    }

    #[test]
    fn version_status_and_gc_need_only_the_command() {
        for name in ["VERSION", "STATUS", "GC"] {
            let raw = RawEnv {
                command: Some(name.into()),
                ..RawEnv::default()
            };
            assert!(parse_env(&raw).is_ok(), "{name}");
        }
    }

    #[test]
    fn missing_or_unknown_command_is_invalid_env() {
        for command in [None, Some(""), Some("add"), Some("UPDATE")] {
            let raw = RawEnv {
                command: command.map(str::to_owned),
                ..env("ADD")
            };
            assert_eq!(parse_env(&raw).unwrap_err().code, ErrorCode::InvalidEnv);
        }
    }

    #[test]
    fn add_and_check_need_netns_del_does_not() {
        for name in ["ADD", "CHECK"] {
            let raw = RawEnv {
                netns: None,
                ..env(name)
            };
            let err = parse_env(&raw).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidEnv);
            assert!(err.msg.contains("CNI_NETNS"), "{err}");
        }
        let raw = RawEnv {
            netns: Some(String::new()),
            ..env("DEL")
        };
        assert!(matches!(
            parse_env(&raw).unwrap(),
            Invocation::Del { netns: None, .. }
        ));
    }

    #[test]
    fn relative_netns_is_rejected() {
        let raw = RawEnv {
            netns: Some("netns/x".into()),
            ..env("ADD")
        };
        assert!(parse_env(&raw).unwrap_err().msg.contains("absolute"));
    }

    #[test]
    fn bad_container_ids_are_rejected() {
        for id in ["", "-abc", "a b", "a/b", "é"] {
            let raw = RawEnv {
                container_id: Some(id.into()),
                ..env("DEL")
            };
            assert_eq!(
                parse_env(&raw).unwrap_err().code,
                ErrorCode::InvalidEnv,
                "{id:?}"
            );
        }
        for id in ["a", "0_.-x", "ABC"] {
            assert!(valid_container_id(id), "{id}");
        }
    }

    #[test]
    fn bad_interface_names_are_rejected() {
        for name in ["", ".", "..", "eth/0", "eth:0", "eth 0", "sixteen-chars-xx"] {
            assert!(!valid_ifname(name), "{name:?}");
        }
        assert!(valid_ifname("fifteen-chars-x"));
    }

    #[test]
    fn missing_ifname_is_reported_by_name() {
        let raw = RawEnv {
            ifname: None,
            ..env("ADD")
        };
        assert!(parse_env(&raw).unwrap_err().msg.contains("CNI_IFNAME"));
    }

    #[test]
    fn malformed_cni_args_are_invalid_env() {
        let raw = RawEnv {
            args: Some("nonsense".into()),
            ..env("ADD")
        };
        assert_eq!(parse_env(&raw).unwrap_err().code, ErrorCode::InvalidEnv);
    }
}
