//! Finding and removing everything a prefix owns: named namespaces (their bind mounts
//! and, with them, all their links) and, defensively, links in the caller's namespace.

use std::{io, path::Path, process::Stdio};

use rand::Rng;

use crate::{TopologyError, addressing::validate_prefix};

/// Where `ip netns` keeps its bind mounts.
pub(crate) const NETNS_DIR: &str = "/var/run/netns";

/// A fresh prefix: `am` and 5 random base36 characters (36^5 ≈ 60 million values, so
/// parallel and leftover runs practically never collide).
pub fn random_prefix() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("am{suffix}")
}

/// What of a prefix still exists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Entries in `/var/run/netns`.
    pub netns: Vec<String>,
    /// Links in the caller's namespace (a topology never creates any).
    pub links: Vec<String>,
    /// Mount points under the netns directory.
    pub mounts: Vec<String>,
}

impl Leftovers {
    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.netns.is_empty() && self.links.is_empty() && self.mounts.is_empty()
    }
}

/// Lists what exists for `prefix` (every name starting with it).
pub fn leftovers(prefix: &str) -> Result<Leftovers, TopologyError> {
    validate_prefix(prefix)?;
    let netns = match std::fs::read_dir(NETNS_DIR) {
        Ok(dir) => dir
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.starts_with(prefix))
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(source) => {
            return Err(TopologyError::Inspect {
                what: NETNS_DIR,
                source,
            });
        }
    };
    let links = nix::net::if_::if_nameindex()
        .map_err(|e| TopologyError::Inspect {
            what: "network interfaces",
            source: e.into(),
        })?
        .iter()
        .map(|i| i.name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(prefix))
        .collect();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| {
        TopologyError::Inspect {
            what: "/proc/self/mountinfo",
            source,
        }
    })?;
    // /var/run is usually a symlink to /run; mountinfo shows the resolved path.
    let dirs: Vec<String> = [Path::new(NETNS_DIR).to_path_buf()]
        .into_iter()
        .chain(std::fs::canonicalize(NETNS_DIR).ok())
        .map(|d| format!("{}/{prefix}", d.display()))
        .collect();
    let mounts = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|mount_point| dirs.iter().any(|d| mount_point.starts_with(d.as_str())))
        .map(str::to_owned)
        .collect();
    Ok(Leftovers {
        netns,
        links,
        mounts,
    })
}

/// Removes everything of `prefix`, e.g. after a crashed run: every `/var/run/netns`
/// entry starting with it (deleting a namespace destroys its links once no process and
/// no descriptor holds it) and any link of that name in the caller's namespace. Fails
/// with [`TopologyError::Leftover`] if something survives.
///
/// Every name *starting with* `prefix` matches, so pass a whole per-run prefix.
pub fn cleanup(prefix: &str) -> Result<(), TopologyError> {
    let found = leftovers(prefix)?;
    if found.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = found
        .netns
        .iter()
        .map(|ns| format!("netns del {ns}"))
        .chain(found.links.iter().map(|l| format!("link del {l}")))
        .collect();
    if !lines.is_empty() {
        // -force: keep going past entries that vanish concurrently; the leftover check
        // below is what decides success.
        let mut child = std::process::Command::new("ip")
            .args(["-force", "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| TopologyError::Spawn {
                program: "ip".into(),
                source,
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            // A failed write shows up as leftovers below.
            let _ = stdin.write_all((lines.join("\n") + "\n").as_bytes());
        }
        child.wait().map_err(|source| TopologyError::Spawn {
            program: "ip".into(),
            source,
        })?;
    }
    let left = leftovers(prefix)?;
    if left.is_empty() {
        Ok(())
    } else {
        Err(TopologyError::Leftover {
            prefix: prefix.to_owned(),
            leftovers: left,
        })
    }
}
