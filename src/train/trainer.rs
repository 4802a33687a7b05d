//! `Trainer`: one GSPO step over a batch of samples on a loaded checkpoint.
//!
//! Order of work: validate every sample ([`Batch::new`]) → pass 1 without gradients recomputes
//! π_old with the recorded routing replayed (trainer-side recomputation; also entropy, expert
//! overlap and rollout-vs-trainer agreement) → for each of `updates` mini-batches of whole groups:
//! current log-probs (pass 1 for the first), the objective's per-trajectory coefficients, then
//! micro-batches of at most `micro_batch_tokens` tokens backpropagate Σ c_t·log π_θ(t) into the
//! accumulated gradient → grad-norm clip → AdamW. Sequences of a micro-batch are packed into one
//! row with a block-diagonal causal mask.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::model::sampled::Processing;
use crate::model::{AttnMask, ExpertLayout, ForwardInput, Model};
use crate::records::{Sample, StepMetrics};

use super::batch::{micro_batches, processing, Batch, Seq};
use super::groups::ParamGroup;
use super::gspo::{accumulate, coefficients, TrajTerm};
use super::optim::AdamW;
use super::settings::Settings;
use super::shard::{combine_per_seq, shard, sum_scalars};
use super::state::SavedState;
use super::update::trainable;
use super::TrainError;
use crate::c10d::ProcessGroup;

pub use super::save::check_out;

/// `lego-rl.json` in a checkpoint written by train-step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct CheckpointInfo {
    /// Policy version of this checkpoint (= train steps since the base model).
    pub policy_version: u64,
    /// Optimizer updates applied so far.
    pub optimizer_steps: u64,
    /// Checkpoint this one was trained from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_checkpoint: Option<PathBuf>,
    /// Samples consumed over all steps.
    pub samples_consumed: u64,
    /// Samples of the step that produced this checkpoint.
    pub samples_this_step: u64,
}

pub(super) const INFO_FILE: &str = "lego-rl.json";

/// A model with its optimizer state, ready to take steps.
#[derive(Debug)]
pub struct Trainer {
    pub model: Model,
    /// The step counter (the parameter groups hold the moments and masters).
    pub opt: AdamW,
    pub info: CheckpointInfo,
    pub(super) source: Option<PathBuf>,
    /// The parameter groups with their optimizer state ([`super::groups`]), laid out at the
    /// first step.
    pub(super) groups: Vec<ParamGroup>,
    /// The optimizer state the loaded checkpoint holds, restored into the groups when they are
    /// laid out.
    pub(super) saved: SavedState,
    /// Expert parallelism ([`super::expert`]), when this rank holds only some experts.
    pub expert: Option<super::expert::ExpertParallel>,
    /// The expert layout the checkpoint is saved in.
    pub expert_layout: ExpertLayout,
}

/// Per-micro-batch results of a forward.
struct MbInputs {
    tokens: Tensor,
    positions: Tensor,
    /// Positions whose next token is scored, and those next tokens.
    at: Tensor,
    next: Tensor,
    /// Block-diagonal mask when several sequences are packed.
    mask: Option<Tensor>,
    /// The recorded experts (`-1` rows: none recorded), `[tokens, moe layers, k]`.
    recorded: Option<Tensor>,
    /// Whether the forward replays `recorded` (R3) or only compares with it.
    replay: bool,
    /// (offset, rows) of each sequence's recorded routing.
    recorded_rows: Vec<(i64, i64)>,
    /// The distributions the scored tokens were sampled from, when not all the model's own.
    proc: Option<Processing>,
}

impl MbInputs {
    fn forward_input(&self) -> ForwardInput<'_> {
        ForwardInput {
            tokens: &self.tokens,
            positions: &self.positions,
            mask: self.mask.as_ref().map_or(AttnMask::Causal, AttnMask::Packed),
            replay: self.recorded.as_ref().filter(|_| self.replay),
        }
    }
}

struct MbOut {
    /// Log-probs of the policy tokens, sequences in micro-batch order.
    lp: Tensor,
    entropy: Option<Tensor>,
    /// (equal (token, layer) sets, compared sets) between the router's own top-k and the record.
    overlap: (i64, i64),
}

impl Trainer {
    /// Wraps a model (e.g. random, for tests) with a fresh optimizer.
    pub fn new(model: Model) -> Self {
        Trainer {
            model,
            opt: AdamW::default(),
            info: CheckpointInfo::default(),
            source: None,
            groups: Vec::new(),
            saved: SavedState::default(),
            expert: None,
            expert_layout: ExpertLayout::Keep,
        }
    }

    /// The packed input tensors of micro-batch `mb` (its sequences concatenated into one row).
    fn inputs(&self, batch: &Batch, mb: &[usize], use_replay: bool) -> MbInputs {
        let dev = self.model.device();
        let moe_l = self.model.lm.moe_layers() as i64;
        let k = self.model.cfg().num_experts_per_tok;
        let total: usize = mb.iter().map(|&i| batch.seqs[i].tokens.len()).sum();
        let mut tokens = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        let mut segment = Vec::with_capacity(total);
        let mut at = Vec::new();
        let mut replay = if moe_l > 0 {
            vec![-1i64; total * (moe_l * k) as usize]
        } else {
            Vec::new()
        };
        let mut recorded_rows = Vec::new();
        for (j, &i) in mb.iter().enumerate() {
            let s: &Seq = &batch.seqs[i];
            let off = tokens.len();
            tokens.extend_from_slice(&s.tokens);
            positions.extend(0..s.tokens.len() as i64);
            segment.extend(std::iter::repeat_n(j as i64, s.tokens.len()));
            at.extend(s.pred_at.iter().map(|&p| p + off as i64));
            if let Some((rows, ids)) = &s.routing {
                let w = (moe_l * k) as usize;
                replay[off * w..(off + rows) * w].copy_from_slice(ids);
                recorded_rows.push((off as i64, *rows as i64));
            }
        }
        let tokens = Tensor::from_slice(&tokens).to_device(dev);
        let positions = Tensor::from_slice(&positions).to_device(dev);
        let at_t = Tensor::from_slice(&at).to_device(dev);
        let next = tokens.index_select(0, &(&at_t + 1));
        let mask = (mb.len() > 1).then(|| {
            let seg = Tensor::from_slice(&segment).to_device(dev);
            let idx = Tensor::arange(total as i64, (Kind::Int64, dev));
            seg.unsqueeze(1)
                .eq_tensor(&seg.unsqueeze(0))
                .logical_and(&idx.unsqueeze(0).le_tensor(&idx.unsqueeze(1)))
        });
        let replay_t = (moe_l > 0).then(|| {
            Tensor::from_slice(&replay)
                .to_device(dev)
                .view([total as i64, moe_l, k])
        });
        MbInputs {
            tokens,
            positions,
            at: at_t,
            next,
            mask,
            recorded: replay_t,
            replay: use_replay,
            recorded_rows,
            proc: processing(&batch.seqs, mb, dev),
        }
    }

    /// Log-probs (no gradients) of micro-batch `mb`, plus entropy and expert overlap with
    /// `extras`.
    fn forward(&self, batch: &Batch, mb: &[usize], extras: bool, s: &Settings) -> MbOut {
        let inp = self.inputs(batch, mb, s.replay);
        let out = self.model.lm.forward(&inp.forward_input(), None);
        let (lp, entropy) = self.model.lm.next_token_logprobs_chunked(
            &out.hidden,
            &inp.at,
            &inp.next,
            extras,
            s.logprob_chunk,
            inp.proc.as_ref(),
        );
        let mut overlap = (0, 0);
        if let (true, Some(own), Some(rec)) = (extras, &out.router_topk, &inp.recorded) {
            for &(off, rows) in &inp.recorded_rows {
                let (a, _) = own.narrow(0, off, rows).sort(-1, false);
                let (b, _) = rec.narrow(0, off, rows).sort(-1, false);
                let eq = a.eq_tensor(&b).all_dim(-1, false);
                overlap.0 += eq.sum(Kind::Int64).int64_value(&[]);
                overlap.1 += eq.numel() as i64;
            }
        }
        MbOut { lp, entropy, overlap }
    }

    /// Per-sequence log-probs of the policy tokens without gradients (plus extras on request).
    fn score(
        &self,
        batch: &Batch,
        idx: &[usize],
        budget: usize,
        extras: bool,
        s: &Settings,
    ) -> Result<Scored, TrainError> {
        let _g = tch::no_grad_guard();
        let mut per_seq = vec![Vec::new(); batch.seqs.len()];
        // (Σ entropy, count) of the sampled positions.
        let mut entropy = (0.0, 0.0);
        let mut overlap = (0, 0);
        for round in self.rounds(micro_batches(&batch.seqs, idx, budget))? {
            let Some(mb) = round else {
                self.idle_round(false, s)?;
                continue;
            };
            let out = self.forward(batch, &mb, extras, s);
            self.check_exchanges()?;
            let lp = Vec::<f64>::try_from(out.lp.to_kind(Kind::Double)).expect("invariant: 1-d f64");
            if let Some(e) = out.entropy {
                let e = Vec::<f64>::try_from(e.to_kind(Kind::Double)).expect("invariant: 1-d f64");
                entropy.0 += e.iter().sum::<f64>();
                entropy.1 += e.len() as f64;
            }
            overlap.0 += out.overlap.0;
            overlap.1 += out.overlap.1;
            let mut o = 0;
            for &i in &mb {
                let n = batch.seqs[i].pred_at.len();
                per_seq[i] = lp[o..o + n].to_vec();
                o += n;
            }
        }
        Ok((per_seq, entropy, overlap))
    }

    /// Runs one training step on `samples` (read from `path`, for error messages) in this
    /// process alone.
    pub fn step(&mut self, samples: &[Sample], path: &Path, s: &Settings) -> Result<StepMetrics, TrainError> {
        let pg = ProcessGroup::single().with_device(self.model.device());
        self.step_on(samples, path, s, &pg)
    }

    /// Runs this rank's part of one training step of `pg` on `samples` (every rank passes the
    /// same): the same update as one process on the whole batch.
    pub fn step_on(
        &mut self,
        samples: &[Sample],
        path: &Path,
        s: &Settings,
        pg: &ProcessGroup,
    ) -> Result<StepMetrics, TrainError> {
        let started = Instant::now();
        let cfg = self.model.cfg().clone();
        let batch = Batch::new(samples, &cfg, self.model.lm.moe_layers(), path, s.adv_eps)?;
        let all: Vec<usize> = (0..batch.seqs.len()).collect();
        // Before any forward pass: a bad --freeze pattern or optimizer state fails at once.
        let all_params = self.model.named_variables();
        let params = trainable(&all_params, s.freeze.as_deref())?;
        self.prepare_optimizer(&all_params, &params, s, pg)?;
        let budget = s.micro_batch_tokens.max(1);
        let (world, rank) = (pg.world_size(), pg.rank());
        // Pass 1: π_old (with replayed routing unless `s.replay` is off), plus diagnostics, each rank on its shard.
        let (mine, ent, overlap) = self.score(&batch, &shard(&batch, &all, world, rank), budget, true, s)?;
        let old = combine_per_seq(pg, &batch, &all, mine, "π_old log-probs (pass 1)")?;
        let d = sum_scalars(
            pg,
            &[ent.0, ent.1, overlap.0 as f64, overlap.1 as f64],
            "pass-1 diagnostics",
        )?;
        let entropy = (d[1] > 0.0).then(|| d[0] / d[1]);
        let overlap = (d[2] as i64, d[3] as i64);
        tracing::debug!(
            seconds = started.elapsed().as_secs_f64(),
            "π_old recomputed (pass 1)"
        );
        finite_logprobs(&batch, &old, "π_old log-prob (pass 1)")?;
        let (is_weights, is_stats) = super::correction::for_batch(&s.corrections(), &batch, &old)?;
        let n_groups = batch.groups.len();
        let updates = s.updates.clamp(1, n_groups.max(1));
        let per_update = n_groups.div_ceil(updates);
        let (mut losses, mut ratios, mut clipped, mut grad_norms, mut lr_used) =
            (Vec::new(), Vec::new(), 0usize, Vec::new(), None);
        let mut copies = 0u64;
        for (u, chunk) in batch.groups.chunks(per_update).enumerate() {
            let in_chunk: Vec<bool> = {
                let mut v = vec![false; batch.trajs.len()];
                chunk.iter().flatten().for_each(|&t| v[t] = true);
                v
            };
            let idx: Vec<usize> = all
                .iter()
                .copied()
                .filter(|&i| in_chunk[batch.seqs[i].traj])
                .collect();
            let my_idx = shard(&batch, &idx, world, rank);
            let cur = if u == 0 {
                old.clone()
            } else {
                let mine = self.score(&batch, &my_idx, budget, false, s)?.0;
                combine_per_seq(
                    pg,
                    &batch,
                    &idx,
                    mine,
                    &format!("log-probs before update {}", u + 1),
                )?
            };
            if u > 0 {
                finite_logprobs(&batch, &cur, "log-prob before an update")?;
            }
            let mut terms = terms_of(&batch, &in_chunk);
            for &i in &idx {
                accumulate(&mut terms[batch.seqs[i].traj], &cur[i], &old[i], &is_weights[i]);
            }
            let obj = coefficients(s.loss, &terms, s.eps_low, s.eps_high);
            if !obj.loss.is_finite() {
                return Err(TrainError::NonFinite {
                    what: "loss",
                    value: obj.loss,
                });
            }
            losses.push(obj.loss);
            for (ti, q) in terms.iter().enumerate() {
                if q.contributes {
                    ratios.push(obj.ratio[ti]);
                    clipped += obj.clipped[ti] as usize;
                }
            }
            if obj.coef.iter().all(|&c| c == 0.0) {
                tracing::warn!(
                    "update {u}: no trajectory carries a learning signal (all groups degenerate); skipped"
                );
                continue;
            }
            // Frozen parameters get gradients too (they are not excluded from autograd); clearing
            // them keeps them from accumulating over updates.
            for (_, p) in &all_params {
                let mut p = p.shallow_clone();
                p.zero_grad();
            }
            self.backward(&batch, &my_idx, &obj.coef, &is_weights, s)?;
            let up = match self.sync_and_update(&params, s, pg) {
                Err(TrainError::NonFinite {
                    what: "gradient norm",
                    value,
                }) => {
                    let grads = Backward {
                        batch: &batch,
                        coef: &obj.coef,
                        is_weights: &is_weights,
                    };
                    return Err(self.blame_gradient(&grads, &my_idx, &all_params, value, s));
                }
                r => r?,
            };
            grad_norms.push(up.norm);
            lr_used = Some(up.lr);
            copies = copies.max(up.copy_bytes);
            tracing::debug!(
                seconds = started.elapsed().as_secs_f64(),
                update = u,
                "optimizer step done"
            );
        }
        let elapsed = started.elapsed().as_secs_f64();
        let prev = self.info.policy_version;
        self.info = CheckpointInfo {
            policy_version: prev + 1,
            optimizer_steps: self.opt.steps,
            parent_checkpoint: self.source.clone(),
            samples_consumed: self.info.samples_consumed + samples.len() as u64,
            samples_this_step: samples.len() as u64,
        };
        let mut m = super::metrics::step_metrics(
            prev,
            samples,
            &batch,
            &old,
            entropy,
            overlap,
            super::metrics::Finished {
                losses,
                ratios,
                clipped,
                grad_norms,
                lr: lr_used.unwrap_or_else(|| s.optim.lr_at(self.opt.steps)),
                elapsed,
            },
        );
        m.by_harness = super::harness_metrics::by_harness(samples, &batch, &old);
        m.routing_replay = (self.model.lm.moe_layers() > 0).then_some(s.replay);
        if m.routing_replay == Some(true) {
            // Tokens of samples without recorded routing ran on the trainer's own routing.
            let (missing, total) = batch.seqs.iter().fold((0usize, 0usize), |(m, t), q| {
                let n = q.pred_at.len();
                (m + if q.routing.is_none() { n } else { 0 }, t + n)
            });
            m.unreplayed_token_fraction = (total > 0).then(|| missing as f64 / total as f64);
        }
        super::correction::record(&s.corrections(), &is_stats, &mut m);
        self.memory_metrics(&mut m, &params, pg, copies);
        Ok(m)
    }

    /// Backpropagates Σ c_t·log π_θ(t) of this rank's sequences `my_idx` into the accumulated
    /// gradient, micro-batch by micro-batch (`coef`: per trajectory; `is_weights`: per token).
    fn backward(
        &self,
        batch: &Batch,
        my_idx: &[usize],
        coef_of: &[f64],
        is_weights: &[Vec<f64>],
        s: &Settings,
    ) -> Result<(), TrainError> {
        let budget = s.micro_batch_tokens.max(1);
        // Micro-batches whose tokens all have coefficient 0 carry no gradient: skipped (under
        // expert parallelism they become idle rounds, since the others' tokens may still
        // need this rank's experts).
        let work: Vec<(Vec<usize>, Vec<f64>)> = micro_batches(&batch.seqs, my_idx, budget)
            .into_iter()
            .map(|mb| {
                let coef = mb
                    .iter()
                    .flat_map(|&i| {
                        let c = coef_of[batch.seqs[i].traj];
                        is_weights[i].iter().map(move |w| c * w)
                    })
                    .collect::<Vec<f64>>();
                (mb, coef)
            })
            .filter(|(_, coef)| coef.iter().any(|&c| c != 0.0))
            .collect();
        for round in self.rounds(work)? {
            let Some((mb, coef)) = round else {
                self.idle_round(true, s)?;
                continue;
            };
            let coef = Tensor::from_slice(&coef)
                .to_device(self.model.device())
                .to_kind(Kind::Float);
            let inp = self.inputs(batch, &mb, s.replay);
            let lm = &self.model.lm;
            let head = |hidden: &Tensor| {
                lm.backward_logprobs(
                    hidden,
                    &inp.at,
                    &inp.next,
                    &coef,
                    s.logprob_chunk,
                    inp.proc.as_ref(),
                )
            };
            let done = if s.activation_checkpointing {
                lm.backward_checkpointed(&inp.forward_input(), head)
            } else {
                head(&lm.forward(&inp.forward_input(), None).hidden)
            };
            let _lp = done.map_err(|e| self.torch_or_expert(e))?;
            self.check_exchanges()?;
        }
        Ok(())
    }
}

/// What one backward pass of an update reads: the batch, the per-trajectory coefficients and the
/// per-token correction weights.
struct Backward<'a> {
    batch: &'a Batch,
    coef: &'a [f64],
    is_weights: &'a [Vec<f64>],
}

impl Trainer {
    /// The error for a non-finite gradient norm, naming the sample that makes it: each of this
    /// rank's sequences `mine` is backpropagated alone, and the first whose gradient holds a
    /// non-finite value is named. Only this failure path pays for it. A forward can be finite
    /// where its backward is not (a NaN at a position past the last policy token leaves every
    /// log-prob finite, but its zero upstream gradient times NaN is NaN in the weights'), so the
    /// log-prob checks cannot name it. Under expert parallelism a sequence's backward needs the
    /// other ranks' experts, so the sample is not looked for; a sample on another rank is
    /// named there.
    fn blame_gradient(
        &self,
        b: &Backward,
        mine: &[usize],
        vars: &[(String, Tensor)],
        value: f64,
        s: &Settings,
    ) -> TrainError {
        let unnamed = TrainError::NonFinite {
            what: "gradient norm",
            value,
        };
        if self.expert.is_some() {
            return unnamed;
        }
        for &i in mine {
            for (_, v) in vars {
                let mut v = v.shallow_clone();
                v.zero_grad();
            }
            if self.backward(b.batch, &[i], b.coef, b.is_weights, s).is_err() {
                continue;
            }
            let bad = vars.iter().any(|(_, v)| {
                let g = v.grad();
                g.defined() && g.isfinite().all().int64_value(&[]) == 0
            });
            if bad {
                return TrainError::NonFiniteGradient {
                    sample: b.batch.seqs[i].id.clone(),
                    value,
                };
            }
        }
        unnamed
    }
}

/// What [`Trainer::score`] returns: per-sequence log-probs (empty for sequences not scored),
/// (Σ entropy, count) of the sampled positions, and (equal, compared) expert sets.
type Scored = (Vec<Vec<f64>>, (f64, f64), (i64, i64));

/// A non-finite log-prob of the trainer's (`lp`, per sequence of `batch`) stops the step, naming
/// the sample and the token: every figure and weight computed from it would be NaN or hidden.
fn finite_logprobs(batch: &Batch, lp: &[Vec<f64>], what: &'static str) -> Result<(), TrainError> {
    for (seq, row) in batch.seqs.iter().zip(lp) {
        if let Some(j) = row.iter().position(|l| !l.is_finite()) {
            return Err(TrainError::NonFiniteSample {
                what,
                sample: seq.id.clone(),
                token: j,
                value: row[j],
            });
        }
    }
    Ok(())
}

/// The objective's per-trajectory terms of one update: the trajectories of `in_chunk` contribute
/// (if they can), the others weigh nothing.
fn terms_of(batch: &Batch, in_chunk: &[bool]) -> Vec<TrajTerm> {
    let mut terms: Vec<TrajTerm> = batch
        .trajs
        .iter()
        .map(|t| TrajTerm {
            advantage: t.advantage,
            weight: t.weight,
            contributes: false,
            tokens: 0,
            logratio_sum: 0.0,
            logprob_sum: 0.0,
        })
        .collect();
    for (ti, t) in batch.trajs.iter().enumerate() {
        terms[ti].contributes = t.contributes && in_chunk[ti];
        if !in_chunk[ti] {
            terms[ti].weight = 0.0;
        }
    }
    terms
}
