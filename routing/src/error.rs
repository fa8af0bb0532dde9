//! Why a route's rules cannot be compiled. Each error maps to the Gateway API reason the
//! operator writes into the route's `Accepted` condition.

use aether_crds::conditions::reason;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("{0}")]
    Unsupported(String),
    #[error("rule {rule}: invalid regular expression {pattern:?}: {message}")]
    InvalidRegex {
        rule: usize,
        pattern: String,
        message: String,
    },
    #[error("rule {rule}: invalid header {what} {value:?}")]
    InvalidHeader {
        rule: usize,
        what: &'static str,
        value: String,
    },
    #[error("rule {rule}: the {filter} filter appears more than once")]
    DuplicateFilter { rule: usize, filter: &'static str },
    #[error("rule {rule}: a {filter} filter needs its {field} field")]
    MissingFilterConfig {
        rule: usize,
        filter: &'static str,
        field: &'static str,
    },
    #[error("rule {rule}: RequestRedirect and URLRewrite cannot be used together")]
    RedirectWithRewrite { rule: usize },
    #[error(
        "rule {rule}: ReplacePrefixMatch needs every match of the rule to be a PathPrefix match"
    )]
    PrefixReplaceWithoutPrefixMatch { rule: usize },
    #[error(
        "rule {rule}: the {filter} filter is not supported on a backendRef (only RequestHeaderModifier and ResponseHeaderModifier are)"
    )]
    UnsupportedBackendFilter { rule: usize, filter: &'static str },
    #[error("rule {rule}: {message}")]
    InvalidValue { rule: usize, message: String },
}

impl RuleError {
    /// The Gateway API `Accepted` reason for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            RuleError::DuplicateFilter { .. }
            | RuleError::RedirectWithRewrite { .. }
            | RuleError::PrefixReplaceWithoutPrefixMatch { .. } => reason::INCOMPATIBLE_FILTERS,
            _ => reason::UNSUPPORTED_VALUE,
        }
    }
}

/// A route table received from elsewhere (the per-node config) that cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("port {port}: invalid regular expression {pattern:?}: {message}")]
    InvalidRegex {
        port: u16,
        pattern: String,
        message: String,
    },
    #[error("port {port}: invalid header {what} {value:?}")]
    InvalidHeader {
        port: u16,
        what: &'static str,
        value: String,
    },
    #[error("port {port}: entry refers to rule {rule}, but the set has {rules} rules")]
    DanglingRule { port: u16, rule: u32, rules: usize },
    #[error("port {port}: invalid method {method:?}")]
    InvalidMethod { port: u16, method: String },
}
