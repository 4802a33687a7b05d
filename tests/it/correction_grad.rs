//! Each off-policy correction reaches the gradient exactly (`train-step --is-correction`, tiny MoE
//! with routing replay): the accumulated gradient of one update, unclipped, read from the
//! parameters after the step. A token mask is a loss mask; TIS scales one token's contribution by
//! min(ρ, cap); a sequence mask removes the whole trajectory, all its segments. Every test here
//! fails when the trainer's backward ignores the correction's weights (checked by hand: the note
//! of issue 58 says how).

use std::path::Path;

use lego_rl::model::Model;
use lego_rl::records::{Packed, Sample};
use lego_rl::train::correction::Correction;
use lego_rl::train::Trainer;
use tch::{Device, Kind, Tensor};

use super::correction::{samples, shift, with};
use super::model::tiny_moe;
use super::train::sample;

/// The gradient one step accumulates on `batch` under `kinds`, every parameter flattened (fp64).
fn gradient(batch: &[Sample], kinds: &[Correction]) -> Tensor {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let mut t = Trainer::new(model);
    let mut s = with(kinds, (0.99, 1.01));
    s.max_grad_norm = 0.0;
    s.updates = 1;
    t.step(batch, Path::new("mem"), &s).unwrap();
    let parts: Vec<Tensor> = t
        .model
        .named_variables()
        .into_iter()
        .map(|(_, v)| {
            let g = v.grad();
            let g = if g.defined() { g } else { v.zeros_like() };
            g.to_kind(Kind::Double).reshape([-1])
        })
        .collect();
    Tensor::cat(&parts, 0)
}

fn norm(t: &Tensor) -> f64 {
    t.norm().double_value(&[])
}

/// `a` equals `b` within float rounding of the accumulation.
fn close(a: &Tensor, b: &Tensor, what: &str) {
    let (d, n) = (norm(&(a - b)), norm(b).max(norm(a)));
    assert!(d <= 1e-5 * n, "{what}: |a - b| = {d:.3e}, |b| = {n:.3e}");
}

/// ρ = π_old / π_rollout of loss token `j` of `s` set to `rho` (the rest as recorded: ρ = 1).
fn rho_at(s: &mut Sample, j: usize, rho: f32) {
    shift(s, |t| if t == j { -rho.ln() } else { 0.0 });
}

#[test]
fn a_token_mask_is_the_loss_mask_at_that_token() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let mut masked = samples(&model);
    rho_at(&mut masked[0], 3, 0.1);
    let g_mask = gradient(&masked, &[Correction::TokenMask]);
    // The same batch with loss token 3 of sample a (position 4 + 3) not a policy token at all.
    let mut cut = samples(&model);
    let mut mask = cut[0].loss_mask.to_dense();
    mask[7] = false;
    cut[0].loss_mask = lego_rl::records::LossMask::from_dense(&mask);
    let mut lp = cut[0].rollout_logprobs.to_f32().unwrap();
    lp.remove(3);
    cut[0].rollout_logprobs = Packed::f32_vec(&lp);
    close(&g_mask, &gradient(&cut, &[]), "token-masked vs loss-masked");
    let plain = gradient(&samples(&model), &[]);
    assert!(
        norm(&(&plain - &g_mask)) > 1e-3 * norm(&plain),
        "the mask changed nothing"
    );
}

#[test]
fn tis_scales_one_tokens_contribution_by_min_rho_and_cap() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    let at = |rho: f32| {
        let mut b = samples(&model);
        rho_at(&mut b[0], 3, rho);
        gradient(&b, &[Correction::Tis])
    };
    let base = at(1.0);
    // Token 3 of a alone: the token mask drops every other token of the batch, so a counts one
    // token where it counted 8 (its coefficient carries 1/|y_a|): 8 × token 3's contribution.
    let mut only = samples(&model);
    shift(&mut only[0], |t| if t == 3 { 0.0 } else { 2.0 });
    for s in &mut only[1..] {
        shift(s, |_| 2.0);
    }
    let g_j = gradient(&only, &[Correction::TokenMask]) / 8.0;
    assert!(
        norm(&g_j) > 1e-4 * norm(&base),
        "token 3's contribution is not negligible"
    );
    close(
        &(at(1.5) - &base),
        &(&g_j * 0.5),
        "ρ = 1.5: 0.5 × the token's contribution more",
    );
    // Above the cap (2): weight 2, whatever ρ.
    close(
        &(at(3.0) - &base),
        &g_j,
        "ρ = 3 capped at 2: 1 × the token's contribution more",
    );
}

#[test]
fn a_sequence_mask_removes_the_whole_trajectory_every_segment_of_it() {
    let model = Model::load(&tiny_moe(), Device::Cpu, None).unwrap();
    // Trajectory a in two segments (compaction): its second segment is sample 4.
    let batch = || {
        let mut b = samples(&model);
        let tokens: Vec<i64> = (0..10).map(|t| (t * 53 + 7) % 4096).collect();
        let mut seg = sample(&model, "a", 0, &tokens, 3, 1.0, 1.0);
        seg.id = "a#0.1".into();
        seg.segment = 1;
        b.push(seg);
        b
    };
    let all = gradient(&batch(), &[Correction::SeqMask]);
    // The band is [0.5, 2]: one token at ρ = 0.1 drops its trajectory.
    let mut drop_a = batch();
    rho_at(&mut drop_a[4], 2, 0.1);
    let without_a = gradient(&drop_a, &[Correction::SeqMask]);
    // The out-of-band token in the other segment drops the same trajectory, the same way.
    let mut drop_a0 = batch();
    rho_at(&mut drop_a0[0], 5, 0.1);
    close(
        &gradient(&drop_a0, &[Correction::SeqMask]),
        &without_a,
        "either segment",
    );
    // a alone: b, c and d dropped.
    let mut only_a = batch();
    for s in &mut only_a[1..4] {
        rho_at(s, 0, 0.1);
    }
    let a = gradient(&only_a, &[Correction::SeqMask]);
    assert!(norm(&a) > 1e-3 * norm(&all), "a contributes");
    close(
        &(&without_a + &a),
        &all,
        "the batch = the batch without a + a alone",
    );
}
