//! [`Sandbox`]: starting a process inside a set of namespaces, with its own mounts, root
//! filesystem, credentials and capabilities — the mechanics of a minimal container runtime,
//! for tests that run pod specs the way a kubelet and a container runtime would (node
//! hosts with their own root filesystem and PID namespace, containers on top of an image).
//!
//! A [`Sandbox`] is a list of steps (join a namespace, unshare one, mount, pivot the root)
//! run in order in the forked child between `fork` and `exec`, followed by the working
//! directory, `no_new_privs`, the capability bounding set and the user. Everything the child
//! needs (paths as C strings, descriptors) is prepared before the fork, so the hook only makes
//! system calls. Directories and files that serve as mount points are the caller's to create
//! beforehand (on the host side, or in an overlay's upper directory).
//!
//! The caller's own namespaces and mounts never change: mount steps only run in the child,
//! and a mount step before [`Sandbox::unshare_mount`] or [`Sandbox::join_mount`] is refused.
//! [`spawn`] starts the command in a PID namespace (joined, or a new one whose PID 1 the
//! command becomes) from a short-lived thread, so no other thread's namespaces change
//! either.
//!
//! When a step fails, the child writes `ambit sandbox: STEP PATH` to its standard error and
//! the spawn fails with that step's `errno`.

use std::ffi::{CString, c_int, c_ulong};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};

/// Why a sandbox could not be prepared (before any process is started).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A path or mount option holds a NUL byte.
    #[error("{what} {value:?} contains a NUL byte")]
    Nul {
        /// What the string was for.
        what: &'static str,
        /// The string.
        value: String,
    },
    /// A mount step came before the process had a mount namespace of its own.
    #[error(
        "mount step on {0} before unshare_mount or join_mount: it would change the caller's mounts"
    )]
    SharedMounts(String),
    /// An unknown capability name.
    #[error("unknown capability {0:?}")]
    Capability(String),
    /// Reading `/proc/sys/kernel/cap_last_cap` failed.
    #[error("reading the highest capability number: {0}")]
    CapLastCap(io::Error),
}

/// Linux capability names (without `CAP_`) in number order (`<linux/capability.h>`).
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The number of a capability named as Kubernetes does (`NET_ADMIN`, also `CAP_NET_ADMIN`,
/// any case).
pub fn capability(name: &str) -> Option<u32> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    CAPABILITIES
        .iter()
        .position(|c| *c == bare)
        .and_then(|i| u32::try_from(i).ok())
}

/// How a bind mount is made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bind {
    /// Include the mounts below the source (`MS_REC`).
    pub recursive: bool,
    /// Read-only (the top mount; mounts below keep their flags).
    pub readonly: bool,
    /// Receive mounts made below the source later, but never send any back (a slave of the
    /// source's peer group: Kubernetes' `mountPropagation: HostToContainer`).
    pub host_to_container: bool,
}

enum Step {
    Setns {
        fd: OwnedFd,
        nstype: c_int,
    },
    Unshare(c_int),
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: c_ulong,
        data: Option<CString>,
        what: &'static [u8],
    },
    PivotRoot(CString),
}

/// Credentials the process ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct User {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

/// A process's namespaces, mounts, root, credentials and capabilities; see the module docs.
#[derive(Default)]
pub struct Sandbox {
    steps: Vec<Step>,
    own_mounts: bool,
    cwd: Option<CString>,
    no_new_privs: bool,
    keep_caps: Option<Vec<u32>>,
    user: Option<User>,
    error: Option<SandboxError>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("steps", &self.steps.len())
            .field("user", &self.user)
            .field("keep_caps", &self.keep_caps)
            .finish_non_exhaustive()
    }
}

fn cstring(what: &'static str, bytes: &[u8]) -> Result<CString, SandboxError> {
    CString::new(bytes).map_err(|_| SandboxError::Nul {
        what,
        value: String::from_utf8_lossy(bytes).into_owned(),
    })
}

fn cpath(path: &Path) -> Result<CString, SandboxError> {
    cstring("path", path.as_os_str().as_bytes())
}

impl Sandbox {
    /// An empty sandbox: the child keeps the caller's namespaces.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps the first error; [`Sandbox::apply`] reports it.
    fn record(&mut self, result: Result<(), SandboxError>) {
        if let Err(e) = result
            && self.error.is_none()
        {
            self.error = Some(e);
        }
    }

    /// Joins the network namespace behind `fd` (`setns`).
    pub fn join_net(mut self, fd: OwnedFd) -> Self {
        self.steps.push(Step::Setns {
            fd,
            nstype: libc::CLONE_NEWNET,
        });
        self
    }

    /// Joins the mount namespace behind `fd`: root and working directory become that
    /// namespace's root. Later mount steps change that namespace unless
    /// [`Sandbox::unshare_mount`] follows.
    pub fn join_mount(mut self, fd: OwnedFd) -> Self {
        self.steps.push(Step::Setns {
            fd,
            nstype: libc::CLONE_NEWNS,
        });
        self.own_mounts = true;
        self
    }

    /// A new network namespace (empty: only a loopback device, down).
    pub fn unshare_net(mut self) -> Self {
        self.steps.push(Step::Unshare(libc::CLONE_NEWNET));
        self
    }

    /// A mount namespace of its own, a copy of the current one in which every mount becomes
    /// a slave: mounts from outside still arrive, none made inside ever leaves.
    pub fn unshare_mount(mut self) -> Self {
        self.steps.push(Step::Unshare(libc::CLONE_NEWNS));
        self.own_mounts = true;
        let root = self.mount_step(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_SLAVE,
            None,
            b"make-rslave",
        );
        self.record(root);
        self
    }

    #[allow(clippy::too_many_arguments)]
    fn mount_step(
        &mut self,
        source: Option<&[u8]>,
        target: &Path,
        fstype: Option<&str>,
        flags: c_ulong,
        data: Option<&str>,
        what: &'static [u8],
    ) -> Result<(), SandboxError> {
        if !self.own_mounts {
            return Err(SandboxError::SharedMounts(target.display().to_string()));
        }
        let step = Step::Mount {
            source: source.map(|s| cstring("mount source", s)).transpose()?,
            target: cpath(target)?,
            fstype: fstype
                .map(|s| cstring("filesystem type", s.as_bytes()))
                .transpose()?,
            flags,
            data: data
                .map(|s| cstring("mount options", s.as_bytes()))
                .transpose()?,
            what,
        };
        self.steps.push(step);
        Ok(())
    }

    /// Bind-mounts `source` on `target` (both must exist; a file on a file, a directory on
    /// a directory).
    pub fn bind(mut self, source: &Path, target: &Path, how: Bind) -> Self {
        let rec = if how.recursive { libc::MS_REC } else { 0 };
        let mut r = self.mount_step(
            Some(source.as_os_str().as_bytes()),
            target,
            None,
            libc::MS_BIND | rec,
            None,
            b"bind",
        );
        if r.is_ok() && how.readonly {
            r = self.mount_step(
                None,
                target,
                None,
                libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                None,
                b"remount-ro",
            );
        }
        if r.is_ok() && how.host_to_container {
            r = self.mount_step(
                None,
                target,
                None,
                libc::MS_SLAVE | rec,
                None,
                b"make-slave",
            );
        }
        self.record(r);
        self
    }

    /// Mounts a filesystem of type `fstype` (`proc`, `sysfs`, `tmpfs`, `overlay`, …) with
    /// `options` on `target`.
    pub fn mount(mut self, fstype: &str, target: &Path, options: &str, readonly: bool) -> Self {
        let flags = if readonly { libc::MS_RDONLY } else { 0 }
            | libc::MS_NOSUID
            | if fstype == "overlay" || fstype == "tmpfs" {
                0
            } else {
                libc::MS_NODEV | libc::MS_NOEXEC
            };
        let data = (!options.is_empty()).then_some(options);
        let r = self.mount_step(
            Some(fstype.as_bytes()),
            target,
            Some(fstype),
            flags,
            data,
            b"mount",
        );
        self.record(r);
        self
    }

    /// Makes the mount at `target` shared: mounts made below it later propagate to its
    /// copies (the other side of [`Bind::host_to_container`]).
    pub fn make_shared(mut self, target: &Path) -> Self {
        let r = self.mount_step(None, target, None, libc::MS_SHARED, None, b"make-shared");
        self.record(r);
        self
    }

    /// Makes the mount at `target` read-only (that mount only).
    pub fn remount_readonly(mut self, target: &Path) -> Self {
        let r = self.mount_step(
            None,
            target,
            None,
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
            None,
            b"remount-ro",
        );
        self.record(r);
        self
    }

    /// Makes `new_root` (a mount point) the root of the mount namespace and detaches the
    /// old root; the working directory becomes `/`.
    pub fn pivot_root(mut self, new_root: &Path) -> Self {
        if !self.own_mounts {
            self.record(Err(SandboxError::SharedMounts(
                new_root.display().to_string(),
            )));
            return self;
        }
        match cpath(new_root) {
            Ok(p) => self.steps.push(Step::PivotRoot(p)),
            Err(e) => self.record(Err(e)),
        }
        self
    }

    /// The working directory, after every step.
    pub fn cwd(mut self, dir: &Path) -> Self {
        match cpath(dir) {
            Ok(p) => self.cwd = Some(p),
            Err(e) => self.record(Err(e)),
        }
        self
    }

    /// `PR_SET_NO_NEW_PRIVS` (Kubernetes' `allowPrivilegeEscalation: false`).
    pub fn no_new_privs(mut self) -> Self {
        self.no_new_privs = true;
        self
    }

    /// Keeps only these capabilities in the bounding set (Kubernetes' `drop: [ALL]` plus
    /// `add`); a process running as root then holds exactly these after `exec`.
    pub fn capabilities<S: AsRef<str>>(mut self, keep: &[S]) -> Self {
        let mut caps = Vec::new();
        for name in keep {
            match capability(name.as_ref()) {
                Some(c) => caps.push(c),
                None => {
                    self.record(Err(SandboxError::Capability(name.as_ref().to_string())));
                    return self;
                }
            }
        }
        self.keep_caps = Some(caps);
        self
    }

    /// Runs as `uid`:`gid` with supplementary `groups` (set last; leaving root clears every
    /// capability).
    pub fn user(mut self, uid: u32, gid: u32, groups: &[u32]) -> Self {
        self.user = Some(User {
            uid,
            gid,
            groups: groups.to_vec(),
        });
        self
    }

    /// Installs the sandbox on `cmd` (start it with [`spawn`] for a PID namespace).
    /// `current_dir`, `uid` and `gid` of `cmd` must not be used: std applies them before the
    /// sandbox's steps.
    pub fn apply(self, cmd: &mut Command) -> Result<(), SandboxError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let drop_caps: Vec<c_int> = match &self.keep_caps {
            None => Vec::new(),
            Some(keep) => {
                let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
                    .map_err(SandboxError::CapLastCap)?
                    .trim()
                    .parse()
                    .map_err(|_| SandboxError::CapLastCap(io::Error::other("not a number")))?;
                (0..=last)
                    .filter(|c| !keep.contains(c))
                    .filter_map(|c| c_int::try_from(c).ok())
                    .collect()
            }
        };
        let prepared = Prepared {
            steps: self.steps,
            cwd: self.cwd,
            no_new_privs: self.no_new_privs,
            drop_caps,
            user: self.user,
        };
        // SAFETY: the hook runs in the forked child before exec. `Prepared::run` only makes
        // system calls (setns, unshare, mount, pivot_root, umount2, chdir, prctl, setgroups,
        // setgid, setuid, write) on data prepared before the fork, and builds io::Errors from
        // raw errnos, which does not allocate. The closure owns the descriptors it uses.
        unsafe {
            cmd.pre_exec(move || prepared.run());
        }
        Ok(())
    }
}

/// What the child runs, prepared before the fork.
struct Prepared {
    steps: Vec<Step>,
    cwd: Option<CString>,
    no_new_privs: bool,
    drop_caps: Vec<c_int>,
    user: Option<User>,
}

/// Writes `ambit sandbox: WHAT DETAIL` to the child's stderr and returns `errno`.
fn fail(what: &[u8], detail: &[u8]) -> io::Error {
    let err = io::Error::last_os_error();
    let parts: [&[u8]; 5] = [b"ambit sandbox: ", what, b" ", detail, b"\n"];
    for part in parts {
        // SAFETY: write(2) on fd 2 with a valid buffer and length; a failed write changes
        // nothing here (the error being reported is captured above).
        unsafe {
            libc::write(2, part.as_ptr().cast(), part.len());
        }
    }
    err
}

fn check(rc: c_int, what: &[u8], detail: &[u8]) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(fail(what, detail))
    }
}

fn ptr(s: &Option<CString>) -> *const libc::c_char {
    s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())
}

impl Prepared {
    /// In the child: every step, then cwd, no_new_privs, capabilities, user.
    fn run(&self) -> io::Result<()> {
        for step in &self.steps {
            match step {
                Step::Setns { fd, nstype } => {
                    // SAFETY: setns on a descriptor the closure owns.
                    let rc = unsafe { libc::setns(fd.as_raw_fd(), *nstype) };
                    check(rc, b"setns", b"")?;
                }
                Step::Unshare(flags) => {
                    // SAFETY: unshare with namespace flags only.
                    let rc = unsafe { libc::unshare(*flags) };
                    check(rc, b"unshare", b"")?;
                }
                Step::Mount {
                    source,
                    target,
                    fstype,
                    flags,
                    data,
                    what,
                } => {
                    // SAFETY: every pointer is a NUL-terminated string owned by the closure,
                    // or null where mount(2) allows it.
                    let rc = unsafe {
                        libc::mount(
                            ptr(source),
                            target.as_ptr(),
                            ptr(fstype),
                            *flags,
                            ptr(data).cast(),
                        )
                    };
                    check(rc, what, target.as_bytes())?;
                }
                Step::PivotRoot(new_root) => {
                    let dot = c".";
                    // SAFETY: chdir/pivot_root/umount2 on NUL-terminated strings. pivot_root
                    // with new_root == put_old stacks the old root on the new one; detaching
                    // it leaves only the new root (as runc does).
                    unsafe {
                        check(
                            libc::chdir(new_root.as_ptr()),
                            b"chdir",
                            new_root.as_bytes(),
                        )?;
                        let rc = libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr());
                        check(c_int::from(rc != 0), b"pivot_root", new_root.as_bytes())?;
                        check(
                            libc::umount2(dot.as_ptr(), libc::MNT_DETACH),
                            b"umount old root",
                            b"",
                        )?;
                        check(libc::chdir(c"/".as_ptr()), b"chdir", b"/")?;
                    }
                }
            }
        }
        if let Some(cwd) = &self.cwd {
            // SAFETY: chdir on a NUL-terminated string.
            let rc = unsafe { libc::chdir(cwd.as_ptr()) };
            check(rc, b"chdir", cwd.as_bytes())?;
        }
        if self.no_new_privs {
            // SAFETY: prctl with integer arguments.
            let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            check(rc, b"prctl", b"no_new_privs")?;
        }
        for cap in &self.drop_caps {
            // SAFETY: prctl with integer arguments.
            let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, *cap, 0, 0, 0) };
            check(rc, b"prctl", b"capbset_drop")?;
        }
        if !self.drop_caps.is_empty() {
            // SAFETY: prctl with integer arguments.
            let rc = unsafe {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_CLEAR_ALL,
                    0,
                    0,
                    0,
                )
            };
            check(rc, b"prctl", b"clear ambient capabilities")?;
        }
        if let Some(u) = &self.user {
            // SAFETY: setgroups with a slice the closure owns; setgid/setuid with integers.
            unsafe {
                let rc = libc::setgroups(u.groups.len(), u.groups.as_ptr());
                check(rc, b"setgroups", b"")?;
                check(libc::setgid(u.gid), b"setgid", b"")?;
                check(libc::setuid(u.uid), b"setuid", b"")?;
            }
        }
        Ok(())
    }
}

/// The PID namespace [`spawn`] starts a command in.
#[derive(Debug, Clone, Copy)]
pub enum PidNamespace<'a> {
    /// The caller's.
    Inherit,
    /// The namespace behind the descriptor (`/proc/PID/ns/pid`).
    Join(&'a OwnedFd),
    /// A new one, child of the caller's: the command is its PID 1, and every process in it
    /// dies with the command. (A new namespace below a joined one is not possible this way:
    /// the kernel refuses `unshare(CLONE_NEWPID)` once `setns` changed the namespace for
    /// children.)
    New,
}

/// Spawns `cmd` in `pid`'s PID namespace. `setns`/`unshare` of a PID namespace only affect
/// the children of the calling thread, so this happens on a thread of its own that ends
/// right after the fork; the caller's threads keep their namespaces.
pub fn spawn(cmd: &mut Command, pid: PidNamespace<'_>) -> io::Result<Child> {
    if let PidNamespace::Inherit = pid {
        return cmd.spawn();
    }
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("sandbox-spawn".into())
            .spawn_scoped(s, move || {
                let (join, new) = match pid {
                    PidNamespace::Inherit => (None, false),
                    PidNamespace::Join(fd) => (Some(fd), false),
                    PidNamespace::New => (None, true),
                };
                if let Some(fd) = join {
                    // SAFETY: setns on a borrowed, open descriptor; it only changes the PID
                    // namespace this thread's children are created in.
                    let rc = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWPID) };
                    if rc != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if new {
                    // SAFETY: unshare with CLONE_NEWPID only changes the namespace this
                    // thread's children are created in.
                    let rc = unsafe { libc::unshare(libc::CLONE_NEWPID) };
                    if rc != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                cmd.spawn()
            })?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_names() {
        let cases = [
            ("NET_ADMIN", Some(12)),
            ("CAP_SYS_ADMIN", Some(21)),
            ("net_raw", Some(13)),
            ("SYS_PTRACE", Some(19)),
            ("DAC_OVERRIDE", Some(1)),
            ("NOPE", None),
        ];
        for (name, want) in cases {
            assert_eq!(capability(name), want, "{name}");
        }
        let err = Sandbox::new()
            .capabilities(&["NET_ADMIN", "FLY"])
            .apply(&mut Command::new("true"))
            .unwrap_err();
        assert!(err.to_string().contains("FLY"), "{err}");
    }

    #[test]
    fn mounts_need_a_mount_namespace_of_their_own() {
        let cases: [(&str, Sandbox); 3] = [
            (
                "bind",
                Sandbox::new().bind(Path::new("/a"), Path::new("/b"), Bind::default()),
            ),
            (
                "mount",
                Sandbox::new().mount("tmpfs", Path::new("/b"), "", false),
            ),
            ("pivot_root", Sandbox::new().pivot_root(Path::new("/b"))),
        ];
        for (what, sandbox) in cases {
            let err = sandbox.apply(&mut Command::new("true")).unwrap_err();
            assert!(
                matches!(err, SandboxError::SharedMounts(ref t) if t == "/b"),
                "{what}: {err}"
            );
        }
        let nul = Sandbox::new()
            .unshare_mount()
            .bind(Path::new("/a\0"), Path::new("/b"), Bind::default())
            .apply(&mut Command::new("true"))
            .unwrap_err();
        assert!(matches!(nul, SandboxError::Nul { .. }), "{nul}");
    }
}
