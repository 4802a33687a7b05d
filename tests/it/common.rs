//! Helpers shared by the integration tests, among them the spawn helpers and their watchdog
//! (a hung subprocess is stopped after a generous limit, SIGTERM then SIGKILL, instead of eating
//! CI's time budget).

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
/// [`watchdog::limit`], it gets SIGTERM (so that it can stop in order: rollout removes its
/// containers), and [`watchdog::grace`] later, if it is still there, SIGKILL with all its
/// descendants (ranks of a launcher, a vLLM server, harness processes); a message naming the test,
/// the command and the limit goes to its stderr (which the test's assertions print) and to the
/// test binary's own.
pub fn watched(cmd: &mut std::process::Command) -> &mut std::process::Command {
    watched_for(cmd, watchdog::limit())
}

/// [`watched`] with a limit of its own.
pub fn watched_for(
    cmd: &mut std::process::Command,
    limit: std::time::Duration,
) -> &mut std::process::Command {
    watched_with_grace(cmd, limit, watchdog::grace())
}

/// [`watched`] with a limit and a grace between SIGTERM and SIGKILL of its own.
pub fn watched_with_grace(
    cmd: &mut std::process::Command,
    limit: std::time::Duration,
    grace: std::time::Duration,
) -> &mut std::process::Command {
    watchdog::start();
    let test = std::thread::current().name().unwrap_or("?").to_string();
    cmd.env(watchdog::MARK_ENV, limit.as_secs().to_string())
        .env(watchdog::GRACE_MARK_ENV, grace.as_secs().to_string())
        .env(watchdog::TEST_ENV, test)
}

/// The checkout's root (testdata/, examples/, scripts/).
/// Every file under `dir` (recursively), relative to `dir`, sorted.
pub fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

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
/// children that [`watched`] marked (their environment names a limit). A child past its limit gets
/// SIGTERM first, itself only, so that it can stop in order (rollout stops its trials and removes
/// its containers); one still there after its grace gets SIGKILL with all its descendants, and so
/// do the descendants it had at SIGTERM that are still there (a child that exits on SIGTERM may
/// leave them behind). /proc rather than a handle: `assert_cmd` spawns and waits inside
/// `output()`, where no handle is to be had, and a child's descendants are found by their parent
/// ids.
pub mod watchdog {
    use std::collections::{HashMap, HashSet};
    use std::io::Write;
    use std::time::{Duration, Instant};

    /// Environment variable of `cargo test` that overrides the limit (seconds).
    pub const LIMIT_ENV: &str = "LEGO_RL_TEST_CHILD_LIMIT_S";
    /// Environment variable of `cargo test` that overrides the grace between SIGTERM and SIGKILL
    /// (seconds).
    pub const GRACE_ENV: &str = "LEGO_RL_TEST_CHILD_GRACE_S";
    /// Environment variable carrying a watched child's limit in seconds, set by [`super::watched`]
    /// only (not [`LIMIT_ENV`], which every child inherits: a server a test starts in-process for
    /// the whole run is not watched).
    pub const MARK_ENV: &str = "LEGO_RL_TEST_WATCHDOG_LIMIT_S";
    /// Environment variable carrying a watched child's grace in seconds (see [`MARK_ENV`]).
    pub const GRACE_MARK_ENV: &str = "LEGO_RL_TEST_WATCHDOG_GRACE_S";
    /// Environment variable carrying the name of the test that started the child.
    pub const TEST_ENV: &str = "LEGO_RL_TEST_NAME";
    /// Seconds between two scans of /proc.
    const SCAN: Duration = Duration::from_secs(2);

    /// Longest a watched subprocess may run: 20 minutes (the longest test's own waits are 15),
    /// or `LEGO_RL_TEST_CHILD_LIMIT_S` seconds from the environment of `cargo test`.
    pub fn limit() -> Duration {
        from_env(LIMIT_ENV, 1200)
    }

    /// How long a watched subprocess has between SIGTERM and SIGKILL: 30 s (time for rollout to
    /// stop its trials and remove its containers), or `LEGO_RL_TEST_CHILD_GRACE_S` seconds from
    /// the environment of `cargo test`.
    pub fn grace() -> Duration {
        from_env(GRACE_ENV, 30)
    }

    fn from_env(var: &str, default_secs: u64) -> Duration {
        let secs = std::env::var(var).ok().and_then(|v| v.parse().ok());
        Duration::from_secs(secs.unwrap_or(default_secs))
    }

    /// Starts the watchdog thread (once).
    pub fn start() {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            std::thread::Builder::new()
                .name("subprocess-watchdog".into())
                .spawn(|| {
                    let mut state = State::default();
                    loop {
                        std::thread::sleep(SCAN);
                        state.sweep();
                    }
                })
                .expect("starting the watchdog thread");
        });
    }

    /// One process from /proc/PID/stat: parent, start time (clock ticks after boot), and whether
    /// it is a zombie (exited, not yet reaped).
    struct Proc {
        ppid: u32,
        start: u64,
        zombie: bool,
    }

    /// A process told apart from a later one with the same pid: (pid, start time).
    type Id = (u32, u64);

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
            if let (Some(state), Some(ppid), Some(start)) = (f.first(), f.get(1), f.get(19)) {
                if let (Ok(ppid), Ok(start)) = (ppid.parse(), start.parse()) {
                    let zombie = *state == "Z";
                    all.insert(pid, Proc { ppid, start, zombie });
                }
            }
        }
        all
    }

    /// `pid`'s descendants in `all`, parents before children.
    fn descendants(all: &HashMap<u32, Proc>, pid: u32) -> Vec<Id> {
        let mut tree = vec![pid];
        let mut k = 0;
        while k < tree.len() {
            let parent = tree[k];
            tree.extend(all.iter().filter(|(_, c)| c.ppid == parent).map(|(&c, _)| c));
            k += 1;
        }
        tree[1..].iter().map(|p| (*p, all[p].start)).collect()
    }

    /// Seconds since boot, in clock ticks.
    fn now_ticks(hz: u64) -> Option<u64> {
        let up = std::fs::read_to_string("/proc/uptime").ok()?;
        let secs: f64 = up.split_whitespace().next()?.parse().ok()?;
        Some((secs * hz as f64) as u64)
    }

    /// A watched child's marks: its limit, grace and test, read from its environment.
    struct Marks {
        limit: u64,
        grace: u64,
        test: String,
    }

    /// `pid`'s marks, when it has [`MARK_ENV`].
    fn marks(pid: u32) -> Option<Marks> {
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let var = |k: &str| {
            env.split(|&b| b == 0).find_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                kv.strip_prefix(&format!("{k}=")).map(str::to_string)
            })
        };
        Some(Marks {
            limit: var(MARK_ENV)?.parse().ok()?,
            grace: var(GRACE_MARK_ENV)
                .and_then(|g| g.parse().ok())
                .unwrap_or(grace().as_secs()),
            test: var(TEST_ENV).unwrap_or_default(),
        })
    }

    /// A watched child that got SIGTERM, waiting out its grace.
    struct Terminated {
        at: Instant,
        marks: Marks,
        cmdline: String,
        /// Its descendants at SIGTERM.
        tree: Vec<Id>,
    }

    /// What the watchdog remembers between scans.
    #[derive(Default)]
    struct State {
        terminated: HashMap<Id, Terminated>,
        /// Children done with: SIGKILLed, or past their grace after exiting on SIGTERM.
        done: HashSet<Id>,
    }

    /// Says `msg` on the child's own stderr, which the test reads, and on this binary's.
    fn tell(pid: u32, msg: &str) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .open(format!("/proc/{pid}/fd/2"))
        {
            let _ = f.write_all(msg.as_bytes());
        }
        let _ = std::io::stderr().write_all(msg.as_bytes());
    }

    fn signal(pid: u32, sig: i32) {
        // SAFETY: kill(2) with a pid read from /proc; a pid gone since is ESRCH, ignored.
        unsafe { libc::kill(pid as i32, sig) };
    }

    impl State {
        fn sweep(&mut self) {
            // SAFETY: sysconf has no preconditions.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
            let (Some(now), all) = (now_ticks(hz), processes()) else {
                return;
            };
            let me = std::process::id();
            for (&pid, p) in all.iter().filter(|(_, p)| p.ppid == me && !p.zombie) {
                let id = (pid, p.start);
                if self.terminated.contains_key(&id) || self.done.contains(&id) {
                    continue;
                }
                let Some(marks) = marks(pid) else { continue };
                let age = now.saturating_sub(p.start) / hz;
                if age > marks.limit {
                    self.terminate(&all, id, age, marks);
                }
            }
            let due: Vec<Id> = self
                .terminated
                .iter()
                .filter(|(_, t)| t.at.elapsed() >= Duration::from_secs(t.marks.grace))
                .map(|(&id, _)| id)
                .collect();
            for id in due {
                let t = self.terminated.remove(&id).expect("invariant: listed above");
                self.kill(&all, id, t);
            }
        }

        /// SIGTERM to the child alone, remembering its descendants.
        fn terminate(&mut self, all: &HashMap<u32, Proc>, id: Id, age: u64, marks: Marks) {
            let pid = id.0;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim().to_string())
                .unwrap_or_default();
            tell(
                pid,
                &format!(
                    "\nwatchdog: test {}: sent SIGTERM to `{cmdline}` (pid {pid}) after {age} s, \
                     over the limit of {} s ({LIMIT_ENV}): it hung; SIGKILL to it and its \
                     descendants follows in {} s ({GRACE_ENV})\n",
                    marks.test, marks.limit, marks.grace
                ),
            );
            signal(pid, libc::SIGTERM);
            let tree = descendants(all, pid);
            self.terminated.insert(
                id,
                Terminated {
                    at: Instant::now(),
                    marks,
                    cmdline,
                    tree,
                },
            );
        }

        /// After the grace: SIGKILL to the child if it is still there, its descendants now, and
        /// those it had at SIGTERM that are still there.
        fn kill(&mut self, all: &HashMap<u32, Proc>, id: Id, t: Terminated) {
            self.done.insert(id);
            let pid = id.0;
            let alive = |(p, start): &Id| all.get(p).is_some_and(|q| q.start == *start && !q.zombie);
            let child = alive(&id);
            let mut victims = if child { descendants(all, pid) } else { Vec::new() };
            let left: Vec<Id> = t
                .tree
                .iter()
                .filter(|d| alive(d) && !victims.contains(d))
                .copied()
                .collect();
            victims.extend(left);
            if !child && victims.is_empty() {
                return;
            }
            let what = if child {
                format!(
                    "killed `{}` (pid {pid}) and its {} descendant(s)",
                    t.cmdline,
                    victims.len()
                )
            } else {
                format!(
                    "killed {} descendant(s) left by `{}` (pid {pid}, exited on SIGTERM)",
                    victims.len(),
                    t.cmdline
                )
            };
            let msg = format!(
                "\nwatchdog: test {}: {what} {} s after SIGTERM, over the limit of {} s \
                 ({LIMIT_ENV}): it hung\n",
                t.marks.test, t.marks.grace, t.marks.limit
            );
            tell(pid, &msg);
            for &(victim, _) in victims.iter().rev() {
                signal(victim, libc::SIGKILL);
            }
            if child {
                signal(pid, libc::SIGKILL);
            }
        }
    }

    /// Whether process `pid` is there and not a zombie.
    fn running(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
        })
    }

    /// A watched child past its limit gets SIGTERM, itself only: one that stops on it exits in its
    /// own way (here with its descendant still there when it handles the signal); one that ignores
    /// it is SIGKILLed after its grace with its descendants. Each says why on its stderr; a child
    /// within its limit is left alone.
    #[test]
    fn kills_a_hung_child_and_its_descendants() {
        use std::process::{Command, Stdio};
        const TEST: &str = "common::watchdog::kills_a_hung_child_and_its_descendants";
        let spawn = |script: &str, grace: u64| {
            super::watched_with_grace(
                Command::new("bash").args(["-c", script]),
                Duration::from_secs(1),
                Duration::from_secs(grace),
            )
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        };
        let mut patient = super::watched_for(Command::new("sleep").arg("600"), Duration::from_secs(3600))
            .spawn()
            .unwrap();
        let started = Instant::now();
        // Stops on SIGTERM, long before its grace of 10 minutes is up.
        let polite = spawn(
            "sleep 600 & trap 'kill -0 $! && echo descendant-alive-at-TERM >&2; kill $!; exit 3' TERM; wait",
            600,
        );
        // Ignores SIGTERM (and so does the `sleep` it starts, which inherits the ignored signal).
        let pid_file = tempfile::NamedTempFile::new().unwrap();
        let deaf = spawn(
            &format!(
                "trap '' TERM; sleep 600 & echo $! > {}; wait",
                pid_file.path().display()
            ),
            2,
        );

        let out = polite.wait_with_output().unwrap();
        let polite_took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(
            polite_took < Duration::from_secs(60),
            "stopped late: {polite_took:?}"
        );
        assert!(
            stderr.contains(&format!(
                "watchdog: test {TEST}: sent SIGTERM to `bash -c sleep 600"
            )) && stderr.contains("over the limit of 1 s")
                && stderr.contains("follows in 600 s")
                && stderr.contains("descendant-alive-at-TERM")
                && !stderr.contains("killed"),
            "{stderr}"
        );

        let out = deaf.wait_with_output().unwrap();
        let deaf_took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&out.status),
            Some(libc::SIGKILL),
            "{stderr}"
        );
        // Not before its limit and grace (1 + 2 s), not much after.
        assert!(
            deaf_took >= Duration::from_secs(3) && deaf_took < Duration::from_secs(60),
            "killed at {deaf_took:?}"
        );
        assert!(
            stderr.contains(&format!("watchdog: test {TEST}: sent SIGTERM to `bash -c trap"))
                && stderr.contains(&format!("watchdog: test {TEST}: killed `bash -c trap"))
                && stderr.contains("and its 1 descendant(s) 2 s after SIGTERM")
                && stderr.contains("over the limit of 1 s"),
            "{stderr}"
        );
        // The `sleep` the shell started is gone too (or a zombie nobody reaped yet).
        let sleeper = std::fs::read_to_string(pid_file.path())
            .unwrap()
            .trim()
            .to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        while running(&sleeper) {
            assert!(Instant::now() < deadline, "the descendant {sleeper} survived");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            patient.try_wait().unwrap().is_none(),
            "a child within its limit was signalled"
        );
        patient.kill().unwrap();
        patient.wait().unwrap();
    }
}
