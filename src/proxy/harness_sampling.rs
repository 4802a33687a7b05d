//! Whose sampling a request is served with.
//!
//! GSPO divides the trainer's probability of each sampled token by the behaviour policy's, so the
//! recorded log-prob must be that of the distribution the token was drawn from. The engines record
//! plain temperature-1, full-vocabulary log-probs and the trainer recomputes the same quantity;
//! a harness that sends its own `temperature` / `top_p` / `top_k` (OpenCode for some model
//! families, mini-swe-agent and OpenHands from user config) would make tokens come from another,
//! tempered or truncated, distribution while the records still agree with the trainer. In train
//! mode rollout therefore *pins* its own sampling ([`HarnessSampling::Pin`]): the request's
//! values are ignored, and the ignored ones are recorded per generation
//! (`Generation::ignored_sampling`) and counted. Eval mode honours them ([`HarnessSampling::Honor`]).
//!
//! `min_p` is not implemented by the engines: a request's `min_p` is recorded as ignored in both
//! modes rather than silently dropped.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::records::Sampling;

/// Whether a request's own sampling fields (temperature, top_p, top_k, min_p) are used.
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

/// Request fields that choose the sampling distribution, in the order they are reported.
pub const SAMPLING_FIELDS: [&str; 4] = ["temperature", "top_p", "top_k", "min_p"];

/// Enforces `mode` on `sampling`, which the API layer built from the configured defaults and the
/// request's own fields, and returns the request's values that were not used (empty when the
/// request was served with what it asked for).
///
/// Under [`HarnessSampling::Pin`] temperature, top_p and top_k are reset to `pinned` (the
/// configured sampling); a request value is reported when it differs from the one sampled with
/// (an explicit `temperature: 1.0` under a pinned 1.0 is no override). `min_p` is reported in
/// both modes when it is set above 0.
pub(crate) fn enforce(
    mode: HarnessSampling,
    pinned: &Sampling,
    request: &Value,
    sampling: &mut Sampling,
) -> BTreeMap<String, Value> {
    let mut ignored = BTreeMap::new();
    if mode == HarnessSampling::Pin {
        sampling.temperature = pinned.temperature;
        sampling.top_p = pinned.top_p;
        sampling.top_k = pinned.top_k;
        let used = |field: &str| -> f64 {
            match field {
                "temperature" => pinned.temperature.unwrap_or(1.0),
                "top_p" => pinned.top_p.unwrap_or(1.0),
                _ => pinned.top_k.map_or(0.0, f64::from),
            }
        };
        for field in ["temperature", "top_p", "top_k"] {
            let v = &request[field];
            let differs = match v.as_f64() {
                Some(x) if field == "top_k" && x <= 0.0 => used(field) != 0.0,
                Some(x) => x != used(field),
                None => !v.is_null(),
            };
            if differs {
                ignored.insert(field.to_string(), v.clone());
            }
        }
    }
    let min_p = &request["min_p"];
    if min_p.as_f64().is_none_or(|p| p > 0.0) && !min_p.is_null() {
        ignored.insert("min_p".to_string(), min_p.clone());
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

    /// What the API layer builds today: the request's values over the defaults.
    fn requested(req: &Value) -> Sampling {
        let mut s = pinned();
        s.temperature = req["temperature"].as_f64().or(s.temperature);
        s.top_p = req["top_p"].as_f64().or(s.top_p);
        s.top_k = req["top_k"].as_u64().map(|k| k as u32).or(s.top_k);
        s
    }

    #[test]
    fn pin_resets_the_request_values_and_reports_them() {
        let req = json!({"temperature": 0.3, "top_p": 0.5, "top_k": 20, "min_p": 0.05, "max_tokens": 8});
        let mut s = requested(&req);
        let ignored = enforce(HarnessSampling::Pin, &pinned(), &req, &mut s);
        assert_eq!(s, pinned());
        assert_eq!(
            ignored,
            BTreeMap::from([
                ("min_p".to_string(), json!(0.05)),
                ("temperature".to_string(), json!(0.3)),
                ("top_k".to_string(), json!(20)),
                ("top_p".to_string(), json!(0.5)),
            ])
        );
    }

    #[test]
    fn pin_reports_nothing_for_values_equal_to_the_pinned_ones() {
        let req = json!({"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0});
        let mut s = requested(&req);
        assert!(enforce(HarnessSampling::Pin, &pinned(), &req, &mut s).is_empty());
        assert_eq!(s.temperature, Some(1.0));
        assert_eq!(s.top_p, None);
    }

    #[test]
    fn honor_keeps_the_request_values_and_reports_only_min_p() {
        let req = json!({"temperature": 0.3, "top_p": 0.5, "min_p": 0.1});
        let mut s = requested(&req);
        let ignored = enforce(HarnessSampling::Honor, &pinned(), &req, &mut s);
        assert_eq!((s.temperature, s.top_p), (Some(0.3), Some(0.5)));
        assert_eq!(ignored, BTreeMap::from([("min_p".to_string(), json!(0.1))]));
    }
}
