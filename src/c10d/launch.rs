//! `--nproc-per-node N`: starts N ranks of this same command on this machine, like
//! `torchrun --standalone`: a free local port for the store, `RANK`/`WORLD_SIZE`/`LOCAL_RANK`/
//! `MASTER_ADDR`/`MASTER_PORT` for each, `OMP_NUM_THREADS` = cores / N unless set, every stderr
//! line prefixed with `[rank R]`, SIGINT and SIGTERM forwarded, and when one rank fails the others
//! are ended.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Grace between SIGTERM and SIGKILL when ending the other ranks.
const GRACE: Duration = Duration::from_secs(10);

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Errors of the launcher.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot find a free local port for the store: {0}")]
    Port(#[source] std::io::Error),
    #[error("cannot start rank {rank} ({exe}): {source}")]
    Spawn {
        rank: usize,
        exe: String,
        #[source]
        source: std::io::Error,
    },
}

/// How the ranks ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// Exit status to report: 0 when every rank succeeded, else the first failed rank's code
    /// (1 or 2; 2 for a rank killed by a signal).
    pub code: i32,
    /// The first rank that failed, with how.
    pub first_failure: Option<(usize, String)>,
    /// The SIGINT/SIGTERM that arrived and was forwarded to every rank.
    pub interrupted: Option<i32>,
}

fn free_port() -> Result<u16, LaunchError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(LaunchError::Port)?;
    Ok(l.local_addr().map_err(LaunchError::Port)?.port())
}

/// Runs `nproc` copies of this executable with `args` and waits for all of them.
pub fn run_local(nproc: usize, args: &[OsString]) -> Result<LaunchOutcome, LaunchError> {
    let exe = std::env::current_exe().map_err(|source| LaunchError::Spawn {
        rank: 0,
        exe: "current executable".into(),
        source,
    })?;
    let port = free_port()?;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    // The ranks share this machine's cores: without a limit each would start one intra-op thread
    // per core and they would oversubscribe them (torchrun sets OMP_NUM_THREADS for the same reason).
    let threads = std::env::var("OMP_NUM_THREADS").unwrap_or_else(|_| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (cores / nproc).max(1).to_string()
    });
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pumps = Vec::new();
    for rank in 0..nproc {
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", nproc.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("OMP_NUM_THREADS", &threads)
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        // A rank must not outlive its launcher (killed with SIGKILL, say).
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(source) => {
                end_all(&mut children);
                return Err(LaunchError::Spawn {
                    rank,
                    exe: exe.display().to_string(),
                    source,
                });
            }
        };
        let stderr = child.stderr.take().expect("invariant: stderr is piped");
        pumps.push(std::thread::spawn(move || {
            for line in BufReader::new(stderr).split(b'\n').map_while(Result::ok) {
                let mut e = std::io::stderr().lock();
                let _ = e.write_all(format!("[rank {rank}] ").as_bytes());
                let _ = e.write_all(&line);
                let _ = e.write_all(b"\n");
            }
        }));
        children.push(Some(child));
    }
    let mut outcome = LaunchOutcome {
        code: 0,
        first_failure: None,
        interrupted: None,
    };
    let mut forwarded = 0;
    while children.iter().any(Option::is_some) {
        let sig = SIGNAL.load(Ordering::SeqCst);
        if sig != 0 && sig != forwarded {
            forwarded = sig;
            signal_all(&children, sig);
        }
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            let Ok(Some(status)) = child.try_wait() else {
                continue;
            };
            *slot = None;
            if status.success() || outcome.first_failure.is_some() || forwarded != 0 {
                continue;
            }
            use std::os::unix::process::ExitStatusExt;
            let (code, how) = match (status.code(), status.signal()) {
                (Some(c), _) => (if c == 1 { 1 } else { 2 }, format!("exited with status {c}")),
                (None, Some(s)) => (2, format!("was killed by signal {s}")),
                _ => (2, "ended".to_string()),
            };
            crate::stderr_line!("lego-rl: rank {rank} {how}; ending the other ranks");
            outcome.code = code;
            outcome.first_failure = Some((rank, how));
        }
        if outcome.first_failure.is_some() {
            end_all(&mut children);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in pumps {
        let _ = p.join();
    }
    if forwarded != 0 {
        outcome.code = 2;
        outcome.interrupted = Some(forwarded);
    }
    Ok(outcome)
}

fn signal_all(children: &[Option<Child>], sig: i32) {
    for c in children.iter().flatten() {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(c.id() as libc::pid_t, sig) };
    }
}

/// SIGTERM to every live rank, SIGKILL to those still alive after [`GRACE`]; reaps them all.
fn end_all(children: &mut [Option<Child>]) {
    signal_all(children, libc::SIGTERM);
    let deadline = Instant::now() + GRACE;
    for slot in children.iter_mut() {
        let Some(child) = slot.as_mut() else { continue };
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            let _ = child.wait();
        }
        *slot = None;
    }
}
