use super::*;

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

fn service() -> CaService {
    let ca = Arc::new(LocalCa::generate("cluster.local").unwrap());
    let tokens = HashMap::from([
        (
            "node1-token".to_string(),
            Caller::NodeProxy {
                node: "node1".into(),
            },
        ),
        (
            "web-token".to_string(),
            Caller::Workload(id("spiffe://cluster.local/ns/default/sa/web")),
        ),
    ]);
    let authorizer = StaticAuthorizer::new(tokens, |node, identity| {
        node == "node1" && identity.service_account() == "pod1"
    });
    CaService::new(ca, Arc::new(authorizer))
}

fn request(identity: &str, impersonate: Option<&str>) -> IstioCertificateRequest {
    let (csr, _key) = ambit_tls::generate_csr(&id(identity)).unwrap();
    let metadata = impersonate.map(|imp| prost_types::Struct {
        fields: [(
            IMPERSONATED_IDENTITY.to_string(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(imp.into())),
            },
        )]
        .into(),
    });
    IstioCertificateRequest {
        csr,
        validity_duration: 3600,
        metadata,
    }
}

/// (name, bearer token, request, expected identity or gRPC code)
type Case<'a> = (
    &'a str,
    Option<&'a str>,
    IstioCertificateRequest,
    Result<&'a str, tonic::Code>,
);

#[tokio::test]
async fn decisions() {
    let svc = service();
    let pod1 = "spiffe://cluster.local/ns/default/sa/pod1";
    let web = "spiffe://cluster.local/ns/default/sa/web";
    let other = "spiffe://cluster.local/ns/default/sa/other";
    let cases: &[Case] = &[
        (
            "node proxy, pod on its node",
            Some("node1-token"),
            request(pod1, Some(pod1)),
            Ok(pod1),
        ),
        (
            "workload, own identity",
            Some("web-token"),
            request(web, None),
            Ok(web),
        ),
        (
            "node proxy, pod elsewhere",
            Some("node1-token"),
            request(other, Some(other)),
            Err(tonic::Code::PermissionDenied),
        ),
        (
            "node proxy, impersonation differs from CSR",
            Some("node1-token"),
            request(other, Some(pod1)),
            Err(tonic::Code::PermissionDenied),
        ),
        (
            "node proxy without impersonation",
            Some("node1-token"),
            request(pod1, None),
            Err(tonic::Code::PermissionDenied),
        ),
        (
            "workload asks for another identity",
            Some("web-token"),
            request(pod1, None),
            Err(tonic::Code::PermissionDenied),
        ),
        (
            "workload tries to impersonate",
            Some("web-token"),
            request(web, Some(web)),
            Err(tonic::Code::PermissionDenied),
        ),
        (
            "unknown token",
            Some("nope"),
            request(web, None),
            Err(tonic::Code::Unauthenticated),
        ),
        (
            "no token",
            None,
            request(web, None),
            Err(tonic::Code::Unauthenticated),
        ),
        (
            "garbage CSR",
            Some("web-token"),
            IstioCertificateRequest {
                csr: "not a csr".into(),
                ..Default::default()
            },
            Err(tonic::Code::InvalidArgument),
        ),
        (
            "bad impersonated id",
            Some("node1-token"),
            request(pod1, Some("spiffe://cluster.local/ns/default")),
            Err(tonic::Code::InvalidArgument),
        ),
    ];
    for (name, token, req, want) in cases {
        let got = svc.create(*token, req).await;
        match (got, want) {
            (Ok(chain), Ok(identity)) => {
                assert_eq!(chain.len(), 2, "{name}: leaf + root");
                let leaf = ambit_tls::cert::parse_certs_pem(&chain[0]).unwrap();
                let ids = ambit_tls::cert::spiffe_ids_of(&leaf[0]).unwrap();
                assert_eq!(ids, vec![id(identity)], "{name}");
            }
            (Err(status), Err(code)) => assert_eq!(status.code(), *code, "{name}: {status:?}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}
