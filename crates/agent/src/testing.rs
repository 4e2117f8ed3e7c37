//! Test support: [`FakeZtunnel`], a real ZDS client speaking the wire format over a real
//! `SOCK_SEQPACKET` socket (`ambit_netns::SeqPacket`, the one transport), decoding with the
//! generated protobuf types directly so it stays independent of the framing both real
//! peers share (`ambit_contract::zds`).
//!
//! It records every request it receives, answers each with an ack (or a configured NACK)
//! and, when asked, binds TCP listeners on 15001/15006/15008 inside each received pod netns,
//! like ztunnel does, so the agent's "ztunnel listens there" check sees a real peer.

use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use ambit_netns::{NetnsFd, NetnsId, SeqPacket, in_netns, zds::TransportError};
use ambit_proto::zds::{
    Ack, WorkloadInfo, WorkloadRequest, WorkloadResponse, workload_request::Payload as Req,
    workload_response::Payload as Resp,
};
use prost::Message;
use tokio::sync::oneshot;

/// One request as the fake ztunnel saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// `AddWorkload`.
    Add {
        /// `uid`.
        uid: String,
        /// `workload_info`.
        info: Option<WorkloadInfo>,
        /// Identity of the attached fd when it was exactly one network namespace.
        netns: Option<NetnsId>,
        /// How many fds were attached.
        fds: usize,
    },
    /// `DelWorkload`.
    Del {
        /// `uid` (field 2).
        uid: String,
    },
    /// `KeepWorkload`.
    Keep {
        /// `uid`.
        uid: String,
        /// How many fds were attached (must be 0).
        fds: usize,
    },
    /// `SnapshotSent`.
    SnapshotSent,
    /// Something undecodable.
    Garbage(Vec<u8>),
}

#[derive(Debug, Default)]
struct Shared {
    seen: Vec<Seen>,
    raw: Vec<Vec<u8>>,
    nack: Option<String>,
    bind_listeners: bool,
    listeners: HashMap<String, Vec<TcpListener>>,
    closed: bool,
}

/// A fake ztunnel connected to a ZDS socket; disconnects when dropped.
#[derive(Debug)]
pub struct FakeZtunnel {
    shared: Arc<Mutex<Shared>>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeZtunnel {
    /// Connects to `path`, sends `ZdsHello{V1}` (bytes `08 01`) and starts answering.
    /// With `bind_listeners`, each `Add` binds the ztunnel ports in the received netns.
    ///
    /// The connection lives on a thread of its own with a single-threaded runtime, so the
    /// fake works from synchronous and asynchronous tests alike.
    pub fn connect(path: &Path, bind_listeners: bool) -> io::Result<Self> {
        let shared = Arc::new(Mutex::new(Shared {
            bind_listeners,
            ..Shared::default()
        }));
        let (connected_tx, connected) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel();
        let thread = {
            let (path, shared) = (path.to_owned(), shared.clone());
            std::thread::Builder::new()
                .name("fake-ztunnel".into())
                .spawn(move || run(&path, &shared, &connected_tx, stopped))?
        };
        match connected.recv() {
            Ok(Ok(())) => Ok(Self {
                shared,
                stop: Some(stop),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(io::Error::other("the fake ztunnel thread ended"))
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Everything received so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// The raw bytes of every datagram received, in order.
    pub fn raw(&self) -> Vec<Vec<u8>> {
        self.lock().raw.clone()
    }

    /// Whether the agent closed the connection.
    pub fn closed(&self) -> bool {
        self.lock().closed
    }

    /// NACK every following request with this text (`None`: ack again).
    pub fn set_nack(&self, nack: Option<&str>) {
        self.lock().nack = nack.map(str::to_owned);
    }

    /// Drops the listeners of one pod, as if ztunnel lost them.
    pub fn drop_listeners(&self, uid: &str) {
        self.lock().listeners.remove(uid);
    }
}

impl Drop for FakeZtunnel {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The fake's thread: connect, say hello, answer until the agent closes or `stopped`.
fn run(
    path: &Path,
    shared: &Mutex<Shared>,
    connected: &std::sync::mpsc::Sender<io::Result<()>>,
    stopped: oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = connected.send(Err(e));
            return;
        }
    };
    runtime.block_on(async {
        let sock = match hello(path).await {
            Ok(sock) => sock,
            Err(e) => {
                let _ = connected.send(Err(io::Error::other(e)));
                return;
            }
        };
        let _ = connected.send(Ok(()));
        tokio::select! {
            _ = stopped => {}
            () = serve(&sock, shared) => {}
        }
    });
    let mut st = shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    st.closed = true;
    st.listeners.clear();
}

async fn hello(path: &Path) -> Result<SeqPacket, TransportError> {
    let sock = SeqPacket::connect(path).await?;
    sock.send(&[0x08, 0x01]).await?;
    Ok(sock)
}

async fn serve(sock: &SeqPacket, shared: &Mutex<Shared>) {
    let lock = || {
        shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    loop {
        let mut buf = [0u8; 1024];
        let (len, fd): (usize, Option<OwnedFd>) = match sock.recv_with_fd(&mut buf).await {
            Ok(got) => got,
            // A datagram that broke the transport rules (oversized, several fds): record
            // it and NACK, as ztunnel does.
            Err(e) if e.is_bad_message() => {
                lock().seen.push(Seen::Garbage(Vec::new()));
                if sock.send(&nack("failure to read message")).await.is_err() {
                    break;
                }
                continue;
            }
            Err(_) => break,
        };
        if len == 0 {
            break;
        }
        let data = &buf[..len];
        lock().raw.push(data.to_vec());
        let nfds = usize::from(fd.is_some());
        let mut nack_text = lock().nack.clone();
        let seen = match WorkloadRequest::decode(data) {
            Ok(WorkloadRequest {
                payload: Some(Req::Add(add)),
            }) => {
                let netns = fd.and_then(|fd| NetnsFd::from_owned_fd(fd).ok());
                let id = netns.as_ref().map(NetnsFd::identity);
                let mut st = lock();
                if nack_text.is_none() && st.bind_listeners {
                    st.listeners.remove(&add.uid);
                    match netns.as_ref().map(bind_ports) {
                        Some(Ok(l)) => {
                            st.listeners.insert(add.uid.clone(), l);
                        }
                        Some(Err(e)) => nack_text = Some(format!("failure to start proxy: {e}")),
                        None => nack_text = Some("No control message".into()),
                    }
                }
                Seen::Add {
                    uid: add.uid,
                    info: add.workload_info,
                    netns: id,
                    fds: nfds,
                }
            }
            Ok(WorkloadRequest {
                payload: Some(Req::Del(del)),
            }) => {
                lock().listeners.remove(&del.uid);
                Seen::Del { uid: del.uid }
            }
            Ok(WorkloadRequest {
                payload: Some(Req::Keep(k)),
            }) => Seen::Keep {
                uid: k.uid,
                fds: nfds,
            },
            Ok(WorkloadRequest {
                payload: Some(Req::SnapshotSent(_)),
            }) => Seen::SnapshotSent,
            _ => Seen::Garbage(data.to_vec()),
        };
        lock().seen.push(seen);
        if sock
            .send(&nack(&nack_text.unwrap_or_default()))
            .await
            .is_err()
        {
            break;
        }
    }
}

/// `WorkloadResponse{ack}` with this error (empty: ACK).
fn nack(error: &str) -> Vec<u8> {
    WorkloadResponse {
        payload: Some(Resp::Ack(Ack {
            error: error.to_owned(),
        })),
    }
    .encode_to_vec()
}

/// Binds the ztunnel ports in `netns`. A port can stay busy for a moment after the
/// previous listener closed (a process forked elsewhere in the test holds the descriptor
/// until its exec), so "address in use" is retried for up to a second, as a real ztunnel
/// retries its binds.
fn bind_ports(netns: &NetnsFd) -> io::Result<Vec<TcpListener>> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        let result = in_netns(netns, || {
            ambit_contract::ports::INPOD_LISTENERS
                .iter()
                .map(|p| TcpListener::bind(("0.0.0.0", *p)))
                .collect::<io::Result<Vec<_>>>()
        })
        .map_err(io::Error::other)?;
        match result {
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Runs the CNI plugin's ADD in-process as a runtime would call it for pod `demo/NAME`
/// (CNI_* environment, a config pointing at the agent's `run_dir`, a prevResult holding
/// `ip`): the exit code and the plugin's output.
pub fn cni_add(run_dir: &Path, netns: &Path, name: &str, ip: std::net::IpAddr) -> (i32, String) {
    let env: Vec<(String, String)> = [
        ("CNI_COMMAND", "ADD".to_string()),
        ("CNI_CONTAINERID", format!("c-{name}")),
        ("CNI_NETNS", netns.display().to_string()),
        ("CNI_IFNAME", "eth0".into()),
        (
            "CNI_ARGS",
            format!("K8S_POD_NAMESPACE=demo;K8S_POD_NAME={name}"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "istio-cni", "type": "istio-cni",
        "cni_agent_run_dir": run_dir, "ambient_enabled": true,
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": format!("{ip}/32")}]},
    });
    let (code, out) = crate::plugin_main(&env, conf.to_string().as_bytes());
    (code, String::from_utf8_lossy(&out).into_owned())
}
