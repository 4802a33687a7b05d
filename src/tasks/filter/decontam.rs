//! Stage 2, decontamination: no training task may overlap the evaluation set.
//!
//! - instance level (`--exclude-instances FILE`): same id, or the same gold patch under another
//!   id (re-packaged datasets rename instances);
//! - repository level (`--exclude-repos-of FILE`): any task from a repository of the set.
//!
//! FILE is an evaluation set in any accepted format (SWE-bench JSONL or `.json`, lego-rl task
//! records, Harbor task directories, a swebench 5.x task repository) or a plain list of ids, one per line (`#` comments). For a
//! plain list, repositories come from SWE-bench's id convention (`owner__name-123`).

use std::collections::HashSet;
use std::path::Path;

use serde_json::json;

use super::Drop;
use crate::tasks::facts::{repo_of_instance_id, Facts};
use crate::tasks::source::{classify, load_dir, parse_record, InputKind, RecordLines};
use crate::tasks::TaskError;

/// What an evaluation set names.
#[derive(Debug, Clone, Default)]
pub struct EvalSet {
    pub ids: HashSet<String>,
    pub repos: HashSet<String>,
    pub patch_keys: HashSet<u64>,
}

impl EvalSet {
    /// Adds one task's identity.
    fn add(&mut self, f: &Facts) {
        self.ids.insert(f.id.clone());
        if let Some(r) = f.repo.clone().or_else(|| repo_of_instance_id(&f.id)) {
            self.repos.insert(r);
        }
        if let Some(k) = f.patch_key {
            self.patch_keys.insert(k);
        }
    }

    /// Loads an evaluation set from a record file, a Harbor directory or a plain id list.
    pub fn load(path: &Path) -> Result<EvalSet, TaskError> {
        let mut set = EvalSet::default();
        match classify(path)? {
            InputKind::TaskDirs(dirs) => {
                for d in dirs {
                    set.add(&Facts::of_task(&load_dir(&d)?));
                }
            }
            InputKind::Records(p) => {
                let mut lines = RecordLines::open(&p)?;
                let mut plain = None;
                while let Some((n, text)) = lines.next_record()? {
                    let t = text.trim();
                    let is_plain = *plain.get_or_insert(!t.starts_with('{'));
                    if is_plain {
                        if t.starts_with('#') {
                            continue;
                        }
                        let id = t.split_whitespace().next().unwrap_or(t).to_string();
                        if let Some(r) = repo_of_instance_id(&id) {
                            set.repos.insert(r);
                        }
                        set.ids.insert(id);
                    } else {
                        set.add(parse_record(&p, n, &text)?.facts());
                    }
                }
            }
        }
        if set.ids.is_empty() {
            return Err(TaskError::Input {
                path: path.to_path_buf(),
                msg: "evaluation set is empty".into(),
            });
        }
        Ok(set)
    }
}

/// Settings of the decontamination stage.
#[derive(Debug, Clone, Default)]
pub struct Decontamination {
    /// Instance-level exclusions.
    pub instances: Option<EvalSet>,
    /// Repository-level exclusions (only the `repos` of the set are used).
    pub repos: Option<EvalSet>,
}

impl Decontamination {
    /// Drops a task that overlaps the evaluation set.
    pub fn check(&self, f: &Facts) -> Result<(), Drop> {
        if let Some(set) = &self.instances {
            if set.ids.contains(&f.id) {
                return Err(Drop {
                    reason: "eval_instance".into(),
                    evidence: json!({"id": f.id}),
                });
            }
            if f.patch_key.is_some_and(|k| set.patch_keys.contains(&k)) {
                return Err(Drop {
                    reason: "eval_instance_patch".into(),
                    evidence: json!({"detail": "gold patch identical to an evaluation instance's"}),
                });
            }
        }
        if let Some(set) = &self.repos {
            let hit = match f.repo.as_deref() {
                Some(r) => set.repos.contains(r).then(|| r.to_string()),
                None => repo_of_instance_id(&f.id).filter(|r| set.repos.contains(r)),
            };
            if let Some(r) = hit {
                return Err(Drop {
                    reason: "eval_repo".into(),
                    evidence: json!({"repo": r}),
                });
            }
        }
        Ok(())
    }
}
