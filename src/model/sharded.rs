//! Saving a checkpoint as Hugging Face sharded safetensors (`model-0000k-of-0000n.safetensors` +
//! `model.safetensors.index.json`) from the ranks of an expert-parallel group, each expert written
//! exactly once, and in either expert layout ([`ExpertLayout`]).
//!
//! With E ranks in the group, rank r writes shard r+1 of E: the per-expert tensors of its own
//! experts, the fused tensors of the MoE layers it is the writer of (layer i's writer is rank
//! i mod E; the layer's slices are all-gathered to it, one layer at a time, because a tensor
//! cannot be split across files), and, on rank 0, every other tensor (non-expert weights and
//! the tensors carried through). The index lists every tensor; every rank can compute it from
//! the config and var names alone, so rank 0 writes it without gathering names.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::checkpoint::{to_dtype, write_index, write_safetensors, Entry};
use super::{Model, ModelError};
use crate::c10d::ProcessGroup;

/// How the routed experts are stored in a saved checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ExpertLayout {
    /// As the source checkpoint stored them.
    #[default]
    Keep,
    /// `experts.N.{gate,up,down}_proj.weight`, one set per expert.
    PerExpert,
    /// `experts.gate_up_proj` `[E, 2·I, hidden]` and `experts.down_proj` `[E, hidden, I]`.
    Fused,
}

/// The name of shard `k` (0-based) of `n`.
pub fn shard_file(k: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", k + 1, n)
}

fn entry(name: String, t: &Tensor, kind: Kind) -> Result<Entry<'static>, ModelError> {
    let t = t.detach().to_device(Device::Cpu).to_kind(kind).contiguous();
    let mut data = vec![0u8; t.numel() * kind.elt_size_in_bytes()];
    t.f_copy_data_u8(&mut data, t.numel())?;
    Ok(Entry {
        name,
        dtype: to_dtype(kind),
        shape: t.size().iter().map(|&d| d as usize).collect(),
        data: Cow::Owned(data),
    })
}

/// `model.layers.N.mlp` of each MoE layer, in layer order.
fn moe_layers(vars: &BTreeMap<String, Tensor>) -> Vec<String> {
    let mut layers: Vec<(i64, String)> = vars
        .keys()
        .filter_map(|n| {
            let (prefix, _) = n.split_once(".experts.")?;
            let (before, _) = prefix.rsplit_once(".mlp")?;
            let num = before.rsplit('.').next()?.parse().ok()?;
            Some((num, prefix.to_string()))
        })
        .collect();
    layers.sort();
    layers.dedup();
    layers.into_iter().map(|(_, p)| p).collect()
}

impl Model {
    /// True when `save` would not write what [`Model::save`] writes: experts split over ranks, or
    /// another expert layout than the source's.
    pub fn needs_sharded_save(&self, layout: ExpertLayout) -> bool {
        !self.cfg().expert_shard.is_whole()
            || match layout {
                ExpertLayout::Keep => false,
                ExpertLayout::PerExpert => self.cfg().fused_experts,
                ExpertLayout::Fused => !self.cfg().fused_experts,
            }
    }

    /// Writes this rank's shard (see the module header) into existing directory `dir`; rank 0
    /// also writes the index and the auxiliary files. Every rank of `ep` (the expert-parallel
    /// group whose experts this model holds, or a group of one) calls it.
    pub fn save_sharded(
        &self,
        dir: &Path,
        ep: &ProcessGroup,
        layout: ExpertLayout,
    ) -> Result<(), ModelError> {
        let cfg = self.cfg();
        let (rank, size) = (ep.rank(), ep.world_size());
        let fused = match layout {
            ExpertLayout::Keep => cfg.fused_experts,
            ExpertLayout::PerExpert => false,
            ExpertLayout::Fused => true,
        };
        let vars: BTreeMap<String, Tensor> = self.named_variables().into_iter().collect();
        let kind_of = |name: &str| self.var_kinds.get(name).copied().unwrap_or(self.file_kind);
        let (n, inter) = (cfg.num_experts, cfg.moe_intermediate_size);
        let per = cfg.expert_shard.per_rank(n);
        let mine = cfg.expert_shard.range(n);
        let mut map: BTreeMap<String, String> = BTreeMap::new();
        let mut total = 0usize;
        let mut entries: Vec<Entry> = Vec::new();
        let mut add = |name: String, file: usize, bytes: usize| {
            map.insert(name, shard_file(file, size));
            total += bytes;
        };
        for (name, t) in &vars {
            if !name.contains(".mlp.experts.") {
                let kind = kind_of(name);
                add(name.clone(), 0, t.numel() * kind.elt_size_in_bytes());
                if rank == 0 {
                    entries.push(entry(name.clone(), t, kind)?);
                }
            }
        }
        for c in &self.carried {
            add(c.name.clone(), 0, c.data.len());
            if rank == 0 {
                entries.push(Entry {
                    name: c.name.clone(),
                    dtype: c.dtype,
                    shape: c.shape.clone(),
                    data: Cow::Borrowed(&c.data),
                });
            }
        }
        let bad = |msg: String| ModelError::Config {
            path: dir.to_path_buf(),
            msg,
        };
        for (li, lp) in moe_layers(&vars).iter().enumerate() {
            let var = |name: String| {
                vars.get(&name)
                    .map(|t| (t.shallow_clone(), kind_of(&name)))
                    .ok_or_else(|| bad(format!("no var `{name}`")))
            };
            // This rank's experts of the layer as `[per, 2·I, H]` and `[per, H, I]`.
            let local = || -> Result<(Tensor, Tensor, Kind), ModelError> {
                if cfg.fused_experts {
                    let (gu, kind) = var(format!("{lp}.experts.gate_up_proj"))?;
                    let (down, _) = var(format!("{lp}.experts.down_proj"))?;
                    return Ok((gu, down, kind));
                }
                let (mut gu, mut down, mut kind) = (Vec::new(), Vec::new(), self.file_kind);
                for e in mine.clone() {
                    let (g, k) = var(format!("{lp}.experts.{e}.gate_proj.weight"))?;
                    let (u, _) = var(format!("{lp}.experts.{e}.up_proj.weight"))?;
                    let (d, _) = var(format!("{lp}.experts.{e}.down_proj.weight"))?;
                    gu.push(Tensor::cat(&[g, u], 0));
                    down.push(d);
                    kind = k;
                }
                Ok((Tensor::stack(&gu, 0), Tensor::stack(&down, 0), kind))
            };
            if fused {
                let writer = li % size;
                let (gu, down, kind) = local()?;
                for (suffix, t) in [("gate_up_proj", gu), ("down_proj", down)] {
                    let name = format!("{lp}.experts.{suffix}");
                    let t = t.detach().to_kind(kind).contiguous();
                    let mut full_size = t.size();
                    full_size[0] = n;
                    let full = Tensor::zeros(full_size.as_slice(), (kind, t.device()));
                    ep.all_gather(&full, &t, &format!("saving `{name}`"))
                        .map_err(|e| bad(e.to_string()))?;
                    add(name.clone(), writer, full.numel() * kind.elt_size_in_bytes());
                    if rank == writer {
                        entries.push(entry(name, &full, kind)?);
                    }
                }
                continue;
            }
            let (split, kind) = if cfg.fused_experts {
                let (gu, down, kind) = local()?;
                (Some((gu, down)), kind)
            } else {
                (
                    None,
                    kind_of(&format!("{lp}.experts.{}.gate_proj.weight", mine.start)),
                )
            };
            for e in 0..n {
                let owner = (e / per) as usize;
                let names =
                    ["gate_proj", "up_proj", "down_proj"].map(|p| format!("{lp}.experts.{e}.{p}.weight"));
                for name in &names {
                    add(
                        name.clone(),
                        owner,
                        (inter * cfg.hidden_size) as usize * kind.elt_size_in_bytes(),
                    );
                }
                if owner != rank {
                    continue;
                }
                let tensors = match &split {
                    Some((gu, down)) => {
                        let j = e - mine.start;
                        let gu = gu.get(j);
                        [gu.narrow(0, 0, inter), gu.narrow(0, inter, inter), down.get(j)]
                    }
                    None => {
                        let get = |i: usize| var(names[i].clone()).map(|v| v.0);
                        [get(0)?, get(1)?, get(2)?]
                    }
                };
                for (name, t) in names.iter().zip(tensors) {
                    entries.push(entry(name.clone(), &t, kind)?);
                }
            }
        }
        write_safetensors(&dir.join(shard_file(rank, size)), &entries)?;
        if rank != 0 {
            return Ok(());
        }
        write_index(dir, total, &map)?;
        self.copy_aux(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_files_and_moe_layers_are_named_like_hugging_face() {
        assert_eq!(shard_file(0, 2), "model-00001-of-00002.safetensors");
        assert_eq!(shard_file(1, 2), "model-00002-of-00002.safetensors");
        let t = || Tensor::zeros([1], (Kind::Float, Device::Cpu));
        let vars: BTreeMap<String, Tensor> = [
            "model.layers.10.mlp.experts.0.gate_proj.weight",
            "model.layers.2.mlp.experts.gate_up_proj",
            "model.layers.2.mlp.experts.down_proj",
            "model.layers.2.mlp.gate.weight",
            "model.layers.3.mlp.gate_proj.weight",
        ]
        .into_iter()
        .map(|n| (n.to_string(), t()))
        .collect();
        assert_eq!(
            moe_layers(&vars),
            vec![
                "model.layers.2.mlp".to_string(),
                "model.layers.10.mlp".to_string()
            ]
        );
    }
}
