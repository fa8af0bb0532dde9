//! The GAMMA route engine, shared by the operator and the proxy. Pure functions, no I/O:
//!
//! - [`compile()`] turns the routes attached to a Service (HTTPRoute, GRPCRoute, a
//!   RouteTarget's inline rules) into its [`RouteTable`], ordered by the Gateway API
//!   precedence rules, and says which parentRefs are accepted and which references resolve;
//! - [`Router`] loads a table and decides, per request, the rule, the backend (by weight),
//!   and the filters to apply;
//! - [`PortProtocol`] says which Service ports are HTTP at all.

#![forbid(unsafe_code)]

mod compile;
mod error;
pub mod filters;
pub mod fuzzing;
mod gateway;
pub mod protocol;
mod request;
pub mod retry;
mod router;
mod rules;
mod source;
/// The compiled table is plain data, defined in `aether_core` so the per-node config carries it
/// typed.
pub use aether_core::route_table as table;

pub use compile::{Compiled, ParentOutcome, RouteOutcome, Verdict, compile, service_verdict};
pub use error::{RuleError, TableError};
pub use protocol::{PortProtocol, Sniffed, sniff};
pub use request::RequestView;
pub use router::{Forward, Outcome, Router, RuleSetRouter};
pub use rules::request_matches;
pub use source::{
    GrpcHeaderMatch, GrpcMatch, GrpcRule, ParentRef, RouteRules, RouteSource, ServiceInfo,
    ServiceKind, ServiceLookup, ServicePort,
};
pub use table::RouteTable;
