//! The resolved options of one training step ([`Settings`]), apart from the trainer so the
//! modules that read them (the objective's corrections, the update, expert parallelism) do not
//! depend on the trainer itself.

use super::correction::{Correction, CorrectionSettings};
use super::gspo::LossKind;
use super::optim::AdamWConfig;
use crate::model::DEFAULT_LOGPROB_CHUNK;

/// Resolved options of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub loss: LossKind,
    pub eps_low: f64,
    pub eps_high: f64,
    /// Optimizer updates per step (the batch is split into this many mini-batches of groups).
    pub updates: usize,
    /// Token budget of one packed micro-batch.
    pub micro_batch_tokens: usize,
    /// Recompute each decoder layer in the backward pass instead of keeping its activations
    /// (long contexts: memory of one layer instead of all; costs one more forward).
    pub activation_checkpointing: bool,
    /// Positions per chunk of the LM head (log-probs and their backward, see
    /// `model/head.rs`): at most `chunk × vocab` logits alive instead of all scored positions'.
    /// `None`: the whole micro-batch at once, differentiated by autograd.
    pub logprob_chunk: Option<usize>,
    pub max_grad_norm: f64,
    /// Truncated importance-sampling cap on π_old/π_rollout per token (None = off; with
    /// `correction`, the cap of its `tis`).
    pub tis_cap: Option<f64>,
    /// Off-policy corrections (`--is-correction`, [`super::correction`]); `tis_cap` alone is TIS.
    pub correction: CorrectionSettings,
    /// ε in A = (r − mean)/(std + ε).
    pub adv_eps: f64,
    /// Regular expression over parameter names (Hugging Face names such as
    /// `model.embed_tokens.weight`): the parameters it matches (anywhere in the name) are not
    /// updated — no optimizer step, no weight decay, left out of the gradient norm. None: all
    /// parameters train.
    pub freeze: Option<String>,
    pub optim: AdamWConfig,
    /// ZeRO stage 1: each rank keeps the AdamW moments of its 1/N of the parameters
    /// ([`super::zero`]); off, every rank keeps all of them.
    pub zero: bool,
    /// Elements per gradient bucket (one all-reduce or reduce-scatter each).
    pub bucket_elems: i64,
    /// Routing replay (R3): MoE layers use the recorded experts. Off, the router picks its own
    /// and the record is only compared with them (the paper's ablation: agreement with vs
    /// without replay).
    pub replay: bool,
}

/// Default gradient bucket: 25 MiB of fp32, as PyTorch DDP.
pub const DEFAULT_BUCKET_ELEMS: i64 = 25 * 1024 * 1024 / 4;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            loss: LossKind::Gspo,
            eps_low: 3e-4,
            eps_high: 4e-4,
            updates: 1,
            micro_batch_tokens: 8192,
            activation_checkpointing: false,
            logprob_chunk: Some(DEFAULT_LOGPROB_CHUNK),
            max_grad_norm: 1.0,
            tis_cap: None,
            correction: Default::default(),
            adv_eps: 1e-6,
            freeze: None,
            optim: AdamWConfig::default(),
            zero: false,
            bucket_elems: DEFAULT_BUCKET_ELEMS,
            replay: true,
        }
    }
}

impl Settings {
    /// The corrections a step applies: `--is-correction`'s, plus TIS whenever `--tis-cap` is
    /// given (alone it means `tis`, its meaning before `--is-correction`), capped at it.
    pub fn corrections(&self) -> CorrectionSettings {
        let mut c = self.correction.clone();
        if let Some(cap) = self.tis_cap {
            c.tis_cap = cap;
            if !c.kinds.contains(&Correction::Tis) {
                c.kinds.push(Correction::Tis);
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tis_cap_turns_tis_on_alone_or_beside_other_corrections() {
        let alone = Settings {
            tis_cap: Some(3.0),
            ..Settings::default()
        };
        let c = alone.corrections();
        assert_eq!((c.kinds, c.tis_cap), (vec![Correction::Tis], 3.0));
        let mut beside = alone.clone();
        beside.correction.kinds = vec![Correction::TokenMask];
        assert_eq!(
            beside.corrections().kinds,
            [Correction::TokenMask, Correction::Tis]
        );
        assert!(Settings::default().corrections().kinds.is_empty());
        assert_eq!(Settings::default().corrections().tis_cap, 2.0);
    }
}
