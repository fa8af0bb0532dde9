//! The pods bound to this node: each gets a supervisor task that builds its sandbox
//! (network namespace + CNI), writes its volumes, runs init containers then containers,
//! probes readiness, reports status, and on deletion stops everything and runs CNI DEL.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::json;
use tokio::sync::{Notify, watch};

use crate::cni::{Attachment, Cni};
use crate::container::{self, Launch};
use crate::mounts::NodeView;
use crate::node::{NodeInfo, now};
use crate::probes;
use crate::volumes::{self, Fetcher, Volumes};

/// Everything the pod supervisors share.
pub struct Runtime {
    pub client: kube::Client,
    pub node: NodeInfo,
    pub view: NodeView,
    pub cni: Cni,
    pub bin_dirs: Vec<PathBuf>,
    pub pods_dir: PathBuf,
    pub node_netns: PathBuf,
    pub cluster_dns: String,
    pub cluster_domain: String,
    pub base_env: Vec<(String, String)>,
}

/// The deletion grace period a supervisor is asked to stop with.
type Stop = watch::Sender<Option<i64>>;

/// Watches this node's pods and keeps one supervisor per pod.
pub async fn run(rt: Arc<Runtime>) -> Result<()> {
    let api: Api<Pod> = Api::all(rt.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", rt.node.name));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut supervisors: HashMap<String, Stop> = HashMap::new();
    let mut listed: HashSet<String> = HashSet::new();
    loop {
        let event = match stream.try_next().await {
            Ok(Some(event)) => event,
            Ok(None) => bail!("the pod watch ended"),
            Err(error) => {
                tracing::warn!(error = %error, "pod watch failed; retrying");
                continue;
            }
        };
        supervisors.retain(|_, stop| !stop.is_closed());
        match event {
            Event::Init => listed.clear(),
            Event::InitApply(pod) => {
                listed.insert(pod.metadata.uid.clone().unwrap_or_default());
                observe(&rt, &mut supervisors, pod);
            }
            Event::InitDone => {
                for (uid, stop) in supervisors.iter().filter(|(uid, _)| !listed.contains(*uid)) {
                    tracing::info!(uid, "pod is gone; stopping it");
                    let _ = stop.send(Some(0));
                }
            }
            Event::Apply(pod) => observe(&rt, &mut supervisors, pod),
            Event::Delete(pod) => {
                if let Some(stop) = supervisors.get(pod.metadata.uid.as_deref().unwrap_or_default())
                {
                    let _ = stop.send(Some(0));
                }
            }
        }
    }
}

fn observe(rt: &Arc<Runtime>, supervisors: &mut HashMap<String, Stop>, pod: Pod) {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if let Some(grace) = pod
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|_| pod.metadata.deletion_grace_period_seconds.unwrap_or(30))
    {
        match supervisors.get(&uid) {
            Some(stop) => {
                let _ = stop.send(Some(grace));
            }
            None => {
                // Deleted while this simulator was not running it: finish the deletion.
                let rt = rt.clone();
                tokio::spawn(async move { teardown(&rt, &pod).await });
            }
        }
        return;
    }
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    if supervisors.contains_key(&uid) || finished {
        return;
    }
    let (stop, stopped) = watch::channel(None);
    supervisors.insert(uid, stop);
    let rt = rt.clone();
    tokio::spawn(async move {
        let name = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        if let Err(error) = supervise(&rt, &pod, stopped).await {
            tracing::error!(
                pod = name,
                error = format!("{error:#}"),
                "pod supervisor failed"
            );
        }
        teardown(&rt, &pod).await;
    });
}

fn pod_dir(rt: &Runtime, pod: &Pod) -> PathBuf {
    rt.pods_dir
        .join(pod.metadata.uid.as_deref().unwrap_or("unknown"))
}

fn netns_name(pod: &Pod) -> String {
    format!("pod-{}", pod.metadata.uid.as_deref().unwrap_or("unknown"))
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

fn attachment(pod: &Pod) -> Attachment {
    Attachment {
        container_id: pod
            .metadata
            .uid
            .as_deref()
            .unwrap_or_default()
            .replace('-', ""),
        netns: Path::new("/var/run/netns").join(netns_name(pod)),
        pod_namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
    }
}

async fn ip(args: &[&str]) -> Result<()> {
    let output = tokio::process::Command::new("ip")
        .args(args)
        .output()
        .await
        .context("running ip")?;
    if !output.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Stops the pod's processes and network (see [`teardown_local`]) and completes the API
/// deletion if one is pending. Safe to run more than once.
async fn teardown(rt: &Runtime, pod: &Pod) {
    teardown_local(rt, pod).await;
    if pod.metadata.deletion_timestamp.is_some() || is_pending_deletion(rt, pod).await {
        let api: Api<Pod> = Api::namespaced(
            rt.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        if let Err(error) = api
            .delete(pod.metadata.name.as_deref().unwrap_or_default(), &params)
            .await
        {
            tracing::debug!(error = %error, "final pod delete");
        }
    }
}

async fn is_pending_deletion(rt: &Runtime, pod: &Pod) -> bool {
    let api: Api<Pod> = Api::namespaced(
        rt.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    );
    matches!(api.get_opt(pod.metadata.name.as_deref().unwrap_or_default()).await,
        Ok(Some(current)) if current.metadata.uid == pod.metadata.uid && current.metadata.deletion_timestamp.is_some())
}

fn read_pids(dir: &Path) -> Vec<i32> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
        .collect()
}

/// What the status reports about one container.
#[derive(Debug, Clone, Default)]
struct ContainerState {
    pid: Option<u32>,
    started_at: Option<Time>,
    ready: bool,
    restarts: i32,
    last_exit: Option<(i32, Time)>,
    waiting: Option<String>,
}

#[derive(Debug, Default)]
struct PodState {
    init: Vec<ContainerState>,
    containers: Vec<ContainerState>,
    initialized: bool,
    ips: Vec<String>,
    phase: &'static str,
    message: Option<String>,
}

type Shared = Arc<Mutex<PodState>>;

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, PodState> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn supervise(rt: &Arc<Runtime>, pod: &Pod, stop: watch::Receiver<Option<i64>>) -> Result<()> {
    let spec = pod.spec.clone().unwrap_or_default();
    let dir = pod_dir(rt, pod);
    // A pod an earlier run of this simulator started keeps running, as containers do
    // across kubelet restarts; anything less than a whole running pod starts afresh.
    let adopted = adoptable(rt, pod, &dir);
    if adopted.is_none() {
        teardown_local(rt, pod).await;
    }
    std::fs::create_dir_all(&dir)?;

    let state: Shared = Arc::new(Mutex::new(PodState {
        init: vec![
            ContainerState {
                waiting: Some("PodInitializing".into()),
                ..Default::default()
            };
            spec.init_containers.as_ref().map_or(0, Vec::len)
        ],
        containers: vec![
            ContainerState {
                waiting: Some("ContainerCreating".into()),
                ..Default::default()
            };
            spec.containers.len()
        ],
        phase: "Pending",
        ..Default::default()
    }));
    let changed = Arc::new(Notify::new());
    let reporter = tokio::spawn(report(
        rt.clone(),
        pod.clone(),
        state.clone(),
        changed.clone(),
        stop.clone(),
    ));

    let netns = if host_network(pod) {
        lock(&state).ips = vec![rt.node.ip.clone()];
        rt.node_netns.clone()
    } else if let Some(adopted) = &adopted {
        lock(&state).ips = adopted.ips.clone();
        attachment(pod).netns
    } else {
        let attachment = attachment(pod);
        ip(&["netns", "add", &netns_name(pod)]).await?;
        let ips = retry_until_stopped(
            &stop,
            "CNI ADD",
            || rt.cni.add(&attachment),
            |message| lock(&state).message = Some(message),
        )
        .await;
        let Some(ips) = ips else { return Ok(()) };
        let mut s = lock(&state);
        s.ips = ips;
        s.message = None;
        drop(s);
        attachment.netns
    };

    let fetcher = Fetcher {
        client: rt.client.clone(),
    };
    let volumes_dir = dir.join("volumes");
    let volumes = retry_until_stopped(
        &stop,
        "volumes",
        || volumes::materialise(&fetcher, pod, &volumes_dir),
        |m| lock(&state).message = Some(m),
    )
    .await;
    let Some(volumes) = volumes else {
        return Ok(());
    };
    let volumes = Arc::new(volumes);
    tokio::spawn(refresh_tokens(
        fetcher,
        pod.clone(),
        volumes.clone(),
        stop.clone(),
    ));

    let resolv = resolv_conf(rt, pod, &dir)?;
    let hostname = if host_network(pod) {
        rt.node.name.clone()
    } else {
        spec.hostname
            .clone()
            .unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default())
    };
    let restart_policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    let context = Arc::new(RunContext {
        rt: rt.clone(),
        pod: pod.clone(),
        volumes,
        netns,
        hostname,
        resolv,
        dir,
        state: state.clone(),
        changed,
    });

    let init_containers = if adopted.is_some() {
        &[][..]
    } else {
        spec.init_containers.as_deref().unwrap_or_default()
    };
    for (index, container) in init_containers.iter().enumerate() {
        loop {
            match context
                .run_once(container, Slot::Init(index), None, &mut stop.clone())
                .await
            {
                Some(0) => break,
                None => return Ok(()),
                Some(_) if restart_policy == "Never" => {
                    lock(&state).phase = "Failed";
                    return wait_for_stop(stop).await;
                }
                Some(_) => tokio::time::sleep(Duration::from_secs(2)).await,
            }
        }
    }
    {
        let mut s = lock(&state);
        s.initialized = true;
        s.phase = "Running";
    }
    let runs: Vec<_> = spec
        .containers
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let running = adopted.as_ref().and_then(|a| a.pids.get(&c.name).copied());
            tokio::spawn(context.clone().keep_running(
                c.clone(),
                index,
                running,
                restart_policy.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let exits = futures::future::join_all(runs).await;
    let all_succeeded = exits.iter().all(|e| matches!(e, Ok(Some(0))));
    if !stop.borrow().is_some() {
        // Every container finished for good (restartPolicy Never or OnFailure).
        lock(&state).phase = if all_succeeded { "Succeeded" } else { "Failed" };
        wait_for_stop(stop).await?;
    }
    reporter.abort();
    Ok(())
}

async fn wait_for_stop(mut stop: watch::Receiver<Option<i64>>) -> Result<()> {
    while stop.borrow().is_none() {
        if stop.changed().await.is_err() {
            break;
        }
    }
    Ok(())
}

/// Kills every process of the pod, runs CNI DEL, and removes its netns and directory.
async fn teardown_local(rt: &Runtime, pod: &Pod) {
    let dir = pod_dir(rt, pod);
    for pid in read_pids(&dir) {
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    if !host_network(pod) {
        let attachment = attachment(pod);
        if attachment.netns.exists() {
            let _ = rt.cni.del(&attachment).await;
            let _ = ip(&["netns", "delete", &netns_name(pod)]).await;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Retries `f` every 2 s until it succeeds (Some) or the pod is stopped (None).
async fn retry_until_stopped<T, F, Fut, E>(
    stop: &watch::Receiver<Option<i64>>,
    what: &str,
    mut f: F,
    mut report: impl FnMut(String),
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut stop = stop.clone();
    loop {
        if stop.borrow().is_some() {
            return None;
        }
        match f().await {
            Ok(value) => return Some(value),
            Err(error) => {
                let message = format!("{what} failed: {error:#}");
                tracing::warn!(message, "pod setup failed; retrying");
                report(message);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = stop.changed() => {}
        }
    }
}

fn resolv_conf(rt: &Runtime, pod: &Pod, dir: &Path) -> Result<Option<PathBuf>> {
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let cluster = match policy {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network(pod),
        _ => false,
    };
    if !cluster {
        return Ok(None);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let domain = &rt.cluster_domain;
    let path = dir.join("resolv.conf");
    std::fs::write(
        &path,
        format!(
            "search {namespace}.svc.{domain} svc.{domain} {domain}\nnameserver {}\noptions ndots:5\n",
            rt.cluster_dns
        ),
    )?;
    Ok(Some(path))
}

async fn refresh_tokens(
    fetcher: Fetcher,
    pod: Pod,
    volumes: Arc<Volumes>,
    mut stop: watch::Receiver<Option<i64>>,
) {
    let mut written: Vec<tokio::time::Instant> =
        vec![tokio::time::Instant::now(); volumes.tokens.len()];
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
            _ = stop.changed() => return,
        }
        for (token, at) in volumes.tokens.iter().zip(written.iter_mut()) {
            let lifetime = Duration::from_secs(token.expiration_seconds.max(60) as u64);
            if at.elapsed() >= lifetime.mul_f64(0.8) {
                match volumes::refresh_token(&fetcher, &pod, token).await {
                    Ok(()) => *at = tokio::time::Instant::now(),
                    Err(error) => {
                        tracing::warn!(path = %token.path.display(), error = format!("{error:#}"), "cannot refresh token")
                    }
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Slot {
    Init(usize),
    Main(usize),
}

struct RunContext {
    rt: Arc<Runtime>,
    pod: Pod,
    volumes: Arc<Volumes>,
    netns: PathBuf,
    hostname: String,
    resolv: Option<PathBuf>,
    dir: PathBuf,
    state: Shared,
    /// Wakes the status reporter, so a started container is reported at once.
    changed: Arc<Notify>,
}

impl RunContext {
    fn with_slot<T>(&self, slot: Slot, f: impl FnOnce(&mut ContainerState) -> T) -> T {
        let mut state = lock(&self.state);
        let result = match slot {
            Slot::Init(i) => f(&mut state.init[i]),
            Slot::Main(i) => f(&mut state.containers[i]),
        };
        self.changed.notify_one();
        result
    }

    /// Runs the container once, or waits for its `running` process; its exit code, or None
    /// when the pod was stopped.
    async fn run_once(
        &self,
        container: &Container,
        slot: Slot,
        running: Option<u32>,
        stop: &mut watch::Receiver<Option<i64>>,
    ) -> Option<i32> {
        let log = self.dir.join(format!("{}.log", container.name));
        let launch = Launch {
            client: &self.rt.client,
            pod: &self.pod,
            container,
            volumes: &self.volumes,
            view: &self.rt.view,
            bin_dirs: &self.rt.bin_dirs,
            netns: &self.netns,
            hostname: &self.hostname,
            resolv_conf: self.resolv.as_deref(),
            base_env: &self.rt.base_env,
            log: &log,
        };
        let started = match running {
            Some(pid) => Ok(Process::Adopted(pid)),
            None => container::start(&launch).await.map(Process::Child),
        };
        let mut process = match started {
            Ok(process) => process,
            Err(error) => {
                let message = format!("{error:#}");
                tracing::warn!(
                    container = container.name,
                    error = message,
                    "cannot start container"
                );
                self.with_slot(slot, |c| {
                    c.waiting = Some(format!("CreateContainerError: {message}"))
                });
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => return Some(128),
                    _ = stop.changed() => return None,
                }
            }
        };
        let pid = process.id();
        let pid_file = self.dir.join(format!("{}.pid", container.name));
        let _ = std::fs::write(&pid_file, pid.to_string());
        self.with_slot(slot, |c| {
            c.pid = Some(pid);
            c.started_at = Some(now());
            c.waiting = None;
            c.ready = false;
        });
        let code = tokio::select! {
            code = process.wait() => code,
            _ = stop.changed() => {
                let grace = stop.borrow().unwrap_or(30).max(0) as u64;
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
                if tokio::time::timeout(Duration::from_secs(grace), process.wait()).await.is_err() {
                    let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
                    let _ = process.wait().await;
                }
                let _ = std::fs::remove_file(&pid_file);
                return None;
            }
        };
        let _ = std::fs::remove_file(&pid_file);
        self.with_slot(slot, |c| {
            c.pid = None;
            c.ready = false;
            c.last_exit = Some((code, now()));
        });
        tracing::info!(container = container.name, code, "container exited");
        Some(code)
    }

    /// Runs a container under the pod's restart policy; its final exit code, or None when
    /// the pod was stopped.
    async fn keep_running(
        self: Arc<Self>,
        container: Container,
        index: usize,
        mut running: Option<u32>,
        policy: String,
        mut stop: watch::Receiver<Option<i64>>,
    ) -> Option<i32> {
        let mut backoff = Duration::from_secs(1);
        loop {
            let code = self
                .run_once(&container, Slot::Main(index), running.take(), &mut stop)
                .await?;
            let restart = match policy.as_str() {
                "Never" => false,
                "OnFailure" => code != 0,
                _ => true,
            };
            if !restart {
                return Some(code);
            }
            self.with_slot(Slot::Main(index), |c| {
                c.restarts += 1;
                c.waiting = Some("CrashLoopBackOff".into());
            });
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return None,
            }
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
    }
}

/// A container's process: started by this simulator, or found running from an earlier run.
enum Process {
    Child(tokio::process::Child),
    Adopted(u32),
}

/// The exit code reported for an adopted process, whose real code only its parent saw.
const UNKNOWN_EXIT_CODE: i32 = 255;

impl Process {
    fn id(&self) -> u32 {
        match self {
            Process::Child(child) => child.id().unwrap_or_default(),
            Process::Adopted(pid) => *pid,
        }
    }

    async fn wait(&mut self) -> i32 {
        match self {
            Process::Child(child) => child
                .wait()
                .await
                .ok()
                .and_then(|s| s.code())
                .unwrap_or(137),
            Process::Adopted(pid) => {
                while alive(*pid) {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                UNKNOWN_EXIT_CODE
            }
        }
    }
}

/// Whether the process runs (a zombie has no executable).
fn alive(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok()
}

/// A pod left running by an earlier run of this simulator.
struct Adopted {
    ips: Vec<String>,
    pids: HashMap<String, u32>,
}

fn adoptable(rt: &Runtime, pod: &Pod, dir: &Path) -> Option<Adopted> {
    let spec = pod.spec.as_ref()?;
    let mut pids = HashMap::new();
    for container in &spec.containers {
        let pid: u32 = std::fs::read_to_string(dir.join(format!("{}.pid", container.name)))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        if !alive(pid) {
            return None;
        }
        pids.insert(container.name.clone(), pid);
    }
    let ips = if host_network(pod) {
        vec![rt.node.ip.clone()]
    } else {
        let attachment = attachment(pod);
        if !attachment.netns.exists() {
            return None;
        }
        rt.cni.cached_ips(&attachment)?
    };
    Some(Adopted { ips, pids })
}

/// Probes readiness and patches the pod's status whenever it changes.
async fn report(
    rt: Arc<Runtime>,
    pod: Pod,
    state: Shared,
    changed: Arc<Notify>,
    mut stop: watch::Receiver<Option<i64>>,
) {
    let api: Api<Pod> = Api::namespaced(
        rt.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let start_time = now();
    let mut last = serde_json::Value::Null;
    let mut probed_at: Vec<Option<tokio::time::Instant>> = vec![None; spec.containers.len()];
    loop {
        for (i, container) in spec.containers.iter().enumerate() {
            let (pid, started) = {
                let s = lock(&state);
                (s.containers[i].pid, s.containers[i].started_at.is_some())
            };
            let ready = match (pid, &container.readiness_probe) {
                (None, _) => false,
                (Some(_), None) => started,
                (Some(pid), Some(probe)) => {
                    let period =
                        Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
                    if probed_at[i].is_some_and(|at| at.elapsed() < period) {
                        continue;
                    }
                    probed_at[i] = Some(tokio::time::Instant::now());
                    let ports: Vec<(String, u16)> = container
                        .ports
                        .iter()
                        .flatten()
                        .filter_map(|p| {
                            Some((p.name.clone()?, u16::try_from(p.container_port).ok()?))
                        })
                        .collect();
                    let pod_ip = lock(&state).ips.first().cloned().unwrap_or_default();
                    let timeout =
                        Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
                    match probes::check(probe, &ports) {
                        Some(check) => {
                            probes::run(&check, &pod_ip, &rt.node_netns, pid, timeout).await
                        }
                        None => false,
                    }
                }
            };
            lock(&state).containers[i].ready = ready;
        }
        let status = status_patch(&rt, &spec, &lock(&state), &start_time);
        if status != last {
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
                .await
            {
                Ok(_) => last = status,
                Err(error) => {
                    tracing::warn!(pod = name, error = %error, "cannot update pod status")
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = changed.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

fn container_status(container: &Container, state: &ContainerState, id: &str) -> serde_json::Value {
    let image = container.image.clone().unwrap_or_default();
    let current = match (
        &state.started_at,
        state.pid,
        &state.last_exit,
        &state.waiting,
    ) {
        (Some(started), Some(_), _, _) => json!({"running": {"startedAt": started}}),
        (_, None, _, Some(reason)) => {
            let (reason, message) = reason.split_once(": ").unwrap_or((reason, ""));
            json!({"waiting": {"reason": reason, "message": message}})
        }
        (started, None, Some((code, at)), None) => {
            json!({"terminated": {"exitCode": code, "reason": if *code == 0 { "Completed" } else { "Error" }, "startedAt": started, "finishedAt": at}})
        }
        _ => json!({"waiting": {"reason": "ContainerCreating"}}),
    };
    let last_state = match (&state.last_exit, state.pid) {
        (Some((code, at)), Some(_)) => json!({"terminated": {"exitCode": code, "finishedAt": at}}),
        _ => json!({}),
    };
    json!({
        "name": container.name,
        "image": image,
        "imageID": image,
        "containerID": format!("aether-nodesim://{id}-{}", container.name),
        "ready": state.ready,
        "started": state.pid.is_some(),
        "restartCount": state.restarts,
        "state": current,
        "lastState": last_state,
    })
}

fn status_patch(
    rt: &Runtime,
    spec: &k8s_openapi::api::core::v1::PodSpec,
    state: &PodState,
    start_time: &Time,
) -> serde_json::Value {
    let id = "pod";
    let containers: Vec<_> = spec
        .containers
        .iter()
        .zip(&state.containers)
        .map(|(c, s)| container_status(c, s, id))
        .collect();
    let init: Vec<_> = spec
        .init_containers
        .iter()
        .flatten()
        .zip(&state.init)
        .map(|(c, s)| container_status(c, s, id))
        .collect();
    let all_ready = !state.containers.is_empty() && state.containers.iter().all(|c| c.ready);
    let condition =
        |kind: &str, ok: bool| json!({"type": kind, "status": if ok { "True" } else { "False" }});
    let mut status = json!({
        "phase": state.phase,
        "hostIP": rt.node.ip,
        "hostIPs": [{"ip": rt.node.ip}],
        "startTime": start_time,
        "conditions": [
            condition("PodScheduled", true),
            condition("PodReadyToStartContainers", !state.ips.is_empty()),
            condition("Initialized", state.initialized),
            condition("ContainersReady", all_ready),
            condition("Ready", all_ready),
        ],
        "containerStatuses": containers,
        "initContainerStatuses": init,
    });
    if let Some(ip) = state.ips.first() {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!(
            state
                .ips
                .iter()
                .map(|ip| json!({"ip": ip}))
                .collect::<Vec<_>>()
        );
    }
    if let Some(message) = &state.message {
        status["message"] = json!(message);
    }
    json!({ "status": status })
}
