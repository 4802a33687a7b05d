//! Off-policy corrections of the rollout/trainer mismatch (`train-step --is-correction`).
//!
//! GSPO's ratio compares the policy being trained with π_old, the trainer's recomputation of the
//! policy that sampled the batch. What really sampled it is π_rollout: the inference engine's
//! numerics, and with `--max-staleness S` a policy up to S steps old. Per loss token, with
//! ρ = π_old / π_rollout (from the recorded `rollout_logprobs`), each correction is a weight on
//! the token's gradient (the trainer multiplies its per-token coefficient by it; see
//! `trainer.rs`, the only hook):
//!
//! - `tis`: truncated importance sampling, w = min(ρ, cap) (`--tis-cap`, 2.0 when unset);
//! - `token-mask`: IcePop-style masking, w = 0 for a token whose ρ leaves [low, high]
//!   (`--is-mask-low/high`, default [0.5, 2.0]);
//! - `seq-mask`: masked IS at the sequence level, w = 0 for every token of a sequence that has
//!   a token outside [low, high];
//! - `geo-mask`: the geometric-mean sequence mask, w = 0 for a sequence whose
//!   exp(mean log ρ) leaves [geo-low, geo-high] (default [0.99, 1.01]).
//!
//! They combine (masks first, TIS on what is left), and with routing replay (R3), which only
//! changes how π_old is computed. Sources: verl's rollout correction (token/sequence TIS and
//! rejection sampling), slime's TIS and MIS, SkyRL's off-policy correction (geometric sequence mask
//! [0.99, 1.01], token TIS 2.0, IcePop token mask [0.5, 2.0]); see the README.

use std::fmt;
use std::str::FromStr;

use super::batch::Batch;
use super::TrainError;
use crate::records::StepMetrics;

/// One correction of `--is-correction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correction {
    Tis,
    TokenMask,
    SeqMask,
    GeoMask,
}

impl Correction {
    const ALL: [(Correction, &'static str); 4] = [
        (Correction::Tis, "tis"),
        (Correction::TokenMask, "token-mask"),
        (Correction::SeqMask, "seq-mask"),
        (Correction::GeoMask, "geo-mask"),
    ];
}

impl fmt::Display for Correction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = Self::ALL.iter().find(|(c, _)| c == self).map_or("?", |(_, n)| n);
        f.write_str(name)
    }
}

impl FromStr for Correction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(c, _)| *c)
            .ok_or_else(|| {
                format!("unknown correction `{s}` (expected tis, token-mask, seq-mask or geo-mask)")
            })
    }
}

/// The corrections of a step and their bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct CorrectionSettings {
    pub kinds: Vec<Correction>,
    /// TIS cap on ρ.
    pub tis_cap: f64,
    /// Token and sequence masks keep ρ in [mask_low, mask_high].
    pub mask_low: f64,
    pub mask_high: f64,
    /// The geometric-mean mask keeps exp(mean log ρ) in [geo_low, geo_high].
    pub geo_low: f64,
    pub geo_high: f64,
}

impl Default for CorrectionSettings {
    fn default() -> Self {
        CorrectionSettings {
            kinds: Vec::new(),
            tis_cap: 2.0,
            mask_low: 0.5,
            mask_high: 2.0,
            geo_low: 0.99,
            geo_high: 1.01,
        }
    }
}

/// What the corrections did in one step (the metrics record's `is_*` fields).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CorrectionStats {
    pub tokens: u64,
    pub sequences: u64,
    /// Tokens masked by the token mask (within sequences no sequence mask dropped).
    pub masked_tokens: u64,
    /// Sequences (trajectories: see [`weights`]) dropped by the sequence or geometric mask.
    pub masked_sequences: u64,
    /// Tokens whose weight is zero for any reason (a masked token or a masked sequence's).
    pub zero_weight_tokens: u64,
    /// Tokens whose ρ was above the TIS cap.
    pub tis_capped_tokens: u64,
    /// Spread of log ρ over all tokens: min, max, standard deviation.
    pub log_ratio_min: Option<f64>,
    pub log_ratio_max: Option<f64>,
    pub log_ratio_std: Option<f64>,
}

impl CorrectionStats {
    /// Fraction of loss tokens whose weight the masks set to zero.
    pub fn masked_token_fraction(&self) -> Option<f64> {
        (self.tokens > 0).then(|| self.zero_weight_tokens as f64 / self.tokens as f64)
    }

    /// Fraction of sequences dropped by a sequence mask.
    pub fn masked_sequence_fraction(&self) -> Option<f64> {
        (self.sequences > 0).then(|| self.masked_sequences as f64 / self.sequences as f64)
    }
}

/// Where a log-ratio is not finite: (sequence, token, value).
pub type NonFiniteAt = (usize, usize, f64);

/// Per-token weights of every sequence (a trajectory's segment): `old[i][j]` is π_old's log-prob
/// of loss token j of sequence i, `rollout[i][j]` the recorded one, `traj[i]` the trajectory the
/// sequence belongs to. Without corrections every weight is 1.
///
/// The sequence masks decide per trajectory, over all its segments' tokens: GSPO's sequence
/// ratio is the trajectory's (a trajectory compaction split into segments is one sequence to it),
/// so a mask that kept one segment and dropped another would compute that ratio over a part of
/// the trajectory. Statistics count trajectories as sequences for the same reason.
///
/// A non-finite log-ratio (a NaN or infinite log-prob on either side) is an error naming the
/// sequence and token (`Err((i, j, value))`): it would otherwise get weight 1 or the TIS cap.
pub fn weights(
    s: &CorrectionSettings,
    old: &[Vec<f64>],
    rollout: &[&[f32]],
    traj: &[usize],
) -> Result<(Vec<Vec<f64>>, CorrectionStats), NonFiniteAt> {
    let has = |c| s.kinds.contains(&c);
    let mut stats = CorrectionStats::default();
    let (mut sum, mut sum_sq) = (0.0, 0.0);
    let mut log_ratios = Vec::with_capacity(old.len());
    for (i, (o, r)) in old.iter().zip(rollout).enumerate() {
        let log_ratio: Vec<f64> = o.iter().zip(r.iter()).map(|(&o, &r)| o - f64::from(r)).collect();
        if let Some(j) = log_ratio.iter().position(|l| !l.is_finite()) {
            return Err((i, j, log_ratio[j]));
        }
        stats.tokens += log_ratio.len() as u64;
        for &l in &log_ratio {
            sum += l;
            sum_sq += l * l;
            stats.log_ratio_min = Some(stats.log_ratio_min.map_or(l, |m| m.min(l)));
            stats.log_ratio_max = Some(stats.log_ratio_max.map_or(l, |m| m.max(l)));
        }
        log_ratios.push(log_ratio);
    }
    let outside = |l: f64| {
        let rho = l.exp();
        rho < s.mask_low || rho > s.mask_high
    };
    // Per trajectory: any token outside the band, Σ log ρ, token count.
    let n_traj = traj.iter().max().map_or(0, |&t| t + 1);
    let mut per_traj = vec![(false, 0.0, 0usize); n_traj];
    for (lr, &t) in log_ratios.iter().zip(traj) {
        let e = &mut per_traj[t];
        e.0 |= lr.iter().any(|&l| outside(l));
        e.1 += lr.iter().sum::<f64>();
        e.2 += lr.len();
    }
    let masked: Vec<bool> = per_traj
        .iter()
        .map(|&(any_outside, total, n)| {
            (has(Correction::SeqMask) && any_outside)
                || (has(Correction::GeoMask) && n > 0 && {
                    let geo = (total / n as f64).exp();
                    geo < s.geo_low || geo > s.geo_high
                })
        })
        .collect();
    let mut seen = vec![false; n_traj];
    for &t in traj {
        if !seen[t] {
            seen[t] = true;
            stats.sequences += 1;
            stats.masked_sequences += masked[t] as u64;
        }
    }
    let mut out = Vec::with_capacity(old.len());
    for (log_ratio, &t) in log_ratios.iter().zip(traj) {
        if masked[t] {
            stats.zero_weight_tokens += log_ratio.len() as u64;
            out.push(vec![0.0; log_ratio.len()]);
            continue;
        }
        let w = log_ratio
            .iter()
            .map(|&l| {
                if has(Correction::TokenMask) && outside(l) {
                    stats.masked_tokens += 1;
                    stats.zero_weight_tokens += 1;
                    return 0.0;
                }
                let rho = l.exp();
                if has(Correction::Tis) {
                    if rho > s.tis_cap {
                        stats.tis_capped_tokens += 1;
                    }
                    rho.min(s.tis_cap)
                } else {
                    1.0
                }
            })
            .collect();
        out.push(w);
    }
    if stats.tokens > 0 {
        let n = stats.tokens as f64;
        let mean = sum / n;
        stats.log_ratio_std = Some((sum_sq / n - mean * mean).max(0.0).sqrt());
    }
    Ok((out, stats))
}

/// [`weights`] of a step's sequences, against π_old (`old`, one row per sequence of `batch`).
pub(super) fn for_batch(
    c: &CorrectionSettings,
    batch: &Batch,
    old: &[Vec<f64>],
) -> Result<(Vec<Vec<f64>>, CorrectionStats), TrainError> {
    let rollout: Vec<&[f32]> = batch.seqs.iter().map(|q| q.rollout_lp.as_slice()).collect();
    let traj: Vec<usize> = batch.seqs.iter().map(|q| q.traj).collect();
    weights(c, old, &rollout, &traj).map_err(|(i, token, value)| TrainError::NonFiniteSample {
        what: "log-ratio log π_old − log π_rollout",
        sample: batch.seqs[i].id.clone(),
        token,
        value,
    })
}

/// The step's `is_*` metrics (only when a correction is on).
pub(super) fn record(c: &CorrectionSettings, st: &CorrectionStats, m: &mut StepMetrics) {
    if c.kinds.is_empty() {
        return;
    }
    let names: Vec<String> = c.kinds.iter().map(Correction::to_string).collect();
    m.is_correction = Some(names.join(","));
    m.is_masked_token_fraction = st.masked_token_fraction();
    m.is_masked_sequence_fraction = st.masked_sequence_fraction();
    m.is_tis_capped_fraction = (st.tokens > 0).then(|| st.tis_capped_tokens as f64 / st.tokens as f64);
    m.is_log_ratio_min = st.log_ratio_min;
    m.is_log_ratio_max = st.log_ratio_max;
    m.is_log_ratio_std = st.log_ratio_std;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(kinds: &[Correction]) -> CorrectionSettings {
        CorrectionSettings {
            kinds: kinds.to_vec(),
            ..Default::default()
        }
    }

    /// Rollout log-probs that make ρ = `ratios` against old log-probs of -1.
    fn crafted(ratios: &[&[f64]]) -> (Vec<Vec<f64>>, Vec<Vec<f32>>) {
        let old: Vec<Vec<f64>> = ratios.iter().map(|r| vec![-1.0; r.len()]).collect();
        let rollout = ratios
            .iter()
            .map(|r| r.iter().map(|rho| (-1.0 - rho.ln()) as f32).collect())
            .collect();
        (old, rollout)
    }

    fn run(kinds: &[Correction], ratios: &[&[f64]]) -> (Vec<Vec<f64>>, CorrectionStats) {
        let (old, rollout) = crafted(ratios);
        let r: Vec<&[f32]> = rollout.iter().map(Vec::as_slice).collect();
        let traj: Vec<usize> = (0..ratios.len()).collect();
        weights(&settings(kinds), &old, &r, &traj).unwrap()
    }

    fn close(a: &[Vec<f64>], b: &[&[f64]]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.len(), y.len());
            for (p, q) in x.iter().zip(y.iter()) {
                assert!((p - q).abs() < 1e-5, "{a:?} vs {b:?}");
            }
        }
    }

    const RATIOS: [&[f64]; 3] = [&[1.0, 0.4, 3.0, 1.5], &[1.0, 1.0, 1.0], &[1.05, 1.05, 1.0]];

    #[test]
    fn no_correction_weighs_every_token_one_and_still_measures_the_spread() {
        let (w, st) = run(&[], &RATIOS);
        close(&w, &[&[1.0; 4], &[1.0; 3], &[1.0; 3]]);
        assert_eq!((st.tokens, st.sequences, st.zero_weight_tokens), (10, 3, 0));
        assert!((st.log_ratio_min.unwrap() - 0.4f64.ln()).abs() < 1e-5);
        assert!((st.log_ratio_max.unwrap() - 3.0f64.ln()).abs() < 1e-5);
        assert!(st.log_ratio_std.unwrap() > 0.0);
    }

    #[test]
    fn tis_caps_the_ratio_per_token() {
        let (w, st) = run(&[Correction::Tis], &RATIOS);
        close(&w, &[&[1.0, 0.4, 2.0, 1.5], &[1.0; 3], &[1.05, 1.05, 1.0]]);
        assert_eq!((st.tis_capped_tokens, st.zero_weight_tokens), (1, 0));
    }

    #[test]
    fn token_mask_zeroes_exactly_the_tokens_outside_the_band() {
        let (w, st) = run(&[Correction::TokenMask], &RATIOS);
        close(&w, &[&[1.0, 0.0, 0.0, 1.0], &[1.0; 3], &[1.0; 3]]);
        assert_eq!((st.masked_tokens, st.masked_sequences), (2, 0));
        assert_eq!(st.masked_token_fraction(), Some(0.2));
    }

    #[test]
    fn sequence_mask_drops_a_sequence_with_any_token_outside_the_band() {
        let (w, st) = run(&[Correction::SeqMask], &RATIOS);
        close(&w, &[&[0.0; 4], &[1.0; 3], &[1.0; 3]]);
        assert_eq!((st.masked_sequences, st.zero_weight_tokens), (1, 4));
        assert_eq!(st.masked_sequence_fraction(), Some(1.0 / 3.0));
    }

    #[test]
    fn geometric_mask_drops_sequences_whose_mean_log_ratio_leaves_the_band() {
        // Sequence 0: geo = (0.4 · 3 · 1.5)^(1/4) = 1.158; sequence 2: (1.05²)^(1/3) = 1.033;
        // both outside [0.99, 1.01]. Sequence 1 is on-policy.
        let (w, st) = run(&[Correction::GeoMask], &RATIOS);
        close(&w, &[&[0.0; 4], &[1.0; 3], &[0.0; 3]]);
        assert_eq!(st.masked_sequences, 2);
        // Inside a wider band, only sequence 0 goes.
        let (old, rollout) = crafted(&RATIOS);
        let r: Vec<&[f32]> = rollout.iter().map(Vec::as_slice).collect();
        let s = CorrectionSettings {
            geo_high: 1.05,
            ..settings(&[Correction::GeoMask])
        };
        let traj = [0, 1, 2];
        close(
            &weights(&s, &old, &r, &traj).unwrap().0,
            &[&[0.0; 4], &[1.0; 3], &[1.0; 3]],
        );
    }

    #[test]
    fn combined_masks_then_tis_on_what_is_left() {
        // Token mask removes 0.4 and 3.0; TIS leaves 1.5 (under the cap) and weighs 1.05.
        let (w, st) = run(&[Correction::TokenMask, Correction::Tis], &RATIOS);
        close(&w, &[&[1.0, 0.0, 0.0, 1.5], &[1.0; 3], &[1.05, 1.05, 1.0]]);
        assert_eq!((st.masked_tokens, st.tis_capped_tokens), (2, 0));
        // With the geometric mask too, sequences 0 and 2 go whole.
        let (w, _) = run(
            &[Correction::GeoMask, Correction::TokenMask, Correction::Tis],
            &RATIOS,
        );
        close(&w, &[&[0.0; 4], &[1.0; 3], &[0.0; 3]]);
    }

    /// A trajectory compaction split into two segments is one sequence to the masks: a token
    /// outside the band in one segment drops both, and the geometric mean is the trajectory's.
    #[test]
    fn sequence_masks_decide_per_trajectory_over_all_its_segments() {
        // Trajectory 0 = segments 0 and 1; trajectory 1 = segment 2.
        let ratios: [&[f64]; 3] = [&[3.0, 1.0], &[1.0, 1.0], &[1.0, 1.0]];
        let (old, rollout) = crafted(&ratios);
        let r: Vec<&[f32]> = rollout.iter().map(Vec::as_slice).collect();
        let traj = [0, 0, 1];
        let (w, st) = weights(&settings(&[Correction::SeqMask]), &old, &r, &traj).unwrap();
        close(&w, &[&[0.0; 2], &[0.0; 2], &[1.0; 2]]);
        assert_eq!(
            (st.sequences, st.masked_sequences, st.zero_weight_tokens),
            (2, 1, 4)
        );
        // Geometric: segment 0 alone is (3 · 1)^(1/2) = 1.73, but trajectory 0 is
        // (3 · 1 · 1 · 1)^(1/4) = 1.32: outside [0.99, 1.01] either way. Inside [0.5, 1.5], the
        // trajectory stays while the segment alone would have gone: per segment, segment 0 is
        // dropped and segment 1 kept.
        let geo = CorrectionSettings {
            geo_low: 0.5,
            geo_high: 1.5,
            ..settings(&[Correction::GeoMask])
        };
        let (w, st) = weights(&geo, &old, &r, &traj).unwrap();
        close(&w, &[&[1.0; 2], &[1.0; 2], &[1.0; 2]]);
        assert_eq!(st.masked_sequences, 0);
        let per_segment = weights(&geo, &old, &r, &[0, 1, 2]).unwrap().0;
        close(&per_segment, &[&[0.0; 2], &[1.0; 2], &[1.0; 2]]);
    }

    #[test]
    fn a_non_finite_log_ratio_is_an_error_naming_its_sequence_and_token() {
        let (mut old, rollout) = crafted(&RATIOS);
        old[1][2] = f64::NAN;
        let r: Vec<&[f32]> = rollout.iter().map(Vec::as_slice).collect();
        let err = weights(&settings(&[Correction::Tis]), &old, &r, &[0, 1, 2]).unwrap_err();
        assert_eq!((err.0, err.1), (1, 2));
        assert!(err.2.is_nan());
        // Without a correction too: no NaN ρ is ever weighed.
        assert!(weights(&settings(&[]), &old, &r, &[0, 1, 2]).is_err());
    }

    #[test]
    fn names_parse_and_print() {
        for (c, n) in Correction::ALL {
            assert_eq!(n.parse::<Correction>().unwrap(), c);
            assert_eq!(c.to_string(), n);
        }
        assert!("icepop"
            .parse::<Correction>()
            .unwrap_err()
            .contains("unknown correction"));
    }
}
