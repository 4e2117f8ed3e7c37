use super::*;

/// What a case expects: the parsed fields, or an error whose text contains every part.
enum Want {
    Ok(MeshConfig),
    Err(&'static [&'static str]),
}

fn md(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn parse_cases() {
    let full = MeshConfig {
        trust_domain: Some("example.org".into()),
        root_namespace: Some("mesh-root".into()),
        proxy_metadata: md(&[("ISTIO_META_DNS_CAPTURE", "true"), ("FOO", "")]),
    };
    let cases: Vec<(&str, String, Want)> = vec![
        ("empty document", String::new(), Want::Ok(MeshConfig::default())),
        ("comment only", "# nothing\n".into(), Want::Ok(MeshConfig::default())),
        (
            "the three fields",
            "trustDomain: example.org\nrootNamespace: mesh-root\ndefaultConfig:\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: \"true\"\n    FOO: \"\"\n".into(),
            Want::Ok(full.clone()),
        ),
        (
            // What `istioctl` / the Helm chart write: many fields ambit has no use for.
            "upstream fields beside ours are ignored",
            "accessLogFile: /dev/stdout\nenableTracing: true\noutboundTrafficPolicy: {mode: ALLOW_ANY}\n\
             trustDomain: example.org\nrootNamespace: mesh-root\n\
             defaultConfig:\n  discoveryAddress: istiod.istio-system.svc:15012\n  tracing: {zipkin: {address: z:9411}}\n  \
             proxyMetadata: {ISTIO_META_DNS_CAPTURE: \"true\", FOO: \"\"}\n\
             extensionProviders: [{name: x, envoyExtAuthzHttp: {service: a, port: 1}}]\n".into(),
            Want::Ok(full.clone()),
        ),
        (
            "empty strings fall back to the flags",
            "trustDomain: \"\"\nrootNamespace: \"\"\n".into(),
            Want::Ok(MeshConfig::default()),
        ),
        (
            "null fields fall back to the flags",
            "trustDomain:\nrootNamespace: ~\ndefaultConfig:\n".into(),
            Want::Ok(MeshConfig::default()),
        ),
        (
            "defaultConfig without proxyMetadata",
            "defaultConfig: {concurrency: 2}\n".into(),
            Want::Ok(MeshConfig::default()),
        ),
        (
            "not YAML",
            "trustDomain: [unclosed\n".into(),
            Want::Err(&["test input", "not a YAML document"]),
        ),
        (
            "a list, not a mapping",
            "- trustDomain: a\n".into(),
            Want::Err(&["test input", "(document)", "expected a mapping, found a list"]),
        ),
        (
            "trustDomain a number",
            "trustDomain: 42\n".into(),
            Want::Err(&["test input: trustDomain", "expected a string, found a number"]),
        ),
        (
            "trustDomain with a slash",
            "trustDomain: a/b\n".into(),
            Want::Err(&["trustDomain", "not a trust domain"]),
        ),
        (
            "trustDomain upper case",
            "trustDomain: Cluster.Local\n".into(),
            Want::Err(&["trustDomain", "not a trust domain"]),
        ),
        (
            "rootNamespace a mapping",
            "rootNamespace: {name: x}\n".into(),
            Want::Err(&["rootNamespace", "expected a string, found a mapping"]),
        ),
        (
            "rootNamespace not a namespace name",
            "rootNamespace: Istio_System\n".into(),
            Want::Err(&["rootNamespace", "not a namespace name"]),
        ),
        (
            "rootNamespace too long",
            format!("rootNamespace: {}\n", "a".repeat(64)),
            Want::Err(&["rootNamespace", "not a namespace name"]),
        ),
        (
            "defaultConfig a string",
            "defaultConfig: yes please\n".into(),
            Want::Err(&["defaultConfig", "expected a mapping, found a string"]),
        ),
        (
            "proxyMetadata a list",
            "defaultConfig:\n  proxyMetadata: [A]\n".into(),
            Want::Err(&["defaultConfig.proxyMetadata", "expected a mapping, found a list"]),
        ),
        (
            "proxyMetadata value unquoted boolean",
            "defaultConfig:\n  proxyMetadata:\n    ISTIO_META_DNS_CAPTURE: true\n".into(),
            Want::Err(&[
                "defaultConfig.proxyMetadata.ISTIO_META_DNS_CAPTURE",
                "expected a string, found a boolean",
            ]),
        ),
        (
            "proxyMetadata value a number",
            "defaultConfig:\n  proxyMetadata:\n    PORT: 15012\n".into(),
            Want::Err(&["defaultConfig.proxyMetadata.PORT", "found a number"]),
        ),
        (
            "proxyMetadata key a number",
            "defaultConfig:\n  proxyMetadata:\n    1: a\n".into(),
            Want::Err(&["defaultConfig.proxyMetadata", "a key is a number"]),
        ),
        (
            "proxyMetadata key with =",
            "defaultConfig:\n  proxyMetadata:\n    \"A=B\": a\n".into(),
            Want::Err(&["defaultConfig.proxyMetadata.A=B", "not an environment variable name"]),
        ),
        (
            "duplicate key",
            "trustDomain: a\ntrustDomain: b\n".into(),
            Want::Err(&["test input", "duplicate"]),
        ),
        (
            "too big",
            format!("accessLogFile: \"{}\"\n", "x".repeat(MAX_BYTES)),
            Want::Err(&["test input", "more than the"]),
        ),
    ];
    let mut failures = Vec::new();
    for (name, text, want) in &cases {
        let got = MeshConfig::parse("test input", text);
        let ok = match (want, &got) {
            (Want::Ok(w), Ok(g)) => w == g,
            (Want::Err(parts), Err(e)) => {
                let msg = e.to_string();
                parts.iter().all(|p| msg.contains(p))
            }
            _ => false,
        };
        if !ok {
            failures.push(format!("{name}: got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_mesh_config_wins_over_the_flags_where_it_sets_a_field() {
    let flags = crate::translate::ClusterConfig {
        trust_domain: "flag.td".into(),
        root_namespace: "flag-ns".into(),
        ..Default::default()
    };
    let cases = [
        (MeshConfig::default(), "flag.td", "flag-ns"),
        (
            MeshConfig {
                trust_domain: Some("mesh.td".into()),
                ..Default::default()
            },
            "mesh.td",
            "flag-ns",
        ),
        (
            MeshConfig {
                root_namespace: Some("mesh-ns".into()),
                ..Default::default()
            },
            "flag.td",
            "mesh-ns",
        ),
    ];
    for (mesh, td, ns) in cases {
        let s = MeshSettings::effective(&flags, &mesh);
        assert_eq!(
            (s.trust_domain.as_str(), s.root_namespace.as_str()),
            (td, ns),
            "{mesh:?}"
        );
    }
}
