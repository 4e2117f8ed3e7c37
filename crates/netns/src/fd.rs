//! [`NetnsFd`]: an open, validated network-namespace descriptor, with its [`NetnsId`].

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd},
    path::Path,
};

use crate::{NetnsError, NetnsId, imp};

/// An open file descriptor of a network namespace.
///
/// Construction validates that the descriptor really is a network namespace, so holders
/// never need to check again. The namespace stays alive while the descriptor is open.
#[derive(Debug)]
pub struct NetnsFd {
    fd: OwnedFd,
    id: NetnsId,
}

impl NetnsFd {
    /// Opens a namespace by path, e.g. `/var/run/netns/NAME` or `/proc/PID/ns/net`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, NetnsError> {
        let path = path.as_ref();
        let fd = imp::open(path)?;
        Self::validate(fd, &path.display().to_string())
    }

    /// Opens the network namespace of a process.
    pub fn from_pid(pid: u32) -> Result<Self, NetnsError> {
        Self::open(format!("/proc/{pid}/ns/net"))
    }

    /// Opens the namespace the calling thread is in right now.
    pub fn current_thread() -> Result<Self, NetnsError> {
        Self::open(imp::current_thread_path())
    }

    /// Takes ownership of a descriptor received from elsewhere (e.g. over a Unix socket)
    /// after checking that it is a network namespace.
    pub fn from_owned_fd(fd: OwnedFd) -> Result<Self, NetnsError> {
        let what = format!("file descriptor {}", fd.as_raw_fd());
        Self::validate(fd, &what)
    }

    /// Creates a new, unnamed network namespace (only `lo`, down). It is destroyed when
    /// the last descriptor to it closes and no process lives in it, so it cannot leak.
    pub fn create_anonymous() -> Result<Self, NetnsError> {
        let fd = imp::create_anonymous()?;
        Self::validate(fd, "new network namespace")
    }

    fn validate(fd: OwnedFd, what: &str) -> Result<Self, NetnsError> {
        let id = imp::inspect(fd.as_fd(), what)?;
        Ok(Self { fd, id })
    }

    /// The namespace's identity.
    pub fn identity(&self) -> NetnsId {
        self.id
    }

    /// Whether both descriptors refer to the same namespace.
    pub fn same_namespace(&self, other: &NetnsFd) -> bool {
        self.id == other.id
    }

    /// Duplicates the descriptor (both keep the namespace alive).
    pub fn try_clone(&self) -> Result<Self, NetnsError> {
        let fd = self.fd.try_clone().map_err(NetnsError::Clone)?;
        Ok(Self { fd, id: self.id })
    }

    /// Gives up the validated wrapper, e.g. to send the descriptor over a Unix socket.
    pub fn into_owned_fd(self) -> OwnedFd {
        self.fd
    }
}

impl AsFd for NetnsFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for NetnsFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
