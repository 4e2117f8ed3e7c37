//! The embedded mesh's manifest loader (`ambit_mesh::manifests::Manifests`, which runs the
//! control plane's multi-document YAML loader, then the mesh's pod checks). The input is one
//! manifest file; after a line `#apply`, the rest is a second file, applied onto the first
//! and then deleted from it (`ambit apply -f` / `ambit delete -f`).
//!
//! Properties: never panics; every refusal displays; an accepted set has at least one pod,
//! unique pod keys, and renders; apply and delete either refuse or give such a set.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use ambit_mesh::manifests::Manifests;
use libfuzzer_sys::fuzz_target;

fn check(m: &Manifests) {
    let keys: BTreeSet<String> = m.pods().iter().map(|p| p.key()).collect();
    assert_eq!(keys.len(), m.pods().len(), "two pods with one key");
    let _ = m.render(&BTreeMap::new(), None);
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (first, second) = match text.split_once("\n#apply\n") {
        Some((a, b)) => (a, Some(b)),
        None => (text, None),
    };
    let m = match Manifests::from_texts(&[("fuzz.yaml".to_owned(), first.to_owned())]) {
        Ok(m) => m,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert!(!m.pods().is_empty());
    check(&m);
    let Some(second) = second else { return };
    match m.apply("applied.yaml", second) {
        Ok((applied, _)) => check(&applied),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    match m.delete("applied.yaml", second) {
        Ok((left, _)) => check(&left),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
