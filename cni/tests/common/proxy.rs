//! The node proxy's side of the protocol, served with `aether_cni::protocol`'s own helpers.
//! The only double in these tests; its decisions are set by each test.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use aether_cni::protocol::{
    CapturePlan, CheckStatus, Decision, ErrorKind, ErrorReply, PodRef, Request, Response,
    StrictPlan, handle_frame, read_frame,
};

use super::TempDir;

#[derive(Debug, Default)]
pub struct ProxyState {
    pub managed_namespaces: Vec<String>,
    pub capture_port: u16,
    pub targets: Vec<SocketAddr>,
    pub generation: u64,
    /// Strict mTLS mode for every meshed pod.
    pub strict: Option<StrictPlan>,
    pub refuse_register: bool,
    /// Registered pods by container id.
    pub registered: BTreeMap<String, (PodRef, PathBuf)>,
    pub requests: Vec<Request>,
}

impl ProxyState {
    fn handle(&mut self, request: Request) -> Response {
        self.requests.push(request.clone());
        match request {
            Request::Ping => Response::Pong,
            Request::Add { pod, .. } => {
                if self.managed_namespaces.contains(&pod.namespace) {
                    Response::Decision(Decision::Meshed(CapturePlan {
                        capture_port: self.capture_port,
                        targets: self.targets.clone(),
                        generation: self.generation,
                        strict: self.strict.clone(),
                    }))
                } else {
                    Response::Decision(Decision::Unmeshed {
                        reason: format!("namespace {} is not managed", pod.namespace),
                    })
                }
            }
            Request::Register {
                pod,
                container_id,
                netns,
                ..
            } => {
                if self.refuse_register {
                    return Response::Error(ErrorReply {
                        kind: ErrorKind::Internal,
                        message: "registration refused by the test".into(),
                    });
                }
                self.registered.insert(container_id, (pod, netns));
                Response::Registered
            }
            Request::Unregister { container_id, .. } => Response::Unregistered {
                known: self.registered.remove(&container_id).is_some(),
            },
            Request::Check { pod, container_id } => {
                if self.managed_namespaces.contains(&pod.namespace) {
                    Response::Checked(CheckStatus::Meshed {
                        registered: self.registered.contains_key(&container_id),
                        capture_port: self.capture_port,
                        strict_inbound_port: self.strict.as_ref().map(|s| s.inbound_port),
                    })
                } else {
                    Response::Checked(CheckStatus::Unmeshed {
                        reason: "not managed".into(),
                    })
                }
            }
            Request::Gc {
                valid_container_ids,
            } => {
                let removed: Vec<String> = self
                    .registered
                    .keys()
                    .filter(|id| !valid_container_ids.contains(id))
                    .cloned()
                    .collect();
                for id in &removed {
                    self.registered.remove(id);
                }
                Response::Collected { removed }
            }
        }
    }
}

pub struct TestProxy {
    _dir: TempDir,
    socket: PathBuf,
    state: Arc<Mutex<ProxyState>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestProxy {
    pub fn start(state: ProxyState) -> Self {
        let dir = TempDir::new();
        let socket = dir.path().join("cni.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let state = Arc::new(Mutex::new(state));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let state = state.clone();
                    std::thread::spawn(move || serve(stream, &state));
                }
            })
        };
        TestProxy {
            _dir: dir,
            socket,
            state,
            stop,
            thread: Some(thread),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn state(&self) -> MutexGuard<'_, ProxyState> {
        self.state.lock().unwrap()
    }
}

fn serve(stream: UnixStream, state: &Mutex<ProxyState>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Ok(Some(frame)) = read_frame(&mut reader) {
        let reply = handle_frame(&frame, |request| state.lock().unwrap().handle(request));
        if writer.write_all(&reply).is_err() {
            return;
        }
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
