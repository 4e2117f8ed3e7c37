//! Pod UIDs from `/proc/<pid>/cgroup` (cgroup v1 `ID:controllers:path` lines or the v2
//! `0::path` line).
//!
//! The kubelet names a pod's cgroup after its UID: with the cgroupfs driver a path
//! component `pod<uid>` (`/kubepods/burstable/pod2f4a…/<container>`), with the systemd
//! driver a slice `kubepods-burstable-pod<uid with _ for ->.slice`. A component matches
//! when `pod` starts it or follows `-`/`_`, is followed by a UUID-shaped string (8-4-4-4-12
//! hex digits separated by `-` or `_`) and then by the component's end or `.`. The result
//! is normalised to the API form (lower case, `-`). CRI-O's `crio-<container id>` scopes
//! inside a pod slice are covered by that rule.
//!
//! CRI-O can also put a container's scope outside any pod slice, so that no pod UID is in
//! the path at all: `0::/../crio-<id>.scope` seen through a cgroup namespace, or
//! `/crio-<id>.scope` / `/system.slice/crio-<id>.scope` (KubeEdge, `conmon_cgroup` /
//! `cgroup_manager` setups). [`owner`] reports those as [`Owner::CrioContainer`]: a
//! container, but of an unknown pod, which discovery attributes by the pod IPs in the
//! process's netns alone. `crio-conmon-<id>` scopes (the monitor process, which lives in
//! the host netns) are not containers.

/// Who a cgroup file says a process belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A container of the pod with this UID (API form).
    Pod(String),
    /// A CRI-O container (this container ID) whose cgroup path names no pod.
    CrioContainer(String),
}

/// The owner named by a cgroup file's contents: a pod UID anywhere wins over a CRI-O
/// container scope without one (first match of each kind wins).
pub fn owner(cgroup: &str) -> Option<Owner> {
    pod_uid(cgroup).map(Owner::Pod).or_else(|| {
        cgroup
            .lines()
            .find_map(crio_container)
            .map(Owner::CrioContainer)
    })
}

/// `crio-<id>[.scope]` as the last component of a line's path, `<id>` being letters and
/// digits only (CRI-O uses 64 hex digits; `crio-conmon-<id>` is rejected by the `-`).
fn crio_container(line: &str) -> Option<String> {
    let path = line.splitn(3, ':').nth(2)?;
    let last = path.rsplit('/').next()?;
    let last = last.strip_suffix(".scope").unwrap_or(last);
    let id = last.strip_prefix("crio-")?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric())).then(|| id.to_owned())
}

/// Length of a UUID in text form.
const UUID_LEN: usize = 36;

/// The pod UID named by a cgroup file's contents, if any (first match wins).
pub fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        // Controllers never contain ':'; the path may, so split at most twice.
        let path = line.splitn(3, ':').nth(2)?;
        path.split('/').find_map(uid_in_component)
    })
}

fn uid_in_component(c: &str) -> Option<String> {
    let bytes = c.as_bytes();
    let mut from = 0;
    while let Some(i) = c.get(from..)?.find("pod") {
        let start = from + i;
        let boundary_before = start == 0 || matches!(bytes[start - 1], b'-' | b'_');
        let uid_start = start + 3;
        if boundary_before
            && let Some(cand) = bytes.get(uid_start..uid_start + UUID_LEN)
            && is_uuid(cand)
            && matches!(bytes.get(uid_start + UUID_LEN), None | Some(b'.'))
        {
            return Some(
                cand.iter()
                    .map(|&b| match b {
                        b'_' => '-',
                        b => char::from(b.to_ascii_lowercase()),
                    })
                    .collect(),
            );
        }
        // "pod" is ASCII, so start + 1 is a char boundary.
        from = start + 1;
    }
    None
}

fn is_uuid(b: &[u8]) -> bool {
    b.len() == UUID_LEN
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-' || c == b'_',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4";

    #[test]
    fn table() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            (
                "v1 systemd (containerd)",
                "12:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4.slice/cri-containerd-2b4b5e0f6c0d4f1e9a7b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f.scope\n\
                 11:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4.slice/cri-containerd-2b4b.scope\n\
                 1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4.slice/cri-containerd-2b4b.scope\n\
                 0::/\n",
                Some(UID),
            ),
            (
                "v1 cgroupfs (docker-era kubelet)",
                "12:freezer:/kubepods/burstable/pod5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4/8f1c2e3d4b5a69788766554433221100ffeeddccbbaa99887766554433221100\n\
                 3:cpu,cpuacct:/kubepods/burstable/pod5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4/8f1c\n",
                Some(UID),
            ),
            (
                "v2 systemd",
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4.slice/cri-containerd-aa.scope\n",
                Some(UID),
            ),
            (
                "v2 systemd guaranteed QoS",
                "0::/kubepods.slice/kubepods-pod5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4.slice/cri-containerd-aa.scope\n",
                Some(UID),
            ),
            (
                "v2 cgroupfs (kind)",
                "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4.slice/cri-containerd-0f.scope\n",
                Some(UID),
            ),
            (
                "v2 cgroupfs guaranteed",
                "0::/kubepods/pod5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4/0f0f\n",
                Some(UID),
            ),
            (
                "v2 seen from inside a cgroup namespace",
                "0::/../../kubepods-besteffort-pod5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4.slice/cri-containerd-0f.scope\n",
                Some(UID),
            ),
            (
                "cri-o systemd",
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4.slice/crio-3f2e1d.scope\n",
                Some(UID),
            ),
            (
                "upper case is normalised",
                "0::/kubepods/pod5C2CA1D1-58B4-4E48-A9A4-1CD3FDC6F8F4/x\n",
                Some(UID),
            ),
            (
                "host service",
                "0::/system.slice/containerd.service\n",
                None,
            ),
            (
                "user session",
                "0::/user.slice/user-1000.slice/session-2.scope\n",
                None,
            ),
            ("root", "0::/\n", None),
            ("empty", "", None),
            ("no path field", "garbage without colons\n", None),
            (
                "pod not at a boundary",
                "0::/kubepods/mypod5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4/x\n",
                None,
            ),
            (
                "trailing junk after the uid",
                "0::/kubepods/pod5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4x/x\n",
                None,
            ),
            (
                "too short",
                "0::/kubepods/pod5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f/x\n",
                None,
            ),
            (
                "not hex",
                "0::/kubepods/pod5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8fz/x\n",
                None,
            ),
            (
                "second occurrence matches",
                "0::/podcast-pod5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4.slice\n",
                Some(UID),
            ),
            ("multibyte text", "0::/pöd/pod\u{e9}\u{1F600}\n", None),
        ];
        for (name, text, want) in cases {
            assert_eq!(pod_uid(text).as_deref(), *want, "{name}");
            // A pod UID always makes the pod the owner.
            if let Some(uid) = want {
                assert_eq!(owner(text), Some(Owner::Pod(uid.to_string())), "{name}");
            }
        }
    }

    #[test]
    fn crio_scopes_outside_a_pod_slice() {
        const ID: &str = "45490e76e0878aaa4d9808f7d2eefba37f093c3efbba9838b6d8ab804d9bd814";
        let crio = |id: &str| Some(Owner::CrioContainer(id.to_owned()));
        let cases: Vec<(&str, String, Option<Owner>)> = vec![
            (
                "v2 through a cgroup namespace",
                format!("0::/../crio-{ID}.scope\n"),
                crio(ID),
            ),
            ("v2 at the root", format!("0::/crio-{ID}.scope\n"), crio(ID)),
            (
                "v2 under system.slice",
                format!("0::/system.slice/crio-{ID}.scope\n"),
                crio(ID),
            ),
            ("no .scope suffix", format!("0::/crio-{ID}\n"), crio(ID)),
            (
                "v1, only some controllers name it",
                format!("12:pids:/\n11:memory:/crio-{ID}.scope\n1:name=systemd:/crio-{ID}.scope\n"),
                crio(ID),
            ),
            (
                "inside a pod slice the pod wins",
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/crio-{ID}.scope\n",
                    "5c2ca1d1_58b4_4e48_a9a4_1cd3fdc6f8f4"
                ),
                Some(Owner::Pod("5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4".into())),
            ),
            (
                "a pod UID on another line wins too",
                format!(
                    "1:name=systemd:/crio-{ID}.scope\n0::/kubepods/pod5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4/{ID}\n"
                ),
                Some(Owner::Pod("5c2ca1d1-58b4-4e48-a9a4-1cd3fdc6f8f4".into())),
            ),
            (
                "conmon is not a container",
                format!("0::/system.slice/crio-conmon-{ID}.scope\n"),
                None,
            ),
            ("the daemon", "0::/system.slice/crio.service\n".into(), None),
            (
                "crio- in the middle",
                format!("0::/crio-{ID}.scope/sub\n"),
                None,
            ),
            ("empty id", "0::/crio-.scope\n".into(), None),
            (
                "not at a component start",
                format!("0::/xcrio-{ID}.scope\n"),
                None,
            ),
            (
                "punctuation in the id",
                "0::/crio-ab_cd.scope\n".into(),
                None,
            ),
            ("multibyte id", "0::/crio-\u{e9}\u{e9}.scope\n".into(), None),
            ("no path field", format!("crio-{ID}\n"), None),
        ];
        for (name, text, want) in cases {
            assert_eq!(owner(&text), want, "{name}");
        }
    }
}
