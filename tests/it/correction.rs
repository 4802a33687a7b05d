//! `train-step --is-correction` through the trainer on the tiny MoE with routing replay (R3):
//! crafted rollout log-probs with known ratios π_old/π_rollout are masked exactly where they should
//! be (the metrics count them), and a batch the masks drop whole trains nothing.

use std::path::Path;

use lego_rl::model::Model;
use lego_rl::records::{Packed, Sample};
use lego_rl::train::correction::{Correction, CorrectionSettings};
use lego_rl::train::{Settings, Trainer};
use tch::Device;

use super::model::tiny_moe;
use super::train::{sample, settings};

/// Two groups of two 12-token sequences, 8 loss tokens each, whose rollout log-probs are the
/// model's own (ρ = 1 up to float noise).
pub(super) fn samples(model: &Model) -> Vec<Sample> {
    let seq = |i: i64| -> Vec<i64> { (0..12).map(|t| (t * 131 + i * 977 + 1) % 4096).collect() };
    vec![
        sample(model, "a", 0, &seq(0), 4, 1.0, 1.0),
        sample(model, "b", 0, &seq(1), 4, 0.0, 1.0),
        sample(model, "c", 1, &seq(2), 4, 1.0, 1.0),
        sample(model, "d", 1, &seq(3), 4, 0.0, 1.0),
    ]
}

/// Adds `shift[j]` to the rollout log-prob of loss token j (ρ = π_old/π_rollout = exp(-shift)).
pub(super) fn shift(s: &mut Sample, f: impl Fn(usize) -> f32) {
    let lp: Vec<f32> = s.rollout_logprobs.to_f32().unwrap();
    let lp: Vec<f32> = lp.iter().enumerate().map(|(j, l)| l + f(j)).collect();
    s.rollout_logprobs = Packed::f32_vec(&lp);
}

/// The test settings without weight decay (which moves parameters even without a gradient).
pub(super) fn with(kinds: &[Correction], geo: (f64, f64)) -> Settings {
    let mut s = settings();
    s.optim.weight_decay = 0.0;
    Settings {
        correction: CorrectionSettings {
            kinds: kinds.to_vec(),
            geo_low: geo.0,
            geo_high: geo.1,
            ..Default::default()
        },
        ..s
    }
}

fn params(t: &Trainer) -> Vec<tch::Tensor> {
    t.model
        .named_variables()
        .into_iter()
        .map(|(_, v)| v.copy())
        .collect()
}

#[test]
fn masks_hit_exactly_the_crafted_tokens_and_sequences_with_replay() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let mut batch = samples(&model);
    // a: one token at ρ = 1/4, outside [0.5, 2]: the token mask takes it (a's geometric mean,
    // exp(-ln 4 / 8) = 0.84, stays inside the [0.8, 1.2] band of this test).
    shift(&mut batch[0], |j| if j == 3 { 4f32.ln() } else { 0.0 });
    // c: every token at ρ = e^0.5 = 1.65, inside [0.5, 2], but a geometric mean of 1.65: the
    // geometric mask drops the sequence.
    shift(&mut batch[2], |_| -0.5);
    let mut t = Trainer::new(model);
    let s = with(
        &[Correction::GeoMask, Correction::TokenMask, Correction::Tis],
        (0.8, 1.2),
    );
    assert!(s.replay, "routing replay (R3) is on");
    let m = t.step(&batch, Path::new("mem"), &s).unwrap();
    assert_eq!(m.is_correction.as_deref(), Some("geo-mask,token-mask,tis"));
    // 1 masked token in a + c's 8 tokens, of 32.
    assert_eq!(m.is_masked_token_fraction, Some(9.0 / 32.0), "{m:?}");
    assert_eq!(m.is_masked_sequence_fraction, Some(0.25));
    assert_eq!(m.is_tis_capped_fraction, Some(0.0));
    let (lo, hi) = (m.is_log_ratio_min.unwrap(), m.is_log_ratio_max.unwrap());
    assert!(
        (lo + 4f64.ln()).abs() < 1e-3 && (hi - 0.5).abs() < 1e-3,
        "{lo} {hi}"
    );
    assert_eq!(m.routing_replay, Some(true));
}

/// The hook reaches the gradient: when the geometric mask drops every sequence, the step leaves
/// every parameter as it was; the same batch without the correction moves them.
#[test]
fn a_batch_masked_whole_trains_nothing() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let mut batch = samples(&model);
    for s in &mut batch {
        shift(s, |_| -0.1);
    }
    let mut t = Trainer::new(model);
    let before = params(&t);
    let m = t
        .step(
            &batch,
            Path::new("mem"),
            &with(&[Correction::GeoMask], (0.99, 1.01)),
        )
        .unwrap();
    assert_eq!(m.is_masked_sequence_fraction, Some(1.0));
    let moved = |t: &Trainer| before.iter().zip(params(t)).any(|(a, b)| !a.equal(&b));
    assert!(!moved(&t), "a fully masked batch changed parameters");
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let mut t = Trainer::new(model);
    let m = t
        .step(&batch, Path::new("mem"), &with(&[], (0.99, 1.01)))
        .unwrap();
    assert_eq!(m.is_masked_token_fraction, None, "no correction, no is_* metrics");
    assert!(moved(&t), "the uncorrected step trains");
}

/// A NaN in the trainer's recomputation stops the step before any update, naming the sample and
/// the token: it would otherwise make the agreement figures "not measured" and weigh ρ as 1.
#[test]
fn a_non_finite_recomputed_logprob_stops_the_step_naming_the_sample() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let batch = samples(&model);
    tch::no_grad(|| {
        for (name, mut t) in model.named_variables() {
            if name == "model.norm.weight" {
                let _ = t.fill_(f64::NAN);
            }
        }
    });
    let mut t = Trainer::new(model);
    let before = params(&t);
    let err = t
        .step(&batch, Path::new("mem"), &with(&[Correction::Tis], (0.99, 1.01)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("non-finite π_old log-prob (pass 1)") && err.contains("sample `a#0.0`"),
        "{err}"
    );
    let same = before.iter().zip(params(&t)).all(|(a, b)| {
        a.isnan().equal(&b.isnan())
            && a.nan_to_num(0.0, None, None)
                .equal(&b.nan_to_num(0.0, None, None))
    });
    assert!(same, "no update was made");
}

/// Every position's experts in the last MoE layer (the model's last layer) avoid `poisoned`,
/// except the last position of sample `last_of`, which is routed to it (replayed routing, so the
/// trainer follows it).
fn route_only_the_last_of(batch: &mut [Sample], last_of: &str, poisoned: u16) {
    for s in batch.iter_mut() {
        let r = s.routing.as_ref().expect("the MoE samples record routing");
        let shape = r.shape.clone();
        let (tokens, layers, k) = (shape[0], shape[1], shape[2]);
        let mut ids = r.to_experts().unwrap();
        for p in 0..tokens {
            let at = (p * layers + layers - 1) * k;
            let row = &mut ids[at..at + k];
            if s.id == last_of && p == tokens - 1 {
                if !row.contains(&poisoned) {
                    row[0] = poisoned;
                }
                continue;
            }
            for j in 0..k {
                if row[j] == poisoned {
                    let free = (0..poisoned).find(|e| !row.contains(e)).unwrap();
                    row[j] = free;
                }
            }
        }
        s.routing = Some(Packed::from_experts(shape, &ids));
    }
}

/// A NaN that only the backward meets: expert 7 of the last layer (an MoE layer) holds NaN weights
/// and only the last position of sample b is routed to it. That position predicts no token and
/// no later layer mixes it into another, so every log-prob stays finite and pass 1 and the loss
/// pass their checks; its zero upstream gradient times the NaN activations is NaN in the expert's
/// weight gradient. The step stops naming sample b (each of the
/// rank's sequences backpropagated alone), and the same batch on clean weights trains.
#[test]
fn a_non_finite_gradient_stops_the_step_naming_the_sample_that_makes_it() {
    let run = |poison: bool| {
        let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
        let mut batch = samples(&model);
        route_only_the_last_of(&mut batch, "b#0.0", 7);
        if poison {
            tch::no_grad(|| {
                for (name, mut t) in model.named_variables() {
                    if name.starts_with("model.layers.2.mlp.experts.7.") {
                        let _ = t.fill_(f64::NAN);
                    } else if name.starts_with("model.layers.2.mlp.experts.") && name.ends_with("_proj") {
                        let _ = t.get(7).fill_(f64::NAN);
                    }
                }
            });
        }
        let mut t = Trainer::new(model);
        let mut s = with(&[], (0.99, 1.01));
        // One sequence per micro-batch: the poisoned position shares no attention with another.
        s.micro_batch_tokens = 12;
        t.step(&batch, Path::new("mem"), &s).map(|_| ())
    };
    run(false).expect("the rerouted batch trains on clean weights");
    let err = run(true).unwrap_err().to_string();
    assert!(
        err.contains("non-finite gradient norm") && err.contains("sample `b#0.0`"),
        "{err}"
    );
}
