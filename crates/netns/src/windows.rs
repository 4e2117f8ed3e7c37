//! The Windows half of the platform switch (`spec/windows.md` §1.5, §2.1, §3.4, §5): socket
//! options as Windows has them, the real [`CompartmentOps`] (`SystemCompartments`), the
//! socket factory that creates sockets inside a pod's compartment, the HCN calls (`hcn`) and
//! the named-pipe ZDS transport (`pipe`).
//!
//! The compartment functions (iphlpapi.dll) and the HCN functions (computenetwork.dll) are
//! looked up when first used instead of imported: a static import makes the whole process
//! fail to start where they are missing (a host without the Containers feature has no
//! computenetwork.dll; Wine, where the tests run, has neither), while a lookup turns that
//! into an error naming the function.

// Loaded through `#[path]`, so children are named from `src/`.
#[path = "windows/hcn.rs"]
pub mod hcn;
#[path = "windows/pipe.rs"]
pub mod pipe;

#[path = "windows/dll.rs"]
mod dll;

use std::io;
use std::sync::{Arc, OnceLock};

use socket2::{Domain, Protocol, Socket, Type};

use crate::compartment::{CompartmentError, CompartmentOps, CompartmentThread};
use crate::socket::{SocketError, SocketFactory, SocketOptions, create_socket};

/// Whether this process runs under Wine (its ntdll exports `wine_get_version`): for tests
/// that assert a Windows behaviour Wine does not reproduce.
pub fn under_wine() -> bool {
    dll::Dll::system("ntdll.dll").is_ok_and(|ntdll| {
        // SAFETY: only whether the symbol exists is used; the pointer is never called.
        unsafe { ntdll.function::<unsafe extern "system" fn()>(c"wine_get_version") }.is_ok()
    })
}

/// What a socket handle is here: a `SOCKET`.
pub(crate) use std::os::windows::io::AsSocket;

/// Windows has no per-socket port range; its port choice is its own.
pub(crate) fn set_sequential_port_search(_sock: &Socket) -> io::Result<bool> {
    Ok(false)
}

/// Windows picks an ephemeral port at `connect` for a socket bound to port 0 anyway.
pub(crate) fn set_bind_address_no_port(_sock: &Socket) -> io::Result<()> {
    Ok(())
}

/// Marks and transparent sockets do not exist on Windows: loop avoidance is the policies'
/// `UserSID` exemption, and original-source binding is not possible (`spec/windows.md`
/// §3.4). `SO_REUSEPORT` hand-off is refused as upstream does (`INPOD_PORT_REUSE`).
pub(crate) fn apply_options(
    _sock: &Socket,
    _ipv6: bool,
    opts: &SocketOptions,
    mark: Option<u32>,
) -> Result<(), SocketError> {
    crate::socket::refuse_linux_options(opts, mark)
}

/// `SO_ORIGINAL_DST` at level `SOL_IP` (HNS's WFP proxy policy records it, as Envoy's
/// Windows original-destination filter reads it); IPv4 first, then IPv6.
pub(crate) fn original_dst(sock: &socket2::SockRef<'_>) -> io::Result<std::net::SocketAddr> {
    let addr = match sock.original_dst_v4() {
        Ok(a) => a,
        Err(_) => sock.original_dst_v6()?,
    };
    addr.as_socket()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "original dst is not IP"))
}

pub(crate) fn is_transparent(_sock: &socket2::SockRef<'_>, _ipv6: bool) -> io::Result<bool> {
    Ok(false)
}

type GetCompartmentFn = unsafe extern "system" fn() -> u32;
type SetCompartmentFn = unsafe extern "system" fn(u32) -> u32;

struct CompartmentFns {
    get: GetCompartmentFn,
    set: SetCompartmentFn,
}

fn compartment_fns() -> Result<&'static CompartmentFns, CompartmentError> {
    static FNS: OnceLock<Result<CompartmentFns, String>> = OnceLock::new();
    FNS.get_or_init(|| {
        let lib = dll::Dll::system("iphlpapi.dll").map_err(|e| e.to_string())?;
        // SAFETY: both are documented in netioapi.h with exactly these signatures:
        // `NET_IF_COMPARTMENT_ID GetCurrentThreadCompartmentId(void)` and
        // `NTSTATUS/DWORD SetCurrentThreadCompartmentId(NET_IF_COMPARTMENT_ID)` (u32 both).
        unsafe {
            Ok(CompartmentFns {
                get: lib.function(c"GetCurrentThreadCompartmentId")?,
                set: lib.function(c"SetCurrentThreadCompartmentId")?,
            })
        }
    })
    .as_ref()
    .map_err(|e| CompartmentError::Unavailable(e.clone()))
}

/// The calling thread's compartment through `GetCurrentThreadCompartmentId` /
/// `SetCurrentThreadCompartmentId` (Microsoft documents the latter as "reserved"; upstream
/// relies on it, and so must we until HNS offers another way).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemCompartments;

impl CompartmentOps for SystemCompartments {
    fn current(&self) -> Result<u32, CompartmentError> {
        let fns = compartment_fns()?;
        // SAFETY: a plain call without arguments, resolved with its documented signature.
        let id = unsafe { (fns.get)() };
        if id == 0 {
            return Err(CompartmentError::Current(io::Error::last_os_error()));
        }
        Ok(id)
    }

    fn set(&self, id: u32) -> Result<(), CompartmentError> {
        let fns = compartment_fns()?;
        // SAFETY: takes a compartment number by value, resolved with its documented signature.
        let rc = unsafe { (fns.set)(id) };
        if rc != 0 {
            return Err(CompartmentError::Enter {
                id,
                // A Win32 error code (NO_ERROR = 0 on success).
                source: io::Error::from_raw_os_error(rc as i32),
            });
        }
        Ok(())
    }
}

/// Creates sockets inside one network compartment (a pod's), on the process's dedicated
/// compartment thread; everything after `socket()` runs on the caller's thread.
#[derive(Debug, Clone)]
pub struct CompartmentSocketFactory {
    compartment: u32,
    thread: CompartmentThread,
}

impl CompartmentSocketFactory {
    /// A factory for `compartment` whose work runs on `thread`.
    pub fn new(compartment: u32, thread: CompartmentThread) -> Self {
        Self {
            compartment,
            thread,
        }
    }

    /// The process's compartment thread over [`SystemCompartments`], started on first use.
    pub fn system_thread() -> Result<CompartmentThread, CompartmentError> {
        static THREAD: OnceLock<Result<CompartmentThread, String>> = OnceLock::new();
        THREAD
            .get_or_init(|| {
                CompartmentThread::spawn(Arc::new(SystemCompartments)).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(CompartmentError::Thread)
    }

    /// The compartment sockets are created in.
    pub fn compartment(&self) -> u32 {
        self.compartment
    }
}

impl SocketFactory for CompartmentSocketFactory {
    fn new_socket(
        &self,
        domain: Domain,
        ty: Type,
        protocol: Protocol,
    ) -> Result<Socket, SocketError> {
        self.thread.run(self.compartment, move || {
            create_socket(domain, ty, protocol)
        })?
    }
}
