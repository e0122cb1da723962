//! Child processes of a control plane, and the reaper that cleans up after them even when
//! the test binary dies without running destructors (statics, panics, SIGKILL).

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// Kills every process group it was told about and removes every directory once its
/// stdin closes, which happens when the test process exits in any way. It runs in its own
/// process group so a terminal's Ctrl-C does not stop it before it has cleaned up.
/// SIGKILL at once: everything is throwaway, and kube-apiserver's graceful shutdown on
/// SIGTERM takes seconds. (dash's `kill` takes no `--`; `-PID` names the group.)
const REAPER_SCRIPT: &str = r#"
trap '' INT HUP
pids=""
dirs=""
while IFS=' ' read -r kind value; do
  case "$kind" in
    pid) pids="$pids $value" ;;
    dir) dirs="$dirs
$value" ;;
  esac
done
for pid in $pids; do kill -KILL "-$pid" 2>/dev/null; done
printf '%s\n' "$dirs" | while IFS= read -r dir; do
  [ -n "$dir" ] && rm -rf -- "$dir"
done
"#;

pub struct Reaper {
    child: Child,
    stdin: ChildStdin,
}

impl Reaper {
    pub fn start() -> Result<Self, String> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(REAPER_SCRIPT)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting the cleanup process (sh): {e}"))?;
        let stdin = child.stdin.take().expect("stdin was piped");
        Ok(Self { child, stdin })
    }

    fn tell(&mut self, line: String) -> Result<(), String> {
        self.stdin
            .write_all(line.as_bytes())
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("telling the cleanup process {line:?}: {e}"))
    }

    pub fn watch_process_group(&mut self, pid: u32) -> Result<(), String> {
        self.tell(format!("pid {pid}\n"))
    }

    pub fn watch_dir(&mut self, dir: &Path) -> Result<(), String> {
        self.tell(format!("dir {}\n", dir.display()))
    }

    /// Normal teardown: the owner cleans up itself, so the reaper must not act later on
    /// process ids the system may have reused.
    pub fn dismiss(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One component (etcd, kube-apiserver, ...) running in its own process group with its
/// output in a log file.
pub struct Component {
    pub name: String,
    pub log_file: PathBuf,
    child: Child,
}

impl Component {
    pub fn spawn(
        name: &str,
        binary: &Path,
        args: &[String],
        log_dir: &Path,
        reaper: &mut Reaper,
    ) -> Result<Self, String> {
        let log_file = log_dir.join(format!("{name}.log"));
        let log =
            File::create(&log_file).map_err(|e| format!("creating {}: {e}", log_file.display()))?;
        let log_for_stderr = log
            .try_clone()
            .map_err(|e| format!("duplicating the log handle of {name}: {e}"))?;
        let child = Command::new(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_for_stderr)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {name} ({}): {e}", binary.display()))?;
        reaper.watch_process_group(child.id())?;
        Ok(Self {
            name: name.to_string(),
            log_file,
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Err` with the log's tail when the process has already exited.
    pub fn check_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.name,
                self.log_file.display(),
                self.log_tail(40)
            )),
            Err(e) => Err(format!("checking on {}: {e}", self.name)),
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_file).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Kills the whole process group (SIGKILL: the data is throwaway).
    pub fn stop(&mut self) {
        // Signal the group only while its leader is unreaped: its id cannot be reused then.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!("kill -KILL -{}", self.child.id()))
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.wait();
    }
}
