//! Where the machine's CPU went during a phase: how busy its cores were (`/proc/stat`) and the
//! CPU seconds of every process, grouped by command name (`/proc/<pid>/stat`). On a 2-core
//! machine the control plane, the simulated kubelets and the controller share the cores, and a
//! launch that is slower than the goals may be one that had no CPU left to be faster with.

use std::collections::BTreeMap;

/// Clock ticks per second of `/proc` CPU times (USER_HZ, 100 on Linux).
pub const TICKS: f64 = 100.0;

#[derive(Clone, Default)]
pub struct CpuSnapshot {
    /// Busy and total ticks over all cores since boot.
    busy: u64,
    total: u64,
    cores: usize,
    /// Ticks by pid, with the command name.
    by_pid: BTreeMap<u32, (String, u64)>,
}

impl CpuSnapshot {
    pub fn take() -> CpuSnapshot {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let mut snapshot = CpuSnapshot::default();
        for line in stat.lines() {
            let mut fields = line.split_whitespace();
            match fields.next() {
                Some("cpu") => {
                    let ticks: Vec<u64> = fields.filter_map(|v| v.parse().ok()).collect();
                    // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
                    snapshot.total = ticks.iter().take(8).sum();
                    let idle =
                        ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
                    snapshot.busy = snapshot.total.saturating_sub(idle);
                }
                Some(name) if name.starts_with("cpu") => snapshot.cores += 1,
                _ => {}
            }
        }
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return snapshot;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(process) = process_ticks(pid) {
                snapshot.by_pid.insert(pid, process);
            }
        }
        snapshot
    }

    /// `busy X % of N cores over T s; CPU seconds: name s, ...` from `self` to `later`, the
    /// `top` busiest command names first. A process that started in between counts whole.
    pub fn report_until(&self, later: &CpuSnapshot, top: usize) -> String {
        let total = later.total.saturating_sub(self.total);
        let busy = later.busy.saturating_sub(self.busy);
        let cores = later.cores.max(1);
        let wall = total as f64 / cores as f64 / TICKS;
        let mut by_name: BTreeMap<&str, u64> = BTreeMap::new();
        for (pid, (name, ticks)) in &later.by_pid {
            let before = match self.by_pid.get(pid) {
                Some((same, before)) if same == name => *before,
                _ => 0,
            };
            *by_name.entry(name.as_str()).or_insert(0) += ticks.saturating_sub(before);
        }
        let mut names: Vec<(&str, u64)> = by_name.into_iter().filter(|(_, t)| *t > 0).collect();
        names.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let each: Vec<String> = names
            .iter()
            .take(top)
            .map(|(name, ticks)| format!("{name} {:.1}", *ticks as f64 / TICKS))
            .collect();
        format!(
            "cores busy {:.0} % ({} cores, {:.0} s, {:.0} of {:.0} CPU seconds); CPU seconds by process: {}",
            100.0 * busy as f64 / total.max(1) as f64,
            cores,
            wall,
            busy as f64 / TICKS,
            total as f64 / TICKS,
            each.join(", ")
        )
    }
}

/// The command name and user + system ticks of `pid`, None when it is gone.
pub fn process_ticks(pid: u32) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces; fields after it start at state,
    // where utime and stime are the 12th and 13th.
    let (head, rest) = stat.rsplit_once(") ")?;
    let name = head.split_once(" (")?.1.to_string();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some((name, ticks(11) + ticks(12)))
}
