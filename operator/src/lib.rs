//! The aether operator: derives RouteTargets from GAMMA routes, computes their status,
//! the routes' status and the per-node config, compiles AuthorizationPolicies into it, and runs
//! the mesh certificate authority.

pub mod authz;
pub mod ca;
pub mod cache;
pub mod controller;
pub mod index;
pub mod leader;
pub mod metrics;
pub mod node_config;
pub mod status;
pub mod targets;
pub mod write;
