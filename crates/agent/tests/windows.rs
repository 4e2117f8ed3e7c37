//! The agent's ZDS server over the Windows named pipe, against a client built like ztunnel's
//! (the same transport, `ambit_netns::zds`, and the same codec, `ambit_contract::zds`):
//! cross-built for x86_64-pc-windows-gnu and run under Wine by `scripts/test`. The pod's HNS
//! namespace travels in `WorkloadInfo.windows_namespace` (`spec/windows.md` §2).

#![cfg(windows)]
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use ambit_agent::platform::PodNamespace;
use ambit_agent::zds::{ZdsConfig, ZdsError, ZdsPod, ZdsServer};
use ambit_contract::zds::{self as wire, MAX_MESSAGE, Request, WindowsNamespace};
use ambit_netns::zds::Conn;
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(10);
const GUID: &str = "0b1c5a7e-3d2f-4e6a-9b8c-1d2e3f405162";

fn pod(uid: &str, compartment: Option<u32>) -> ZdsPod {
    ZdsPod {
        uid: uid.parse().unwrap(),
        name: format!("name-{uid}"),
        namespace: "ns".into(),
        service_account: "sa".into(),
        netns: compartment.map(|compartment| PodNamespace {
            guid: GUID.parse().unwrap(),
            compartment,
        }),
    }
}

/// What the client saw, as (kind, uid, windows_namespace).
type Seen = (&'static str, Option<String>, Option<WindowsNamespace>);

/// Reads one request and answers it (`nack`: with that error).
async fn answer(conn: &Conn, nack: Option<&str>) -> Seen {
    let mut buf = [0u8; MAX_MESSAGE];
    let (n, _) = tokio::time::timeout(WAIT, conn.recv_with_fd(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let req = wire::decode_request_windows(&buf[..n]).unwrap();
    let seen = (
        req.kind(),
        req.uid().map(|u| u.as_str().to_owned()),
        match &req {
            Request::Add { netns, .. } => Some(netns.clone()),
            _ => None,
        },
    );
    conn.send(&wire::encode_ack(nack)).await.unwrap();
    seen
}

#[tokio::test]
async fn a_named_pipe_round_trip_between_the_agent_and_a_ztunnel_client() {
    let path = PathBuf::from(format!(r"\\.\pipe\ambit-zds-test-{}", std::process::id()));
    let listener = ZdsServer::bind(&path).unwrap();
    let server = ZdsServer::new(
        ZdsConfig {
            accept_interval: Duration::from_millis(1),
            ..ZdsConfig::default()
        },
        None,
    );
    server.remember(pod("a", Some(7)));
    server.remember(pod("b", None));
    let (stop, stop_rx) = watch::channel(false);
    let serving = tokio::spawn({
        let server = server.clone();
        async move { server.serve(listener, stop_rx).await }
    });

    let zt = Conn::connect(&path).await.unwrap();
    zt.send(&wire::encode_hello()).await.unwrap();
    let wns = |id| {
        Some(WindowsNamespace {
            id,
            guid: GUID.into(),
        })
    };
    // The snapshot: Add with the namespace in the payload, Keep for the pod without one.
    assert_eq!(
        answer(&zt, None).await,
        ("AddWorkload", Some("a".into()), wns(7))
    );
    assert_eq!(
        answer(&zt, None).await,
        ("KeepWorkload", Some("b".into()), None)
    );
    assert_eq!(answer(&zt, None).await, ("SnapshotSent", None, None));

    // Updates: an Add of a pod whose compartment does not exist yet, NACKed as ztunnel
    // does while it waits; then acked; then a Del.
    let add = tokio::spawn({
        let server = server.clone();
        async move { server.add(pod("c", Some(0))).await }
    });
    assert_eq!(
        answer(&zt, Some("compartment not there yet")).await,
        ("AddWorkload", Some("c".into()), wns(0))
    );
    let err = add.await.unwrap().unwrap_err();
    assert!(
        matches!(err, ZdsError::Nack(ref e) if e.contains("compartment")),
        "{err}"
    );

    let add = tokio::spawn({
        let server = server.clone();
        async move { server.add(pod("c", Some(9))).await }
    });
    assert_eq!(
        answer(&zt, None).await,
        ("AddWorkload", Some("c".into()), wns(9))
    );
    add.await.unwrap().unwrap();

    let del = tokio::spawn({
        let server = server.clone();
        async move { server.del("c").await }
    });
    assert_eq!(
        answer(&zt, None).await,
        ("DelWorkload", Some("c".into()), None)
    );
    del.await.unwrap().unwrap();
    assert_eq!(server.connected(), 1);

    // ztunnel goes away: the server notices and forgets the connection.
    drop(zt);
    ambit_testkit::eventually("the server to forget the gone ztunnel", WAIT, || {
        server.connected() == 0
    })
    .await;
    stop.send(true).unwrap();
    serving.await.unwrap();
}

#[path = "support/fake_cri.rs"]
mod fake_cri;

/// A server end of the named pipe, as tonic's server wants its connections.
struct PipeConn(tokio::net::windows::named_pipe::NamedPipeServer);

impl tonic::transport::server::Connected for PipeConn {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl tokio::io::AsyncRead for PipeConn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for PipeConn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// The CRI client over a named pipe (containerd's transport on Windows) against the fake
/// runtime served on a pipe: the same lookup as on Linux, the transport Windows'.
#[tokio::test]
async fn the_cri_client_reads_sandboxes_over_a_named_pipe() {
    use ambit_agent::windows::sandboxes::{CONTAINERD_PIPE, CriClient, SkipReason};
    use fake_cri::{Answer, FakeRuntime, Sandbox, info_naming};
    use tokio::net::windows::named_pipe::ServerOptions;

    assert_eq!(CONTAINERD_PIPE, r"\\.\pipe\containerd-containerd");
    let name = format!(r"\\.\pipe\ambit-cri-test-{}", std::process::id());
    let first = ServerOptions::new()
        .first_pipe_instance(true)
        .create(&name)
        .unwrap();
    let incoming =
        futures_util::stream::unfold((first, name.clone()), |(server, name)| async move {
            let connected = server.connect().await.map(|()| PipeConn(server));
            let next = ServerOptions::new().create(&name).unwrap();
            Some((connected, (next, name)))
        });
    let runtime = FakeRuntime::new(vec![
        Sandbox {
            id: "a-1",
            uid: Some("a"),
            ready: true,
            created_at: 1,
            answer: info_naming(GUID),
        },
        Sandbox {
            id: "b-1",
            uid: Some("b"),
            ready: true,
            created_at: 1,
            answer: Answer::Info(r#"{"runtimeSpec":{"windows":{}}}"#.into()),
        },
    ]);
    let service = runtime.service();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await
    });

    let mut client = CriClient::connect(std::path::Path::new(&name), WAIT)
        .await
        .unwrap();
    let lookup = client
        .pod_namespaces(&["a".to_owned(), "b".to_owned()].into())
        .await
        .unwrap();
    assert_eq!(lookup.found.len(), 1, "{lookup:?}");
    assert_eq!(lookup.found["a"].namespace.to_string(), GUID);
    assert!(
        matches!(lookup.skipped.as_slice(), [s] if s.sandbox == "b-1" && matches!(s.reason, SkipReason::Info(_))),
        "{lookup:?}"
    );
    drop(stop);
    drop(client);
    tokio::time::timeout(WAIT, serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
