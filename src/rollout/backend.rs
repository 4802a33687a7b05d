//! `--backend`: where generations come from, started for a rollout, and the chat format it is
//! rendered with.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use super::{RolloutConfig, RolloutError};
use crate::chat::ChatFormat;
use crate::engine::embedded::{EmbeddedBackend, EngineOptions};
use crate::engine::sglang::SglangBackend;
use crate::engine::vllm::VllmBackend;
use crate::engine::Backend;

/// `--backend`: where generations come from.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendSpec {
    /// The embedded tch engine on a Hugging Face checkpoint directory.
    Embedded(PathBuf),
    Vllm(String),
    Sglang(String),
}

impl FromStr for BackendSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}`: expected embedded:CKPT_DIR, vllm:URL or sglang:URL"))?;
        if rest.is_empty() {
            return Err(format!("`{s}`: empty {kind} target"));
        }
        match kind {
            "embedded" => Ok(BackendSpec::Embedded(PathBuf::from(rest))),
            "vllm" => Ok(BackendSpec::Vllm(rest.to_string())),
            "sglang" => Ok(BackendSpec::Sglang(rest.to_string())),
            other => Err(format!(
                "`{s}`: unknown backend `{other}` (expected embedded, vllm or sglang)"
            )),
        }
    }
}

pub(super) async fn start_backend(cfg: &RolloutConfig) -> Result<(Arc<dyn Backend>, PathBuf), RolloutError> {
    let err = |backend: &str, msg: String| RolloutError::Backend {
        backend: backend.into(),
        msg,
    };
    Ok(match &cfg.backend {
        BackendSpec::Embedded(dir) => {
            let device = crate::model::parse_device(&cfg.device).ok_or_else(|| {
                err(
                    "embedded",
                    format!("unknown device `{}` (cpu, cuda, cuda:N)", cfg.device),
                )
            })?;
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
            let chat = cfg
                .chat_model
                .clone()
                .ok_or_else(|| RolloutError::Invalid("--backend vllm: needs --chat-model DIR".into()))?;
            (Arc::new(VllmBackend::new(url)), chat)
        }
        BackendSpec::Sglang(url) => {
            let chat = cfg
                .chat_model
                .clone()
                .ok_or_else(|| RolloutError::Invalid("--backend sglang: needs --chat-model DIR".into()))?;
            (Arc::new(SglangBackend::new(url, None)), chat)
        }
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
        assert!("sglang:".parse::<BackendSpec>().is_err());
        assert!("tgi:http://x"
            .parse::<BackendSpec>()
            .unwrap_err()
            .contains("unknown backend"));
        assert!("nothing".parse::<BackendSpec>().is_err());
    }
}
