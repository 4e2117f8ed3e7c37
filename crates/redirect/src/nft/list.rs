//! Parsing `nft list table` / `nft list set` output (nft 1.0.x text form).
//!
//! Only what state checks need: which chains exist, their hooks, how many rules each holds,
//! and the elements (address + comment) of a set. nft normalises rule text heavily
//! (`0x00000fff`, `priority dstnat`), so rule text is never compared.

use std::net::IpAddr;

/// A chain as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedChain {
    /// Chain name.
    pub name: String,
    /// Hook name for base chains.
    pub hook: Option<String>,
    /// Number of rules.
    pub rules: usize,
}

/// A set element as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedElement {
    /// The address.
    pub addr: IpAddr,
    /// The comment, if any.
    pub comment: Option<String>,
}

/// A table as listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedTable {
    /// Chains in listing order.
    pub chains: Vec<ListedChain>,
    /// Sets and their elements.
    pub sets: Vec<(String, Vec<ListedElement>)>,
}

enum Block {
    None,
    Chain(ListedChain),
    Set(String, String),
}

impl ListedTable {
    /// Parse the output of `nft list table inet T` (or `nft list set inet T S`).
    pub fn parse(text: &str) -> Self {
        let mut out = ListedTable::default();
        let mut block = Block::None;
        for raw in text.lines() {
            let line = raw.trim();
            match &mut block {
                Block::None => {
                    if let Some(rest) = line.strip_prefix("chain ") {
                        block = Block::Chain(ListedChain {
                            name: rest.trim_end_matches('{').trim().to_owned(),
                            hook: None,
                            rules: 0,
                        });
                    } else if let Some(rest) = line.strip_prefix("set ") {
                        block =
                            Block::Set(rest.trim_end_matches('{').trim().to_owned(), String::new());
                    }
                }
                Block::Chain(c) => {
                    if line == "}" {
                        out.chains.push(c.clone());
                        block = Block::None;
                    } else if line.starts_with("type ") {
                        let mut words = line.split_whitespace();
                        c.hook = words
                            .by_ref()
                            .skip_while(|w| *w != "hook")
                            .nth(1)
                            .map(str::to_owned);
                    } else if !line.is_empty() && !line.starts_with("policy ") {
                        c.rules += 1;
                    }
                }
                Block::Set(name, body) => {
                    // The set block ends at a line that is only `}`; element lists close
                    // on their own line's end, never on a bare `}` line.
                    if line == "}" {
                        out.sets.push((name.clone(), parse_elements(body)));
                        block = Block::None;
                    } else {
                        body.push_str(line);
                        body.push('\n');
                    }
                }
            }
        }
        out
    }

    /// A chain by name.
    pub fn chain(&self, name: &str) -> Option<&ListedChain> {
        self.chains.iter().find(|c| c.name == name)
    }

    /// A set's elements by name.
    pub fn set(&self, name: &str) -> Option<&[ListedElement]> {
        self.sets
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, e)| e.as_slice())
    }
}

/// Parse the `elements = { a comment "x", b }` part of a set body.
fn parse_elements(body: &str) -> Vec<ListedElement> {
    let Some(start) = body.find("elements = {") else {
        return Vec::new();
    };
    let list = &body[start + "elements = {".len()..];
    let mut items = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    for c in list.chars() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                cur.push(c);
            }
            ',' | '}' if !in_quotes => {
                items.push(std::mem::take(&mut cur));
                if c == '}' {
                    break;
                }
            }
            c => cur.push(c),
        }
    }
    items
        .iter()
        .filter_map(|item| {
            let item = item.trim();
            let (addr, rest) = item.split_once(char::is_whitespace).unwrap_or((item, ""));
            let addr: IpAddr = addr.parse().ok()?;
            let comment = rest
                .trim()
                .strip_prefix("comment")
                .map(|c| c.trim().trim_matches('"').to_owned());
            Some(ListedElement { addr, comment })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_chains_and_sets() {
        let text = r#"table inet istio-ambient-nat {
	set istio-inpod-probes-v4 {
		type ipv4_addr
		comment "UUID of the pods that are part of ambient mesh"
		elements = { 10.244.1.5 comment "pod-uid",
			     10.244.1.6 comment "a, b }", 10.244.1.7 }
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		meta l4proto tcp meta skuid 1000 ip daddr @istio-inpod-probes-v4 counter packets 0 bytes 0 snat ip to 169.254.7.127
	}

	chain istio-output {
	}
}
"#;
        let t = ListedTable::parse(text);
        assert_eq!(
            t.chains,
            vec![
                ListedChain {
                    name: "postrouting".into(),
                    hook: Some("postrouting".into()),
                    rules: 1
                },
                ListedChain {
                    name: "istio-output".into(),
                    hook: None,
                    rules: 0
                },
            ]
        );
        let e = t.set("istio-inpod-probes-v4").unwrap();
        let got: Vec<(String, Option<&str>)> = e
            .iter()
            .map(|e| (e.addr.to_string(), e.comment.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("10.244.1.5".into(), Some("pod-uid")),
                ("10.244.1.6".into(), Some("a, b }")),
                ("10.244.1.7".into(), None),
            ]
        );
    }
}
