//! `--follow CKPT_ROOT`: finding the newest complete checkpoint and a checkpoint's policy version.
//!
//! A checkpoint is a directory `step-NNNNNN` under the root holding `lego-rl.json` (train-step
//! writes it with the weights; a directory without it is still being written and is skipped).

use std::path::{Path, PathBuf};

use crate::train::CheckpointInfo;

/// One complete checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub policy_version: u64,
}

/// Errors reading checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error("{path}: cannot list checkpoints: {source}")]
    List {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid lego-rl.json: {msg}")]
    Info { path: PathBuf, msg: String },
}

/// The policy version of the checkpoint in `dir`: `policy_version` of its `lego-rl.json`, else
/// the step number of a `step-NNNNNN` name, else 0 (a base model).
pub fn policy_version(dir: &Path) -> Result<u64, FollowError> {
    let info = dir.join("lego-rl.json");
    if info.is_file() {
        let text = std::fs::read_to_string(&info).map_err(|e| FollowError::Info {
            path: info.clone(),
            msg: e.to_string(),
        })?;
        let parsed: CheckpointInfo = serde_json::from_str(&text).map_err(|e| FollowError::Info {
            path: info.clone(),
            msg: e.to_string(),
        })?;
        return Ok(parsed.policy_version);
    }
    Ok(dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(step_number)
        .unwrap_or(0))
}

fn step_number(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// The newest complete checkpoint under `root` (highest policy version, then highest step), or
/// `None` when there is none yet.
pub fn newest(root: &Path) -> Result<Option<Checkpoint>, FollowError> {
    let list = |source| FollowError::List {
        path: root.to_path_buf(),
        source,
    };
    let mut best: Option<(u64, u64, PathBuf)> = None;
    for entry in std::fs::read_dir(root).map_err(list)? {
        let entry = entry.map_err(list)?;
        let name = entry.file_name();
        let Some(step) = name.to_str().and_then(step_number) else {
            continue;
        };
        let dir = entry.path();
        if !dir.join("lego-rl.json").is_file() {
            continue;
        }
        let v = policy_version(&dir)?;
        if best.as_ref().is_none_or(|(bv, bs, _)| (v, step) > (*bv, *bs)) {
            best = Some((v, step, dir));
        }
    }
    Ok(best.map(|(policy_version, _, dir)| Checkpoint { dir, policy_version }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ckpt(root: &Path, name: &str, version: Option<u64>) {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        if let Some(v) = version {
            let info = CheckpointInfo {
                policy_version: v,
                ..Default::default()
            };
            std::fs::write(d.join("lego-rl.json"), serde_json::to_string(&info).unwrap()).unwrap();
        }
    }

    #[test]
    fn newest_complete_checkpoint_wins() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(newest(tmp.path()).unwrap(), None);
        ckpt(tmp.path(), "step-000000", Some(0));
        ckpt(tmp.path(), "step-000001", Some(1));
        ckpt(tmp.path(), "step-000002", None); // still being written
        ckpt(tmp.path(), "other", Some(9));
        let n = newest(tmp.path()).unwrap().unwrap();
        assert_eq!(n.policy_version, 1);
        assert!(n.dir.ends_with("step-000001"));
        assert_eq!(policy_version(&tmp.path().join("step-000002")).unwrap(), 2);
        std::fs::write(tmp.path().join("step-000001/lego-rl.json"), "{").unwrap();
        let e = newest(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("step-000001/lego-rl.json"), "{e}");
        assert!(newest(&tmp.path().join("missing")).is_err());
    }
}
