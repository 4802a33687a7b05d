//! `Facts`: the small, owned summary of one task that the filter stages decide on, computed
//! once per record from either a borrowed SWE-bench line ([`super::view`]) or a `Task`.

use std::hash::{Hash, Hasher};

use serde::Serialize;

use super::patch::{self, PatchStats};
use crate::records::{Grader, Task, TaskSource};

/// What the stages need to know about a task.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Facts {
    pub id: String,
    pub source: TaskSource,
    /// `owner/name`, lower-cased (GitHub names are case-insensitive).
    pub repo: Option<String>,
    pub base_commit: Option<String>,
    pub instruction_chars: usize,
    pub patch: Option<PatchStats>,
    pub test_patch: Option<PatchStats>,
    pub fail_to_pass: Option<usize>,
    pub pass_to_pass: Option<usize>,
    /// Lower-cased; from the record, else guessed from the gold patch's file extensions.
    pub language: Option<String>,
    pub license: Option<String>,
    /// Hash of (repo, base_commit, gold patch) for exact-duplicate detection.
    #[serde(skip)]
    pub dedupe_key: Option<u64>,
    /// Hash of the gold patch alone, for instance-level decontamination by content.
    #[serde(skip)]
    pub patch_key: Option<u64>,
    /// A Harbor task (graded by tests/test.sh, no patches).
    pub harbor: bool,
    /// Harbor multi-step tasks (`[[steps]]`), which one trial cannot run.
    pub multi_step: bool,
}

/// Normalises a repository name: strips a GitHub URL prefix and `.git`, lower-cases.
pub fn normalize_repo(repo: &str) -> String {
    let r = repo.trim();
    let r = r
        .strip_prefix("https://github.com/")
        .or_else(|| r.strip_prefix("http://github.com/"))
        .or_else(|| r.strip_prefix("github.com/"))
        .unwrap_or(r);
    let r = r.strip_suffix(".git").unwrap_or(r).trim_end_matches('/');
    r.to_ascii_lowercase()
}

/// The repository of a SWE-bench-style instance id (`owner__name-123` → `owner/name`).
pub fn repo_of_instance_id(id: &str) -> Option<String> {
    let (owner, rest) = id.split_once("__")?;
    let (name, num) = rest.rsplit_once('-')?;
    if owner.is_empty() || name.is_empty() || num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(normalize_repo(&format!("{owner}/{name}")))
}

/// Hash used for dedupe keys. std's `DefaultHasher::new()`: SipHash-1-3 with fixed keys, so
/// deterministic within a build (the keys are never stored; both sides of every comparison are
/// hashed in the same run), about 1.5x faster than the SipHash-2-4 of `SipHasher` on patches;
/// the chance that two of a million distinct patches collide is about 3e-8.
pub fn content_hash(parts: &[&str]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

impl Facts {
    /// Sets the patch-derived facts from a decoded gold patch.
    pub fn set_gold_patch(&mut self, text: &str) {
        let st = patch::stats(text);
        if self.language.is_none() {
            self.language = st.language.map(str::to_string);
        }
        let patch_key = content_hash(&[text]);
        self.patch_key = Some(patch_key);
        // The patch enters the dedupe key through its hash, so it is hashed once.
        let mut h = std::hash::DefaultHasher::new();
        self.repo.as_deref().unwrap_or("").hash(&mut h);
        self.base_commit.as_deref().unwrap_or("").hash(&mut h);
        patch_key.hash(&mut h);
        self.dedupe_key = Some(h.finish());
        self.patch = Some(st);
    }

    /// Facts of a lego-rl `Task` (also what Harbor directories become).
    pub fn of_task(task: &Task) -> Facts {
        let meta_str = |k: &str| {
            task.metadata
                .get(k)
                .and_then(|v| v.as_str())
                .map(|s| s.trim().to_ascii_lowercase())
        };
        let mut f = Facts {
            id: task.id.clone(),
            source: task.source,
            repo: task.repo.as_deref().map(normalize_repo),
            base_commit: task.base_commit.clone(),
            instruction_chars: task.instruction.chars().count(),
            fail_to_pass: Some(task.fail_to_pass.len()),
            pass_to_pass: Some(task.pass_to_pass.len()),
            language: meta_str("language"),
            license: meta_str("license").or_else(|| meta_str("license_name")),
            harbor: matches!(task.grader, Some(Grader::Harbor { .. })) || task.source == TaskSource::Harbor,
            multi_step: task
                .metadata
                .get("harbor")
                .and_then(|h| h.get("steps"))
                .and_then(|s| s.as_array())
                .is_some_and(|s| !s.is_empty()),
            ..Facts::default()
        };
        if let Some(p) = &task.gold_patch {
            f.set_gold_patch(p);
        }
        if let Some(p) = &task.test_patch {
            f.test_patch = Some(patch::stats(p));
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repos_normalise_and_derive_from_ids() {
        assert_eq!(
            normalize_repo("https://github.com/Django/django.git"),
            "django/django"
        );
        assert_eq!(
            repo_of_instance_id("django__django-10097").as_deref(),
            Some("django/django")
        );
        assert_eq!(
            repo_of_instance_id("scikit-learn__scikit-learn-11574").as_deref(),
            Some("scikit-learn/scikit-learn")
        );
        assert_eq!(
            repo_of_instance_id("pylint-dev__astroid-1268").as_deref(),
            Some("pylint-dev/astroid")
        );
        assert_eq!(repo_of_instance_id("hello-world"), None);
        assert_eq!(repo_of_instance_id("a__b-x1"), None);
    }
}
