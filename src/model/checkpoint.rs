//! Hugging Face checkpoint directories: `config.json` + `model.safetensors` (or a sharded
//! `model.safetensors.index.json`) in, the same layout, tensor names and dtype out, with the
//! tokenizer, generation config and chat template copied through so transformers, vLLM and
//! SGLang load the output unchanged.
//!
//! No tensor is ever dropped: a checkpoint tensor the model does not use (Qwen3.5's vision tower
//! and MTP head, an `mtp.*` added to any checkpoint) is kept as its raw bytes and written back
//! unchanged, in the shard it came from. Every var is written in the dtype it had on disk, so
//! an untouched tensor saves byte-identical.
//!
//! Weight files are memory-mapped: a rank of an expert-parallel group ([`Model::load_shard`])
//! reads only the tensors it holds (its experts' per-expert tensors, its slice of fused ones, and
//! the rest), never whole files. Saving under expert parallelism or into another expert layout
//! is in [`super::sharded`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use tch::{nn, Device, Kind, Tensor};

use super::{CausalLm, Config, ExpertShard, ModelError};

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

pub(super) const INDEX: &str = "model.safetensors.index.json";
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
    /// Tensors of the source the model does not use, written back as they were.
    pub(super) carried: Vec<Carried>,
    /// Var name → its dtype on disk (vars not listed are written in `file_kind`).
    pub(super) var_kinds: HashMap<String, Kind>,
}

/// A checkpoint tensor the model does not use, carried through to a saved checkpoint.
#[derive(Debug)]
pub(super) struct Carried {
    pub(super) name: String,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) data: Vec<u8>,
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

pub(super) fn to_dtype(k: Kind) -> Dtype {
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
            carried: Vec::new(),
            var_kinds: HashMap::new(),
        }
    }

    /// Loads a checkpoint directory. `kind` overrides the compute dtype (default: the file's).
    pub fn load(dir: &Path, device: Device, kind: Option<Kind>) -> Result<Self, ModelError> {
        Self::load_shard(dir, device, kind, ExpertShard::default())
    }

    /// [`Model::load`] holding only `shard`'s experts of every MoE layer (expert parallelism):
    /// the other experts' tensors are not read (nor carried).
    pub fn load_shard(
        dir: &Path,
        device: Device,
        kind: Option<Kind>,
        shard: ExpertShard,
    ) -> Result<Self, ModelError> {
        let mut cfg = Config::from_file(&dir.join("config.json"))?;
        if !shard.is_whole() && (cfg.num_experts == 0 || cfg.num_experts % shard.size as i64 != 0) {
            return Err(ModelError::Config {
                path: dir.join("config.json"),
                msg: format!(
                    "--expert-parallel {}: must divide num_experts ({})",
                    shard.size, cfg.num_experts
                ),
            });
        }
        cfg.expert_shard = shard;
        let (files, shard_map) = weight_files(dir)?;
        let names = match &shard_map {
            Some(map) => map.keys().cloned().collect(),
            None => tensor_names(&dir.join(SINGLE))?,
        };
        cfg.fused_experts = names.iter().any(|n| n.ends_with(".mlp.experts.gate_up_proj"));
        let mut vs = nn::VarStore::new(device);
        let lm = tch::no_grad(|| CausalLm::new(&vs.root(), &cfg));
        let vars = vs.variables();
        let mut seen = HashMap::new();
        let mut file_kind = None;
        let mut carried = Vec::new();
        let mut var_kinds = HashMap::new();
        for file in &files {
            let path = dir.join(file);
            let read_err = |source| ModelError::Read {
                path: path.clone(),
                source,
            };
            let f = std::fs::File::open(&path).map_err(read_err)?;
            // SAFETY: the file is only read; a checkpoint rewritten while it loads is outside
            // what any loader can guard against (transformers and vLLM mmap the same way).
            let bytes = unsafe { memmap2::Mmap::map(&f) }.map_err(read_err)?;
            let st = SafeTensors::deserialize(&bytes).map_err(|e| ModelError::Safetensors {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            for (name, view) in st.tensors() {
                let Some(var) = vars.get(&name) else {
                    if !shard.is_whole() && name.contains(".mlp.experts.") {
                        // Another rank's expert: not read, not carried (that rank writes it).
                        continue;
                    }
                    tracing::debug!(
                        "{}: carrying tensor `{name}` the model does not use through unchanged",
                        path.display()
                    );
                    carried.push(Carried {
                        dtype: view.dtype(),
                        shape: view.shape().to_vec(),
                        data: view.data().to_vec(),
                        name,
                    });
                    continue;
                };
                let k = to_kind(view.dtype()).ok_or_else(|| ModelError::DType {
                    path: path.clone(),
                    name: name.clone(),
                    dtype: format!("{:?}", view.dtype()),
                })?;
                file_kind.get_or_insert(k);
                var_kinds.insert(name.clone(), k);
                let mut shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
                let mut data = view.data();
                if !shard.is_whole()
                    && name.contains(".mlp.experts.")
                    && shape.first() == Some(&cfg.num_experts)
                {
                    // A fused `[experts, …]` tensor: this rank's rows only (contiguous bytes).
                    let rows = shard.range(cfg.num_experts);
                    let row_bytes = data.len() / cfg.num_experts as usize;
                    data = &data[rows.start as usize * row_bytes..rows.end as usize * row_bytes];
                    shape[0] = rows.end - rows.start;
                }
                if shape != var.size() {
                    return Err(ModelError::Shape {
                        path,
                        name,
                        got: shape,
                        want: var.size(),
                    });
                }
                let t = Tensor::f_from_data_size(data, &shape, k)?;
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
            carried,
            var_kinds,
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

    /// The dtype variable `name` is saved in ([`Model::save`]).
    pub fn stored_kind(&self, name: &str) -> Kind {
        self.var_kinds.get(name).copied().unwrap_or(self.file_kind)
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
        let file_of = |name: &str| {
            self.shard_map
                .as_ref()
                .and_then(|m| m.get(name).cloned())
                .unwrap_or_else(|| SINGLE.to_string())
        };
        let mut by_file: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
        for (name, t) in vars {
            let kind = self.var_kinds.get(&name).copied().unwrap_or(self.file_kind);
            let t = t.detach().to_device(Device::Cpu).to_kind(kind).contiguous();
            let mut data = vec![0u8; t.numel() * kind.elt_size_in_bytes()];
            t.f_copy_data_u8(&mut data, t.numel())?;
            let shape = t.size().iter().map(|&d| d as usize).collect();
            by_file.entry(file_of(&name)).or_default().push(Entry {
                dtype: to_dtype(kind),
                shape,
                data: std::borrow::Cow::Owned(data),
                name,
            });
        }
        for c in &self.carried {
            by_file.entry(file_of(&c.name)).or_default().push(Entry {
                name: c.name.clone(),
                dtype: c.dtype,
                shape: c.shape.clone(),
                data: std::borrow::Cow::Borrowed(&c.data),
            });
        }
        let mut total = 0usize;
        for (file, entries) in &by_file {
            write_safetensors(&dir.join(file), entries)?;
            total += entries.iter().map(|e| e.data.len()).sum::<usize>();
        }
        if let Some(map) = &self.shard_map {
            write_index(dir, total, map)?;
        }
        self.copy_aux(dir)
    }

    /// Copies [`AUX_FILES`] from the source directory into `dir`.
    pub(super) fn copy_aux(&self, dir: &Path) -> Result<(), ModelError> {
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

/// Writes `model.safetensors.index.json` into `dir`: the tensors' total bytes and the tensor →
/// file map, as Hugging Face writes it.
pub(super) fn write_index(
    dir: &Path,
    total: usize,
    map: &BTreeMap<String, String>,
) -> Result<(), ModelError> {
    let index = serde_json::json!({
        "metadata": {"total_size": total},
        "weight_map": map,
    });
    let path = dir.join(INDEX);
    let text = serde_json::to_string_pretty(&index).expect("invariant: JSON value serializes");
    std::fs::write(&path, text + "\n").map_err(|source| ModelError::Write { path, source })
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
    Err(ModelError::NoWeights {
        dir: dir.to_path_buf(),
    })
}

/// One tensor to write: its name, dtype, shape and little-endian bytes.
pub(super) struct Entry<'a> {
    pub(super) name: String,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) data: std::borrow::Cow<'a, [u8]>,
}

/// The tensor names in a safetensors file's header (without reading the data).
fn tensor_names(path: &Path) -> Result<Vec<String>, ModelError> {
    use std::io::Read;
    let bad = |msg: String| ModelError::Safetensors {
        path: path.to_path_buf(),
        msg,
    };
    let mut f = std::fs::File::open(path).map_err(|source| ModelError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|e| bad(format!("no header: {e}")))?;
    let len = u64::from_le_bytes(len);
    if len > 100_000_000 {
        return Err(bad(format!("header of {len} bytes")));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header)
        .map_err(|e| bad(format!("truncated header: {e}")))?;
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("invalid header: {e}")))?;
    Ok(map
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k != "__metadata__")
        .collect())
}

pub(super) fn write_safetensors(path: &Path, entries: &[Entry]) -> Result<(), ModelError> {
    let views = entries
        .iter()
        .map(|e| {
            TensorView::new(e.dtype, e.shape.clone(), &e.data)
                .map(|v| (e.name.clone(), v))
                .map_err(|err| ModelError::Safetensors {
                    path: path.to_path_buf(),
                    msg: format!("tensor `{}`: {err}", e.name),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let meta = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    safetensors::tensor::serialize_to_file(views, &meta, path).map_err(|e| ModelError::Safetensors {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}
