//! One entry of a Gateway API route's `status.parents`, the same for HTTPRoute and GRPCRoute:
//! what aether writes, and what it reads of the entries already there.

use aether_core::lenient::Lenient;
use aether_core::names::CONTROLLER_NAME;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentReference,
    pub controller_name: String,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// An entry already in a route's status, read leniently: another controller's entry that
/// aether cannot read is kept as it is.
pub type ExistingParent = Lenient<RouteParentStatus>;

/// Reads a route's `status.parents` as the typed client holds them.
pub fn existing_parents<T: Serialize>(parents: &[T]) -> serde_json::Result<Vec<ExistingParent>> {
    serde_json::from_value(serde_json::to_value(parents)?)
}

/// Whether an existing entry is aether's own.
fn is_ours(entry: &ExistingParent) -> bool {
    match entry {
        Lenient::Valid(parent) => parent.controller_name == CONTROLLER_NAME,
        Lenient::Invalid { value, .. } => value["controllerName"] == CONTROLLER_NAME,
    }
}

/// Replaces aether's entries in an existing `status.parents`, keeping other controllers'
/// entries, and the transition times of conditions that did not change.
pub fn merge_parents(
    existing: &[ExistingParent],
    ours: &[RouteParentStatus],
) -> Vec<ExistingParent> {
    let mut merged: Vec<ExistingParent> =
        existing.iter().filter(|p| !is_ours(p)).cloned().collect();
    for entry in ours {
        let mut entry = entry.clone();
        let old = existing.iter().find_map(|p| match p {
            Lenient::Valid(old) if is_ours(p) && old.parent_ref == entry.parent_ref => Some(old),
            _ => None,
        });
        if let Some(old) = old {
            for condition in &mut entry.conditions {
                let same = (old.conditions.iter())
                    .find(|o| o.type_ == condition.type_ && o.status == condition.status);
                if let Some(same) = same {
                    condition.last_transition_time = same.last_transition_time.clone();
                }
            }
        }
        merged.push(Lenient::Valid(entry));
    }
    merged
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn entry(controller: &str, name: &str, status: &str, since: &str) -> serde_json::Value {
        json!({
            "parentRef": {"group": "", "kind": "Service", "name": name},
            "controllerName": controller,
            "conditions": [{"type": "Accepted", "status": status, "reason": "R", "message": "",
                            "lastTransitionTime": since}],
        })
    }

    #[test]
    fn replaces_only_aethers_entries_and_keeps_unchanged_transition_times() {
        let existing: Vec<ExistingParent> = serde_json::from_value(json!([
            entry("other.io/mesh", "echo", "True", "2026-01-01T00:00:00Z"),
            {"controllerName": "third.io/x", "parentRef": "not an object"},
            entry(CONTROLLER_NAME, "echo", "True", "2026-01-02T00:00:00Z"),
            entry(CONTROLLER_NAME, "gone", "True", "2026-01-02T00:00:00Z"),
        ]))
        .unwrap();
        assert!(existing[1].valid().is_err());
        let ours: Vec<RouteParentStatus> = serde_json::from_value(json!([
            entry(CONTROLLER_NAME, "echo", "True", "2026-12-06T00:00:00Z"),
            entry(CONTROLLER_NAME, "new", "False", "2026-12-06T00:00:00Z"),
        ]))
        .unwrap();
        let merged = serde_json::to_value(merge_parents(&existing, &ours)).unwrap();
        assert_eq!(
            merged,
            json!([
                entry("other.io/mesh", "echo", "True", "2026-01-01T00:00:00Z"),
                {"controllerName": "third.io/x", "parentRef": "not an object"},
                entry(CONTROLLER_NAME, "echo", "True", "2026-01-02T00:00:00Z"),
                entry(CONTROLLER_NAME, "new", "False", "2026-12-06T00:00:00Z"),
            ])
        );
    }
}
