//! VMs and bare hosts in the ambient mesh (`docs/vm.md`).
//!
//! Istio onboards a VM with the files `istioctl x workload entry configure` writes:
//! `cluster.env`, `mesh.yaml`, `hosts`, `root-cert.pem` and `istio-token`. This crate owns
//! reading that bundle into typed settings ([`Bundle`]): who the VM is (namespace, service
//! account, labels), where its control plane is, and what its host-level redirection captures
//! (a [`ambit_redirect::vm::VmRedirectConfig`]). It does no I/O beyond reading the bundle's
//! files; `ambit vm up` applies the result.

// VMs are Linux hosts: off Unix (the Windows build) the crate is empty.
#![cfg(unix)]
#![forbid(unsafe_code)]

pub mod bundle;
pub mod configure;
mod signal;
pub mod up;

pub use bundle::{Bundle, BundleError, BundleErrors, Identity};
