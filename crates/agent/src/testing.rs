//! Test support: [`FakeZtunnel`], a real ZDS client speaking the wire format over a real
//! `SOCK_SEQPACKET` socket, independent of the server code in [`crate::zds`].
//!
//! It records every request it receives, answers each with an ack (or a configured NACK)
//! and, when asked, binds TCP listeners on 15001/15006/15008 inside each received pod netns,
//! like ztunnel does, so the agent's "ztunnel listens there" check sees a real peer.

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ambit_netns::{NetnsFd, NetnsId, in_netns};
use ambit_proto::zds::{
    Ack, WorkloadInfo, WorkloadRequest, WorkloadResponse, workload_request::Payload as Req,
    workload_response::Payload as Resp,
};
use nix::cmsg_space;
use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, Shutdown, SockFlag, SockType, UnixAddr, connect,
    recvmsg, sendmsg, shutdown, socket,
};
use prost::Message;

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
    sock: Arc<OwnedFd>,
    shared: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeZtunnel {
    /// Connects to `path`, sends `ZdsHello{V1}` (bytes `08 01`) and starts answering.
    /// With `bind_listeners`, each `Add` binds the ztunnel ports in the received netns.
    pub fn connect(path: &Path, bind_listeners: bool) -> io::Result<Self> {
        let sock = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        connect(sock.as_raw_fd(), &UnixAddr::new(path)?)?;
        send(&sock, &[0x08, 0x01])?;
        let sock = Arc::new(sock);
        let shared = Arc::new(Mutex::new(Shared {
            bind_listeners,
            ..Shared::default()
        }));
        let thread = {
            let (sock, shared) = (sock.clone(), shared.clone());
            std::thread::Builder::new()
                .name("fake-ztunnel".into())
                .spawn(move || serve(&sock, &shared))?
        };
        Ok(Self {
            sock,
            shared,
            thread: Some(thread),
        })
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

    /// Polls `f(seen)` until it holds or `deadline` passes.
    pub fn wait_for(&self, deadline: Duration, f: impl Fn(&[Seen]) -> bool) -> bool {
        let end = Instant::now() + deadline;
        loop {
            if f(&self.lock().seen) {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for FakeZtunnel {
    fn drop(&mut self) {
        let _ = shutdown(self.sock.as_raw_fd(), Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn send(sock: &OwnedFd, data: &[u8]) -> io::Result<()> {
    sendmsg::<UnixAddr>(
        sock.as_raw_fd(),
        &[IoSlice::new(data)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}

fn serve(sock: &OwnedFd, shared: &Mutex<Shared>) {
    let lock = || {
        shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    loop {
        let mut buf = [0u8; 1024];
        // Room for two fds so "more than one" is observable.
        let mut cmsg = cmsg_space!([RawFd; 2]);
        let (len, fds) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let Ok(msg) = recvmsg::<UnixAddr>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) else {
                break;
            };
            let mut fds = Vec::new();
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        for fd in raw {
                            // SAFETY: received with this message; we are the only owner.
                            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                        }
                    }
                }
            }
            (msg.bytes, fds)
        };
        if len == 0 {
            break;
        }
        let data = &buf[..len];
        lock().raw.push(data.to_vec());
        let nfds = fds.len();
        let mut nack = lock().nack.clone();
        let seen = match WorkloadRequest::decode(data) {
            Ok(WorkloadRequest {
                payload: Some(Req::Add(add)),
            }) => {
                let netns = match fds.into_iter().next() {
                    Some(fd) if nfds == 1 => NetnsFd::from_owned_fd(fd).ok(),
                    _ => None,
                };
                let id = netns.as_ref().map(NetnsFd::identity);
                let mut st = lock();
                if nack.is_none() && st.bind_listeners {
                    st.listeners.remove(&add.uid);
                    match netns.as_ref().map(bind_ports) {
                        Some(Ok(l)) => {
                            st.listeners.insert(add.uid.clone(), l);
                        }
                        Some(Err(e)) => nack = Some(format!("failure to start proxy: {e}")),
                        None => nack = Some("No control message".into()),
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
        let ack = WorkloadResponse {
            payload: Some(Resp::Ack(Ack {
                error: nack.unwrap_or_default(),
            })),
        }
        .encode_to_vec();
        if send(sock, &ack).is_err() {
            break;
        }
    }
    let mut st = lock();
    st.closed = true;
    st.listeners.clear();
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
