//! The Helm chart, rendered without a cluster: `helm lint` is clean, the values schema
//! refuses bad values with helm's message, and the rendered objects are what the mesh
//! needs (the node proxy on every node's network, the CNI installer, a highly available
//! operator, least-privilege RBAC, everything in the release namespace).

use std::process::{Command, Output};

use aether_e2e::Paths;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// Not `aether-system`, so a hard-coded namespace anywhere in the chart shows.
const NAMESPACE: &str = "mesh-test";

fn helm(args: &[&str]) -> Result<Output> {
    let paths = Paths::from_env();
    Command::new(paths.helm())
        .args(args)
        .output()
        .with_context(|| format!("running {}", paths.helm().display()))
}

/// `helm template` of the chart with `--set` values; fails with helm's message.
fn render(sets: &[&str]) -> Result<Vec<Value>> {
    let chart = Paths::from_env().chart();
    let mut args = vec![
        "template",
        "aether",
        chart.to_str().context("chart path")?,
        "--namespace",
        NAMESPACE,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    let output = helm(&args)?;
    if !output.status.success() {
        bail!("{}", String::from_utf8_lossy(&output.stderr));
    }
    let objects: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(output.stdout)?)?;
    Ok(objects.into_iter().filter(|o| !o.is_null()).collect())
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name} rendered"))
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn container<'a>(pod_spec: &'a Value, list: &str, name: &str) -> Result<&'a Value> {
    pod_spec[list]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .with_context(|| format!("no {list} entry {name}"))
}

/// Whether a pod with these tolerations may run on a node with the taint `key:effect`
/// (without a value), by the scheduler's matching rules.
fn tolerates(tolerations: &Value, key: &str, effect: &str) -> bool {
    tolerations.as_array().into_iter().flatten().any(|t| {
        let exists = t["operator"] == "Exists";
        let key_matches = match t["key"].as_str().unwrap_or_default() {
            "" => exists,
            k => k == key && (exists || t["value"].as_str().unwrap_or_default().is_empty()),
        };
        let effect_matches =
            matches!(t["effect"].as_str(), None | Some("")) || t["effect"] == effect;
        key_matches && effect_matches
    })
}

fn helm_error(sets: &[&str]) -> Result<String> {
    match render(sets) {
        Ok(_) => bail!("helm accepted {sets:?}"),
        Err(e) => Ok(e.to_string()),
    }
}

#[test]
fn helm_lint_is_clean() -> Result<()> {
    let chart = Paths::from_env().chart();
    let chart = chart.to_str().context("chart path")?;
    for extra in [&[][..], &["--set", "ca.existingSecret=mesh-root"]] {
        let mut args = vec!["lint", "--strict", chart, "--namespace", NAMESPACE];
        args.extend(extra);
        let output = helm(&args)?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "helm lint {extra:?} failed:\n{text}"
        );
        assert!(
            !text.contains("[WARNING]") && !text.contains("[ERROR]"),
            "helm lint {extra:?} is not clean:\n{text}"
        );
    }
    Ok(())
}

#[test]
fn the_schema_refuses_bad_values_with_a_clear_message() -> Result<()> {
    // A good override passes, so the refusals below are the schema's doing.
    render(&["operator.replicas=3", "ca.existingSecret=mesh-root"])?;
    for (set, message) in [
        (
            "operator.replicas=two",
            "at '/operator/replicas': got string, want integer",
        ),
        (
            "operator.replica=3",
            "at '/operator': additional properties 'replica' not allowed",
        ),
        (
            "trustDomains=x",
            "additional properties 'trustDomains' not allowed",
        ),
        ("proxy.ports.admin=70000", "at '/proxy/ports/admin'"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        (
            "image.registry=registry.example.com/",
            "at '/image/registry'",
        ),
        ("ca.existingSecret=Not_A_Name", "at '/ca/existingSecret'"),
    ] {
        let error = helm_error(&[set])?;
        assert!(
            error.contains("values don't meet the specifications of the schema")
                && error.contains(message),
            "--set {set}: expected {message:?} in:\n{error}"
        );
    }
    Ok(())
}

#[test]
fn every_image_comes_from_the_registry_value() -> Result<()> {
    let objects = render(&[
        "image.registry=registry.example.com:5000/mesh",
        "image.tag=0.1.0-rc1",
        "image.pullPolicy=Always",
    ])?;
    let proxy = &find(&objects, "DaemonSet", "aether-proxy")?["spec"]["template"]["spec"];
    let operator = &find(&objects, "Deployment", "aether-operator")?["spec"]["template"]["spec"];
    for (image, want) in [
        (container(proxy, "initContainers", "install-cni")?, "cni"),
        (container(proxy, "containers", "proxy")?, "proxy"),
        (container(proxy, "containers", "holder")?, "proxy"),
        (container(operator, "containers", "operator")?, "operator"),
    ] {
        assert_eq!(
            image["image"],
            format!("registry.example.com:5000/mesh/{want}:0.1.0-rc1")
        );
        assert_eq!(image["imagePullPolicy"], "Always");
    }
    Ok(())
}

#[test]
fn the_proxy_runs_on_every_node_on_the_node_network() -> Result<()> {
    let objects = render(&[])?;
    let daemonset = find(&objects, "DaemonSet", "aether-proxy")?;
    assert_eq!(daemonset["metadata"]["namespace"], NAMESPACE);
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(pod["serviceAccountName"], "aether-proxy");
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    for (key, effect) in [
        ("aether.io/agent-not-ready", "NoSchedule"),
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node-role.kubernetes.io/control-plane", "NoSchedule"),
    ] {
        assert!(
            tolerates(&pod["tolerations"], key, effect),
            "{key}:{effect} not tolerated: {}",
            pod["tolerations"]
        );
    }
    // Narrowing the tolerations never loses the one the proxy exists to clear.
    let narrowed = render(&["proxy.tolerations=null"])?;
    let pod = &find(&narrowed, "DaemonSet", "aether-proxy")?["spec"]["template"]["spec"];
    assert!(tolerates(
        &pod["tolerations"],
        "aether.io/agent-not-ready",
        "NoSchedule"
    ));
    assert!(!tolerates(
        &pod["tolerations"],
        "node-role.kubernetes.io/control-plane",
        "NoSchedule"
    ));
    Ok(())
}

#[test]
fn the_init_container_chains_aether_cni_into_the_node_config() -> Result<()> {
    let objects = render(&[])?;
    let pod = &find(&objects, "DaemonSet", "aether-proxy")?["spec"]["template"]["spec"];
    let install = container(pod, "initContainers", "install-cni")?;
    assert_eq!(install["image"], "localhost/aether/cni:0.1.0");
    let argv: Vec<&str> = strings(&install["command"])
        .into_iter()
        .chain(strings(&install["args"]))
        .collect();
    assert_eq!(
        argv,
        [
            "aether-cni",
            "install",
            "--cni-bin-dir=/opt/cni/bin",
            "--cni-conf-dir=/etc/cni/net.d",
            "--proxy-socket=/var/run/aether/cni.sock",
            "--kubeconfig=/etc/cni/net.d/aether-cni.kubeconfig",
        ]
    );
    // Other CNI directories on the node: mounted where the installer and the proxy look,
    // and the plugin's own config names the node's path.
    let objects = render(&[
        "cni.binDir=/home/kubernetes/bin",
        "cni.confDir=/etc/k3s/cni",
    ])?;
    let pod = &find(&objects, "DaemonSet", "aether-proxy")?["spec"]["template"]["spec"];
    let install = container(pod, "initContainers", "install-cni")?;
    let mounted: Vec<(&str, &str)> = install["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|mount| {
            let volume = pod["volumes"]
                .as_array()?
                .iter()
                .find(|v| v["name"] == mount["name"])?;
            Some((
                volume["hostPath"]["path"].as_str()?,
                mount["mountPath"].as_str()?,
            ))
        })
        .collect();
    assert_eq!(
        mounted,
        [
            ("/home/kubernetes/bin", "/opt/cni/bin"),
            ("/etc/k3s/cni", "/etc/cni/net.d")
        ]
    );
    assert!(
        strings(&install["args"]).contains(&"--kubeconfig=/etc/k3s/cni/aether-cni.kubeconfig"),
        "{}",
        install["args"]
    );
    Ok(())
}

#[test]
fn the_proxy_gets_the_agreed_command_line_token_and_probes() -> Result<()> {
    let objects = render(&[])?;
    let daemonset = find(&objects, "DaemonSet", "aether-proxy")?;
    let pod = &daemonset["spec"]["template"]["spec"];
    let proxy = container(pod, "containers", "proxy")?;
    assert_eq!(proxy["image"], "localhost/aether/proxy:0.1.0");
    let argv: Vec<&str> = strings(&proxy["command"])
        .into_iter()
        .chain(strings(&proxy["args"]))
        .collect();
    let expected = "aether-proxy run --node $(NODE_NAME) --cni-socket /var/run/aether/cni.sock \
        --state-dir /var/lib/aether/proxy --capture-port 15001 --inbound-port 15008 \
        --admin-addr $(HOST_IP):15020 --holder-socket /var/run/aether-holder/holder.sock \
        --svid-dir /var/run/aether-holder/svids --namespace mesh-test --daemonset aether-proxy \
        --uninstall-marker aether-uninstalling --trust-domain cluster.local --ca-address aether-operator.mesh-test.svc:8443 \
        --token-file /var/run/secrets/aether/token --worker-threads 1";
    assert_eq!(argv.join(" "), expected);
    assert!(
        proxy["env"].as_array().into_iter().flatten().any(|e| e
            == &json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})),
        "NODE_NAME: {}",
        proxy["env"]
    );
    assert!(
        proxy["env"].as_array().into_iter().flatten().any(|e| e
            == &json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})),
        "POD_NAME: {}",
        proxy["env"]
    );
    assert!(
        proxy["env"].as_array().into_iter().flatten().any(|e| e
            == &json!({"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}})),
        "HOST_IP: {}",
        proxy["env"]
    );
    // The proxies' one signal of an uninstall: made by `helm uninstall` before anything goes.
    let marker = find(&objects, "ConfigMap", "aether-uninstalling")?;
    assert_eq!(
        marker["metadata"]["annotations"]["helm.sh/hook"],
        "pre-delete"
    );
    assert_eq!(
        proxy["securityContext"],
        json!({"runAsUser": 0, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_ADMIN"]}})
    );
    // The holder shares the proxy's sockets through its pod's own memory, and nothing else.
    let holder = container(pod, "containers", "holder")?;
    assert_eq!(
        strings(&holder["args"]),
        ["hold", "--socket", "/var/run/aether-holder/holder.sock"]
    );
    assert_eq!(
        holder["securityContext"],
        json!({"runAsUser": 0, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]}})
    );
    assert_eq!(
        holder["volumeMounts"],
        json!([{"name": "holder", "mountPath": "/var/run/aether-holder"}])
    );
    let install = container(pod, "initContainers", "install-cni")?;
    assert_eq!(
        install["securityContext"],
        json!({"runAsUser": 0, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]}})
    );
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    // The new proxy of a node starts beside the old one, and takes its sockets over: no
    // host port may stand in its way.
    assert!(proxy["ports"].is_null(), "ports: {}", proxy["ports"]);
    assert_eq!(
        daemonset["spec"]["updateStrategy"]["rollingUpdate"],
        json!({"maxSurge": 1, "maxUnavailable": 0})
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(proxy[probe]["httpGet"]["path"], path);
        assert_eq!(proxy[probe]["httpGet"]["port"], 15020);
    }

    let token = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "aether-token")
        .context("no token volume")?;
    assert_eq!(
        token["projected"]["sources"],
        json!([{"serviceAccountToken": {"audience": "aether", "expirationSeconds": 3600, "path": "token"}}])
    );
    let mounts: Vec<&str> = proxy["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    for path in [
        "/etc/cni/net.d",
        "/opt/cni/bin",
        "/var/run/aether",
        "/var/lib/aether",
        "/var/run/netns",
        "/var/run/secrets/aether",
    ] {
        assert!(mounts.contains(&path), "{path} not mounted: {mounts:?}");
    }
    Ok(())
}

#[test]
fn the_operator_is_highly_available() -> Result<()> {
    let objects = render(&[])?;
    let deployment = find(&objects, "Deployment", "aether-operator")?;
    assert_eq!(deployment["spec"]["replicas"], 2);
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "aether-operator");
    let anti = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0]["podAffinityTerm"];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");

    let operator = container(pod, "containers", "operator")?;
    assert_eq!(operator["image"], "localhost/aether/operator:0.1.0");
    let args = strings(&operator["args"]);
    for arg in [
        "--trust-domain=cluster.local",
        "--cluster-domain=cluster.local",
        "--proxy-service-account=mesh-test/aether-proxy",
        "--ca-addr=0.0.0.0:8443",
        "--metrics-addr=0.0.0.0:9090",
    ] {
        assert!(args.contains(&arg), "{arg} missing from {args:?}");
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--ca-secret")),
        "{args:?}"
    );
    for (var, field) in [
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_NAME", "metadata.name"),
    ] {
        let env = json!({"name": var, "valueFrom": {"fieldRef": {"fieldPath": field}}});
        assert!(
            operator["env"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| *e == env),
            "{var}: {}",
            operator["env"]
        );
    }
    assert_eq!(operator["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(operator["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert!(operator["resources"]["requests"]["memory"].is_string());

    let pdb = find(&objects, "PodDisruptionBudget", "aether-operator")?;
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    for (key, value) in pdb["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("PDB selector")?
    {
        assert_eq!(&labels[key], value, "PDB selects {key}={value}");
    }
    let service = find(&objects, "Service", "aether-operator")?;
    assert_eq!(
        service["spec"]["ports"],
        json!([
            {"name": "ca", "port": 8443, "targetPort": "ca"},
            {"name": "metrics", "port": 9090, "targetPort": "metrics"},
        ])
    );

    // One replica: a budget of one pod would block every node drain.
    let single = render(&["operator.replicas=1"])?;
    assert!(find(&single, "PodDisruptionBudget", "aether-operator").is_err());
    Ok(())
}

/// The operator Role's rules on Secrets.
fn secret_rules(objects: &[Value]) -> Result<Vec<&Value>> {
    let role = find(objects, "Role", "aether-operator")?;
    Ok(role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| strings(&r["resources"]).contains(&"secrets"))
        .collect())
}

#[test]
fn the_operator_reads_only_its_own_ca_secret() -> Result<()> {
    let objects = render(&["ca.existingSecret=mesh-root"])?;
    let pod = &find(&objects, "Deployment", "aether-operator")?["spec"]["template"]["spec"];
    let args = strings(&container(pod, "containers", "operator")?["args"]);
    assert!(args.contains(&"--ca-secret=mesh-root"), "{args:?}");
    assert_eq!(
        secret_rules(&objects)?,
        [
            &json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["mesh-root"], "verbs": ["get"]})
        ]
    );
    // A generated root: the operator reads its own Secret only, and may create it.
    let objects = render(&[])?;
    assert_eq!(
        secret_rules(&objects)?,
        [
            &json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["aether-ca"], "verbs": ["get"]}),
            &json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]})
        ]
    );
    Ok(())
}

/// The rules of every ClusterRole and Role bound to `service_account`.
fn rules_of<'a>(objects: &'a [Value], service_account: &str) -> Vec<&'a Value> {
    let bound = |binding: &Value| {
        binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == service_account
                    && s["namespace"] == NAMESPACE
            })
    };
    objects
        .iter()
        .filter(|b| {
            matches!(
                b["kind"].as_str(),
                Some("ClusterRoleBinding" | "RoleBinding")
            )
        })
        .filter(|b| bound(b))
        .filter_map(|b| {
            let role = &b["roleRef"];
            objects
                .iter()
                .find(|r| r["kind"] == role["kind"] && r["metadata"]["name"] == role["name"])
        })
        .flat_map(|r| r["rules"].as_array().into_iter().flatten())
        .collect()
}

#[test]
fn rbac_is_least_privilege() -> Result<()> {
    let objects = render(&[])?;
    for account in ["aether-operator", "aether-proxy", "aether-cni"] {
        find(&objects, "ServiceAccount", account)?;
        let rules = rules_of(&objects, account);
        assert!(!rules.is_empty(), "{account} is bound to no rules");
        for rule in &rules {
            for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                assert!(
                    !strings(&rule[field]).contains(&"*"),
                    "{account} has a wildcard: {rule}"
                );
            }
        }
        let touches_secrets = rules
            .iter()
            .any(|r| strings(&r["resources"]).contains(&"secrets"));
        assert_eq!(
            touches_secrets,
            account == "aether-operator",
            "{account} and Secrets"
        );
    }

    // The proxy writes only its NodeConfig's status, its node's taint and events, and mints
    // tokens for the CNI plugin's fallback identity alone.
    for rule in rules_of(&objects, "aether-proxy") {
        for verb in strings(&rule["verbs"]) {
            if matches!(verb, "get" | "list" | "watch") {
                continue;
            }
            for resource in strings(&rule["resources"]) {
                let token_for_cni = resource == "serviceaccounts/token"
                    && strings(&rule["resourceNames"]) == ["aether-cni"];
                assert!(
                    matches!(resource, "nodeconfigs/status" | "nodes" | "events") || token_for_cni,
                    "aether-proxy may {verb} {resource}"
                );
            }
        }
    }
    // Neither reads pods: the proxy has its node's through the operator.
    for account in ["aether-proxy", "aether-cni"] {
        for rule in rules_of(&objects, account) {
            assert!(
                !strings(&rule["resources"]).contains(&"pods"),
                "{account} reads pods: {rule}"
            );
        }
    }
    // The CNI fallback only reads namespaces, one at a time.
    let cni = rules_of(&objects, "aether-cni");
    assert_eq!(
        cni,
        [&json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]})]
    );
    Ok(())
}

#[test]
fn everything_lives_in_the_release_namespace() -> Result<()> {
    let objects = render(&[])?;
    let cluster_scoped = [
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    for object in &objects {
        let kind = object["kind"].as_str().unwrap_or_default();
        assert_ne!(kind, "Namespace", "the chart must not own its namespace");
        if !cluster_scoped.contains(&kind) {
            assert_eq!(
                object["metadata"]["namespace"], NAMESPACE,
                "{kind} {}",
                object["metadata"]["name"]
            );
        }
    }
    let text = serde_json::to_string(&objects)?;
    assert!(!text.contains("aether-system"), "a hard-coded namespace");
    Ok(())
}
