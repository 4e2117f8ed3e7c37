//! Resource use of the proxy and agent processes, read from `/proc`: resident memory
//! (`VmRSS` in `/proc/<pid>/status`) and CPU time (`utime + stime` in `/proc/<pid>/stat`, all
//! threads; `cutime + cstime` for the children a process has waited for).

use std::io;

/// Clock ticks per second of `/proc/<pid>/stat` times. `USER_HZ` is 100 on every Linux
/// architecture we run on (it is fixed in the kernel ABI, unlike `CONFIG_HZ`), so no
/// `sysconf` call is needed.
const USER_HZ: f64 = 100.0;

/// Resident set size of `pid` in KiB.
pub fn rss_kib(pid: u32) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_vmrss(&status).ok_or_else(|| io::Error::other(format!("no VmRSS for pid {pid}")))
}

/// User + system CPU seconds consumed so far by `pid` (every thread).
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_cpu_ticks(&stat)
        .map(|ticks| ticks as f64 / USER_HZ)
        .ok_or_else(|| io::Error::other(format!("unparsable /proc/{pid}/stat")))
}

/// CPU seconds of `pid` itself (every thread) and of the children it has waited for (the
/// rule tools an agent runs), as (own, children).
pub fn cpu_seconds_with_children(pid: u32) -> io::Result<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let own = parse_cpu_ticks(&stat);
    let children = parse_children_cpu_ticks(&stat);
    own.zip(children)
        .map(|(o, c)| (o as f64 / USER_HZ, c as f64 / USER_HZ))
        .ok_or_else(|| io::Error::other(format!("unparsable /proc/{pid}/stat")))
}

/// Sum of [`cpu_seconds`] over `pids`.
pub fn total_cpu_seconds(pids: &[u32]) -> io::Result<f64> {
    pids.iter().map(|p| cpu_seconds(*p)).sum()
}

/// Raises this process's soft limit on open files to its hard limit (children inherit it);
/// returns the new soft limit.
pub fn raise_open_files_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the valid, exclusively borrowed `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // An unlimited hard limit still cannot exceed the kernel's per-process maximum.
    let target = if lim.rlim_max == libc::RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20)
    } else {
        lim.rlim_max
    };
    if lim.rlim_cur < target {
        lim.rlim_cur = target;
        // SAFETY: setrlimit only reads the valid `lim`.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

/// The soft limit on open files of this process (children inherit it).
pub fn open_files_soft_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn parse_vmrss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain spaces or ')'; the
    // fields after the *last* ')' start with field 3 (state). utime and stime are fields
    // 14 and 15, i.e. indexes 11 and 12 from there.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn parse_children_cpu_ticks(stat: &str) -> Option<u64> {
    // cutime and cstime are fields 16 and 17: indexes 13 and 14 after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(13);
    let cutime: u64 = fields.next()?.parse().ok()?;
    let cstime: u64 = fields.next()?.parse().ok()?;
    Some(cutime + cstime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vmrss() {
        let s = "Name:\tambit\nVmPeak:\t  9000 kB\nVmRSS:\t   12345 kB\nThreads:\t3\n";
        assert_eq!(parse_vmrss(s), Some(12345));
        assert_eq!(parse_vmrss("Name: x\n"), None);
    }

    #[test]
    fn parses_cpu_ticks_with_odd_names() {
        let stat = "4242 (we ird) name)) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 3 0";
        assert_eq!(parse_cpu_ticks(stat), Some(22));
        assert_eq!(parse_children_cpu_ticks(stat), Some(0));
        let waited = "7 (agent) S 1 7 7 0 -1 0 0 0 0 0 40 2 7 3 20 0 3 0";
        assert_eq!(parse_children_cpu_ticks(waited), Some(10));
        assert_eq!(parse_cpu_ticks("garbage"), None);
        assert_eq!(parse_children_cpu_ticks("4 (x) S 1 2"), None);
    }

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        assert!(rss_kib(me).unwrap() > 0);
        assert!(cpu_seconds(me).unwrap() >= 0.0);
        let raised = raise_open_files_limit().unwrap();
        assert_eq!(open_files_soft_limit(), Some(raised));
    }
}
