//! Qwen3-MoE sparse block (transformers' `Qwen3MoeSparseMoeBlock`) with routing capture and
//! replay (R3, Ma et al. 2025).
//!
//! Router linear → softmax (fp32) → top-k → renormalise if `norm_topk_prob` → experts. Tokens are
//! grouped by expert (argsort of the flattened `[T·k]` expert ids, one `index_select` and one
//! SwiGLU over each expert's tokens, `index_add` back); experts that received no token are skipped.
//!
//! Replay: rows of `replay` with ids ≥ 0 use the recorded experts instead of the router's top-k,
//! but the gate weights are still computed from the *current* router probabilities gathered at
//! the replayed experts (renormalised when `norm_topk_prob`, i.e. softmax over the selected
//! logits), so gradients reach the router. Rows with -1 (e.g. the last token when the engine
//! returned T−1 rows) route normally.
//!
//! Qwen3-Next and Qwen3.5 (transformers' `Qwen3NextSparseMoeBlock`, `Qwen3_5MoeSparseMoeBlock`)
//! add a shared expert every token goes through, scaled by `sigmoid(shared_expert_gate(x))`; it
//! takes no part in routing or replay. Experts are stored either one module per expert
//! (`experts.E.gate_proj.weight`, ...) or fused as transformers ≥ 5 keeps them
//! (`experts.gate_up_proj` `[E, 2·I, hidden]`, `experts.down_proj` `[E, hidden, I]`); the vars
//! follow the checkpoint, so it is saved in the layout it came in.
//!
//! Under expert parallelism ([`super::expert_parallel`]) a layer holds only its rank's slice of
//! the experts (`experts.E.*` for its E; fused tensors of `[E_local, …]`), and the grouped
//! dispatch exchanges rows with the other ranks of its group instead of running every expert.

use std::sync::Arc;

use tch::{nn, Kind, Tensor};

use super::expert_parallel::{rows_per_rank, ExpertComm, ExpertShard, Regroup};
use super::layers::{linear, weight, Mlp};
use super::Config;

/// What one MoE layer did: the expert ids used and the router's own choice.
#[derive(Debug)]
pub struct MoeRouting {
    /// `[T, k]` ids actually used (replayed where given).
    pub used: Tensor,
    /// `[T, k]` the router's own top-k under the current weights (descending probability).
    pub own: Tensor,
}

/// The routed experts of one layer, in the checkpoint's layout.
#[derive(Debug)]
enum Experts {
    /// `experts.E.{gate,up,down}_proj.weight`.
    PerExpert(Vec<Mlp>),
    /// `experts.gate_up_proj` `[E, 2·I, hidden]` and `experts.down_proj` `[E, hidden, I]`.
    Fused {
        gate_up: Tensor,
        down: Tensor,
        inter: i64,
    },
}

impl Experts {
    fn len(&self) -> i64 {
        match self {
            Experts::PerExpert(v) => v.len() as i64,
            Experts::Fused { gate_up, .. } => gate_up.size()[0],
        }
    }

    /// Local expert `e`'s SwiGLU on `[N, hidden]`.
    fn forward(&self, e: usize, x: &Tensor) -> Tensor {
        match self {
            Experts::PerExpert(v) => v[e].forward(x),
            Experts::Fused { gate_up, down, inter } => {
                let gu = linear(x, &gate_up.get(e as i64));
                let g = gu.narrow(-1, 0, *inter).silu();
                linear(&(g * gu.narrow(-1, *inter, *inter)), &down.get(e as i64))
            }
        }
    }
}

/// Router plus experts of one layer (`model.layers.N.mlp`), and the gated shared expert of the
/// hybrid families.
#[derive(Debug)]
pub struct SparseMoe {
    gate: Tensor,
    /// This rank's experts (all of them unless `shard` says otherwise).
    experts: Experts,
    /// Experts of the layer over all ranks (the router's width).
    n_experts: i64,
    shard: ExpertShard,
    /// The expert-parallel group, once attached ([`SparseMoe::attach`]).
    comm: Option<Arc<ExpertComm>>,
    /// `shared_expert` and `shared_expert_gate.weight` (`[1, hidden]`).
    shared: Option<(Mlp, Tensor)>,
    top_k: i64,
    norm_topk_prob: bool,
}

impl SparseMoe {
    /// Creates `<p>.gate.weight`, the experts (per expert or fused, [`Config::fused_experts`])
    /// and, when `shared_expert_intermediate_size > 0`, `<p>.shared_expert.*` and
    /// `<p>.shared_expert_gate.weight`.
    pub fn new(p: &nn::Path, cfg: &Config) -> Self {
        let ep = p / "experts";
        let (h, inter, n) = (cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts);
        let shard = cfg.expert_shard;
        let local = shard.per_rank(n);
        let experts = if cfg.fused_experts {
            Experts::Fused {
                gate_up: ep.randn(
                    "gate_up_proj",
                    &[local, 2 * inter, h],
                    0.0,
                    super::layers::INIT_STD,
                ),
                down: ep.randn("down_proj", &[local, h, inter], 0.0, super::layers::INIT_STD),
                inter,
            }
        } else {
            Experts::PerExpert(shard.range(n).map(|e| Mlp::new(&(&ep / e), h, inter)).collect())
        };
        let shared = (cfg.shared_expert_intermediate_size > 0).then(|| {
            (
                Mlp::new(&(p / "shared_expert"), h, cfg.shared_expert_intermediate_size),
                weight(&(p / "shared_expert_gate"), 1, h),
            )
        });
        SparseMoe {
            gate: weight(&(p / "gate"), n, h),
            experts,
            n_experts: n,
            shard,
            comm: None,
            shared,
            top_k: cfg.num_experts_per_tok,
            norm_topk_prob: cfg.norm_topk_prob,
        }
    }

    /// `x`: `[T, hidden]`; `replay`: optional `[T, k]` int64 ids (-1 rows route normally).
    pub fn forward(&self, x: &Tensor, replay: Option<&Tensor>) -> (Tensor, MoeRouting) {
        let logits = linear(x, &self.gate);
        let probs = logits.softmax(-1, Kind::Float);
        let (_, own) = probs.topk(self.top_k, -1, true, true);
        let used = match replay {
            Some(r) => {
                let has = r.narrow(1, 0, 1).ge(0);
                r.where_self(&has, &own)
            }
            None => own.shallow_clone(),
        };
        let mut gates = probs.gather(1, &used, false);
        if self.norm_topk_prob {
            gates = &gates / gates.sum_dim_intlist(-1, true, Kind::Float);
        }
        let gates = gates.to_kind(x.kind());
        let out = match &self.comm {
            Some(comm) if !self.shard.is_whole() => self.dispatch_ep(comm, x, &used, &gates),
            _ => self.dispatch(x, &used, &gates),
        };
        // transformers: experts + sigmoid(shared_expert_gate(x)) · shared_expert(x).
        let out = match &self.shared {
            Some((mlp, gate)) => out + linear(x, gate).sigmoid() * mlp.forward(x),
            None => out,
        };
        (out, MoeRouting { used, own })
    }

    /// Makes the layer exchange tokens with the other ranks of `comm`'s group (its shard says
    /// which experts each holds).
    pub fn attach(&mut self, comm: Arc<ExpertComm>) {
        self.comm = Some(comm);
    }

    /// This rank's part in one layer's exchanges without tokens of its own (another rank of its
    /// group still has a micro-batch): it computes its experts for the others. `x`: `[0, hidden]`.
    pub fn idle(&self, x: &Tensor) -> Tensor {
        match &self.comm {
            Some(comm) if !self.shard.is_whole() => {
                let ids = Tensor::zeros([0, self.top_k], (Kind::Int64, x.device()));
                let gates = Tensor::zeros([0, self.top_k], (x.kind(), x.device()));
                self.dispatch_ep(comm, x, &ids, &gates)
            }
            _ => x.shallow_clone(),
        }
    }

    /// [`SparseMoe::dispatch`] over the ranks of an expert-parallel group (see
    /// [`super::expert_parallel`] for the steps). Every rank calls it the same number of times.
    fn dispatch_ep(&self, comm: &ExpertComm, x: &Tensor, ids: &Tensor, gates: &Tensor) -> Tensor {
        let per = self.shard.per_rank(self.n_experts) as usize;
        let flat = ids.reshape([-1]);
        let order = flat.argsort(0, false);
        let counts = Vec::<i64>::try_from(flat.bincount(None::<Tensor>, self.n_experts))
            .expect("invariant: bincount is a 1-d int64 tensor");
        let send = rows_per_rank(&counts, per);
        let Some(recv) = comm.counts(&counts, per, x.device()) else {
            return x.zeros_like();
        };
        let regroup = Regroup::new(&recv, per);
        let token_of = order.floor_divide_scalar(self.top_k);
        let rows = x.index_select(0, &token_of);
        let got = comm.exchange(&rows, &regroup.per_source, &send, "MoE dispatch: token rows");
        let dev = x.device();
        let grouped = got.index_select(0, &Tensor::from_slice(&regroup.order).to_device(dev));
        let mut pieces = Vec::new();
        let mut start = 0;
        for (j, &n) in regroup.per_expert.iter().enumerate() {
            if n > 0 {
                pieces.push(self.experts.forward(j, &grouped.narrow(0, start, n)));
                start += n;
            }
        }
        // With no rows the result still hangs off `got`, so this rank's backward takes part in
        // the reverse exchange of the dispatch too.
        let y = if pieces.is_empty() {
            &got * 0.0
        } else {
            Tensor::cat(&pieces, 0).index_select(0, &Tensor::from_slice(&regroup.inverse).to_device(dev))
        };
        let back = comm.exchange(&y, &send, &regroup.per_source, "MoE combine: expert outputs");
        let gate_sorted = gates.reshape([-1]).index_select(0, &order);
        // One index_add in sorted order adds each token's k products in ascending expert id,
        // as the one-rank dispatch's per-expert index_adds do.
        x.zeros_like()
            .index_add(0, &token_of, &(back * gate_sorted.unsqueeze(-1)))
    }

    /// Grouped expert computation: `Σ_k gate[t,k] · expert_{ids[t,k]}(x[t])`.
    fn dispatch(&self, x: &Tensor, ids: &Tensor, gates: &Tensor) -> Tensor {
        if x.size()[0] == 1 {
            return self.dispatch_one(x, ids, gates);
        }
        let k = self.top_k;
        let flat = ids.reshape([-1]);
        let order = flat.argsort(0, false);
        let counts = Vec::<i64>::try_from(flat.bincount(None::<Tensor>, self.experts.len()))
            .expect("invariant: bincount is a 1-d int64 tensor");
        let token_of = order.floor_divide_scalar(k);
        let gate_sorted = gates.reshape([-1]).index_select(0, &order);
        let mut out = x.zeros_like();
        let mut start = 0;
        for (e, &n) in counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let tokens = token_of.narrow(0, start, n);
            let y = self.experts.forward(e, &x.index_select(0, &tokens))
                * gate_sorted.narrow(0, start, n).unsqueeze(-1);
            out = out.index_add(0, &tokens, &y);
            start += n;
        }
        out
    }

    /// One token (a decode step of a lone sequence; a batched decode step of B sequences is B
    /// tokens and takes the grouped path): its k experts one after another, no sort, gather or
    /// scatter.
    /// The same products summed in the same order as [`SparseMoe::dispatch`]'s `index_add`
    /// (ascending expert id), so both paths give identical results.
    fn dispatch_one(&self, x: &Tensor, ids: &Tensor, gates: &Tensor) -> Tensor {
        let ids = Vec::<i64>::try_from(ids.reshape([-1])).expect("invariant: [1, k] int64 ids");
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_by_key(|&j| ids[j]);
        let gates = gates.reshape([-1]);
        let mut out: Option<Tensor> = None;
        for j in order {
            let y = self.experts.forward(ids[j] as usize, x) * gates.narrow(0, j as i64, 1);
            // `0 + y` is `y` exactly: the first product needs no zeros to be added to.
            out = Some(match out {
                Some(o) => o + y,
                None => y,
            });
        }
        out.unwrap_or_else(|| x.zeros_like())
    }
}
