//! Harbor rewards: `/logs/verifier/reward.json` (preferred) or `reward.txt`.
//!
//! reward.json is an object of named finite numbers (`{"correctness": 1, "performance": 0}`); the
//! scalar reward is its `reward` key when present, else the mean of all values (Harbor's multi-reward
//! recipes report per-dimension metrics; training needs one number). reward.txt holds one number.

use std::collections::{BTreeMap, BTreeSet};

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

/// The audit event of a Harbor reward that is not the one `test.sh` wrote (reward 0).
pub const REWARD_TAMPERING: &str = "reward_tampering";

/// The audit event of processes of the verifier user still running when `test.sh` exited (killed
/// before the reward was read).
pub const OUTLIVED_VERIFIER: &str = "outlived_verifier";

/// The reward files a Harbor verifier may write.
pub const REWARD_FILES: [&str; 2] = ["reward.json", "reward.txt"];

/// The reward files a task's verifier writes: those its tests directory names (in `test.sh` or any
/// helper it runs), given the text of every file there. A verifier that names neither (it builds
/// the name at run time) may write either.
pub fn expected_files<'a>(texts: impl IntoIterator<Item = &'a [u8]>) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    for t in texts {
        for f in REWARD_FILES {
            if t.windows(f.len()).any(|w| w == f.as_bytes()) {
                out.insert(f);
            }
        }
    }
    if out.is_empty() {
        out.extend(REWARD_FILES);
    }
    out
}

/// One reward file as root saw it after `test.sh` exited and the verifier user's processes were
/// killed (`stat -c '%n %a %U %F %.9Z'`).
#[derive(Debug, Clone, PartialEq)]
pub struct RewardStat {
    pub name: String,
    pub mode: String,
    pub owner: String,
    /// `regular file`, `regular empty file`, `symbolic link`, ...
    pub kind: String,
    /// Status change time (seconds): the code under test can set a file's mtime, not its ctime.
    pub ctime: f64,
}

/// Parses `LEGO_STAT NAME MODE OWNER KIND... CTIME` lines.
pub fn parse_stats(out: &str) -> Vec<RewardStat> {
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("LEGO_STAT ")?;
            let mut w: Vec<&str> = rest.split(' ').collect();
            let ctime = w.pop()?.parse().ok()?;
            if w.len() < 4 {
                return None;
            }
            Some(RewardStat {
                name: w[0].to_string(),
                mode: w[1].to_string(),
                owner: w[2].to_string(),
                kind: w[3..].join(" "),
                ctime,
            })
        })
        .collect()
}

/// Root pre-creates every reward file empty, mode 644, owned by the verifier user, in a directory
/// of its own: the non-empty ones are those written. Why a reward is not the one `test.sh` wrote,
/// if it is not: a file that is not a regular file, a changed mode, a file the task's verifier
/// does not write (`expected`), or a change after `test.sh` exited (`exited`: the ctime of a file
/// root stamped when it reaped `test.sh`, so both times come from the kernel's file clock).
pub fn tampering(stats: &[RewardStat], expected: &BTreeSet<&str>, exited: Option<f64>) -> Option<String> {
    let mut why = Vec::new();
    for f in REWARD_FILES {
        let Some(s) = stats.iter().find(|s| s.name == f) else {
            why.push(format!("{f} is gone"));
            continue;
        };
        let written = s.kind == "regular file";
        if !written && s.kind != "regular empty file" {
            why.push(format!("{f} is a {}", s.kind));
        } else if s.mode != "644" {
            why.push(format!("{f} has mode {} (was 644)", s.mode));
        } else if written && !expected.contains(f) {
            why.push(format!(
                "{f} was written, but the task's verifier writes only {expected:?}"
            ));
        } else if exited.is_some_and(|t| s.ctime > t) {
            // Written or truncated after the exit (an empty file too: a writer killed between
            // truncating and writing).
            why.push(format!("{f} was changed after test.sh exited"));
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_files_are_checked_against_what_test_sh_writes() {
        let expected = expected_files([&b"echo 1 > /logs/verifier/reward.txt"[..], &b"x"[..]]);
        assert_eq!(expected, BTreeSet::from(["reward.txt"]));
        assert_eq!(expected_files([&b"no name"[..]]).len(), 2);
        let out = "LEGO_STAT reward.txt 644 agent regular file 100.5\n\
                   LEGO_STAT reward.json 644 agent regular empty file 90.25\n";
        let stats = parse_stats(out);
        assert_eq!(stats.len(), 2);
        assert_eq!(stats[1].kind, "regular empty file");
        assert_eq!(tampering(&stats, &expected, Some(101.0)), None);
        // Written after test.sh exited.
        let why = tampering(&stats, &expected, Some(100.0)).expect("late");
        assert!(why.contains("after test.sh exited"), "{why}");
        // A planted reward.json, a read-only reward.txt, a symlink.
        let planted = parse_stats(&out.replace("regular empty file 90.25", "regular file 90.25"));
        assert!(tampering(&planted, &expected, None)
            .expect("planted")
            .contains("reward.json was written"));
        let ro = parse_stats(&out.replace("644 agent regular file", "444 agent regular file"));
        assert!(tampering(&ro, &expected, None)
            .expect("mode")
            .contains("mode 444"));
        let link = parse_stats(&out.replace("regular file 100.5", "symbolic link 100.5"));
        assert!(tampering(&link, &expected, None)
            .expect("link")
            .contains("symbolic link"));
        assert!(tampering(&stats[..1], &expected, None)
            .expect("gone")
            .contains("reward.json is gone"));
        // Truncated after the exit by a writer killed before it wrote.
        let truncated = tampering(&stats, &expected, Some(80.0)).expect("truncated");
        assert!(truncated.contains("reward.json was changed after"), "{truncated}");
    }

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
