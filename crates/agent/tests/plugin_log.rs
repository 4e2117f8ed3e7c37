//! The plugin log socket (`spec/cni.md` §5.6) over a real Unix socket, no privileges:
//! raw HTTP requests (status per body), the plugin-side sender, and `plugin_main` reporting
//! its own invocation.

// Unix only: it drives the Linux agent, namespaces or Unix sockets.
#![cfg(unix)]
#![allow(clippy::unwrap_used)] // tests: helpers panic on setup failure

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ambit_agent::daemon::plugin_log::{Level, LogServer, PluginLogLine};
use ambit_agent::plugin::log::{log_line, post_lines};
use ambit_testkit::eventually;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(10);

async fn raw_request(sock: &Path, method: &str, path: &str, body: &str) -> String {
    let mut s = tokio::net::UnixStream::connect(sock).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: unix\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_are_reemitted() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let got: Arc<Mutex<Vec<PluginLogLine>>> = Arc::default();
    let server = {
        let got = got.clone();
        LogServer::bind(&run_dir)
            .unwrap()
            .with_sink(Arc::new(move |l| got.lock().unwrap().push(l)))
    };
    let sock = server.path.clone();
    let (stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(server.serve(stop));

    // (method, path, body, expected status, lines delivered)
    let cases = [
        (
            "POST",
            "/log",
            r#"["{\"level\":\"info\",\"msg\":\"a\"}","plain"]"#,
            "200",
            2,
        ),
        ("POST", "/log", "[]", "200", 0),
        ("POST", "/log", r#"{"not":"an array"}"#, "400", 0),
        ("POST", "/log", "[1,2]", "400", 0),
        ("GET", "/log", "", "404", 0),
        ("POST", "/other", "[]", "404", 0),
    ];
    for (method, path, body, status, n) in cases {
        got.lock().unwrap().clear();
        let resp = raw_request(&sock, method, path, body).await;
        assert!(
            resp.starts_with(&format!("HTTP/1.1 {status}")),
            "{method} {path} {body}: {resp}"
        );
        assert_eq!(got.lock().unwrap().len(), n, "{method} {path} {body}");
    }

    // The plugin-side sender (blocking, as in the plugin process).
    got.lock().unwrap().clear();
    let lines = vec![
        log_line(Level::Error, "boom", &[("pod", "demo/p1")]),
        log_line(Level::Debug, "detail", &[]),
    ];
    let rd = run_dir.clone();
    tokio::task::spawn_blocking(move || post_lines(&rd, &lines))
        .await
        .unwrap()
        .unwrap();
    {
        let got = got.lock().unwrap();
        let summary: Vec<(Level, &str)> = got.iter().map(|l| (l.level, l.msg.as_str())).collect();
        assert_eq!(
            summary,
            vec![(Level::Error, "boom"), (Level::Debug, "detail")]
        );
        assert_eq!(
            got[0].fields.get("pod").map(String::as_str),
            Some("demo/p1")
        );
    }

    // plugin_main reports its invocation (here: a pod it lets through without the agent).
    got.lock().unwrap().clear();
    let env: Vec<(String, String)> = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", "K8S_POD_NAMESPACE=demo;K8S_POD_NAME=web"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "istio-cni", "type": "istio-cni",
        "cni_agent_run_dir": run_dir, "ambient_enabled": false,
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.9/32"}]},
    });
    let (code, _) = tokio::task::spawn_blocking(move || {
        ambit_agent::plugin_main(&env, &serde_json::to_vec(&conf).unwrap())
    })
    .await
    .unwrap();
    assert_eq!(code, 0);
    eventually("the plugin's log line", WAIT, || {
        !got.lock().unwrap().is_empty()
    })
    .await;
    {
        let got = got.lock().unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].msg, "ADD done");
        assert_eq!(
            got[0].fields.get("pod").map(String::as_str),
            Some("demo/web")
        );
    }

    let _ = stop_tx.send(true);
    task.await.unwrap();
    // With the agent gone, sending fails (and the plugin ignores it).
    assert!(post_lines(&run_dir, &[log_line(Level::Info, "x", &[])]).is_err());
}
