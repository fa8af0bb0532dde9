//! `kubectl aether status`: one row per node, from [`Facts`].

use serde::Serialize;

use crate::facts::Facts;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeRow {
    pub node: String,
    pub proxy: String,
    pub version: String,
    /// `applied/current` NodeConfig generations.
    pub config: String,
    pub captured_pods: String,
    pub drift_repairs: String,
}

pub const HEADERS: [&str; 6] = [
    "NODE",
    "PROXY",
    "VERSION",
    "CONFIG (APPLIED/CURRENT)",
    "CAPTURED PODS",
    "DRIFT REPAIRS",
];

pub fn rows(facts: &Facts) -> Vec<NodeRow> {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    facts
        .nodes
        .iter()
        .map(|node| {
            let figures = node.figures.as_ref();
            let proxy = match (&node.proxy_pod, node.proxy_ready) {
                (None, _) => "none".to_owned(),
                (Some(pod), true) => format!("{pod} (Ready)"),
                (Some(pod), false) => format!("{pod} (not Ready)"),
            };
            let version = figures.and_then(|f| {
                f.version
                    .as_ref()
                    .map(|v| format!("{v} {}", f.profile.as_deref().unwrap_or_default()))
            });
            NodeRow {
                node: node.name.clone(),
                proxy,
                version: or_dash(version.map(|v| v.trim().to_owned())),
                config: format!(
                    "{}/{}",
                    or_dash(node.applied_generation.map(|g| g.to_string())),
                    or_dash(node.config_generation.map(|g| g.to_string()))
                ),
                captured_pods: or_dash(
                    figures.and_then(|f| f.captured_pods).map(|c| c.to_string()),
                ),
                drift_repairs: or_dash(figures.map(|f| f.drift_repairs.to_string())),
            }
        })
        .collect()
}

impl NodeRow {
    pub fn cells(&self) -> Vec<String> {
        vec![
            self.node.clone(),
            self.proxy.clone(),
            self.version.clone(),
            self.config.clone(),
            self.captured_pods.clone(),
            self.drift_repairs.clone(),
        ]
    }
}

/// Left-aligned columns, two spaces apart, as `kubectl get` prints them.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::NodeFacts;
    use crate::metrics::ProxyFigures;

    #[test]
    fn a_node_without_a_readable_proxy_shows_dashes() {
        let facts = Facts {
            nodes: vec![
                NodeFacts {
                    name: "n1".into(),
                    ready: true,
                    proxy_pod: Some("aether-proxy-a".into()),
                    proxy_ready: true,
                    config_generation: Some(5),
                    applied_generation: Some(5),
                    figures: Some(ProxyFigures {
                        version: Some("0.1.0".into()),
                        profile: Some("release".into()),
                        captured_pods: Some(3),
                        config_generation: Some(5),
                        drift_repairs: 0,
                    }),
                    scrape_error: None,
                },
                NodeFacts {
                    name: "n2".into(),
                    ready: true,
                    proxy_pod: None,
                    proxy_ready: false,
                    config_generation: Some(5),
                    applied_generation: None,
                    figures: None,
                    scrape_error: Some("no proxy pod".into()),
                },
            ],
            ..Facts::default()
        };
        let rows: Vec<Vec<String>> = rows(&facts).iter().map(NodeRow::cells).collect();
        assert_eq!(
            table(&HEADERS, &rows),
            "NODE  PROXY                   VERSION        CONFIG (APPLIED/CURRENT)  CAPTURED PODS  DRIFT REPAIRS\n\
             n1    aether-proxy-a (Ready)  0.1.0 release  5/5                       3              0\n\
             n2    none                    -              -/5                       -              -\n"
        );
    }
}
