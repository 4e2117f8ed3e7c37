//! Looking functions up in system DLLs at run time (see `windows.rs` for why).

use std::ffi::CStr;

use windows_sys::Win32::Foundation::HMODULE;
use windows_sys::Win32::System::LibraryLoader::{
    GetProcAddress, LOAD_LIBRARY_SEARCH_SYSTEM32, LoadLibraryExW,
};

/// A DLL from the system directory, loaded for the life of the process (never freed: the
/// functions looked up in it are kept in statics).
pub(crate) struct Dll {
    name: &'static str,
    module: HMODULE,
}

// SAFETY: an HMODULE is a process-wide handle; using it from any thread is allowed.
unsafe impl Send for Dll {}
// SAFETY: as above; GetProcAddress is thread-safe.
unsafe impl Sync for Dll {}

impl Dll {
    /// Loads `name` from System32 only (never the application directory or PATH, so a
    /// planted DLL is never picked up).
    pub(crate) fn system(name: &'static str) -> Result<Self, String> {
        let wide: Vec<u16> = name.encode_utf16().chain(Some(0)).collect();
        // SAFETY: `wide` is NUL-terminated UTF-16 that outlives the call; no file handle.
        let module = unsafe {
            LoadLibraryExW(
                wide.as_ptr(),
                std::ptr::null_mut(),
                LOAD_LIBRARY_SEARCH_SYSTEM32,
            )
        };
        if module.is_null() {
            return Err(format!("{name}: {}", std::io::Error::last_os_error()));
        }
        Ok(Self { name, module })
    }

    /// The function `symbol` as a `F`.
    ///
    /// # Safety
    ///
    /// `F` must be an `unsafe extern "system" fn` type matching the function's real
    /// signature.
    pub(crate) unsafe fn function<F: Copy>(&self, symbol: &CStr) -> Result<F, String> {
        // SAFETY: a module we loaded and a NUL-terminated name.
        let f = unsafe { GetProcAddress(self.module, symbol.as_ptr().cast()) };
        match f {
            None => Err(format!(
                "{}!{}: not exported",
                self.name,
                symbol.to_string_lossy()
            )),
            Some(f) => {
                debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of_val(&f));
                // SAFETY: the caller promises `F` is this function's pointer type; function
                // pointers all have the same size.
                Ok(unsafe { std::mem::transmute_copy::<_, F>(&f) })
            }
        }
    }
}
