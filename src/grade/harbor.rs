//! Harbor rewards: `/logs/verifier/reward.json` (preferred) or `reward.txt`.
//!
//! reward.json is an object of named finite numbers (`{"correctness": 1, "performance": 0}`); the
//! scalar reward is its `reward` key when present, else the mean of all values (Harbor's multi-reward
//! recipes report per-dimension metrics; training needs one number). reward.txt holds one number.

use std::collections::BTreeMap;

use super::GradeError;

/// A parsed Harbor reward.
#[derive(Debug, Clone, PartialEq)]
pub struct HarborReward {
    pub reward: f64,
    /// Every named component (`reward` for reward.txt).
    pub components: BTreeMap<String, f64>,
    pub file: &'static str,
}

fn finite(v: f64, file: &'static str) -> Result<f64, GradeError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(GradeError::BadReward {
            file,
            message: format!("non-finite reward {v}"),
        })
    }
}

/// Parses the reward from the contents of reward.json / reward.txt (`None` = file absent).
pub fn parse_reward(json: Option<&str>, txt: Option<&str>) -> Result<HarborReward, GradeError> {
    if let Some(text) = json {
        let file = "reward.json";
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| GradeError::BadReward {
            file,
            message: e.to_string(),
        })?;
        let mut components = BTreeMap::new();
        match value {
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    let n = v.as_f64().ok_or_else(|| GradeError::BadReward {
                        file,
                        message: format!("`{k}` is not a number"),
                    })?;
                    components.insert(k, finite(n, file)?);
                }
            }
            serde_json::Value::Number(n) => {
                components.insert("reward".into(), finite(n.as_f64().unwrap_or(f64::NAN), file)?);
            }
            other => {
                return Err(GradeError::BadReward {
                    file,
                    message: format!("expected an object, got {other}"),
                })
            }
        }
        if components.is_empty() {
            return Err(GradeError::BadReward {
                file,
                message: "empty object".into(),
            });
        }
        let reward = match components.get("reward") {
            Some(r) => *r,
            None => components.values().sum::<f64>() / components.len() as f64,
        };
        return Ok(HarborReward {
            reward,
            components,
            file,
        });
    }
    if let Some(text) = txt {
        let file = "reward.txt";
        let n: f64 = text.trim().parse().map_err(|_| GradeError::BadReward {
            file,
            message: format!("not a number: {:?}", text.trim()),
        })?;
        let reward = finite(n, file)?;
        return Ok(HarborReward {
            reward,
            components: BTreeMap::from([("reward".to_string(), reward)]),
            file,
        });
    }
    Err(GradeError::MissingReward)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_first_then_txt() {
        let r = parse_reward(Some(r#"{"correctness": 1, "performance": 0}"#), Some("1")).expect("json");
        assert_eq!((r.reward, r.file), (0.5, "reward.json"));
        let r = parse_reward(None, Some(" 1\n")).expect("txt");
        assert_eq!((r.reward, r.file), (1.0, "reward.txt"));
        let r = parse_reward(Some(r#"{"reward": 0.25, "x": 1}"#), None).expect("reward key");
        assert_eq!(r.reward, 0.25);
    }

    #[test]
    fn missing_or_non_finite_is_an_error() {
        assert_eq!(parse_reward(None, None), Err(GradeError::MissingReward));
        assert!(parse_reward(None, Some("nan")).is_err());
        assert!(parse_reward(None, Some("inf")).is_err());
        assert!(parse_reward(None, Some("")).is_err());
        assert!(parse_reward(Some("{}"), None).is_err());
        assert!(parse_reward(Some(r#"{"a": "x"}"#), None).is_err());
    }
}
