//! ZDS over a Windows named pipe (`spec/windows.md` §2.1): the agent serves, ztunnel
//! connects; one ZDS message per pipe message, nothing rides along.
//!
//! The server side is stricter than upstream's placeholder: every instance is message mode
//! in both directions, refuses remote clients, admits only SYSTEM and Administrators (a
//! protected DACL, `D:P(A;;GA;;;SY)(A;;GA;;;BA)`; upstream grants every authenticated user),
//! and the first instance must be new (`FILE_FLAG_FIRST_PIPE_INSTANCE`), so another process
//! that got the name first makes `bind` fail instead of receiving ztunnel. Buffers are
//! [`ZDS_PIPE_BUFFER`] both ways, and both ends read into that much: a valid message (under
//! 1 KiB) is always read whole. A message longer than the caller's buffer is
//! [`TransportError::Truncated`] and the connection is unusable afterwards (its remainder would
//! read as another message), so both ends drop it, as they do on Linux.

use std::ffi::c_void;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::windows::named_pipe::{
    ClientOptions, NamedPipeClient, NamedPipeServer, PipeMode, ServerOptions,
};
use windows_sys::Win32::Foundation::{HLOCAL, LocalFree};
use windows_sys::Win32::Security::Authorization::{
    ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
};
use windows_sys::Win32::Security::{PSECURITY_DESCRIPTOR, SECURITY_ATTRIBUTES};

use crate::zds::{NoAttachment, TransportError};

/// Pipe buffer and read size (`ambit_contract::windows::ZDS_PIPE_BUFFER`).
pub const ZDS_PIPE_BUFFER: usize = 64 * 1024;

/// Protected DACL: GENERIC_ALL for LocalSystem and the built-in Administrators, nobody else.
pub const ZDS_PIPE_SDDL: &str = "D:P(A;;GA;;;SY)(A;;GA;;;BA)";

#[derive(Debug)]
enum End {
    Server(NamedPipeServer),
    Client(NamedPipeClient),
}

/// A connected ZDS pipe (either end). Must be created and used inside a tokio runtime.
#[derive(Debug)]
pub struct PipeConn {
    end: End,
    buf: Mutex<Vec<u8>>,
    broken: AtomicBool,
}

macro_rules! on_end {
    ($self:expr, $p:ident => $e:expr) => {
        match &$self.end {
            End::Server($p) => $e,
            End::Client($p) => $e,
        }
    };
}

impl PipeConn {
    fn new(end: End) -> Self {
        Self {
            end,
            buf: Mutex::new(vec![0; ZDS_PIPE_BUFFER]),
            broken: AtomicBool::new(false),
        }
    }

    /// Opens the pipe named `path` (e.g. `\\.\pipe\istio-zds`) in message read mode. Fails
    /// at once when there is no server or every instance is busy; retry later.
    pub async fn connect(path: &Path) -> Result<Self, TransportError> {
        let client = ClientOptions::new()
            .pipe_mode(PipeMode::Message)
            .open(path.as_os_str())
            .map_err(|source| TransportError::Connect {
                path: path.to_owned(),
                source,
            })?;
        Ok(Self::new(End::Client(client)))
    }

    /// Sends one message.
    pub async fn send(&self, data: &[u8]) -> Result<(), TransportError> {
        loop {
            on_end!(self, p => p.writable().await).map_err(TransportError::Send)?;
            match on_end!(self, p => p.try_write(data)) {
                Ok(n) if n == data.len() => return Ok(()),
                Ok(sent) => {
                    return Err(TransportError::ShortSend {
                        sent,
                        len: data.len(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(TransportError::Send(e)),
            }
        }
    }

    /// Sends one message; nothing can ride along on a pipe.
    pub async fn send_with_fds(
        &self,
        data: &[u8],
        fds: &[NoAttachment],
    ) -> Result<(), TransportError> {
        match fds.first() {
            Some(never) => match *never {},
            None => self.send(data).await,
        }
    }

    /// Receives one message into `buf`: its length (0 when the peer closed). Longer than
    /// `buf` (which must be smaller than 4 KiB, the pipe layer's first read) is an error and
    /// ends the connection's usefulness. Cancel-safe: nothing is consumed unless the future
    /// completes.
    pub async fn recv_with_fd(
        &self,
        buf: &mut [u8],
    ) -> Result<(usize, Option<NoAttachment>), TransportError> {
        if self.broken.load(Ordering::SeqCst) {
            return Err(TransportError::Desynchronised);
        }
        loop {
            on_end!(self, p => p.readable().await).map_err(TransportError::Recv)?;
            let mut inner = self
                .buf
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match on_end!(self, p => p.try_read(&mut inner)) {
                Ok(n) if n > buf.len() => {
                    self.broken.store(true, Ordering::SeqCst);
                    return Err(TransportError::Truncated(buf.len()));
                }
                Ok(n) => {
                    buf[..n].copy_from_slice(&inner[..n]);
                    return Ok((n, None));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok((0, None)),
                Err(e) => return Err(TransportError::Recv(e)),
            }
        }
    }
}

/// The `SECURITY_ATTRIBUTES` of [`ZDS_PIPE_SDDL`], freed on drop.
struct Security {
    descriptor: PSECURITY_DESCRIPTOR,
    attrs: SECURITY_ATTRIBUTES,
}

impl Security {
    fn new() -> Result<Self, TransportError> {
        let sddl: Vec<u16> = ZDS_PIPE_SDDL.encode_utf16().chain(Some(0)).collect();
        let mut descriptor: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
        // SAFETY: a NUL-terminated SDDL string and an out pointer; on success the system
        // allocates the descriptor with LocalAlloc, which `Drop` frees.
        let ok = unsafe {
            ConvertStringSecurityDescriptorToSecurityDescriptorW(
                sddl.as_ptr(),
                SDDL_REVISION_1,
                &mut descriptor,
                std::ptr::null_mut(),
            )
        };
        if ok == 0 || descriptor.is_null() {
            return Err(TransportError::Security {
                sddl: ZDS_PIPE_SDDL,
                source: io::Error::last_os_error(),
            });
        }
        Ok(Self {
            descriptor,
            attrs: SECURITY_ATTRIBUTES {
                nLength: std::mem::size_of::<SECURITY_ATTRIBUTES>() as u32,
                lpSecurityDescriptor: descriptor,
                bInheritHandle: 0,
            },
        })
    }
}

impl Drop for Security {
    fn drop(&mut self) {
        // SAFETY: allocated by ConvertStringSecurityDescriptorToSecurityDescriptorW with
        // LocalAlloc and freed exactly once, here.
        unsafe { LocalFree(self.descriptor as HLOCAL) };
    }
}

/// The listening end: one waiting pipe instance at a time; `accept` hands the connected one
/// out and creates the next.
#[derive(Debug)]
pub struct PipeListener {
    path: PathBuf,
    next: tokio::sync::Mutex<NamedPipeServer>,
}

fn create_instance(path: &Path, first: bool) -> Result<NamedPipeServer, TransportError> {
    let security = Security::new()?;
    let mut attrs = security.attrs;
    let buffer = ZDS_PIPE_BUFFER as u32;
    let mut opts = ServerOptions::new();
    opts.pipe_mode(PipeMode::Message)
        .access_inbound(true)
        .access_outbound(true)
        .reject_remote_clients(true)
        .first_pipe_instance(first)
        .in_buffer_size(buffer)
        .out_buffer_size(buffer);
    // SAFETY: `attrs` is a valid SECURITY_ATTRIBUTES whose descriptor (owned by `security`)
    // lives until after the call; CreateNamedPipeW copies what it needs.
    let server = unsafe {
        opts.create_with_security_attributes_raw(
            path.as_os_str(),
            std::ptr::from_mut(&mut attrs).cast::<c_void>(),
        )
    };
    drop(security);
    server.map_err(|source| TransportError::Listen {
        path: path.to_owned(),
        source,
    })
}

impl PipeListener {
    /// Creates the first instance of the pipe `path`; fails if the name is already served.
    /// Must be called inside a tokio runtime.
    pub fn bind(path: &Path) -> Result<Self, TransportError> {
        Ok(Self {
            path: path.to_owned(),
            next: tokio::sync::Mutex::new(create_instance(path, true)?),
        })
    }

    /// Waits for the next client.
    pub async fn accept(&self) -> Result<PipeConn, TransportError> {
        let mut next = self.next.lock().await;
        next.connect().await.map_err(TransportError::Accept)?;
        let fresh = create_instance(&self.path, false)?;
        let connected = std::mem::replace(&mut *next, fresh);
        Ok(PipeConn::new(End::Server(connected)))
    }

    /// The pipe name.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
