//! Worker threads placed on the machine's memory nodes (`--numa`, see `docs/NUMA.md`): the
//! nodes' CPUs read from `/sys/devices/system/node`, each worker pinned to the CPUs its
//! policy gives it when the pool starts it. Pinning changes where threads run, never what
//! they compute.

use std::path::Path;

use ferrox_engine::NumaPolicy;

/// CPUs above this are refused when reading a CPU list (a hostile or corrupt list cannot
/// make us allocate for billions of CPUs).
const MAX_CPUS: usize = 1 << 16;

/// The memory nodes this process may run on, each with the CPUs of it the process is
/// allowed (nodes left without such CPUs are dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<Node>,
    /// The CPUs the process was allowed when the topology was read.
    allowed: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    id: usize,
    cpus: Vec<usize>,
}

impl Topology {
    /// The running machine's nodes and this process's allowed CPUs; one node holding the
    /// allowed CPUs where the system describes no nodes (or is not Linux).
    pub fn read() -> Topology {
        let allowed = allowed_cpus();
        let lists = node_cpulists(Path::new("/sys/devices/system/node"));
        let lists: Vec<(usize, &str)> = lists.iter().map(|(id, l)| (*id, l.as_str())).collect();
        Topology::from_cpulists(&lists, &allowed)
    }

    /// The topology of nodes given as `(node id, CPU list)` in the kernel's format, limited
    /// to the `allowed` CPUs. Lists that cannot be read are left out.
    pub fn from_cpulists(lists: &[(usize, &str)], allowed: &[usize]) -> Topology {
        let mut nodes: Vec<Node> = lists
            .iter()
            .filter_map(|&(id, list)| {
                let cpus: Vec<usize> = parse_cpulist(list)
                    .ok()?
                    .into_iter()
                    .filter(|c| allowed.contains(c))
                    .collect();
                (!cpus.is_empty()).then_some(Node { id, cpus })
            })
            .collect();
        nodes.sort_by_key(|n| n.id);
        if nodes.is_empty() && !allowed.is_empty() {
            nodes.push(Node {
                id: 0,
                cpus: allowed.to_vec(),
            });
        }
        Topology {
            nodes,
            allowed: allowed.to_vec(),
        }
    }

    /// Nodes the process may run on.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The CPUs worker `worker` is pinned to under `policy` (`current_cpu`: the CPU the
    /// process runs on now, which names the node `Isolate` keeps to); `None` leaves the
    /// worker where the system puts it.
    pub fn cpus_for_worker(
        &self,
        policy: NumaPolicy,
        worker: usize,
        current_cpu: Option<usize>,
    ) -> Option<&[usize]> {
        match policy {
            NumaPolicy::Off => None,
            NumaPolicy::Distribute => {
                let node = self.nodes.get(worker % self.nodes.len().max(1))?;
                Some(&node.cpus)
            }
            NumaPolicy::Isolate => {
                let cpu = current_cpu?;
                let node = self.nodes.iter().find(|n| n.cpus.contains(&cpu))?;
                Some(&node.cpus)
            }
            NumaPolicy::Numactl => (!self.allowed.is_empty()).then_some(&self.allowed[..]),
        }
    }

    /// One line for the log: the policy and the nodes' CPUs.
    pub fn describe(&self, policy: NumaPolicy) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("node {}: {} CPUs", n.id, n.cpus.len()))
            .collect();
        format!("--numa {policy:?}: {}", nodes.join(", ")).to_lowercase()
    }
}

/// The CPUs of a list in the kernel's format (`0-3,8,10-11`; empty for none).
pub fn parse_cpulist(list: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let number = |text: &str| -> Result<usize, String> {
            let n: usize = text
                .trim()
                .parse()
                .map_err(|_| format!("`{part}` is not a CPU or a range of CPUs"))?;
            if n >= MAX_CPUS {
                return Err(format!("CPU {n} is beyond {MAX_CPUS}"));
            }
            Ok(n)
        };
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (number(lo)?, number(hi)?),
            None => {
                let n = number(part)?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(format!("`{part}`: the range runs backwards"));
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// `(node id, CPU list)` of every `nodeN/cpulist` under `dir`.
fn node_cpulists(dir: &Path) -> Vec<(usize, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let id: usize = e.file_name().to_str()?.strip_prefix("node")?.parse().ok()?;
            let list = std::fs::read_to_string(e.path().join("cpulist")).ok()?;
            Some((id, list))
        })
        .collect()
}

/// The CPUs this process may run on (all CPUs the system reports where it cannot say).
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set, filled by the call for this
        // thread (pid 0) with its size passed.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let ok =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }
                == 0;
        if ok {
            return (0..libc::CPU_SETSIZE as usize)
                // SAFETY: `c` is below the set's size.
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect();
        }
    }
    (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
}

/// The CPU the calling thread runs on now, where the system says.
pub fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: no arguments; -1 on failure.
        let cpu = unsafe { libc::sched_getcpu() };
        usize::try_from(cpu).ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Pins the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET is given CPUs below the
        // set's size only; the call reads the set of the size passed.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpus;
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "pinning threads is built for Linux only",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_as_the_kernel_writes_them() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n").unwrap(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpulist("5").unwrap(), [5]);
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpulist("2-3,0-2").unwrap(), [0, 1, 2, 3]);
        for bad in [
            "3-1",
            "a",
            "1-",
            "-1",
            "0-4294967295",
            "99999999999999999999",
        ] {
            assert!(parse_cpulist(bad).is_err(), "{bad}");
        }
    }

    fn two_nodes() -> Topology {
        Topology::from_cpulists(&[(1, "4-7"), (0, "0-3")], &[0, 1, 2, 3, 4, 5, 6, 7])
    }

    #[test]
    fn distribute_deals_workers_over_the_nodes_in_turn() {
        let t = two_nodes();
        assert_eq!(t.node_count(), 2);
        let cpus = |w| t.cpus_for_worker(NumaPolicy::Distribute, w, None).unwrap();
        assert_eq!(cpus(0), [0, 1, 2, 3]);
        assert_eq!(cpus(1), [4, 5, 6, 7]);
        assert_eq!(cpus(2), [0, 1, 2, 3]);
        assert_eq!(cpus(5), [4, 5, 6, 7]);
    }

    #[test]
    fn isolate_keeps_to_the_starting_node_and_numactl_to_the_given_cpus() {
        let t = two_nodes();
        for w in 0..4 {
            let isolate = t.cpus_for_worker(NumaPolicy::Isolate, w, Some(6)).unwrap();
            assert_eq!(isolate, [4, 5, 6, 7]);
            let all = t.cpus_for_worker(NumaPolicy::Numactl, w, Some(6)).unwrap();
            assert_eq!(all, [0, 1, 2, 3, 4, 5, 6, 7]);
            assert!(t.cpus_for_worker(NumaPolicy::Off, w, Some(6)).is_none());
        }
        // Only the allowed CPUs (`numactl --physcpubind=2,5`): each node keeps its own.
        let t = Topology::from_cpulists(&[(0, "0-3"), (1, "4-7")], &[2, 5]);
        assert_eq!(
            t.cpus_for_worker(NumaPolicy::Distribute, 1, None).unwrap(),
            [5]
        );
        assert_eq!(
            t.cpus_for_worker(NumaPolicy::Isolate, 0, Some(2)).unwrap(),
            [2]
        );
        // A node without allowed CPUs is dropped.
        let t = Topology::from_cpulists(&[(0, "0-3"), (1, "4-7")], &[1, 2]);
        assert_eq!(t.node_count(), 1);
        assert_eq!(
            t.cpus_for_worker(NumaPolicy::Distribute, 1, None).unwrap(),
            [1, 2]
        );
    }

    #[test]
    fn no_node_list_means_one_node_of_the_allowed_cpus() {
        let t = Topology::from_cpulists(&[(0, "garbage")], &[0, 1]);
        assert_eq!(t.node_count(), 1);
        assert_eq!(
            t.cpus_for_worker(NumaPolicy::Distribute, 3, None).unwrap(),
            [0, 1]
        );
    }

    #[test]
    fn a_pinned_thread_runs_on_the_cpus_it_was_given() {
        let allowed = allowed_cpus();
        let first = allowed[0];
        std::thread::spawn(move || {
            pin_current_thread(&[first]).unwrap();
            assert_eq!(allowed_cpus(), [first]);
            assert_eq!(current_cpu(), Some(first));
        })
        .join()
        .unwrap();
    }
}
