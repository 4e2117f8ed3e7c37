//! The VM bundle's text files (`ambit vm up DIR`, `docs/vm.md`): `cluster.env` through
//! `ambit_vm::bundle::shell::parse`, and the same bytes as `mesh.yaml`
//! (`bundle::parse_mesh`), `hosts` (`bundle::parse_hosts`) and `root-cert.pem`
//! (`bundle::check_root_cert`).
//!
//! Properties beyond "never panics": every assignment and every refused line names a line of
//! the input; accepted keys are shell names and unique; and the accepted assignments written
//! back as istioctl writes them (`KEY=` + `configure::shell_quote`, one per line) parse to
//! the same keys and values with no refusal, so what `vm up` reads is exactly what
//! `vm configure` can write.
#![no_main]

use ambit_vm::bundle::{parse_hosts, parse_mesh, shell};
use ambit_vm::configure::shell_quote;
use libfuzzer_sys::fuzz_target;

fn is_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let lines = text.split('\n').count();
    let (assignments, refused) = shell::parse(text);
    for e in &refused {
        assert!(
            (1..=lines).contains(&e.line),
            "refusal {e} outside {lines} lines"
        );
        let _ = e.to_string();
    }
    let mut keys = std::collections::BTreeSet::new();
    for a in &assignments {
        assert!((1..=lines).contains(&a.line), "{a:?} outside {lines} lines");
        assert!(is_name(&a.key), "{a:?}: not a shell name");
        assert!(keys.insert(a.key.clone()), "{a:?}: key returned twice");
    }
    let written: String = assignments
        .iter()
        .map(|a| format!("{}={}\n", a.key, shell_quote(&a.value)))
        .collect();
    let (again, refused_again) = shell::parse(&written);
    assert!(
        refused_again.is_empty(),
        "re-written file refused: {refused_again:?}\n{written}"
    );
    let pairs = |v: &[shell::Assignment]| {
        v.iter()
            .map(|a| (a.key.clone(), a.value.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(pairs(&again), pairs(&assignments), "re-written:\n{written}");

    let _ = parse_mesh(text);
    if let Err(bad) = parse_hosts(text) {
        for (line, _) in bad {
            assert!(
                (1..=lines).contains(&line),
                "hosts line {line} outside {lines}"
            );
        }
    }
});
