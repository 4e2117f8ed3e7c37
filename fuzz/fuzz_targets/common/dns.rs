//! What ztunnel's DNS proxy does with one raw query short of forwarding it, against a fixed
//! small mesh: classify, then FORMERR, a local answer, or the SERVFAIL a failed forward
//! gives. Shared by `dns_udp` and `dns_tcp` (included with `#[path]`).
//!
//! Checks on every answer: it is a response with the query's id that hickory decodes again;
//! a local answer fits the transport's limit and says NOERROR, authoritative, and (unless
//! truncated) carries the CNAME and every address the resolver returned.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use ambit_model::names::{NamespacedHostname, WorkloadUid};
use ambit_model::{NetworkAddr, Service, SpiffeId, Workload};
use ambit_ztunnel::dns::message::{self, Action, Classified};
use ambit_ztunnel::dns::resolve::{NameConfig, resolve};
use ambit_ztunnel::state::ProxyState;
use hickory_proto::op::{Message, MessageType, ResponseCode};

struct Mesh {
    state: ProxyState,
    client: Arc<Workload>,
}

const CONFIG: NameConfig<'static> = NameConfig {
    cluster_domain: "cluster.local",
    prefered_service_namespace: None,
    ipv6_enabled: true,
};

fn service(ns: &str, host: &str, vips: &[&str]) -> Service {
    let key = NamespacedHostname::new(ns, host).expect("fixed service key");
    let mut s = Service::new(host.split('.').next().unwrap_or(host).to_owned(), key);
    s.vips = vips
        .iter()
        .map(|ip| NetworkAddr::new("", ip.parse::<IpAddr>().expect("fixed VIP")))
        .collect();
    s
}

/// The client pod `client` in `default`, and services in its namespace, another one, a
/// wildcard and an external name.
fn mesh() -> &'static Mesh {
    static MESH: OnceLock<Mesh> = OnceLock::new();
    MESH.get_or_init(|| {
        let uid = WorkloadUid::new("Kubernetes//Pod/default/client").expect("fixed uid");
        let id = SpiffeId::new("cluster.local", "default", "default").expect("fixed identity");
        let mut client = Workload::new(uid, "client".to_owned(), id);
        client.addresses = vec!["10.244.0.9".parse().expect("fixed address")];
        client.node = "node1".into();
        let services = vec![
            service(
                "default",
                "svc1.default.svc.cluster.local",
                &["10.96.0.1", "fd00::1"],
            ),
            service("ns2", "svc2.ns2.svc.cluster.local", &["10.96.0.2"]),
            service("default", "*.wild.example.com", &["10.96.0.3"]),
            service("default", "external.example.org", &["10.96.0.4"]),
        ];
        let state = ProxyState::new();
        state.replace_local(vec![client], services, Vec::new());
        let client = state
            .find_local_workload("client", "default", "default", Some("node1"))
            .expect("the client workload was just inserted");
        Mesh { state, client }
    })
}

/// The proxy's answer to `raw` (`None`: dropped), with `limit` the TCP maximum, or `None`
/// for UDP (the request's own limit).
pub fn answer(raw: &[u8], tcp_limit: Option<usize>) -> Option<Vec<u8>> {
    let Classified::Request(req) = message::classify(raw) else {
        assert!(
            raw.len() < message::HEADER_LEN || message::is_response(raw),
            "a readable query was dropped"
        );
        return None;
    };
    let limit = tcp_limit.unwrap_or_else(|| req.udp_limit());
    let m = mesh();
    let out = match &req.action {
        Action::FormErr => req.error(ResponseCode::FormErr),
        Action::Forward => req.error(ResponseCode::ServFail),
        Action::Local { name, family } => {
            match resolve(&m.state, &CONFIG, &m.client, &name.to_ascii(), *family) {
                None => req.error(ResponseCode::ServFail),
                Some(local) => {
                    let out = req.local_answer(name, &local, limit);
                    assert!(
                        out.len() <= limit,
                        "{} bytes over a {limit} limit",
                        out.len()
                    );
                    let msg = decode(&out);
                    assert_eq!(msg.response_code(), ResponseCode::NoError);
                    assert!(msg.authoritative());
                    if !msg.truncated() {
                        let want = local.addrs.len() + usize::from(local.cname.is_some());
                        assert_eq!(msg.answers().len(), want, "answers of {local:?}");
                    }
                    out
                }
            }
        }
    };
    assert_eq!(message::read_id(&out), Some(req.header.id()));
    assert!(message::is_response(&out));
    let msg = decode(&out);
    assert_eq!(msg.message_type(), MessageType::Response);
    Some(out)
}

fn decode(out: &[u8]) -> Message {
    Message::from_vec(out)
        .unwrap_or_else(|e| panic!("our response {out:02x?} does not decode: {e}"))
}
