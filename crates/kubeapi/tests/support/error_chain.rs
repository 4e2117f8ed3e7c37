//! An error with its sources, `error: cause: cause …`, as a log line shows it (shared by the
//! kubeapi test binaries that assert on whole messages).

/// `e` and every source below it, joined with `": "`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
