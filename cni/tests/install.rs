//! `aether-cni install` / `uninstall` against a CNI bin and conf dir. No root needed.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::{AETHER_CNI, TempDir};
use serde_json::{Value, json};

fn aether_cni(args: &[&str]) {
    let out = Command::new(AETHER_CNI).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
}

fn read(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn types(config: &Value) -> Vec<String> {
    config["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_owned())
        .collect()
}

struct Dirs {
    _root: TempDir,
    bin: String,
    conf: String,
}

fn dirs() -> Dirs {
    let root = TempDir::new();
    let bin = root.path().join("bin");
    let conf = root.path().join("net.d");
    fs::create_dir_all(&bin).unwrap();
    fs::create_dir_all(&conf).unwrap();
    Dirs {
        bin: bin.to_string_lossy().into_owned(),
        conf: conf.to_string_lossy().into_owned(),
        _root: root,
    }
}

fn install(d: &Dirs) {
    aether_cni(&[
        "install",
        "--cni-bin-dir",
        &d.bin,
        "--cni-conf-dir",
        &d.conf,
        "--kubeconfig",
        "/etc/cni/net.d/aether-cni.kubeconfig",
    ]);
}

#[test]
fn install_appends_to_the_primary_list_once_and_uninstall_restores_it() {
    let d = dirs();
    let primary = Path::new(&d.conf).join("10-bridge.conflist");
    let other = Path::new(&d.conf).join("20-other.conflist");
    let original = json!({"cniVersion": "1.0.0", "name": "k8s-pod-network",
                          "plugins": [{"type": "bridge"}, {"type": "portmap"}]});
    fs::write(&primary, original.to_string()).unwrap();
    fs::write(&other, original.to_string()).unwrap();

    install(&d);
    install(&d);
    let installed = read(&primary);
    assert_eq!(types(&installed), ["bridge", "portmap", "aether-cni"]);
    assert_eq!(
        installed["plugins"][2],
        json!({"type": "aether-cni", "proxySocket": "/var/run/aether/cni.sock",
               "kubeconfig": "/etc/cni/net.d/aether-cni.kubeconfig"})
    );
    assert_eq!(read(&other), original, "only the primary config is edited");
    let binary = Path::new(&d.bin).join("aether-cni");
    assert_eq!(fs::read(&binary).unwrap(), fs::read(AETHER_CNI).unwrap());
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&binary).unwrap().permissions().mode() & 0o777,
            0o755
        );
    }
    let leftovers: Vec<_> = fs::read_dir(&d.conf)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("aether-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    aether_cni(&[
        "uninstall",
        "--cni-bin-dir",
        &d.bin,
        "--cni-conf-dir",
        &d.conf,
    ]);
    assert_eq!(read(&primary), original);
    assert!(!binary.exists());
    aether_cni(&[
        "uninstall",
        "--cni-bin-dir",
        &d.bin,
        "--cni-conf-dir",
        &d.conf,
    ]);
}

#[test]
fn a_single_plugin_conf_becomes_a_list() {
    let d = dirs();
    let conf = Path::new(&d.conf).join("10-bridge.conf");
    fs::write(
        &conf,
        json!({"cniVersion": "0.4.0", "name": "net", "type": "bridge"}).to_string(),
    )
    .unwrap();

    install(&d);
    assert!(!conf.exists());
    let list = read(&Path::new(&d.conf).join("10-bridge.conflist"));
    assert_eq!(list["cniVersion"], "0.4.0");
    assert_eq!(types(&list), ["bridge", "aether-cni"]);
}

#[test]
fn install_without_a_network_config_says_what_is_missing() {
    let d = dirs();
    let out = Command::new(AETHER_CNI)
        .args([
            "install",
            "--cni-bin-dir",
            &d.bin,
            "--cni-conf-dir",
            &d.conf,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("install the primary network plugin first"),
        "{stderr}"
    );
}

#[test]
fn a_dropped_entry_is_put_back_exactly_as_installed() {
    let d = dirs();
    let primary = Path::new(&d.conf).join("10-bridge.conflist");
    let original = json!({"cniVersion": "1.0.0", "name": "k8s-pod-network",
                          "plugins": [{"type": "bridge"}]});
    fs::write(&primary, original.to_string()).unwrap();
    install(&d);
    let conf = Path::new(&d.conf);
    let entry = aether_cni::install::chained_entry(conf).unwrap().unwrap();
    assert_eq!(entry["type"], "aether-cni");

    // Another plugin rewrites its config and our entry is gone.
    fs::write(&primary, original.to_string()).unwrap();
    assert_eq!(aether_cni::install::chained_entry(conf).unwrap(), None);
    let (path, changed) = aether_cni::install::chain(conf, &entry).unwrap();
    assert!(changed);
    assert_eq!(path, primary);
    assert_eq!(types(&read(&primary)), ["bridge", "aether-cni"]);
    assert_eq!(
        aether_cni::install::chained_entry(conf).unwrap(),
        Some(entry.clone())
    );
    assert!(
        !aether_cni::install::chain(conf, &entry).unwrap().1,
        "idempotent"
    );
}
