//! Lookup tables over workloads and services, for the proxy to keep its state in: workloads by
//! uid and by `network/IP`, services by `namespace/hostname` and by VIP, and each service's
//! endpoints (the workloads whose `services` map names it). Values are shared (`Arc`) so
//! readers can hold them without copying; the tables themselves are plain data.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::addr::NetworkAddr;
use crate::names::{NamespacedHostname, WorkloadUid};
use crate::service::Service;
use crate::workload::{PortMap, Workload};

#[derive(Debug, Default, Clone)]
pub struct WorkloadIndex {
    workloads: HashMap<WorkloadUid, Arc<Workload>>,
    /// Last writer wins when two workloads claim an address (as upstream).
    by_addr: HashMap<NetworkAddr, WorkloadUid>,
    services: HashMap<NamespacedHostname, Arc<Service>>,
    by_vip: HashMap<NetworkAddr, NamespacedHostname>,
    /// service → uids of workloads naming it (the service may not be known yet).
    endpoints: HashMap<NamespacedHostname, BTreeSet<WorkloadUid>>,
}

impl WorkloadIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts or replaces a workload (by uid); returns the replaced one.
    pub fn insert_workload(&mut self, workload: Workload) -> Option<Arc<Workload>> {
        let old = self.remove_workload(&workload.uid);
        for addr in workload.network_addrs() {
            self.by_addr.insert(addr, workload.uid.clone());
        }
        for svc in workload.services.keys() {
            self.endpoints
                .entry(svc.clone())
                .or_default()
                .insert(workload.uid.clone());
        }
        self.workloads
            .insert(workload.uid.clone(), Arc::new(workload));
        old
    }

    pub fn remove_workload(&mut self, uid: &WorkloadUid) -> Option<Arc<Workload>> {
        let old = self.workloads.remove(uid)?;
        for addr in old.network_addrs() {
            if self.by_addr.get(&addr) == Some(uid) {
                self.by_addr.remove(&addr);
            }
        }
        for svc in old.services.keys() {
            if let Some(uids) = self.endpoints.get_mut(svc) {
                uids.remove(uid);
                if uids.is_empty() {
                    self.endpoints.remove(svc);
                }
            }
        }
        Some(old)
    }

    pub fn workload(&self, uid: &WorkloadUid) -> Option<&Arc<Workload>> {
        self.workloads.get(uid)
    }

    pub fn workload_by_addr(&self, addr: &NetworkAddr) -> Option<&Arc<Workload>> {
        self.by_addr
            .get(addr)
            .and_then(|uid| self.workloads.get(uid))
    }

    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    /// Inserts or replaces a service (by `namespace/hostname`); returns the replaced one.
    pub fn insert_service(&mut self, service: Service) -> Option<Arc<Service>> {
        let old = self.remove_service(&service.key);
        for vip in &service.vips {
            self.by_vip.insert(vip.clone(), service.key.clone());
        }
        self.services.insert(service.key.clone(), Arc::new(service));
        old
    }

    pub fn remove_service(&mut self, key: &NamespacedHostname) -> Option<Arc<Service>> {
        let old = self.services.remove(key)?;
        for vip in &old.vips {
            if self.by_vip.get(vip) == Some(key) {
                self.by_vip.remove(vip);
            }
        }
        Some(old)
    }

    pub fn service(&self, key: &NamespacedHostname) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    pub fn service_by_vip(&self, vip: &NetworkAddr) -> Option<&Arc<Service>> {
        self.by_vip.get(vip).and_then(|key| self.services.get(key))
    }

    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    /// The workloads behind a service with their port maps, ordered by uid.
    pub fn endpoints<'a>(
        &'a self,
        service: &'a NamespacedHostname,
    ) -> impl Iterator<Item = (&'a Arc<Workload>, &'a PortMap)> + 'a {
        self.endpoints
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(move |uid| {
                let w = self.workloads.get(uid)?;
                Some((w, w.services.get(service)?))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::NetworkMode;

    fn workload(uid: &str, ip: &str, services: &[&str]) -> Workload {
        let id = "spiffe://cluster.local/ns/ns/sa/sa".parse().unwrap();
        let mut w = Workload::new(uid.parse().unwrap(), uid, id);
        w.addresses = vec![ip.parse().unwrap()];
        w.services = services
            .iter()
            .map(|s| (s.parse().unwrap(), PortMap::from([(80, 8080)])))
            .collect();
        w
    }

    fn addr(s: &str) -> NetworkAddr {
        s.parse().unwrap()
    }

    fn uids<'a>(it: impl Iterator<Item = (&'a Arc<Workload>, &'a PortMap)>) -> Vec<String> {
        it.map(|(w, _)| w.uid.to_string()).collect()
    }

    #[test]
    fn workloads_by_uid_and_address() {
        let mut idx = WorkloadIndex::new();
        idx.insert_workload(workload("a", "10.0.0.1", &["ns/svc"]));
        idx.insert_workload(workload("b", "10.0.0.2", &["ns/svc", "ns/other"]));
        let mut host = workload("h", "10.0.0.9", &[]);
        host.network_mode = NetworkMode::HostNetwork;
        idx.insert_workload(host);

        let cases = [
            ("/10.0.0.1", Some("a")),
            ("/10.0.0.2", Some("b")),
            ("/10.0.0.9", None),
            ("net/10.0.0.1", None),
        ];
        for (key, want) in cases {
            assert_eq!(
                idx.workload_by_addr(&addr(key)).map(|w| w.uid.as_str()),
                want,
                "{key}"
            );
        }
        let svc: NamespacedHostname = "ns/svc".parse().unwrap();
        assert_eq!(uids(idx.endpoints(&svc)), ["a", "b"]);

        // Re-inserting `a` with a new address and no services moves both indexes.
        idx.insert_workload(workload("a", "10.0.0.3", &[]));
        assert!(idx.workload_by_addr(&addr("/10.0.0.1")).is_none());
        assert_eq!(
            idx.workload_by_addr(&addr("/10.0.0.3"))
                .map(|w| w.uid.as_str()),
            Some("a")
        );
        assert_eq!(uids(idx.endpoints(&svc)), ["b"]);

        idx.remove_workload(&"b".parse().unwrap());
        assert_eq!(uids(idx.endpoints(&svc)).len(), 0);
        assert!(idx.workload(&"b".parse().unwrap()).is_none());
        assert_eq!(idx.workloads().count(), 2);
    }

    #[test]
    fn services_by_key_and_vip() {
        let mut idx = WorkloadIndex::new();
        let mut s = Service::new("svc", "ns/svc".parse().unwrap());
        s.vips = vec![addr("/10.96.0.1"), addr("remote/10.96.0.1")];
        idx.insert_service(s.clone());
        for (vip, found) in [
            ("/10.96.0.1", true),
            ("remote/10.96.0.1", true),
            ("/10.96.0.2", false),
        ] {
            assert_eq!(idx.service_by_vip(&addr(vip)).is_some(), found, "{vip}");
        }
        s.vips = vec![addr("/10.96.0.2")];
        assert!(idx.insert_service(s).is_some());
        assert!(idx.service_by_vip(&addr("/10.96.0.1")).is_none());
        assert!(idx.service_by_vip(&addr("/10.96.0.2")).is_some());
        assert!(idx.remove_service(&"ns/svc".parse().unwrap()).is_some());
        assert!(idx.service_by_vip(&addr("/10.96.0.2")).is_none());
        assert_eq!(idx.services().count(), 0);
    }
}
