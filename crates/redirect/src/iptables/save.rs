//! Parsing `iptables-save` output, and the semantic view of it used by state checks.
//!
//! `iptables-save` normalises rule text (`/32` suffixes, implicit `-m tcp`, `--to-port` →
//! `--to-ports`, rules grouped per chain; `spec/cni.md` §3.4), so saved text is never compared
//! to rendered text directly. Presence is decided by the kernel via `-C`; this module only
//! counts rules per chain and, to name extra rules in a report, reduces both sides to a
//! canonical key.

use std::collections::{BTreeMap, BTreeSet};

use super::Rule;

/// A rule line as saved: its chain and tokens after `-A CHAIN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedRule {
    /// Chain name.
    pub chain: String,
    /// Tokens after the chain name, quotes removed.
    pub args: Vec<String>,
    /// The original line.
    pub line: String,
}

impl SavedRule {
    /// The jump target, if the rule is `-j X` / `-g X`.
    pub fn target(&self) -> Option<&str> {
        self.args
            .windows(2)
            .find(|w| w[0] == "-j" || w[0] == "-g")
            .map(|w| w[1].as_str())
    }
}

/// One table of a save.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTable {
    /// Declared chains (built-in and user), in save order.
    pub chains: Vec<String>,
    /// Rules, in save order.
    pub rules: Vec<SavedRule>,
}

/// A parsed `iptables-save`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Saved {
    /// Tables by name.
    pub tables: BTreeMap<String, SavedTable>,
}

/// Our chains: everything named `ISTIO_*`, including leftovers from other versions.
pub fn is_istio_chain(name: &str) -> bool {
    name.starts_with("ISTIO_")
}

impl Saved {
    /// Parse save output. Unknown lines (comments, blank) are skipped.
    pub fn parse(text: &str) -> Self {
        let mut out = Saved::default();
        let mut current: Option<String> = None;
        for line in text.lines() {
            let line = line.trim_end();
            if let Some(name) = line.strip_prefix('*') {
                let name = name.trim().to_owned();
                out.tables.entry(name.clone()).or_default();
                current = Some(name);
                continue;
            }
            let Some(table) = current.as_ref().and_then(|t| out.tables.get_mut(t)) else {
                continue;
            };
            if let Some(decl) = line.strip_prefix(':') {
                if let Some(name) = decl.split_whitespace().next() {
                    table.chains.push(name.to_owned());
                }
            } else if line.starts_with("-A ") {
                let mut toks = split_tokens(line);
                if toks.len() >= 2 {
                    let args = toks.split_off(2);
                    table.rules.push(SavedRule {
                        chain: toks.swap_remove(1),
                        args,
                        line: line.to_owned(),
                    });
                }
            } else if line == "COMMIT" {
                current = None;
            }
        }
        out
    }

    /// `ISTIO_*` chains per table.
    pub fn istio_chains(&self) -> BTreeSet<(String, String)> {
        self.tables
            .iter()
            .flat_map(|(t, tab)| {
                tab.chains
                    .iter()
                    .filter(|c| is_istio_chain(c))
                    .map(move |c| (t.clone(), c.clone()))
            })
            .collect()
    }

    /// Rules that belong to us: everything in `ISTIO_*` chains plus jumps to them.
    pub fn istio_rules(&self) -> Vec<(String, &SavedRule)> {
        self.tables
            .iter()
            .flat_map(|(t, tab)| {
                tab.rules
                    .iter()
                    .filter(|r| is_istio_chain(&r.chain) || r.target().is_some_and(is_istio_chain))
                    .map(move |r| (t.clone(), r))
            })
            .collect()
    }

    /// Count of our rules per (table, chain); `ISTIO_*` chains appear even when empty.
    pub fn counts(&self) -> BTreeMap<(String, String), usize> {
        let mut m: BTreeMap<(String, String), usize> =
            self.istio_chains().into_iter().map(|k| (k, 0)).collect();
        for (t, r) in self.istio_rules() {
            *m.entry((t, r.chain.clone())).or_default() += 1;
        }
        m
    }
}

/// The same counts for planned rules: every planned `ISTIO_*` chain (even empty) plus rules.
pub fn planned_counts(rules: &super::RuleSet) -> BTreeMap<(String, String), usize> {
    let mut m = BTreeMap::new();
    for table in rules.tables() {
        for c in rules.chains(table) {
            m.insert((table.name().to_owned(), c.name().to_owned()), 0);
        }
    }
    for r in &rules.rules {
        *m.entry((r.table.name().to_owned(), r.chain.name().to_owned()))
            .or_default() += 1;
    }
    m
}

/// Split a save line into tokens, honouring double quotes (comments, `--log-prefix`).
pub fn split_tokens(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut has_tok = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_quotes => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            '"' => {
                in_quotes = !in_quotes;
                has_tok = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if has_tok {
                    out.push(std::mem::take(&mut cur));
                    has_tok = false;
                }
            }
            c => {
                cur.push(c);
                has_tok = true;
            }
        }
    }
    if has_tok {
        out.push(cur);
    }
    out
}

/// A normalised, order-independent form of a rule spec: the set of (module, option, negated,
/// value) it contains. Reverses the normalisations listed in §3.4 so a planned rule and its
/// saved form compare equal.
pub fn canonical_key(args: &[String]) -> BTreeSet<(String, String, bool, String)> {
    let mut out = BTreeSet::new();
    let mut module = String::new();
    let mut proto = String::new();
    let mut in_target = false;
    let mut negate = false;
    let mut i = 0;
    while i < args.len() {
        // `--to-port` is iptables' abbreviation of `--to-ports`; save prints the long form.
        let a = match args[i].as_str() {
            "--to-port" => "--to-ports",
            a => a,
        };
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match a {
            "!" => {
                negate = true;
                i += 1;
                continue;
            }
            "-m" => {
                // Protocol modules are implied by `-p` and printed by save; drop them.
                module = value.clone();
                i += 2;
                continue;
            }
            "-j" | "-g" => {
                in_target = true;
                module = value.clone();
                out.insert(("".into(), "-j".into(), false, value));
                i += 2;
                continue;
            }
            _ => {}
        }
        if let Some(opt) = a.strip_prefix('-') {
            let takes_value = !matches!(a, "--socket-exists" | "--restore-mark");
            let mut v = if takes_value { value } else { String::new() };
            let mut key_mod = if opt.starts_with('-') {
                module.clone()
            } else {
                String::new()
            };
            match a {
                "-p" => proto = v.clone(),
                "-s" | "-d" if !v.contains('/') => {
                    v = if v.contains(':') {
                        format!("{v}/128")
                    } else {
                        format!("{v}/32")
                    };
                }
                "--dport" | "--sport"
                    if key_mod.is_empty() || key_mod == "tcp" || key_mod == "udp" =>
                {
                    key_mod = proto.clone();
                }
                _ => {}
            }
            if in_target {
                key_mod = format!("target:{key_mod}");
            }
            out.insert((key_mod, a.to_owned(), negate, v));
            negate = false;
            i += if takes_value { 2 } else { 1 };
        } else {
            i += 1;
        }
    }
    out
}

/// The canonical key of a planned rule.
pub fn rule_key(rule: &Rule) -> BTreeSet<(String, String, bool, String)> {
    canonical_key(&rule.spec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Family, PodRedirectConfig};
    use crate::iptables::pod_rules;

    /// Save output captured from iptables 1.8.9 (nf_tables) after applying the §3.2 rules.
    const SAVED_NAT: &str = "# Generated by iptables-save v1.8.9
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:ISTIO_OUTPUT - [0:0]
:ISTIO_PRERT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -d 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_PRERT -m comment --comment \"not ours \\\"x\\\"\" -j RETURN
COMMIT
";

    #[test]
    fn parses_and_counts() {
        let s = Saved::parse(SAVED_NAT);
        let c = s.counts();
        let get = |ch: &str| c.get(&("nat".to_owned(), ch.to_owned())).copied();
        assert_eq!(get("ISTIO_OUTPUT"), Some(6));
        assert_eq!(get("ISTIO_PRERT"), Some(3));
        assert_eq!(get("PREROUTING"), Some(1));
        assert_eq!(get("OUTPUT"), Some(1));
        let last = &s.tables["nat"].rules.last().unwrap().args;
        assert_eq!(last[3], "not ours \"x\"");
    }

    #[test]
    fn saved_form_matches_planned_keys() {
        let s = Saved::parse(SAVED_NAT);
        let plan = pod_rules(&PodRedirectConfig::default(), Family::V4);
        let planned: Vec<_> = plan
            .rules_in(crate::iptables::Table::Nat)
            .map(rule_key)
            .collect();
        let unmatched: Vec<&str> = s.tables["nat"]
            .rules
            .iter()
            .filter(|r| !planned.contains(&canonical_key(&r.args)))
            .map(|r| r.line.as_str())
            .collect();
        assert_eq!(
            unmatched,
            vec!["-A ISTIO_PRERT -m comment --comment \"not ours \\\"x\\\"\" -j RETURN"]
        );
    }
}
