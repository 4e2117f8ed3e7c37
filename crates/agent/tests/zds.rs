//! ZDS server against a fake ztunnel speaking the real wire format over a real SEQPACKET
//! socket. The netns fd sent in these tests is the test process's own (`/proc/self/ns/net`),
//! which needs no privileges.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)] // tests: helpers panic on setup failure

use std::sync::Arc;
use std::time::Duration;

use ambit_agent::testing::{FakeZtunnel, Seen};
use ambit_agent::zds::{ZdsConfig, ZdsError, ZdsPod, ZdsServer};
use ambit_netns::NetnsFd;
use ambit_testkit::eventually;
use tokio::sync::watch;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(5);

struct Harness {
    server: ZdsServer,
    path: std::path::PathBuf,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("zds").join("ztunnel.sock");
        // A stale regular file must not prevent binding.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"stale").unwrap();
        let listener = ZdsServer::bind(&path).unwrap();
        let server = ZdsServer::new(
            ZdsConfig {
                accept_interval: Duration::from_millis(1),
                ..ZdsConfig::default()
            },
            None,
        );
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn({
            let server = server.clone();
            async move { server.serve(listener, rx).await }
        });
        Self {
            server,
            path,
            stop,
            task: Some(task),
            _dir: dir,
        }
    }

    /// Connects a fake ztunnel and waits until its snapshot completed.
    async fn connect(&self) -> FakeZtunnel {
        let mut snaps = self.server.snapshots();
        let before = *snaps.borrow_and_update();
        let zt = FakeZtunnel::connect(&self.path, false).unwrap();
        tokio::time::timeout(WAIT, snaps.wait_for(|n| *n > before))
            .await
            .expect("snapshot completes")
            .unwrap();
        zt
    }

    async fn stop(mut self) {
        self.stop.send(true).unwrap();
        self.task.take().unwrap().await.unwrap();
    }
}

fn own_netns() -> Arc<NetnsFd> {
    Arc::new(NetnsFd::open("/proc/self/ns/net").unwrap())
}

fn pod(uid: &str, netns: Option<Arc<NetnsFd>>) -> ZdsPod {
    ZdsPod {
        uid: uid.parse().unwrap(),
        name: format!("name-{uid}"),
        namespace: "ns".into(),
        service_account: "sa".into(),
        netns,
    }
}

#[tokio::test]
async fn snapshot_then_updates() {
    let h = Harness::start();
    let ns = own_netns();
    h.server.remember(pod("a", Some(ns.clone())));
    h.server.remember(pod("b", None));
    let zt = h.connect().await;

    let seen = zt.seen();
    let expected_info = ambit_proto::zds::WorkloadInfo {
        name: "name-a".into(),
        namespace: "ns".into(),
        service_account: "sa".into(),
        windows_namespace: None,
    };
    assert_eq!(
        seen,
        vec![
            Seen::Add {
                uid: "a".into(),
                info: Some(expected_info),
                netns: Some(ns.identity()),
                fds: 1,
            },
            Seen::Keep {
                uid: "b".into(),
                fds: 0
            },
            Seen::SnapshotSent,
        ]
    );
    // SnapshotSent is exactly `1a 00` on the wire.
    assert_eq!(zt.raw()[2], vec![0x1a, 0x00]);

    h.server.add(pod("c", Some(ns.clone()))).await.unwrap();
    h.server.del("c").await.unwrap();
    let raw = zt.raw();
    // DelWorkload{uid: "c"} inside WorkloadRequest field 2, uid in field 2.
    assert_eq!(raw.last().unwrap(), &vec![0x12, 0x03, 0x12, 0x01, b'c']);
    assert!(matches!(zt.seen()[3], Seen::Add { ref uid, fds: 1, .. } if uid == "c"));
    assert_eq!(h.server.cached(), vec!["a".to_string(), "b".to_string()]);
    h.stop().await;
}

#[tokio::test]
async fn add_errors() {
    let h = Harness::start();
    let ns = own_netns();

    // No ztunnel: Add fails, Del succeeds; the pod stays cached for the next snapshot.
    assert!(matches!(
        h.server.add(pod("x", Some(ns.clone()))).await,
        Err(ZdsError::NoConnection)
    ));
    h.server.del("gone").await.unwrap();
    assert_eq!(h.server.cached(), vec!["x".to_string()]);

    let zt = h.connect().await;
    assert_eq!(zt.seen().len(), 2, "snapshot carried the pending pod");

    struct Case {
        name: &'static str,
        pod: ZdsPod,
        nack: Option<&'static str>,
        check: fn(&Result<(), ZdsError>) -> bool,
    }
    let cases = [
        Case {
            name: "nack surfaced",
            pod: pod("n", Some(ns.clone())),
            nack: Some("failure to start proxy: busy"),
            check: |r| matches!(r, Err(ZdsError::Nack(t)) if t == "failure to start proxy: busy"),
        },
        Case {
            name: "no Keep after snapshot",
            pod: pod("k", None),
            nack: None,
            check: |r| matches!(r, Err(ZdsError::NoNetns(_))),
        },
        Case {
            name: "oversized refused",
            pod: ZdsPod {
                name: "x".repeat(1100),
                ..pod("big", Some(ns.clone()))
            },
            nack: None,
            check: |r| matches!(r, Err(ZdsError::TooLarge(n)) if *n >= 1024),
        },
        Case {
            name: "still works afterwards",
            pod: pod("ok", Some(ns.clone())),
            nack: None,
            check: |r| r.is_ok(),
        },
    ];
    for c in cases {
        zt.set_nack(c.nack);
        let r = h.server.add(c.pod).await;
        assert!((c.check)(&r), "{}: {r:?}", c.name);
    }
    let after: Vec<Seen> = zt.seen().split_off(2);
    assert!(
        after
            .iter()
            .all(|s| !matches!(s, Seen::Keep { .. } | Seen::SnapshotSent)),
        "{after:?}"
    );
    // Only the NACKed and the final Add reached ztunnel; the others were refused locally.
    assert_eq!(after.len(), 2, "{after:?}");
    h.stop().await;
}

#[tokio::test]
async fn two_connections_add_newest_del_all() {
    let h = Harness::start();
    let ns = own_netns();
    let old = h.connect().await;
    let new = h.connect().await;
    assert_eq!(h.server.connected(), 2);

    h.server.add(pod("p", Some(ns.clone()))).await.unwrap();
    let adds = |z: &FakeZtunnel| {
        z.seen()
            .iter()
            .filter(|s| matches!(s, Seen::Add { .. }))
            .count()
    };
    assert_eq!((adds(&old), adds(&new)), (0, 1));

    h.server.del("p").await.unwrap();
    for z in [&old, &new] {
        assert_eq!(z.seen().last(), Some(&Seen::Del { uid: "p".into() }));
    }

    // NACK from one connection is reported by the joined Del.
    old.set_nack(Some("nope"));
    let err = h.server.del("q").await.unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");

    // The newest disappears: Add falls back to the older one.
    drop(new);
    eventually("h.server.connected() == 1", WAIT, || {
        h.server.connected() == 1
    })
    .await;
    old.set_nack(None);
    h.server.add(pod("r", Some(ns))).await.unwrap();
    assert_eq!(adds(&old), 1);

    drop(old);
    eventually("h.server.connected() == 0", WAIT, || {
        h.server.connected() == 0
    })
    .await;
    h.stop().await;
}
