//! Whose sampling a request is served with.
//!
//! GSPO divides the trainer's probability of each sampled token by the behaviour policy's, so the
//! recorded log-prob must be that of the distribution the token was drawn from. A harness that
//! sends its own `temperature` / `top_p` / `top_k` / `min_p` (OpenCode for some model families,
//! mini-swe-agent and OpenHands from user config) would make tokens come from another
//! distribution than the one rollout configured. In train mode rollout therefore *pins* its own
//! sampling ([`HarnessSampling::Pin`]): the request's values are ignored, and the ignored ones are
//! recorded per generation (`Generation::ignored_sampling`) and counted. Eval mode honours them
//! ([`HarnessSampling::Honor`]); the engines record the processed log-probs of whatever was used,
//! and the trainer recomputes them with the same rule (src/model/sampled.rs).
//!
//! Every field of either API that shapes the distribution is read here, from the request as
//! received, and is either applied or recorded as ignored, never dropped (the table is in
//! man/lego-rl-formats.md, "Sampling fields of a request"):
//! - [`SAMPLING_FIELDS`] (`temperature`, `top_p`, `top_k`, `min_p`, `seed`): applied under honor;
//!   under pin reset to the configured values and recorded when the request's differ. A seed
//!   picks the draw, not the distribution, but under pin rollout's own per-call seed must stay
//!   (a harness's fixed seed would make a group's identical first prompts sample identically).
//!   A value of the wrong type (`"temperature": "hot"`) is recorded as ignored in both modes.
//! - [`UNSUPPORTED_FIELDS`] (the penalties, `logit_bias`): no engine of lego-rl applies them and
//!   the trainer could not recompute them, so a value that would change the distribution is
//!   recorded as ignored in both modes.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::records::Sampling;

/// Whether a request's own sampling fields (temperature, top_p, top_k, min_p, seed) are used.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HarnessSampling {
    /// The proxy's configured sampling is the only sampling; request values are ignored and
    /// recorded (train mode).
    Pin,
    /// The request's values override the configured ones (eval mode; the library's default).
    #[default]
    Honor,
}

impl HarnessSampling {
    /// `pin` or `honor` (as recorded in trajectories' metadata).
    pub fn as_str(self) -> &'static str {
        match self {
            HarnessSampling::Pin => "pin",
            HarnessSampling::Honor => "honor",
        }
    }
}

/// Request fields that choose the sampling distribution (or the draw), in the order they are
/// reported; applied under honor, pinned under pin.
pub const SAMPLING_FIELDS: [&str; 5] = ["temperature", "top_p", "top_k", "min_p", "seed"];

/// Request fields no engine applies, with the value that leaves the distribution as it is.
pub const UNSUPPORTED_FIELDS: [(&str, f64); 3] = [
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
    ("repetition_penalty", 1.0),
];

/// A sampling field's value in `sampling`, as a request would write it (`None`: unset).
fn current(sampling: &Sampling, field: &str) -> Option<f64> {
    match field {
        "temperature" => sampling.temperature,
        "top_p" => sampling.top_p,
        "top_k" => sampling.top_k.map(f64::from),
        "min_p" => sampling.min_p,
        _ => sampling.seed.map(|s| s as f64),
    }
}

/// Whether a request's `value` of `field` asks for what `used` gives: unset values take each
/// field's neutral one (temperature 1, top-p 1, top-k 0 or below, min-p 0), the way vLLM reads
/// them.
fn same(field: &str, value: f64, used: Option<f64>) -> bool {
    match field {
        "temperature" => value == used.unwrap_or(1.0),
        "top_p" => value.min(1.0) == used.unwrap_or(1.0).min(1.0),
        "top_k" => value.max(0.0) == used.unwrap_or(0.0).max(0.0),
        "min_p" => value.max(0.0) == used.unwrap_or(0.0),
        _ => Some(value) == used,
    }
}

/// Sets `field` of `sampling` to a request's `value`; `false` when the value is not one the
/// field takes (a non-integer top-k or seed).
fn apply(sampling: &mut Sampling, field: &str, value: f64) -> bool {
    let integer = value.fract() == 0.0;
    match field {
        "temperature" => sampling.temperature = Some(value),
        "top_p" => sampling.top_p = Some(value),
        // vLLM's -1 (and 0) mean no limit.
        "top_k" if integer => sampling.top_k = (value >= 1.0).then(|| value.min(f64::from(u32::MAX)) as u32),
        "min_p" => sampling.min_p = (value > 0.0).then_some(value),
        "seed" if integer && value >= 0.0 => sampling.seed = Some(value as u64),
        _ => return false,
    }
    true
}

/// Enforces `mode` on `sampling` (the configured sampling, with the API layer's max_tokens and
/// stop) from the request's own fields, and returns the request's values that were not used
/// (empty when the request was served with what it asked for). See the module docs.
pub(crate) fn enforce(
    mode: HarnessSampling,
    pinned: &Sampling,
    request: &Value,
    sampling: &mut Sampling,
) -> BTreeMap<String, Value> {
    let mut ignored = BTreeMap::new();
    for field in SAMPLING_FIELDS {
        let v = &request[field];
        if v.is_null() {
            continue;
        }
        let used = match (mode, v.as_f64()) {
            (HarnessSampling::Honor, Some(x)) => apply(sampling, field, x),
            (HarnessSampling::Pin, Some(x)) => same(field, x, current(pinned, field)),
            (_, None) => false,
        };
        if !used {
            ignored.insert(field.to_string(), v.clone());
        }
    }
    if mode == HarnessSampling::Pin {
        sampling.temperature = pinned.temperature;
        sampling.top_p = pinned.top_p;
        sampling.top_k = pinned.top_k;
        sampling.min_p = pinned.min_p;
        sampling.seed = pinned.seed;
    }
    for (field, neutral) in UNSUPPORTED_FIELDS {
        let v = &request[field];
        if !v.is_null() && v.as_f64() != Some(neutral) {
            ignored.insert(field.to_string(), v.clone());
        }
    }
    let bias = &request["logit_bias"];
    if !bias.is_null() && bias.as_object().is_none_or(|m| !m.is_empty()) {
        ignored.insert("logit_bias".to_string(), bias.clone());
    }
    ignored
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pinned() -> Sampling {
        Sampling {
            temperature: Some(1.0),
            max_tokens: Some(64),
            ..Default::default()
        }
    }

    fn run(mode: HarnessSampling, req: &Value) -> (Sampling, BTreeMap<String, Value>) {
        let mut s = pinned();
        let ignored = enforce(mode, &pinned(), req, &mut s);
        (s, ignored)
    }

    fn keys(m: &BTreeMap<String, Value>) -> Vec<&str> {
        m.keys().map(String::as_str).collect()
    }

    #[test]
    fn pin_resets_the_request_values_and_reports_them() {
        let req = json!({"temperature": 0.3, "top_p": 0.5, "top_k": 20, "min_p": 0.05, "seed": 7,
            "max_tokens": 8});
        let (s, ignored) = run(HarnessSampling::Pin, &req);
        assert_eq!(s, pinned());
        assert_eq!(keys(&ignored), ["min_p", "seed", "temperature", "top_k", "top_p"]);
        assert_eq!(ignored["top_k"], json!(20));
    }

    #[test]
    fn pin_reports_nothing_for_values_equal_to_the_pinned_ones() {
        let req = json!({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0});
        let (s, ignored) = run(HarnessSampling::Pin, &req);
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(s, pinned());
        let (_, ignored) = run(HarnessSampling::Pin, &json!({"top_k": 0}));
        assert!(ignored.is_empty(), "{ignored:?}");
    }

    #[test]
    fn honor_applies_every_sampling_field_of_either_api() {
        // OpenAI's body (top_k and min_p are the vLLM extensions harnesses send) and
        // Anthropic's (top_k is its own field): the same names.
        let req = json!({"temperature": 0.3, "top_p": 0.5, "top_k": 20, "min_p": 0.1, "seed": 9});
        let (s, ignored) = run(HarnessSampling::Honor, &req);
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p, s.seed),
            (Some(0.3), Some(0.5), Some(20), Some(0.1), Some(9))
        );
        // No limit is no limit, however it is written.
        let (s, _) = run(HarnessSampling::Honor, &json!({"top_k": -1, "min_p": 0}));
        assert_eq!((s.top_k, s.min_p), (None, None));
    }

    #[test]
    fn what_no_engine_applies_and_what_cannot_be_read_is_reported_in_both_modes() {
        let req = json!({"presence_penalty": 0.5, "frequency_penalty": 0.0, "repetition_penalty": 1.1,
            "logit_bias": {"42": -100}, "temperature": "hot", "top_k": 2.5});
        for mode in [HarnessSampling::Honor, HarnessSampling::Pin] {
            let (s, ignored) = run(mode, &req);
            assert_eq!(
                keys(&ignored),
                [
                    "logit_bias",
                    "presence_penalty",
                    "repetition_penalty",
                    "temperature",
                    "top_k"
                ],
                "{mode:?}"
            );
            assert_eq!((s.temperature, s.top_k), (Some(1.0), None));
        }
        let (_, ignored) = run(
            HarnessSampling::Honor,
            &json!({"logit_bias": {}, "presence_penalty": 0}),
        );
        assert!(ignored.is_empty(), "{ignored:?}");
    }
}
