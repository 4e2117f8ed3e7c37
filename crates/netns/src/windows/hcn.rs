//! The Host Compute Network calls ambit makes (`spec/windows.md` §1.3, §3.3): read a
//! namespace (its compartment and endpoints), read an endpoint, modify an endpoint's
//! policies. Each wrapper opens, queries or modifies, and closes; returned strings and error
//! records are CoTaskMem UTF-16, copied and freed here. A non-empty error record is a
//! failure even when the HRESULT is success (as hcsshim reads them). What the JSON means is
//! `crate::hns` (namespaces) and `ambit_redirect::hns` (policies), both platform-neutral.

use std::ffi::c_void;
use std::sync::OnceLock;

use windows_sys::Win32::Foundation::{HCN_E_ENDPOINT_NOT_FOUND, HCN_E_NETWORK_NOT_FOUND};
use windows_sys::Win32::System::Com::CoTaskMemFree;
use windows_sys::core::{GUID, HRESULT, PCWSTR, PWSTR};

use super::dll::Dll;
use crate::guid::Guid;
use crate::hns::{self, HnsNamespace, HnsParseError};

/// `HRESULT_FROM_WIN32(ERROR_NOT_FOUND)`: what HCN answers for a namespace that is gone.
const E_NOT_FOUND: HRESULT = 0x8007_0490_u32 as HRESULT;

/// A failed HCN call; names the call and the object.
#[derive(Debug, thiserror::Error)]
pub enum HcnError {
    /// computenetwork.dll or one of its functions is missing (no Containers feature).
    #[error("HNS is not available: {0}")]
    Unavailable(String),
    /// The call failed.
    #[error("{call} {object}: HRESULT {hresult:#010x}{}", record.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    Call {
        /// The HCN function.
        call: &'static str,
        /// The namespace or endpoint.
        object: String,
        /// Its HRESULT.
        hresult: HRESULT,
        /// HNS's error record, if it wrote one.
        record: Option<String>,
    },
    /// HNS answered JSON we cannot read.
    #[error(transparent)]
    Parse(#[from] HnsParseError),
}

impl HcnError {
    /// The namespace or endpoint does not exist (any more).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Call { hresult, .. }
            if [HCN_E_ENDPOINT_NOT_FOUND, HCN_E_NETWORK_NOT_FOUND, E_NOT_FOUND].contains(hresult))
    }
}

type Handle = *mut c_void;
type OpenFn = unsafe extern "system" fn(*const GUID, *mut Handle, *mut PWSTR) -> HRESULT;
type CloseFn = unsafe extern "system" fn(*const c_void) -> HRESULT;
type QueryFn = unsafe extern "system" fn(*const c_void, PCWSTR, *mut PWSTR, *mut PWSTR) -> HRESULT;
type EnumerateFn = unsafe extern "system" fn(PCWSTR, *mut PWSTR, *mut PWSTR) -> HRESULT;
type ModifyFn = unsafe extern "system" fn(*const c_void, PCWSTR, *mut PWSTR) -> HRESULT;

struct Fns {
    open_namespace: OpenFn,
    close_namespace: CloseFn,
    query_namespace: QueryFn,
    open_endpoint: OpenFn,
    close_endpoint: CloseFn,
    query_endpoint: QueryFn,
    modify_endpoint: ModifyFn,
    enumerate_endpoints: EnumerateFn,
}

fn fns() -> Result<&'static Fns, HcnError> {
    static FNS: OnceLock<Result<Fns, String>> = OnceLock::new();
    FNS.get_or_init(|| {
        let lib = Dll::system("computenetwork.dll")?;
        // SAFETY: each type is the signature computenetwork.h declares for that function
        // (the same ones windows-sys binds statically).
        unsafe {
            Ok(Fns {
                open_namespace: lib.function(c"HcnOpenNamespace")?,
                close_namespace: lib.function(c"HcnCloseNamespace")?,
                query_namespace: lib.function(c"HcnQueryNamespaceProperties")?,
                open_endpoint: lib.function(c"HcnOpenEndpoint")?,
                close_endpoint: lib.function(c"HcnCloseEndpoint")?,
                query_endpoint: lib.function(c"HcnQueryEndpointProperties")?,
                modify_endpoint: lib.function(c"HcnModifyEndpoint")?,
                enumerate_endpoints: lib.function(c"HcnEnumerateEndpoints")?,
            })
        }
    })
    .as_ref()
    .map_err(|e| HcnError::Unavailable(e.clone()))
}

fn wide(s: &str) -> Vec<u16> {
    s.encode_utf16().chain(Some(0)).collect()
}

fn win_guid(g: Guid) -> GUID {
    let (data1, data2, data3, data4) = g.fields();
    GUID {
        data1,
        data2,
        data3,
        data4,
    }
}

/// Takes a CoTaskMem string the system returned: copies it and frees it.
fn take(p: PWSTR) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: HCN returns NUL-terminated UTF-16 allocated with CoTaskMemAlloc; we read up to
    // the NUL, then free it exactly once.
    unsafe {
        let len = (0..).take_while(|&i| *p.add(i) != 0).count();
        let s = String::from_utf16_lossy(std::slice::from_raw_parts(p, len));
        CoTaskMemFree(p.cast_const().cast());
        Some(s)
    }
}

fn check(
    call: &'static str,
    object: &dyn std::fmt::Display,
    hr: HRESULT,
    record: PWSTR,
) -> Result<(), HcnError> {
    let record = take(record).and_then(|r| hns::error_record_message(&r));
    if hr < 0 || record.is_some() {
        return Err(HcnError::Call {
            call,
            object: object.to_string(),
            hresult: hr,
            record,
        });
    }
    Ok(())
}

/// An open namespace or endpoint, closed on drop.
struct Opened {
    handle: Handle,
    close: CloseFn,
}

impl Drop for Opened {
    fn drop(&mut self) {
        // SAFETY: a handle the matching open call returned, closed once.
        unsafe { (self.close)(self.handle) };
    }
}

fn open(call: &'static str, f: OpenFn, close: CloseFn, id: Guid) -> Result<Opened, HcnError> {
    let guid = win_guid(id);
    let mut handle: Handle = std::ptr::null_mut();
    let mut record: PWSTR = std::ptr::null_mut();
    // SAFETY: valid pointers to a GUID and two out slots for the duration of the call.
    let hr = unsafe { f(&guid, &mut handle, &mut record) };
    check(call, &id, hr, record)?;
    Ok(Opened { handle, close })
}

fn query(call: &'static str, f: QueryFn, h: &Opened, id: Guid) -> Result<String, HcnError> {
    let q = wide(&hns::properties_query());
    let mut props: PWSTR = std::ptr::null_mut();
    let mut record: PWSTR = std::ptr::null_mut();
    // SAFETY: an open handle, a NUL-terminated query and two out slots.
    let hr = unsafe { f(h.handle, q.as_ptr(), &mut props, &mut record) };
    let props = take(props);
    check(call, &id, hr, record)?;
    Ok(props.unwrap_or_default())
}

/// `HcnOpenNamespace` + `HcnQueryNamespaceProperties` + `HcnCloseNamespace`, parsed.
pub fn namespace(id: Guid) -> Result<HnsNamespace, HcnError> {
    let f = fns()?;
    let h = open("HcnOpenNamespace", f.open_namespace, f.close_namespace, id)?;
    let json = query("HcnQueryNamespaceProperties", f.query_namespace, &h, id)?;
    Ok(hns::parse_namespace(&json)?)
}

/// `HcnOpenEndpoint` + `HcnQueryEndpointProperties` + `HcnCloseEndpoint`: the endpoint's
/// JSON (its `Policies` among it).
pub fn endpoint_properties(id: Guid) -> Result<String, HcnError> {
    let f = fns()?;
    let h = open("HcnOpenEndpoint", f.open_endpoint, f.close_endpoint, id)?;
    query("HcnQueryEndpointProperties", f.query_endpoint, &h, id)
}

/// `HcnOpenEndpoint` + `HcnModifyEndpoint(settings)` + `HcnCloseEndpoint`.
pub fn modify_endpoint(id: Guid, settings: &str) -> Result<(), HcnError> {
    let f = fns()?;
    let h = open("HcnOpenEndpoint", f.open_endpoint, f.close_endpoint, id)?;
    let s = wide(settings);
    let mut record: PWSTR = std::ptr::null_mut();
    // SAFETY: an open handle, NUL-terminated settings and an out slot.
    let hr = unsafe { (f.modify_endpoint)(h.handle, s.as_ptr(), &mut record) };
    check("HcnModifyEndpoint", &id, hr, record)
}

/// `HcnEnumerateEndpoints(query)`: the IDs matching `query` (see [`hns::query_by_id`]).
pub fn enumerate_endpoints(query: &str) -> Result<Vec<Guid>, HcnError> {
    let f = fns()?;
    let q = wide(query);
    let mut out: PWSTR = std::ptr::null_mut();
    let mut record: PWSTR = std::ptr::null_mut();
    // SAFETY: a NUL-terminated query and two out slots.
    let hr = unsafe { (f.enumerate_endpoints)(q.as_ptr(), &mut out, &mut record) };
    let out = take(out);
    check("HcnEnumerateEndpoints", &"(query)", hr, record)?;
    Ok(hns::parse_enumeration(
        &out.unwrap_or_default(),
        "endpoint enumeration",
    )?)
}
