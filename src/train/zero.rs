//! ZeRO stage 1 (`--zero 1`): each rank keeps AdamW's moments for its 1/N of the parameters.
//!
//! The trained parameters, in order, are packed into buckets (one dtype each, at most
//! `bucket_elems` elements unless a single parameter is larger); a bucket of n elements is padded
//! to a multiple of N and rank r owns chunk r of it. Per update: the bucket's flat gradient,
//! upcast to fp32, is reduce-scattered (rank r receives the fp32 sum of chunk r), the gradient norm is the all-reduced sum
//! of the chunks' squares, each rank applies [`adamw_update`] to its chunk, and the updated
//! chunks are all-gathered back into the parameters. AdamW is elementwise, so this is the same
//! update as one process applying it to whole tensors.
//!
//! A bucket narrower than fp32 (bf16), or stored narrower than it is computed (`--dtype float32`
//! on a bf16 checkpoint), also keeps this rank's chunk of the fp32 master weights
//! ([`super::optim`]'s header says why): AdamW updates the master chunk, the parameters' chunk is
//! copied from it (rounded to the stored dtype) and all-gathered. They are saved as `master.B`
//! beside the moments.
//!
//! On disk ([`super::state`]): the layout (world size, buckets) in the group's `group.json`, and
//! each rank's chunks (`exp_avg.B`, `exp_avg_sq.B`, `master.B`, one fp32 chunk per bucket B) in
//! its slice file. Resuming needs the same world size and layout; full moments (a group that was
//! not sharded, or one process's checkpoint) are re-sharded on load ([`ZeroAdamW::reshard_from`]).

use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::optim::{adamw_update, AdamWConfig, Moments, StepScale};
use super::TrainError;
use crate::c10d::{ProcessGroup, ReduceOp};

/// Parameters of one bucket, as saved in `zero.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketLayout {
    pub names: Vec<String>,
    pub numels: Vec<i64>,
}

/// `optimizer/zero.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZeroLayout {
    /// Ranks the moments are sharded over (the world; under expert parallelism, for the experts,
    /// the ranks holding the same experts).
    pub world_size: usize,
    /// `--expert-parallel` of the run that saved it (absent before expert parallelism existed:
    /// 1). Under expert parallelism the dense parameters and the experts have layouts of their
    /// own, so resuming needs the same E.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub expert_parallel: usize,
    pub buckets: Vec<BucketLayout>,
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

#[derive(Debug)]
struct Bucket {
    /// Indices into the trained parameters.
    params: Vec<usize>,
    /// Offset of each parameter in the flat bucket.
    offsets: Vec<i64>,
    numels: Vec<i64>,
    kind: Kind,
    /// The dtype the checkpoint stores the bucket's parameters in: a bucket keeps masters when it
    /// is narrower than fp32, and its updated values are rounded to it.
    stored: Kind,
    /// Elements per rank (the padded bucket is world_size × chunk).
    chunk: i64,
}

/// The sharded AdamW state of this rank.
#[derive(Debug)]
pub struct ZeroAdamW {
    layout: ZeroLayout,
    /// This rank's index in the group the state is sharded over.
    rank: usize,
    buckets: Vec<Bucket>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// This rank's chunk of the fp32 master weights of each bucket narrower than fp32, started
    /// from the weights at the first update unless loaded or re-sharded.
    master: Vec<Option<Tensor>>,
}

fn bad(path: &Path, msg: String) -> TrainError {
    TrainError::OptimizerState {
        path: path.to_path_buf(),
        msg,
    }
}

impl ZeroAdamW {
    /// Lays out `params` over `pg`'s ranks with fresh (zero) moments. `stored`: the stored dtype
    /// of the parameters stored narrower than they are computed ([`super::optim::AdamW::stored`]).
    pub fn new(
        params: &[(String, Tensor)],
        stored: &std::collections::BTreeMap<String, Kind>,
        pg: &ProcessGroup,
        bucket_elems: i64,
    ) -> Self {
        let world = pg.world_size() as i64;
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut layout = Vec::new();
        for (i, (name, p)) in params.iter().enumerate() {
            let n = p.numel() as i64;
            let store = stored.get(name).copied().unwrap_or(p.kind());
            let fits = buckets.last().is_some_and(|b: &Bucket| {
                b.kind == p.kind()
                    && b.stored == store
                    && b.offsets.last().unwrap_or(&0) + b.numels.last().unwrap_or(&0) + n <= bucket_elems
            });
            if !fits {
                buckets.push(Bucket {
                    params: Vec::new(),
                    offsets: Vec::new(),
                    numels: Vec::new(),
                    kind: p.kind(),
                    stored: store,
                    chunk: 0,
                });
                layout.push(BucketLayout {
                    names: Vec::new(),
                    numels: Vec::new(),
                });
            }
            let b = buckets.last_mut().expect("invariant: pushed above");
            let off = b
                .offsets
                .last()
                .map_or(0, |o| o + b.numels.last().expect("same length"));
            b.params.push(i);
            b.offsets.push(off);
            b.numels.push(n);
            let l = layout.last_mut().expect("invariant: pushed above");
            l.names.push(name.clone());
            l.numels.push(n);
        }
        for b in &mut buckets {
            let total: i64 = b.numels.iter().sum();
            b.chunk = (total + world - 1) / world;
        }
        let dev = params.first().map_or(tch::Device::Cpu, |(_, p)| p.device());
        let zeros = |b: &Bucket| Tensor::zeros([b.chunk], (Kind::Float, dev));
        ZeroAdamW {
            exp_avg: buckets.iter().map(zeros).collect(),
            exp_avg_sq: buckets.iter().map(zeros).collect(),
            master: buckets.iter().map(|_| None).collect(),
            rank: pg.rank(),
            layout: ZeroLayout {
                world_size: pg.world_size(),
                expert_parallel: 1,
                buckets: layout,
            },
            buckets,
        }
    }

    /// The same layout, recorded as part of a run with `--expert-parallel ep`.
    pub fn with_expert_parallel(mut self, ep: usize) -> Self {
        self.layout.expert_parallel = ep;
        self
    }

    /// Bytes of optimizer state this rank holds.
    pub fn state_bytes(&self) -> u64 {
        self.exp_avg
            .iter()
            .chain(&self.exp_avg_sq)
            .chain(self.master.iter().flatten())
            .map(|t| t.numel() as u64 * 4)
            .sum()
    }

    /// Bytes of the state this rank holds for the parameters `pick` selects (by name): the parts
    /// of its chunks that fall in those parameters' ranges of each bucket.
    pub fn state_bytes_where(&self, pick: impl Fn(&str) -> bool) -> u64 {
        let mut elems = 0u64;
        for (bi, b) in self.buckets.iter().enumerate() {
            let per_elem = 2 + u64::from(self.master[bi].is_some());
            let (lo_chunk, hi_chunk) = (self.rank as i64 * b.chunk, (self.rank as i64 + 1) * b.chunk);
            for (j, name) in self.layout.buckets[bi].names.iter().enumerate() {
                let (lo, hi) = (
                    b.offsets[j].max(lo_chunk),
                    (b.offsets[j] + b.numels[j]).min(hi_chunk),
                );
                if hi > lo && pick(name) {
                    elems += (hi - lo) as u64 * per_elem;
                }
            }
        }
        elems * 4
    }

    /// Bytes of the reduced gradient chunks (fp32) this rank holds during an update.
    pub fn grad_bytes(&self) -> u64 {
        self.buckets.iter().map(|b| b.chunk as u64 * 4).sum()
    }

    /// Takes this rank's chunks of full state (`opt`: from a group that was not sharded, or one
    /// process's checkpoint); parameters without moments start at zero, without masters from
    /// their weights.
    pub fn reshard_from(&mut self, opt: &Moments, params: &[(String, Tensor)]) {
        let rank = self.rank;
        let _g = tch::no_grad_guard();
        for (bi, b) in self.buckets.iter().enumerate() {
            let pick = |which: usize| {
                let parts: Vec<Tensor> = b
                    .params
                    .iter()
                    .map(|&i| {
                        let (name, p) = &params[i];
                        match opt.moments(name) {
                            Some(m) => (if which == 0 { m.0 } else { m.1 })
                                .to_kind(Kind::Float)
                                .reshape([-1]),
                            None => Tensor::zeros([p.numel() as i64], (Kind::Float, p.device())),
                        }
                    })
                    .collect();
                chunk_of(&Tensor::cat(&parts, 0), b, rank)
            };
            self.exp_avg[bi] = pick(0);
            self.exp_avg_sq[bi] = pick(1);
            if b.stored != Kind::Float {
                let parts: Vec<Tensor> = b
                    .params
                    .iter()
                    .map(|&i| {
                        let (name, p) = &params[i];
                        opt.master(name)
                            .map_or_else(|| p.detach().to_kind(Kind::Float), |m| m.to_kind(Kind::Float))
                            .reshape([-1])
                    })
                    .collect();
                self.master[bi] = Some(chunk_of(&Tensor::cat(&parts, 0), b, rank));
            }
        }
    }

    /// The layout this state was laid out with (saved as the group's `group.json`).
    pub fn layout(&self) -> &ZeroLayout {
        &self.layout
    }

    /// Refuses a saved layout (read from `path`) this state cannot continue.
    pub fn check_saved(&self, saved: &ZeroLayout, path: &Path) -> Result<(), TrainError> {
        if saved.expert_parallel != self.layout.expert_parallel {
            return Err(bad(
                path,
                format!(
                    "saved with --zero 1 at --expert-parallel {}, this run has {}: resume at \
                     --expert-parallel {} (or from a checkpoint with full moments)",
                    saved.expert_parallel, self.layout.expert_parallel, saved.expert_parallel
                ),
            ));
        }
        if saved.world_size != self.layout.world_size {
            return Err(bad(
                path,
                format!(
                    "saved by {} ranks with --zero 1, this run has {}: resume at world size {} (re-sharding \
                     ZeRO state across world sizes is not supported)",
                    saved.world_size, self.layout.world_size, saved.world_size
                ),
            ));
        }
        if saved.buckets != self.layout.buckets {
            return Err(bad(
                path,
                "the saved bucket layout differs from this run's (another --freeze, --bucket-mb or model?)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Loads this rank's chunks from `file` (written by [`ZeroAdamW::write_slice`] with this
    /// layout: check it first with [`ZeroAdamW::check_saved`]).
    pub fn read_slice(&mut self, file: &Path) -> Result<(), TrainError> {
        let tensors = Tensor::read_safetensors(file).map_err(|e| bad(file, e.to_string()))?;
        let dev = self.exp_avg.first().map_or(tch::Device::Cpu, Tensor::device);
        for (name, t) in tensors {
            let (which, b) = name
                .split_once('.')
                .and_then(|(w, b)| Some((w, b.parse::<usize>().ok()?)))
                .filter(|(_, b)| *b < self.buckets.len())
                .ok_or_else(|| bad(file, format!("unexpected tensor `{name}`")))?;
            if t.size() != [self.buckets[b].chunk] {
                return Err(bad(file, format!("`{name}` has shape {:?}", t.size())));
            }
            match which {
                "exp_avg" => self.exp_avg[b] = t.to_device(dev),
                "exp_avg_sq" => self.exp_avg_sq[b] = t.to_device(dev),
                "master" => self.master[b] = Some(t.to_device(dev)),
                _ => return Err(bad(file, format!("unexpected tensor `{name}`"))),
            }
        }
        Ok(())
    }

    /// Writes this rank's chunks to `file`.
    pub fn write_slice(&self, file: &Path) -> Result<(), TrainError> {
        let mut tensors = Vec::new();
        for (b, (m, v)) in self.exp_avg.iter().zip(&self.exp_avg_sq).enumerate() {
            tensors.push((format!("exp_avg.{b}"), m.to_device(tch::Device::Cpu)));
            tensors.push((format!("exp_avg_sq.{b}"), v.to_device(tch::Device::Cpu)));
            if let Some(w) = &self.master[b] {
                tensors.push((format!("master.{b}"), w.to_device(tch::Device::Cpu)));
            }
        }
        Tensor::write_safetensors(&tensors, file).map_err(|e| bad(file, e.to_string()))
    }

    /// Reduce-scatters the gradients: this rank's chunk of each bucket's summed flat gradient,
    /// in fp32 (the bucket's parameters may be narrower).
    /// `defined[i]`: some rank has a gradient for parameter i (the others contribute zeros).
    pub fn reduce_scatter(
        &self,
        params: &[(String, Tensor)],
        defined: &[bool],
        pg: &ProcessGroup,
    ) -> Result<Vec<Tensor>, crate::c10d::DistError> {
        let _g = tch::no_grad_guard();
        let mut out = Vec::new();
        for (bi, b) in self.buckets.iter().enumerate() {
            // fp32 whatever the bucket's dtype: bf16 partial sums would round every gradient.
            let dev = params[b.params[0]].1.device();
            let flat = padded(b, Kind::Float, pg.world_size(), dev, |i| {
                let (_, p) = &params[i];
                let g = p.grad();
                (defined[i] && g.defined()).then(|| g.to_kind(Kind::Float).reshape([-1]))
            });
            let chunk = Tensor::zeros([b.chunk], (Kind::Float, flat.device()));
            pg.reduce_scatter(
                &chunk,
                &flat,
                ReduceOp::Sum,
                &format!("gradient bucket {}/{}", bi + 1, self.buckets.len()),
            )?;
            out.push(chunk);
        }
        Ok(out)
    }

    /// AdamW on this rank's chunks with their reduced gradients `grads`, then all-gathers the
    /// updated parameters. Parameters nobody has a gradient for are left alone.
    pub(crate) fn step(
        &mut self,
        params: &[(String, Tensor)],
        defined: &[bool],
        grads: &[Tensor],
        (step, cfg): (StepScale, &AdamWConfig),
        pg: &ProcessGroup,
    ) -> Result<(), crate::c10d::DistError> {
        let _g = tch::no_grad_guard();
        let rank = pg.rank() as i64;
        for (bi, b) in self.buckets.iter().enumerate() {
            let dev = params[b.params[0]].1.device();
            let flat = padded(b, b.kind, pg.world_size(), dev, |i| {
                Some(params[i].1.detach().reshape([-1]))
            });
            let mine = chunk_of(&flat, b, rank as usize);
            if b.stored != Kind::Float && self.master[bi].is_none() {
                self.master[bi] = Some(mine.to_kind(Kind::Float));
            }
            let (lo_chunk, hi_chunk) = (rank * b.chunk, (rank + 1) * b.chunk);
            for (j, &i) in b.params.iter().enumerate() {
                let (lo, hi) = (
                    b.offsets[j].max(lo_chunk),
                    (b.offsets[j] + b.numels[j]).min(hi_chunk),
                );
                if lo >= hi || !defined[i] {
                    continue;
                }
                let (at, n) = (lo - lo_chunk, hi - lo);
                let mut seg = mine.narrow(0, at, n);
                let g = grads[bi].narrow(0, at, n).to_kind(Kind::Float);
                let mut m = self.exp_avg[bi].narrow(0, at, n);
                let mut v = self.exp_avg_sq[bi].narrow(0, at, n);
                let decay = params[i].1.dim() > 1;
                let master = self.master[bi].as_ref().map(|w| w.narrow(0, at, n));
                let base = master
                    .as_ref()
                    .map_or_else(|| seg.to_kind(Kind::Float), Tensor::copy);
                let new = adamw_update(base, &g, &mut m, &mut v, decay, step.lr, step.bc, cfg);
                if let Some(mut w) = master {
                    w.copy_(&new);
                }
                seg.copy_(&new.to_kind(b.stored).to_kind(b.kind));
            }
            let what = format!("updated parameters, bucket {}/{}", bi + 1, self.buckets.len());
            pg.all_gather(&flat, &mine, &what)?;
            for (j, &i) in b.params.iter().enumerate() {
                let mut p = params[i].1.shallow_clone();
                p.copy_(
                    &flat
                        .narrow(0, b.offsets[j], b.numels[j])
                        .view(p.size().as_slice()),
                );
            }
        }
        Ok(())
    }
}

/// The bucket's flat tensor, parameters in order (zeros where `part` gives none), zero-padded
/// to world_size × chunk.
fn padded(
    b: &Bucket,
    kind: Kind,
    world: usize,
    dev: tch::Device,
    part: impl Fn(usize) -> Option<Tensor>,
) -> Tensor {
    let mut parts: Vec<Tensor> = b
        .params
        .iter()
        .zip(&b.numels)
        .map(|(&i, &n)| part(i).unwrap_or_else(|| Tensor::zeros([n], (kind, dev))))
        .collect();
    let total: i64 = b.numels.iter().sum();
    let pad = b.chunk * world as i64 - total;
    if pad > 0 {
        parts.push(Tensor::zeros([pad], (kind, dev)));
    }
    Tensor::cat(&parts, 0)
}

/// Rank `rank`'s chunk of a flat tensor (padded when shorter), as its own contiguous tensor.
fn chunk_of(flat: &Tensor, b: &Bucket, rank: usize) -> Tensor {
    let start = b.chunk * rank as i64;
    let n = flat.size()[0];
    let take = (n - start).clamp(0, b.chunk);
    let out = Tensor::zeros([b.chunk], (flat.kind(), flat.device()));
    if take > 0 {
        out.narrow(0, 0, take).copy_(&flat.narrow(0, start, take));
    }
    out
}
