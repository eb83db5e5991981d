//! How much memory this process may use: the limit of its memory cgroup (the container's `resources.limits.memory`),
//! else the machine's memory. The watches' byte budget defaults to a share of it.

use std::path::Path;

/// The memory this process may use, in bytes: its memory cgroup's limit (v2's smallest `memory.max` from the
/// process's cgroup up to the root, v1's `hierarchical_memory_limit`), else the machine's (`MemTotal` of
/// /proc/meminfo); None where neither can be read.
pub fn limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    cgroup_limit(Path::new("/sys/fs/cgroup"), &own)
        .or_else(|| mem_total(&std::fs::read_to_string("/proc/meminfo").ok()?))
}

/// The cgroup memory limit of the process whose /proc/self/cgroup is `own`, under the cgroup mount `root`;
/// None when there is none (or it cannot be read).
fn cgroup_limit(root: &Path, own: &str) -> Option<u64> {
    // cgroup v1: the memory controller's own hierarchy, whose memory.stat gives the effective limit.
    if let Some(path) = own.lines().find_map(|l| l.split_once(":memory:").map(|(_, p)| p)) {
        let stat = std::fs::read_to_string(root.join("memory").join(relative(path)).join("memory.stat")).ok()?;
        let limit = stat.lines().find_map(|l| l.strip_prefix("hierarchical_memory_limit "))?.trim().parse().ok()?;
        // Unlimited is the largest page-aligned i64.
        return (limit < 1 << 62).then_some(limit);
    }
    // cgroup v2: the smallest memory.max from the process's cgroup up to the root.
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mut dir = root.join(relative(path));
    let mut smallest: Option<u64> = None;
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.join("memory.max"))
            && let Ok(limit) = text.trim().parse::<u64>()
        {
            smallest = Some(smallest.map_or(limit, |s| s.min(limit)));
        }
        if dir == root || !dir.pop() {
            return smallest;
        }
    }
}

/// A cgroup path from /proc/self/cgroup, below the mount.
fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

/// `MemTotal` of /proc/meminfo, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let kib = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().strip_suffix("kB")?.trim();
    kib.parse::<u64>().ok().map(|k| k * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_v2_takes_the_smallest_limit_up_to_the_root() {
        let root = tempfile::tempdir().expect("temp dir");
        let pod = root.path().join("kubepods/pod1");
        let container = pod.join("c1");
        std::fs::create_dir_all(&container).expect("dirs");
        std::fs::write(root.path().join("kubepods/memory.max"), "max\n").expect("write");
        std::fs::write(pod.join("memory.max"), "134217728\n").expect("write");
        std::fs::write(container.join("memory.max"), "268435456\n").expect("write");
        assert_eq!(cgroup_limit(root.path(), "0::/kubepods/pod1/c1\n"), Some(134_217_728), "the pod's is smaller");
        std::fs::write(pod.join("memory.max"), "max\n").expect("write");
        assert_eq!(cgroup_limit(root.path(), "0::/kubepods/pod1/c1\n"), Some(268_435_456));
        std::fs::write(container.join("memory.max"), "max\n").expect("write");
        assert_eq!(cgroup_limit(root.path(), "0::/kubepods/pod1/c1\n"), None, "unlimited");
        // In a container's own cgroup namespace the path is "/".
        std::fs::write(root.path().join("memory.max"), "67108864\n").expect("write");
        assert_eq!(cgroup_limit(root.path(), "0::/\n"), Some(67_108_864));
    }

    #[test]
    fn cgroup_v1_reads_the_hierarchical_limit() {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = root.path().join("memory/kubepods/pod1");
        std::fs::create_dir_all(&dir).expect("dirs");
        let own = "4:memory:/kubepods/pod1\n0::/\n";
        std::fs::write(dir.join("memory.stat"), "cache 0\nhierarchical_memory_limit 134217728\n").expect("write");
        assert_eq!(cgroup_limit(root.path(), own), Some(134_217_728));
        std::fs::write(dir.join("memory.stat"), "hierarchical_memory_limit 9223372036854771712\n").expect("write");
        assert_eq!(cgroup_limit(root.path(), own), None, "unlimited");
    }

    #[test]
    fn the_machines_memory_is_read_from_meminfo() {
        assert_eq!(mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"), Some(24_576_000 * 1024));
        assert_eq!(mem_total("nothing here"), None);
    }

    #[test]
    fn this_process_has_a_limit() {
        assert!(limit().is_some_and(|bytes| bytes > 0));
    }
}
