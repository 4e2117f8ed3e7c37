//! What a benchmark run must leave behind: nothing.

/// Every scenario (including the fresh ones of the memory measurements; at least
/// `scenarios` of them) printed its namespace prefix and directory; none of them may exist
/// any more, and no process may still run from under `root` (every process of the run works
/// in a directory under it).
pub fn assert_nothing_left(stderr: &str, root: &std::path::Path, scenarios: usize) {
    let mut prefixes = 0;
    for line in stderr.lines() {
        let Some((_, rest)) = line.split_once(" namespaces: ") else {
            continue;
        };
        let (prefix, files) = rest.split_once("~*, files: ").expect("prefix line format");
        let left = ambit_topology::leftovers(prefix).expect("listing namespaces");
        assert!(left.is_empty(), "namespaces left behind: {left:?}");
        assert!(
            !std::path::Path::new(files).exists(),
            "directory left behind: {files}"
        );
        prefixes += 1;
    }
    assert!(
        prefixes >= scenarios,
        "only {prefixes} scenarios reported:\n{stderr}"
    );
    let mut survivors = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("reading /proc").flatten() {
        if let Ok(cwd) = std::fs::read_link(entry.path().join("cwd"))
            && cwd.starts_with(root)
        {
            survivors.push(format!(
                "{} in {}",
                entry.file_name().to_string_lossy(),
                cwd.display()
            ));
        }
    }
    assert!(survivors.is_empty(), "processes left behind: {survivors:?}");
}
