//! Hugging Face checkpoint directories: `config.json` + `model.safetensors` (or a sharded
//! `model.safetensors.index.json`) in, the same layout, tensor names and dtype out, with the
//! tokenizer, generation config and chat template copied through so transformers, vLLM and
//! SGLang load the output unchanged.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use tch::{nn, Device, Kind, Tensor};

use super::{CausalLm, Config, ModelError};

/// Non-weight files copied from the source checkpoint into a saved one (when present).
pub const AUX_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
];

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// A model with its variables and where it came from.
#[derive(Debug)]
pub struct Model {
    pub vs: nn::VarStore,
    pub lm: CausalLm,
    /// Directory it was loaded from (auxiliary files are copied from here on save).
    pub source: Option<PathBuf>,
    /// dtype of the weights on disk; [`Model::save`] writes this dtype.
    pub file_kind: Kind,
    /// tensor name → shard file, when the source was sharded.
    shard_map: Option<BTreeMap<String, String>>,
}

/// Parses `cpu`, `cuda`, `cuda:N`.
pub fn parse_device(s: &str) -> Option<Device> {
    match s {
        "cpu" => Some(Device::Cpu),
        "cuda" => Some(Device::Cuda(0)),
        _ => s.strip_prefix("cuda:")?.parse().ok().map(Device::Cuda),
    }
}

/// Parses `float32|fp32|bfloat16|bf16|float16|fp16`.
pub fn parse_kind(s: &str) -> Option<Kind> {
    match s {
        "float32" | "fp32" | "f32" => Some(Kind::Float),
        "bfloat16" | "bf16" => Some(Kind::BFloat16),
        "float16" | "fp16" | "f16" => Some(Kind::Half),
        _ => None,
    }
}

fn to_kind(d: Dtype) -> Option<Kind> {
    match d {
        Dtype::F32 => Some(Kind::Float),
        Dtype::BF16 => Some(Kind::BFloat16),
        Dtype::F16 => Some(Kind::Half),
        Dtype::F64 => Some(Kind::Double),
        _ => None,
    }
}

fn to_dtype(k: Kind) -> Dtype {
    match k {
        Kind::BFloat16 => Dtype::BF16,
        Kind::Half => Dtype::F16,
        Kind::Double => Dtype::F64,
        _ => Dtype::F32,
    }
}

impl Model {
    /// A randomly initialised model (transformers' init) in `kind` on `device`.
    pub fn random(cfg: &Config, device: Device, kind: Kind) -> Self {
        let mut vs = nn::VarStore::new(device);
        let lm = CausalLm::new(&vs.root(), cfg);
        if kind != Kind::Float {
            vs.set_kind(kind);
        }
        Model {
            vs,
            lm,
            source: None,
            file_kind: kind,
            shard_map: None,
        }
    }

    /// Loads a checkpoint directory. `kind` overrides the compute dtype (default: the file's).
    pub fn load(dir: &Path, device: Device, kind: Option<Kind>) -> Result<Self, ModelError> {
        let cfg = Config::from_file(&dir.join("config.json"))?;
        let (files, shard_map) = weight_files(dir)?;
        let mut vs = nn::VarStore::new(device);
        let lm = tch::no_grad(|| CausalLm::new(&vs.root(), &cfg));
        let vars = vs.variables();
        let mut seen = HashMap::new();
        let mut file_kind = None;
        for file in &files {
            let path = dir.join(file);
            let bytes = std::fs::read(&path).map_err(|source| ModelError::Read {
                path: path.clone(),
                source,
            })?;
            let st = SafeTensors::deserialize(&bytes).map_err(|e| ModelError::Safetensors {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            for (name, view) in st.tensors() {
                let Some(var) = vars.get(&name) else {
                    tracing::debug!("{}: ignoring tensor `{name}` the model does not use", path.display());
                    continue;
                };
                let k = to_kind(view.dtype()).ok_or_else(|| ModelError::DType {
                    path: path.clone(),
                    name: name.clone(),
                    dtype: format!("{:?}", view.dtype()),
                })?;
                file_kind.get_or_insert(k);
                let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
                if shape != var.size() {
                    return Err(ModelError::Shape {
                        path,
                        name,
                        got: shape,
                        want: var.size(),
                    });
                }
                let t = Tensor::f_from_data_size(view.data(), &shape, k)?;
                tch::no_grad(|| var.shallow_clone().f_copy_(&t.to_kind(var.kind())))?;
                seen.insert(name, ());
            }
        }
        let mut missing: Vec<&String> = vars.keys().filter(|n| !seen.contains_key(*n)).collect();
        missing.sort();
        if let Some(name) = missing.first() {
            return Err(ModelError::MissingTensor {
                dir: dir.to_path_buf(),
                name: (*name).clone(),
            });
        }
        let file_kind = file_kind.unwrap_or(Kind::Float);
        let compute = kind.unwrap_or(file_kind);
        if compute != Kind::Float {
            vs.set_kind(compute);
        }
        Ok(Model {
            vs,
            lm,
            source: Some(dir.to_path_buf()),
            file_kind,
            shard_map,
        })
    }

    /// The model's configuration.
    pub fn cfg(&self) -> &Config {
        &self.lm.cfg
    }

    /// The device the variables live on.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// Variables sorted by name.
    pub fn named_variables(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Writes weights (same layout, names and dtype as the source) and copies [`AUX_FILES`]
    /// from the source directory into `dir` (which must exist). Without a source, writes a
    /// minimal `config.json`-less weights file (tests only).
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        let vars = self.named_variables();
        let mut by_file: BTreeMap<String, Vec<(String, Tensor)>> = BTreeMap::new();
        for (name, t) in vars {
            let file = self
                .shard_map
                .as_ref()
                .and_then(|m| m.get(&name).cloned())
                .unwrap_or_else(|| SINGLE.to_string());
            let t = t.detach().to_device(Device::Cpu).to_kind(self.file_kind).contiguous();
            by_file.entry(file).or_default().push((name, t));
        }
        let mut total = 0usize;
        for (file, tensors) in &by_file {
            let path = dir.join(file);
            write_safetensors(&path, tensors, self.file_kind)?;
            total += tensors.iter().map(|(_, t)| t.numel() * t.kind().elt_size_in_bytes()).sum::<usize>();
        }
        if let Some(map) = &self.shard_map {
            let index = serde_json::json!({
                "metadata": {"total_size": total},
                "weight_map": map,
            });
            let path = dir.join(INDEX);
            let text = serde_json::to_string_pretty(&index).expect("invariant: JSON value serializes");
            std::fs::write(&path, text + "\n").map_err(|source| ModelError::Write { path, source })?;
        }
        if let Some(src) = &self.source {
            for name in AUX_FILES {
                let from = src.join(name);
                if from.is_file() {
                    let to = dir.join(name);
                    std::fs::copy(&from, &to).map_err(|source| ModelError::Write { path: to, source })?;
                }
            }
        }
        Ok(())
    }
}

/// The weight files of a checkpoint and, when sharded, the tensor → file map.
type WeightFiles = (Vec<String>, Option<BTreeMap<String, String>>);

fn weight_files(dir: &Path) -> Result<WeightFiles, ModelError> {
    let index = dir.join(INDEX);
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|source| ModelError::Read {
            path: index.clone(),
            source,
        })?;
        #[derive(serde::Deserialize)]
        struct Index {
            weight_map: BTreeMap<String, String>,
        }
        let idx: Index = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: index.clone(),
            msg: format!("invalid index: {e}"),
        })?;
        let mut files: Vec<String> = idx.weight_map.values().cloned().collect();
        files.sort();
        files.dedup();
        return Ok((files, Some(idx.weight_map)));
    }
    if dir.join(SINGLE).is_file() {
        return Ok((vec![SINGLE.to_string()], None));
    }
    Err(ModelError::NoWeights { dir: dir.to_path_buf() })
}

fn write_safetensors(path: &Path, tensors: &[(String, Tensor)], kind: Kind) -> Result<(), ModelError> {
    let mut buffers = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let n = t.numel() * kind.elt_size_in_bytes();
        let mut buf = vec![0u8; n];
        t.f_copy_data_u8(&mut buf, t.numel())?;
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        buffers.push((name.clone(), shape, buf));
    }
    let views = buffers
        .iter()
        .map(|(name, shape, buf)| {
            TensorView::new(to_dtype(kind), shape.clone(), buf)
                .map(|v| (name.clone(), v))
                .map_err(|e| ModelError::Safetensors {
                    path: path.to_path_buf(),
                    msg: e.to_string(),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let meta = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    safetensors::tensor::serialize_to_file(views, &meta, path).map_err(|e| ModelError::Safetensors {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}
