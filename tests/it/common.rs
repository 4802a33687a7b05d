//! Helpers shared by the integration tests, among them the spawn helpers and their watchdog
//! (a hung subprocess is killed after a generous limit instead of eating CI's time budget).

use assert_cmd::Command;

/// The lego-rl binary under test, with progress bars and colours off; watched (see [`watched`]).
pub fn lego() -> Command {
    let mut std_cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("lego-rl"));
    watched(&mut std_cmd);
    let mut cmd = Command::from_std(std_cmd);
    cmd.env("NO_COLOR", "1")
        .env("LEGO_RL_NO_PROGRESS", "1")
        .env_remove("RUST_LOG");
    cmd
}

/// The lego-rl binary under test as a plain `std` command (for `spawn`, signals, redirections),
/// watched (see [`watched`]); nothing else is set.
pub fn lego_process() -> std::process::Command {
    let mut cmd = std::process::Command::new(assert_cmd::cargo::cargo_bin("lego-rl"));
    watched(&mut cmd);
    cmd
}

/// A script of the checkout (`scripts/loop.sh`, ...) as a command, watched (see [`watched`]).
pub fn script(path: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(root().join(path));
    watched(&mut cmd);
    cmd
}

/// Marks `cmd` for the watchdog: once the process it starts has run longer than
/// [`watchdog::limit`], it is killed (SIGKILL) with all its descendants (ranks of a launcher, a
/// vLLM server, harness processes), and a message naming the test, the command and the limit goes
/// to its stderr (which the test's assertions print) and to the test binary's own.
pub fn watched(cmd: &mut std::process::Command) -> &mut std::process::Command {
    watched_for(cmd, watchdog::limit())
}

/// [`watched`] with a limit of its own.
pub fn watched_for(
    cmd: &mut std::process::Command,
    limit: std::time::Duration,
) -> &mut std::process::Command {
    watchdog::start();
    let test = std::thread::current().name().unwrap_or("?").to_string();
    cmd.env(watchdog::MARK_ENV, limit.as_secs().to_string())
        .env(watchdog::TEST_ENV, test)
}

/// The checkout's root (testdata/, examples/, scripts/).
pub fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python with transformers: `LEGO_RL_PYTHON`, else the checkout's `.venv` (scripts/setup.sh).
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("LEGO_RL_PYTHON") {
        return p.into();
    }
    let venv = root().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// True when the Docker Engine answers; outside CI a missing engine skips the test (with a
/// message), under CI it fails loudly.
pub fn docker_available() -> bool {
    let ok = std::process::Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("CI").is_some() {
        panic!("Docker is required under CI");
    }
    if !ok {
        eprintln!("SKIPPED: no Docker engine");
    }
    ok
}

/// The subprocess watchdog: one thread scans /proc every few seconds for this binary's direct
/// children that [`watched`] marked (their environment names a limit) and kills those past it.
/// /proc rather than a handle: `assert_cmd` spawns and waits inside `output()`, where no handle
/// is to be had, and a child's descendants are found by their parent ids.
pub mod watchdog {
    use std::collections::{HashMap, HashSet};
    use std::io::Write;
    use std::time::Duration;

    /// Environment variable of `cargo test` that overrides the limit (seconds).
    pub const LIMIT_ENV: &str = "LEGO_RL_TEST_CHILD_LIMIT_S";
    /// Environment variable carrying a watched child's limit in seconds, set by [`super::watched`]
    /// only (not [`LIMIT_ENV`], which every child inherits: a server a test starts in-process for
    /// the whole run is not watched).
    pub const MARK_ENV: &str = "LEGO_RL_TEST_WATCHDOG_LIMIT_S";
    /// Environment variable carrying the name of the test that started the child.
    pub const TEST_ENV: &str = "LEGO_RL_TEST_NAME";
    /// Longest a watched subprocess may run: 20 minutes (the longest test's own waits are 15),
    /// or `LEGO_RL_TEST_CHILD_LIMIT_S` seconds from the environment of `cargo test`.
    pub fn limit() -> Duration {
        let secs = std::env::var(LIMIT_ENV).ok().and_then(|v| v.parse().ok());
        Duration::from_secs(secs.unwrap_or(1200))
    }

    /// Starts the watchdog thread (once).
    pub fn start() {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            std::thread::Builder::new()
                .name("subprocess-watchdog".into())
                .spawn(|| {
                    let mut killed = HashSet::new();
                    loop {
                        std::thread::sleep(Duration::from_secs(2));
                        sweep(&mut killed);
                    }
                })
                .expect("starting the watchdog thread");
        });
    }

    /// One process from /proc/PID/stat: parent and start time (clock ticks after boot).
    struct Proc {
        ppid: u32,
        start: u64,
    }

    fn processes() -> HashMap<u32, Proc> {
        let mut all = HashMap::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // After the command name (in parentheses, which may hold spaces): state, ppid, ...,
            // starttime (field 22 of the whole line).
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            if let (Some(ppid), Some(start)) = (f.get(1), f.get(19)) {
                if let (Ok(ppid), Ok(start)) = (ppid.parse(), start.parse()) {
                    all.insert(pid, Proc { ppid, start });
                }
            }
        }
        all
    }

    /// Seconds since boot, in clock ticks.
    fn now_ticks(hz: u64) -> Option<u64> {
        let up = std::fs::read_to_string("/proc/uptime").ok()?;
        let secs: f64 = up.split_whitespace().next()?.parse().ok()?;
        Some((secs * hz as f64) as u64)
    }

    /// `pid`'s environment variables `MARK_ENV` and `TEST_ENV`, when it has the first.
    fn marks(pid: u32) -> Option<(u64, String)> {
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let var = |k: &str| {
            env.split(|&b| b == 0).find_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                kv.strip_prefix(&format!("{k}=")).map(str::to_string)
            })
        };
        Some((var(MARK_ENV)?.parse().ok()?, var(TEST_ENV).unwrap_or_default()))
    }

    fn sweep(killed: &mut HashSet<(u32, u64)>) {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let (Some(now), all) = (now_ticks(hz), processes()) else {
            return;
        };
        let me = std::process::id();
        for (&pid, p) in all.iter().filter(|(_, p)| p.ppid == me) {
            let Some((limit, test)) = marks(pid) else { continue };
            let age = now.saturating_sub(p.start) / hz;
            if age <= limit || !killed.insert((pid, p.start)) {
                continue;
            }
            let mut tree = vec![pid];
            let mut k = 0;
            while k < tree.len() {
                let parent = tree[k];
                tree.extend(all.iter().filter(|(_, c)| c.ppid == parent).map(|(&c, _)| c));
                k += 1;
            }
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim().to_string())
                .unwrap_or_default();
            let msg = format!(
                "\nwatchdog: test {test}: killed `{cmdline}` (pid {pid}) and its {} descendant(s) \
                 after {age} s, over the limit of {limit} s ({LIMIT_ENV}): it hung\n",
                tree.len() - 1
            );
            // Into the child's own stderr, which the test reads, and onto this binary's.
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .append(true)
                .open(format!("/proc/{pid}/fd/2"))
            {
                let _ = f.write_all(msg.as_bytes());
            }
            let _ = std::io::stderr().write_all(msg.as_bytes());
            for &victim in tree.iter().rev() {
                // SAFETY: kill(2) with a pid read from /proc; a pid gone since is ESRCH, ignored.
                unsafe { libc::kill(victim as i32, libc::SIGKILL) };
            }
        }
    }

    /// A watched child past its limit is killed with its descendants, and says why on its
    /// stderr; one within its limit is left alone.
    #[test]
    fn kills_a_hung_child_and_its_descendants() {
        use std::process::{Command, Stdio};
        let pid_file = tempfile::NamedTempFile::new().unwrap();
        let script = format!("sleep 600 & echo $! > {}; wait", pid_file.path().display());
        let mut patient = super::watched_for(Command::new("sleep").arg("600"), Duration::from_secs(3600))
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        let out = super::watched_for(Command::new("bash").args(["-c", &script]), Duration::from_secs(1))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
            .wait_with_output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&out.status),
            Some(libc::SIGKILL),
            "{stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "killed late: {:?}",
            started.elapsed()
        );
        assert!(
            stderr.contains(
                "watchdog: test common::watchdog::kills_a_hung_child_and_its_descendants: killed `bash -c sleep 600"
            ) && stderr.contains("and its 1 descendant(s)")
                && stderr.contains("over the limit of 1 s"),
            "{stderr}"
        );
        // The `sleep` the shell started is gone too (or a zombie nobody reaped yet).
        let sleeper = std::fs::read_to_string(pid_file.path())
            .unwrap()
            .trim()
            .to_string();
        let alive = || {
            std::fs::read_to_string(format!("/proc/{sleeper}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while alive() {
            assert!(
                std::time::Instant::now() < deadline,
                "the descendant {sleeper} survived"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            patient.try_wait().unwrap().is_none(),
            "a child within its limit was killed"
        );
        patient.kill().unwrap();
        patient.wait().unwrap();
    }
}
