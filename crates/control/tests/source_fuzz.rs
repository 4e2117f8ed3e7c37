//! Fuzz harness for the manifest loader: whatever the text, `load_documents` returns objects
//! or an error naming the file, and never panics.

use ambit_control::objects::load_documents;
use proptest::prelude::*;

/// Fragments real manifests are made of, so generated text reaches deep into the typed
/// deserializers instead of failing at the first byte.
const FRAGMENTS: &[&str] = &[
    "---\n",
    "apiVersion: v1\n",
    "apiVersion: security.istio.io/v1\n",
    "kind: Pod\n",
    "kind: Service\n",
    "kind: Namespace\n",
    "kind: PeerAuthentication\n",
    "kind: AuthorizationPolicy\n",
    "metadata:\n",
    "  name: a\n",
    "  namespace: b\n",
    "  labels: {app: x}\n",
    "  creationTimestamp: 2024-01-01T00:00:00Z\n",
    "spec:\n",
    "  ports: [{port: 80, targetPort: http}]\n",
    "  clusterIP: None\n",
    "  containers: [{name: c, ports: [{containerPort: 8080}]}]\n",
    "  mtls: {mode: STRICT}\n",
    "  portLevelMtls: {8080: {mode: PERMISSIVE}}\n",
    "  rules: [{from: [{source: {}}]}]\n",
    "status: {podIP: 10.0.0.1}\n",
    "  - ",
    "- a\n",
    ": ",
    "{",
    "}",
    "[",
    "]",
    "&a ",
    "*a ",
    "!tag ",
    "'",
    "\"",
    "\n",
    "  ",
    "null",
    "~",
    "70000",
    "-1",
    "1e9",
    "<<: *a\n",
    "\t",
    "#",
];

fn yamlish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(FRAGMENTS).prop_map(str::to_string),
            1 => any::<String>(),
        ],
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn never_panics(text in yamlish()) {
        if let Err(e) = load_documents("fuzz.yaml", &text) {
            prop_assert!(e.to_string().starts_with("fuzz.yaml: document "), "{e}");
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(text in any::<String>()) {
        let _ = load_documents("fuzz.yaml", &text);
    }
}

#[test]
fn deep_nesting_and_alias_bombs_are_errors_not_crashes() {
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
                c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
                e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n\
                g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n";
    for text in [deep.as_str(), bomb] {
        assert!(load_documents("f.yaml", text).is_err());
    }
}
