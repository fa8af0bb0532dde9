//! The figures the plugin reads from a node proxy's Prometheus text (`/metrics` of its admin
//! port): what it is, what it applies, and whether it had to repair what it installed.

use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProxyFigures {
    pub version: Option<String>,
    pub profile: Option<String>,
    pub captured_pods: Option<u64>,
    pub config_generation: Option<i64>,
    /// Every drift repair since the proxy started, whatever it repaired.
    pub drift_repairs: u64,
}

/// The figures of one scrape; samples it does not know are skipped, and a missing one stays
/// `None`, so a proxy of another version is still shown.
pub fn parse(text: &str) -> ProxyFigures {
    let mut figures = ProxyFigures::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        match name {
            "aether_proxy_build_info" => {
                figures.version = label(labels, "version");
                figures.profile = label(labels, "profile");
            }
            "aether_proxy_captured_pods" => figures.captured_pods = Some(value as u64),
            "aether_proxy_config_generation" => figures.config_generation = Some(value as i64),
            "aether_proxy_drift_repairs_total" => figures.drift_repairs += value as u64,
            _ => {}
        }
    }
    figures
}

/// The value of label `name` in `a="x",b="y"` (aether's label values hold no quotes).
fn label(labels: &str, name: &str) -> Option<String> {
    labels.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"').to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_build_the_config_and_the_repairs() {
        let text = "# HELP aether_proxy_build_info Always 1\n\
            # TYPE aether_proxy_build_info gauge\n\
            aether_proxy_build_info{version=\"0.1.0\",profile=\"release\"} 1\n\
            aether_proxy_captured_pods 7\n\
            aether_proxy_config_generation 42\n\
            aether_proxy_drift_repairs_total{what=\"table\"} 2\n\
            aether_proxy_drift_repairs_total{what=\"listener\"} 1\n\
            aether_proxy_requests_total{direction=\"outbound\"} 9\n\
            garbage line\n";
        assert_eq!(
            parse(text),
            ProxyFigures {
                version: Some("0.1.0".into()),
                profile: Some("release".into()),
                captured_pods: Some(7),
                config_generation: Some(42),
                drift_repairs: 3,
            }
        );
    }

    #[test]
    fn an_older_proxy_leaves_what_it_lacks_unknown() {
        let figures = parse("aether_proxy_captured_pods 1\n");
        assert_eq!(figures.version, None);
        assert_eq!(figures.captured_pods, Some(1));
    }
}
