//! vLLM's routed-experts fields, in every published format.

use base64::Engine as _;
use serde_json::Value;

use super::bad;
use crate::engine::npy;
use crate::engine::{EngineError, Routing};

/// An expert id that stands for "not recorded": −1 in the signed formats. No vLLM source we could
/// read writes it (0.32.0 re-reads prefix-cached rows from a store keyed by block hash; see
/// `mod.rs` and testdata/engine-routing/README.md), so this guards a server that would, instead of
/// replaying expert 65535.
const MISSING: u16 = u16::MAX;

/// Decodes a routed-experts field: base64 `.npy` or nested lists `[tokens][layers][top_k]`.
fn experts_array(url: &str, v: &Value) -> Result<Option<Routing>, EngineError> {
    match v {
        Value::Null => Ok(None),
        Value::String(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| bad(url, &format!("routed_experts is not base64: {e}")))?;
            let arr = npy::parse(&bytes).map_err(|e| bad(url, &format!("routed_experts: {e}")))?;
            let [t, l, k] = arr.shape[..] else {
                return Err(bad(
                    url,
                    &format!("routed_experts has shape {:?}, want 3-d", arr.shape),
                ));
            };
            Ok(Some(Routing {
                start: 0,
                tokens: t,
                layers: l,
                top_k: k,
                // Signed arrays hold −1 (a prefix-cached position) as all ones.
                experts: arr
                    .data
                    .into_iter()
                    .map(|e| u16::try_from(e).unwrap_or(MISSING))
                    .collect(),
            }))
        }
        Value::Array(rows) => {
            let t = rows.len();
            let l = rows.first().and_then(|r| r.as_array()).map_or(0, Vec::len);
            let k = rows
                .first()
                .and_then(|r| r.as_array())
                .and_then(|r| r.first())
                .and_then(|x| x.as_array())
                .map_or(0, Vec::len);
            let mut flat = Vec::with_capacity(t * l * k);
            for row in rows {
                for layer in row.as_array().into_iter().flatten() {
                    let experts = layer
                        .as_array()
                        .filter(|e| e.len() == k)
                        .ok_or_else(|| bad(url, "ragged routed_experts"))?;
                    for e in experts {
                        let id = e.as_i64().ok_or_else(|| bad(url, "non-integer expert id"))?;
                        flat.push(if id < 0 { MISSING } else { id as u16 });
                    }
                }
            }
            if flat.len() != t * l * k {
                return Err(bad(url, "ragged routed_experts"));
            }
            Ok(Some(Routing {
                start: 0,
                tokens: t,
                layers: l,
                top_k: k,
                experts: flat,
            }))
        }
        _ => Err(bad(url, "routed_experts is neither base64 nor a list")),
    }
}

pub(super) fn routing(
    url: &str,
    resp: &Value,
    choice: &Value,
    prompt: usize,
    output: usize,
) -> Result<Option<Routing>, EngineError> {
    let Some(Routing {
        tokens: t,
        layers: l,
        top_k: k,
        experts,
        ..
    }) = experts_array(url, &choice["routed_experts"])?
    else {
        return Ok(None);
    };
    if let Some(mut p) = experts_array(url, &resp["prompt_routed_experts"])? {
        // Split form: prompt rows at the response level, generated rows per choice.
        if (p.layers, p.top_k) != (l, k) {
            return Err(bad(
                url,
                "prompt_routed_experts and routed_experts disagree on layers/top_k",
            ));
        }
        p.experts.extend(experts);
        p.tokens += t;
        return skip_cached_prefix(url, p);
    }
    let total = prompt + output;
    let start = if t == total || t + 1 == total {
        0
    } else if t == output || t + 1 == output {
        prompt
    } else {
        return Err(bad(
            url,
            &format!("routed_experts has {t} rows for {prompt} prompt + {output} output tokens"),
        ));
    };
    skip_cached_prefix(
        url,
        Routing {
            start,
            tokens: t,
            layers: l,
            top_k: k,
            experts,
        },
    )
}

/// Drops the leading rows marked −1 (positions the server took from its prefix cache and has
/// no routing for): the routing then starts after them, and align takes those positions' routing
/// from the earlier generation that computed them, or leaves the sample without routing. A −1
/// after a routed position is no cached prefix and is refused.
fn skip_cached_prefix(url: &str, mut r: Routing) -> Result<Option<Routing>, EngineError> {
    let width = r.layers * r.top_k;
    if width == 0 {
        return Ok(Some(r));
    }
    let cached = r
        .experts
        .chunks(width)
        .take_while(|row| row.iter().all(|&e| e == MISSING))
        .count();
    if let Some(pos) = r.experts[cached * width..].iter().position(|&e| e == MISSING) {
        return Err(bad(
            url,
            &format!(
                "routed experts has −1 at position {} after routed positions (only a prefix-cached \
                 prefix may be missing)",
                r.start + cached + pos / width
            ),
        ));
    }
    if cached == r.tokens {
        return Ok(None);
    }
    r.experts.drain(..cached * width);
    r.start += cached;
    r.tokens -= cached;
    Ok(Some(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routing every fixture in testdata/engine-routing encodes: positions 0..3 of a
    /// 3-token prompt and 2 output tokens, 2 layers, top-2 (see its README).
    const ROWS: [[u16; 4]; 4] = [[1, 5, 2, 7], [3, 0, 6, 4], [7, 2, 1, 3], [4, 6, 0, 5]];

    fn fixture(name: &str) -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/engine-routing")
            .join(name);
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    fn decode(name: &str) -> Option<Routing> {
        let v = fixture(name);
        routing("http://vllm", &v, &v["choices"][0], 3, 2).unwrap()
    }

    fn rows(from: usize) -> Vec<u16> {
        ROWS[from..].iter().flatten().copied().collect()
    }

    #[test]
    fn every_published_vllm_format_decodes_to_the_same_routing() {
        for name in [
            "vllm-completions-npy-uint8.json",
            "vllm-chat-npy-int32.json",
            "vllm-chat-split-lists.json",
        ] {
            let r = decode(name).unwrap_or_else(|| panic!("{name}: no routing"));
            assert_eq!((r.start, r.tokens, r.layers, r.top_k), (0, 4, 2, 2), "{name}");
            assert_eq!(r.experts, rows(0), "{name}");
        }
    }

    #[test]
    fn a_prefix_cached_start_is_skipped_and_a_hole_is_refused() {
        let r = decode("vllm-completions-npy-int16-prefix-cached-UNVERIFIED.json").unwrap();
        assert_eq!((r.start, r.tokens), (2, 2));
        assert_eq!(r.experts, rows(2));
        // −1 after a routed position is no cached prefix.
        let mut v = fixture("vllm-chat-split-lists.json");
        v["choices"][0]["routed_experts"][0][1] = serde_json::json!([-1, -1]);
        let err = routing("http://vllm", &v, &v["choices"][0], 3, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("−1 at position 3"), "{err}");
        // A server without the flag: no routing, not an error.
        let mut v = fixture("vllm-completions-npy-uint8.json");
        v["choices"][0]["routed_experts"] = Value::Null;
        assert_eq!(routing("http://vllm", &v, &v["choices"][0], 3, 2).unwrap(), None);
    }
}
