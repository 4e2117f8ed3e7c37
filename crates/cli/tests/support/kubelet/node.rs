//! [`NodeHost`]: a topology node made into a host with an operating system of its own, as a
//! kubelet and a container runtime see their node: a root filesystem (a directory of the
//! test's temp dir, so the test reads and writes the node's files directly), a PID namespace
//! whose PID 1 lives in the node's network namespace (so `/proc/1/ns/net` is the node's, as
//! the CNI agent expects of `/host/proc`), and `/run/netns` as a shared mount where pod
//! sandboxes are pinned.
//!
//! The node's root holds `/usr` and `/etc/alternatives` of the machine (read-only) with the
//! merged-usr links, `/dev`,
//! its own `/proc` and `/sys`, `/etc/cni/net.d`, `/opt/cni/bin`, `/var/run` → `/run`, and the
//! container image under `/images/ambit` (read-only). None of it is mounted in the test's
//! own mount namespace: only processes of the node see it, and it goes away with them.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use ambit_netns::NetnsFd;
use ambit_netns::sandbox::{self, Bind, PidNamespace, Sandbox};

/// Where the image is mounted inside every node.
pub const IMAGE_DIR: &str = "/images/ambit";

/// A node's operating system: see the module docs. Dropping it kills the node's PID 1,
/// which ends every process of the node.
pub struct NodeHost {
    pub name: String,
    /// The node's address (`eth0`).
    pub ip: std::net::Ipv4Addr,
    /// The node's pod range (host-local IPAM of the primary CNI).
    pub pod_cidr: String,
    /// The node's root directory on the test's side.
    pub root: PathBuf,
    netns: NetnsFd,
    init: Child,
    mount_ns: OwnedFd,
    pid_ns: OwnedFd,
}

impl std::fmt::Debug for NodeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHost")
            .field("name", &self.name)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

fn ns_fd(pid: u32, kind: &str) -> OwnedFd {
    std::fs::File::open(format!("/proc/{pid}/ns/{kind}"))
        .unwrap_or_else(|e| panic!("opening /proc/{pid}/ns/{kind}: {e}"))
        .into()
}

impl NodeHost {
    /// Boots `node` with its root under `dir` and the image root filesystem `image`.
    pub fn boot(node: &ambit_topology::Node, dir: &Path, image: &Path) -> NodeHost {
        let root = dir.join("root");
        for d in [
            "usr",
            "dev",
            "proc",
            "sys",
            "tmp",
            "run/netns",
            "etc/cni/net.d",
            "etc/alternatives",
            "opt/cni/bin",
            "var/lib/cni",
            "var/lib/kubelet/pods",
            "var/lib/containers",
            "var/log/pods",
            IMAGE_DIR.trim_start_matches('/'),
        ] {
            std::fs::create_dir_all(root.join(d)).expect("node directory");
        }
        // Merged /usr as on the machine: the links, or binds where the machine has dirs.
        let mut binds: Vec<(PathBuf, PathBuf)> = Vec::new();
        for top in ["bin", "sbin", "lib", "lib64"] {
            let host = Path::new("/").join(top);
            match std::fs::read_link(&host) {
                Ok(target) => std::os::unix::fs::symlink(target, root.join(top)).expect("link"),
                Err(_) if host.is_dir() => {
                    std::fs::create_dir_all(root.join(top)).expect("dir");
                    binds.push((host, root.join(top)));
                }
                Err(_) => {}
            }
        }
        std::os::unix::fs::symlink("../run", root.join("var/run")).expect("/var/run link");
        let netns = NetnsFd::open(node.netns_path()).expect("node netns");
        let ro = Bind {
            recursive: true,
            readonly: true,
            ..Bind::default()
        };
        let mut s = Sandbox::new()
            .join_net(netns.try_clone().expect("dup").into_owned_fd())
            .unshare_mount()
            .bind(&root, &root, Bind::default())
            .bind(Path::new("/usr"), &root.join("usr"), ro);
        // Debian's tool names (iptables-save, …) are links through /etc/alternatives.
        binds.push((
            PathBuf::from("/etc/alternatives"),
            root.join("etc/alternatives"),
        ));
        for (host, target) in &binds {
            s = s.bind(host, target, ro);
        }
        let run_netns = root.join("run/netns");
        let s = s
            .bind(
                Path::new("/dev"),
                &root.join("dev"),
                Bind {
                    recursive: true,
                    ..Bind::default()
                },
            )
            .bind(image, &root.join(IMAGE_DIR.trim_start_matches('/')), ro)
            .bind(&run_netns, &run_netns, Bind::default())
            .make_shared(&run_netns)
            .pivot_root(&root)
            .mount("proc", Path::new("/proc"), "", false)
            .mount("sysfs", Path::new("/sys"), "", true);
        let mut cmd = Command::new("/usr/bin/sleep");
        cmd.arg("infinity")
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        s.apply(&mut cmd).expect("node sandbox");
        let init = sandbox::spawn(&mut cmd, PidNamespace::New).expect("node init");
        let (mount_ns, pid_ns) = (ns_fd(init.id(), "mnt"), ns_fd(init.id(), "pid"));
        NodeHost {
            name: node.name().to_string(),
            ip: node.ip(),
            pod_cidr: node.pod_cidr().to_string(),
            root,
            netns,
            init,
            mount_ns,
            pid_ns,
        }
    }

    /// The test's path of the node's `path`.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// The node's network namespace.
    pub fn netns(&self) -> &NetnsFd {
        &self.netns
    }

    /// A sandbox that starts on the node: its mount, network and PID namespaces.
    pub fn sandbox(&self) -> Sandbox {
        Sandbox::new()
            .join_mount(self.mount_ns.try_clone().expect("dup"))
            .join_net(self.netns.try_clone().expect("dup").into_owned_fd())
    }

    /// A sandbox that starts in the node's mount namespace and the pod network `netns`.
    pub fn container_sandbox(&self, netns: &NetnsFd) -> Sandbox {
        Sandbox::new()
            .join_mount(self.mount_ns.try_clone().expect("dup"))
            .join_net(netns.try_clone().expect("dup").into_owned_fd())
    }

    /// Starts `cmd` (already given a sandbox from [`NodeHost::sandbox`] or
    /// [`NodeHost::container_sandbox`]) in the node's PID namespace. Containers share it (no
    /// PID namespace per pod): the kernel allows no new PID namespace below a joined one
    /// without an intermediate process.
    pub fn spawn(&self, cmd: &mut Command) -> std::io::Result<Child> {
        sandbox::spawn(cmd, PidNamespace::Join(&self.pid_ns))
    }

    /// Runs `program args` on the node (the node's view of the filesystem, the node's
    /// network) and returns its output.
    pub fn run(&self, program: &str, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        self.sandbox()
            .cwd(Path::new("/"))
            .apply(&mut cmd)
            .expect("sandbox");
        self.spawn(&mut cmd)
            .and_then(|c| c.wait_with_output())
            .unwrap_or_else(|e| panic!("{program} on {}: {e}", self.name))
    }

    /// Creates a pod sandbox's network namespace, pinned at the node's `/run/netns/NAME` (as
    /// a CRI runtime pins it), and opens it.
    pub fn create_netns(&self, name: &str) -> NetnsFd {
        let pin = self.path("/run/netns").join(name);
        std::fs::write(&pin, b"").expect("netns pin file");
        let node_pin = Path::new("/run/netns").join(name);
        let mut cmd = Command::new("/usr/bin/true");
        cmd.env_clear();
        self.sandbox()
            .unshare_net()
            .bind(Path::new("/proc/self/ns/net"), &node_pin, Bind::default())
            .apply(&mut cmd)
            .expect("sandbox");
        let status = self
            .spawn(&mut cmd)
            .and_then(|mut c| c.wait())
            .expect("pinning a netns");
        assert!(status.success(), "pinning netns {name}: {status}");
        NetnsFd::open(format!("/proc/{}/root/run/netns/{name}", self.init.id()))
            .expect("opening the pod netns")
    }
}

impl Drop for NodeHost {
    fn drop(&mut self) {
        // PID 1 gone: the kernel kills every process of the node's PID namespace.
        let _ = self.init.kill();
        let _ = self.init.wait();
    }
}
