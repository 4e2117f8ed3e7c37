//! `DirectorySource`: loading a directory of manifests and watching it for edits.

use std::path::Path;
use std::time::Duration;

use ambit_control::source::{DirectorySource, SourceError};
use ambit_control::translate::ClusterConfig;

fn namespace(name: &str) -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}}}\n")
}

fn write(dir: &Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).expect("write manifest");
}

fn names(cluster: &ambit_control::translate::Cluster) -> Vec<String> {
    cluster
        .objects
        .namespaces
        .iter()
        .map(|n| n.metadata.name.clone())
        .collect()
}

#[test]
fn loads_yaml_files_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "b.yml", &namespace("b"));
    write(
        dir.path(),
        "a.yaml",
        &format!("{}---\n{}", namespace("a1"), namespace("a2")),
    );
    write(dir.path(), "notes.txt", "not yaml: [");
    write(dir.path(), ".a.yaml.swp", "not yaml: [");
    std::fs::create_dir(dir.path().join("sub.yaml")).unwrap();
    let source = DirectorySource::new(dir.path(), ClusterConfig::default());
    let cluster = source.load().unwrap();
    assert_eq!(names(&cluster), ["a1", "a2", "b"]);
    assert_eq!(cluster.config, ClusterConfig::default());
}

/// (file name, contents) pairs.
type Files = &'static [(&'static str, &'static str)];

#[test]
fn errors_name_the_file_and_document() {
    let cases: [(&str, Files, &str); 3] = [
        (
            "broken file",
            &[(
                "a.yaml",
                "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\nkind: [\n",
            )],
            "a.yaml: document 2",
        ),
        (
            "duplicate across files",
            &[
                (
                    "a.yaml",
                    "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n",
                ),
                (
                    "b.yaml",
                    "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n",
                ),
            ],
            "b.yaml: document 1: duplicate Namespace a (first defined at ",
        ),
        (
            "unknown kind",
            &[(
                "c.yaml",
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\n",
            )],
            "c.yaml: document 1: unsupported kind \"Deployment\"",
        ),
    ];
    for (case, files, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        for (file, text) in files {
            write(dir.path(), file, text);
        }
        let err = DirectorySource::new(dir.path(), ClusterConfig::default())
            .load()
            .unwrap_err();
        assert!(matches!(err, SourceError::Objects(_)), "{case}: {err:?}");
        assert!(err.to_string().contains(want), "{case}: {err}");
    }
    let missing = DirectorySource::new("/nonexistent/ambit", ClusterConfig::default()).load();
    assert!(matches!(missing, Err(SourceError::ReadDir { .. })));
}

/// Waits until the watched snapshot satisfies `pred`, failing after `deadline`.
async fn wait_for(
    rx: &mut tokio::sync::watch::Receiver<std::sync::Arc<ambit_control::translate::Cluster>>,
    deadline: Duration,
    pred: impl Fn(&[String]) -> bool,
) -> bool {
    tokio::time::timeout(deadline, async {
        loop {
            if pred(&names(&rx.borrow_and_update())) {
                return;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn watch_picks_up_edits_and_keeps_the_last_good_set() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &namespace("one"));
    let watch = DirectorySource::new(dir.path(), ClusterConfig::default())
        .watch()
        .await
        .unwrap();
    let mut rx = watch.subscribe();
    assert_eq!(names(&watch.current()), ["one"]);

    // An edit shows up within 2 s.
    write(
        dir.path(),
        "a.yaml",
        &format!("{}---\n{}", namespace("one"), namespace("two")),
    );
    assert!(
        wait_for(&mut rx, Duration::from_secs(2), |n| n == ["one", "two"]).await,
        "edit not seen"
    );

    // A new file too.
    write(dir.path(), "b.yaml", &namespace("three"));
    assert!(
        wait_for(&mut rx, Duration::from_secs(2), |n| n
            == ["one", "two", "three"])
        .await,
        "new file not seen"
    );

    // A broken edit keeps the last good set.
    write(dir.path(), "b.yaml", "kind: [\n");
    assert!(
        !wait_for(&mut rx, Duration::from_millis(800), |n| n
            != ["one", "two", "three"])
        .await
    );
    assert_eq!(names(&watch.current()), ["one", "two", "three"]);

    // Fixing it (and removing a file) is picked up again.
    write(dir.path(), "b.yaml", &namespace("four"));
    std::fs::remove_file(dir.path().join("a.yaml")).unwrap();
    assert!(
        wait_for(&mut rx, Duration::from_secs(2), |n| n == ["four"]).await,
        "fix not seen"
    );

    watch.stop().await;
    assert!(rx.changed().await.is_err(), "sender dropped once stopped");
}

#[tokio::test]
async fn watch_fails_on_a_broken_start() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", "kind: [\n");
    let err = DirectorySource::new(dir.path(), ClusterConfig::default())
        .watch()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("a.yaml: document 1"), "{err}");
}
