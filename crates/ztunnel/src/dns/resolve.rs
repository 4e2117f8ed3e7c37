//! Local name matching (§7): which mesh service, if any, a queried name means for a client
//! pod, and which addresses to answer with. Pure: no sockets, no wire format.
//!
//! Clients send names already expanded by their resolver (`svc1.ns.svc.cluster.local`), bare
//! (`dig svc1`), or expanded once too often (`remote.default` + search domain
//! `default.svc.cluster.local`). So for the pod's synthetic search list
//! `<ns>.svc.<cd>`, `svc.<cd>`, `<cd>` we try, in order:
//!
//! 1. the name as asked;
//! 2. the name with each search domain appended (a bare or partial name);
//! 3. for each search domain the name ends with: the name with it stripped, alone and with
//!    each search domain appended. A match here is answered with a CNAME from the asked
//!    name to the stripped one, so the client learns which name really resolved.
//!
//! Each candidate is tried exactly, then as wildcards (`a.b.c` → `*.b.c`, `*.c`).

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use ambit_model::names::NamespacedHostname;
use ambit_model::service::Visibility;
use ambit_model::{Service, Workload};
use rand::seq::SliceRandom;

use crate::state::ProxyState;

/// Matching settings shared by every pod.
#[derive(Debug, Clone, Copy)]
pub struct NameConfig<'a> {
    pub cluster_domain: &'a str,
    pub prefered_service_namespace: Option<&'a str>,
    pub ipv6_enabled: bool,
}

/// The address family a question asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `A`
    V4,
    /// `AAAA`
    V6,
}

impl Family {
    fn matches(self, ip: &IpAddr) -> bool {
        match self {
            Family::V4 => ip.is_ipv4(),
            Family::V6 => ip.is_ipv6(),
        }
    }
}

/// A locally known name and its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalAnswer {
    /// Set when the name matched only after stripping a search domain: answer with a CNAME
    /// from the asked name to this one, and own the address records by this name.
    pub cname: Option<String>,
    /// Addresses of the asked family, shuffled (empty ⇒ NOERROR without records).
    pub addrs: Vec<IpAddr>,
    /// The service that matched (for logs).
    pub service: NamespacedHostname,
}

/// A name to look up, and the CNAME target to answer with if it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    lookup: String,
    cname: Option<String>,
}

/// Finds the service `qname` means for `client` and its addresses of `family`; `None` when
/// the name is not a visible mesh service (the caller forwards the query).
///
/// `qname` may carry a trailing dot and any letter case.
pub fn resolve(
    state: &ProxyState,
    cfg: &NameConfig<'_>,
    client: &Workload,
    qname: &str,
    family: Family,
) -> Option<LocalAnswer> {
    let qname = normalize(qname)?;
    let search = search_domains(client.namespace(), cfg.cluster_domain);
    for candidate in candidates(&qname, &search) {
        for name in with_wildcards(&candidate.lookup) {
            let Some(service) = pick_service(state.services_by_hostname(&name), client, cfg) else {
                continue;
            };
            let addrs = addresses(state, &service, client, family, cfg.ipv6_enabled);
            return Some(LocalAnswer {
                cname: candidate.cname,
                addrs,
                service: service.key.clone(),
            });
        }
    }
    None
}

/// Lower case, without the root dot; `None` for the root itself.
fn normalize(qname: &str) -> Option<String> {
    let name = qname
        .strip_suffix('.')
        .unwrap_or(qname)
        .to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

/// The synthetic search list of a pod in `namespace` (shared mode).
fn search_domains(namespace: &str, cluster_domain: &str) -> [String; 3] {
    let cd = cluster_domain.trim_matches('.').to_ascii_lowercase();
    [format!("{namespace}.svc.{cd}"), format!("svc.{cd}"), cd]
}

fn candidates(qname: &str, search: &[String]) -> Vec<Candidate> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut push = |lookup: String, cname: Option<String>| {
        if seen.insert(lookup.clone()) {
            out.push(Candidate { lookup, cname });
        }
    };
    push(qname.to_string(), None);
    for domain in search {
        push(format!("{qname}.{domain}"), None);
    }
    for domain in search {
        let Some(stripped) = qname
            .strip_suffix(domain.as_str())
            .and_then(|rest| rest.strip_suffix('.'))
            .filter(|rest| !rest.is_empty())
        else {
            continue;
        };
        push(stripped.to_string(), Some(stripped.to_string()));
        for domain in search {
            push(format!("{stripped}.{domain}"), Some(stripped.to_string()));
        }
    }
    out
}

/// `a.b.c` → `a.b.c`, `*.b.c`, `*.c`.
fn with_wildcards(name: &str) -> impl Iterator<Item = String> + '_ {
    let parents = name
        .match_indices('.')
        .map(move |(i, _)| format!("*{}", &name[i..]));
    std::iter::once(name.to_string()).chain(parents)
}

/// Among same-hostname services the client may see, prefer its own namespace, then the
/// configured preferred namespace, then the canonical one; otherwise the first by key (the
/// state returns them sorted, so the choice is stable).
fn pick_service(
    services: Vec<Arc<Service>>,
    client: &Workload,
    cfg: &NameConfig<'_>,
) -> Option<Arc<Service>> {
    let headless_suffix = format!(".svc.{}", cfg.cluster_domain.trim_matches('.'));
    let visible: Vec<Arc<Service>> = services
        .into_iter()
        .filter(|s| s.visibility == Visibility::Public || s.namespace() == client.namespace())
        // A service without VIPs is only meaningful as a Kubernetes headless service; other
        // VIP-less entries (e.g. ServiceEntries resolved elsewhere) belong to upstream DNS.
        .filter(|s| {
            !s.vips.is_empty()
                || s.hostname()
                    .to_ascii_lowercase()
                    .ends_with(&headless_suffix)
        })
        .collect();
    let by = |pred: &dyn Fn(&Service) -> bool| visible.iter().find(|s| pred(s)).cloned();
    by(&|s| s.namespace() == client.namespace())
        .or_else(|| {
            cfg.prefered_service_namespace
                .and_then(|ns| by(&|s| s.namespace() == ns))
        })
        .or_else(|| by(&|s| s.canonical))
        .or_else(|| visible.first().cloned())
}

/// The service's VIPs (or, headless, its endpoints' pod IPs) of `family` on the client's
/// network, shuffled so clients spread over them.
fn addresses(
    state: &ProxyState,
    service: &Service,
    client: &Workload,
    family: Family,
    ipv6_enabled: bool,
) -> Vec<IpAddr> {
    if family == Family::V6 && !ipv6_enabled {
        return Vec::new();
    }
    let mut addrs: Vec<IpAddr> = if service.vips.is_empty() {
        state
            .endpoints(service)
            .iter()
            .filter(|e| e.workload.network == client.network)
            .flat_map(|e| e.workload.addresses.clone())
            .collect()
    } else {
        service
            .vips
            .iter()
            .filter(|v| v.network == client.network)
            .map(|v| v.ip)
            .collect()
    };
    addrs.retain(|ip| family.matches(ip));
    addrs.sort();
    addrs.dedup();
    addrs.shuffle(&mut rand::rng());
    addrs
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_model::NetworkAddr;
    use ambit_model::identity::SpiffeId;
    use ambit_model::names::WorkloadUid;

    fn workload(uid: &str, ns: &str, network: &str, ips: &[&str]) -> Workload {
        let id = SpiffeId::new("cluster.local", ns, "default").unwrap();
        let mut w = Workload::new(WorkloadUid::new(uid).unwrap(), uid, id);
        w.network = network.to_string();
        w.addresses = ips.iter().map(|ip| ip.parse().unwrap()).collect();
        w
    }

    fn service(ns: &str, host: &str, vips: &[(&str, &str)]) -> Service {
        let key = NamespacedHostname::new(ns, host).unwrap();
        let mut s = Service::new(host.split('.').next().unwrap(), key);
        s.vips = vips
            .iter()
            .map(|(net, ip)| NetworkAddr::new(*net, ip.parse().unwrap()))
            .collect();
        s
    }

    /// The mesh every case runs against; the client is `client` in namespace `default`.
    fn state() -> ProxyState {
        let state = ProxyState::new();
        let mut svcs = vec![
            service(
                "default",
                "svc1.default.svc.cluster.local",
                &[("", "10.0.0.1")],
            ),
            service(
                "default",
                "remote.default.svc.cluster.local",
                &[("", "10.0.0.2"), ("", "fd00::2"), ("other", "10.9.9.9")],
            ),
            service(
                "other",
                "remote.other.svc.cluster.local",
                &[("", "10.0.0.3")],
            ),
            // Same hostname in two namespaces, neither the client's.
            service("ns-a", "shared.example.com", &[("", "10.1.0.1")]),
            service("ns-b", "shared.example.com", &[("", "10.1.0.2")]),
            // Same hostname also in the client's namespace.
            service("ns-a", "mine.example.com", &[("", "10.2.0.1")]),
            service("default", "mine.example.com", &[("", "10.2.0.2")]),
            service("ns-a", "canon.example.com", &[("", "10.3.0.1")]),
            service("ns-c", "canon.example.com", &[("", "10.3.0.2")]),
            service("default", "*.wild.example.com", &[("", "10.4.0.1")]),
            service("default", "headless.default.svc.cluster.local", &[]),
            service("default", "novip.example.com", &[]),
            service(
                "secret",
                "hidden.secret.svc.cluster.local",
                &[("", "10.5.0.1")],
            ),
            service(
                "default",
                "own.default.svc.cluster.local",
                &[("", "10.5.0.2")],
            ),
            service("default", "v6only.example.com", &[("", "fd00::7")]),
        ];
        svcs[7].canonical = false;
        svcs[8].canonical = true;
        for s in &mut svcs {
            if s.hostname().starts_with("hidden") || s.hostname().starts_with("own") {
                s.visibility = Visibility::Namespace;
            }
        }
        let mut pod1 = workload("pod1", "default", "", &["10.244.0.5", "fd00::5"]);
        let mut pod2 = workload("pod2", "default", "", &["10.244.0.6"]);
        let mut far = workload("far", "default", "other", &["10.99.0.1"]);
        let headless =
            NamespacedHostname::new("default", "headless.default.svc.cluster.local").unwrap();
        for w in [&mut pod1, &mut pod2, &mut far] {
            w.services.insert(headless.clone(), Default::default());
        }
        state.replace_local(vec![pod1, pod2, far], svcs, vec![]);
        state
    }

    fn sorted(mut v: Vec<IpAddr>) -> Vec<IpAddr> {
        v.sort();
        v
    }

    /// `None` ⇒ not local (forwarded); else (CNAME target, addresses in any order).
    type Want = Option<(Option<&'static str>, &'static [&'static str])>;
    /// (PREFERED_SERVICE_NAMESPACE, IPV6_ENABLED)
    type Opts = (Option<&'static str>, bool);
    /// (label, query, family, options, expected)
    type Row = (&'static str, &'static str, Family, Opts, Want);

    #[test]
    fn name_matching_table() {
        use Family::{V4, V6};
        const STD: Opts = (None, true);
        const NO_V6: Opts = (None, false);
        const PREFER_A: Opts = (Some("ns-a"), true);
        const PREFER_B: Opts = (Some("ns-b"), true);
        const PREFER_NONE: Opts = (Some("nope"), true);
        #[rustfmt::skip]
        let cases: &[Row] = &[
            ("short name", "svc1", V4, STD, Some((None, &["10.0.0.1"]))),
            ("name.ns", "remote.default", V4, STD, Some((None, &["10.0.0.2"]))),
            ("name.ns of another ns", "remote.other", V4, STD, Some((None, &["10.0.0.3"]))),
            ("name.ns.svc", "remote.other.svc", V4, STD, Some((None, &["10.0.0.3"]))),
            ("FQDN, root dot, mixed case", "Svc1.Default.svc.cluster.local.", V4, STD,
                Some((None, &["10.0.0.1"]))),
            ("search domain twice → CNAME", "remote.default.default.svc.cluster.local", V4, STD,
                Some((Some("remote.default"), &["10.0.0.2"]))),
            ("external + search domain → CNAME", "shared.example.com.default.svc.cluster.local",
                V4, STD, Some((Some("shared.example.com"), &["10.1.0.1"]))),
            ("wildcard", "a.wild.example.com", V4, STD, Some((None, &["10.4.0.1"]))),
            ("deep wildcard", "x.y.wild.example.com", V4, STD, Some((None, &["10.4.0.1"]))),
            ("wildcard is not its apex", "wild.example.com", V4, STD, None),
            ("client namespace first", "mine.example.com", V4, PREFER_A,
                Some((None, &["10.2.0.2"]))),
            ("preferred namespace next", "shared.example.com", V4, PREFER_B,
                Some((None, &["10.1.0.2"]))),
            ("canonical next", "canon.example.com", V4, PREFER_NONE, Some((None, &["10.3.0.2"]))),
            ("stable first otherwise", "shared.example.com", V4, STD, Some((None, &["10.1.0.1"]))),
            ("headless → pod IPs on client network", "headless", V4, STD,
                Some((None, &["10.244.0.5", "10.244.0.6"]))),
            ("headless AAAA", "headless.default.svc.cluster.local", V6, STD,
                Some((None, &["fd00::5"]))),
            ("VIP-less non-cluster service ignored", "novip.example.com", V4, STD, None),
            ("namespace-visible, other ns", "hidden.secret", V4, STD, None),
            ("namespace-visible, own ns", "own", V4, STD, Some((None, &["10.5.0.2"]))),
            ("AAAA of dual VIPs", "remote.default", V6, STD, Some((None, &["fd00::2"]))),
            ("known name, no AAAA → empty", "svc1", V6, STD, Some((None, &[]))),
            ("v6-only service, A → empty", "v6only.example.com", V4, STD, Some((None, &[]))),
            ("ipv6 disabled → empty AAAA", "remote.default", V6, NO_V6, Some((None, &[]))),
            ("unknown name", "google.com", V4, STD, None),
            ("unknown + search domain", "google.com.default.svc.cluster.local", V4, STD, None),
            ("root", ".", V4, STD, None),
        ];
        let state = state();
        let client = workload("client", "default", "", &["10.244.0.9"]);
        for (label, query, family, (prefered, ipv6), want) in cases {
            let cfg = NameConfig {
                cluster_domain: "cluster.local",
                prefered_service_namespace: *prefered,
                ipv6_enabled: *ipv6,
            };
            let got =
                resolve(&state, &cfg, &client, query, *family).map(|a| (a.cname, sorted(a.addrs)));
            let want = want.map(|(cname, ips)| {
                let ips = ips.iter().map(|ip| ip.parse().unwrap()).collect();
                (cname.map(str::to_string), sorted(ips))
            });
            assert_eq!(got, want, "case {label:?} ({query})");
        }
    }

    #[test]
    fn client_network_selects_vips() {
        let state = state();
        let client = workload("client", "default", "other", &["10.99.0.9"]);
        let cfg = NameConfig {
            cluster_domain: "cluster.local",
            prefered_service_namespace: None,
            ipv6_enabled: true,
        };
        let got = resolve(&state, &cfg, &client, "remote.default", Family::V4).unwrap();
        assert_eq!(got.addrs, vec!["10.9.9.9".parse::<IpAddr>().unwrap()]);
        let got = resolve(&state, &cfg, &client, "headless", Family::V4).unwrap();
        assert_eq!(got.addrs, vec!["10.99.0.1".parse::<IpAddr>().unwrap()]);
    }

    /// Hole: every candidate name and wildcard parent scanned every service, so one query
    /// (a miss walks them all) cost time proportional to the number of services. Timing
    /// compares the best of many runs; the threshold is far from both the indexed ratio (~1)
    /// and the scanning one (hundreds).
    #[test]
    fn query_cost_does_not_grow_with_the_service_count() {
        let client = workload("client", "default", "", &["10.244.0.9"]);
        let cfg = NameConfig {
            cluster_domain: "cluster.local",
            prefered_service_namespace: None,
            ipv6_enabled: true,
        };
        let best_of = |n: usize| {
            let svcs = (0..n)
                .map(|i| {
                    let ns = format!("ns{}", i % 100);
                    let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
                    service(&ns, &format!("svc{i}.{ns}.svc.cluster.local"), &[("", &ip)])
                })
                .collect();
            let state = ProxyState::new();
            state.replace_local(vec![], svcs, vec![]);
            (0..20)
                .map(|_| {
                    let started = std::time::Instant::now();
                    for _ in 0..10 {
                        std::hint::black_box(resolve(
                            &state,
                            &cfg,
                            &client,
                            "a.b.c.d.example.org.default.svc.cluster.local",
                            Family::V4,
                        ));
                    }
                    started.elapsed()
                })
                .min()
                .unwrap()
        };
        let (small, large) = (best_of(10), best_of(10_000));
        assert!(
            large < small * 10,
            "10 services: {small:?}, 10,000 services: {large:?} per 10 queries"
        );
    }

    #[test]
    fn candidate_order() {
        let search = search_domains("ns", "cluster.local");
        let got: Vec<_> = candidates("a.ns.svc.cluster.local", &search)
            .into_iter()
            .map(|c| (c.lookup, c.cname))
            .collect();
        let first = [
            ("a.ns.svc.cluster.local", None),
            ("a.ns.svc.cluster.local.ns.svc.cluster.local", None),
            ("a.ns.svc.cluster.local.svc.cluster.local", None),
            ("a.ns.svc.cluster.local.cluster.local", None),
            ("a", Some("a")),
        ];
        for (i, (lookup, cname)) in first.iter().enumerate() {
            assert_eq!(
                got[i],
                (lookup.to_string(), cname.map(str::to_string)),
                "index {i}"
            );
        }
        let wild: Vec<_> = with_wildcards("a.b.c").collect();
        assert_eq!(wild, ["a.b.c", "*.b.c", "*.c"]);
    }
}
