//! Loopback gRPC calls through the generated client and server, pinning the service
//! paths upstream peers use (`/istio.v1.auth.IstioCertificateService/CreateCertificate`,
//! `/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`).

use std::net::SocketAddr;
use std::pin::Pin;

use ambit_proto::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use ambit_proto::ca::istio_certificate_service_server::{
    self as ca_server, IstioCertificateService, IstioCertificateServiceServer,
};
use ambit_proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambit_proto::discovery::aggregated_discovery_service_server::{
    self as ads_server, AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use ambit_proto::{ca, discovery, workload};
use futures_util::{Stream, StreamExt, stream};
use tokio::sync::oneshot;
use tonic::transport::Server;
use tonic::transport::server::{Router, TcpIncoming};
use tonic::{Request, Response, Status, Streaming};

use crate::samples as s;

/// Signs nothing: answers with the CSR as the "leaf" so the test sees its request.
struct EchoCa;

#[tonic::async_trait]
impl IstioCertificateService for EchoCa {
    async fn create_certificate(
        &self,
        request: Request<ca::IstioCertificateRequest>,
    ) -> Result<Response<ca::IstioCertificateResponse>, Status> {
        let request = request.into_inner();
        Ok(Response::new(ca::IstioCertificateResponse {
            cert_chain: vec![request.csr, request.validity_duration.to_string()],
        }))
    }
}

/// Answers the first request of a stream with one resource of the requested type,
/// using the subscribe list as the nonce so the test sees what arrived.
struct OneShotAds;

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<discovery::DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for OneShotAds {
    type DeltaAggregatedResourcesStream = ResponseStream;

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<discovery::DeltaDiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("no request"))?;
        let response = discovery::DeltaDiscoveryResponse {
            type_url: first.type_url,
            nonce: first.resource_names_subscribe.join(","),
            resources: vec![s::resource()],
            ..Default::default()
        };
        Ok(Response::new(Box::pin(stream::iter([Ok(response)]))))
    }
}

/// Serves `router` on an ephemeral loopback port until the returned sender is dropped.
async fn serve(router: Router) -> (SocketAddr, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("bound address");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        router.serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
            let _ = stopped.await;
        }),
    );
    (addr, stop)
}

#[test]
fn service_names_match_upstream() {
    let cases = [
        (
            ca_server::SERVICE_NAME,
            "istio.v1.auth.IstioCertificateService",
        ),
        (
            ads_server::SERVICE_NAME,
            "envoy.service.discovery.v3.AggregatedDiscoveryService",
        ),
        (
            ambit_proto::cri::runtime_service_server::SERVICE_NAME,
            "runtime.v1.RuntimeService",
        ),
    ];
    for (generated, upstream) in cases {
        assert_eq!(generated, upstream);
    }
}

#[tokio::test]
async fn certificate_request_reaches_the_server() {
    let (addr, _stop) =
        serve(Server::builder().add_service(IstioCertificateServiceServer::new(EchoCa))).await;
    let mut client = IstioCertificateServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let chain = client
        .create_certificate(s::certificate_request())
        .await
        .unwrap()
        .into_inner()
        .cert_chain;
    assert_eq!(
        chain,
        vec![s::certificate_request().csr, "86400".to_owned()]
    );
}

#[tokio::test]
async fn delta_ads_stream_carries_requests_and_responses() {
    let (addr, _stop) =
        serve(Server::builder().add_service(AggregatedDiscoveryServiceServer::new(OneShotAds)))
            .await;
    let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let request = discovery::DeltaDiscoveryRequest {
        type_url: ambit_proto::ADDRESS_TYPE_URL.into(),
        resource_names_subscribe: vec!["a".into(), "b".into()],
        ..s::delta_request()
    };
    let mut responses = client
        .delta_aggregated_resources(stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.next().await.unwrap().unwrap();
    assert_eq!(response.type_url, ambit_proto::ADDRESS_TYPE_URL);
    assert_eq!(response.nonce, "a,b");
    let address: workload::Address = response.resources[0]
        .resource
        .as_ref()
        .unwrap()
        .to_msg()
        .unwrap();
    assert_eq!(
        address.r#type,
        Some(workload::address::Type::Workload(s::workload()))
    );
}
