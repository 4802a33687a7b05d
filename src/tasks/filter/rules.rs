//! Stage 1, rules: required fields present and well-formed, size bounds, test/non-test file
//! separation, language and licence allow-lists. Exact duplicates (same repo + base commit +
//! gold patch) and repeated ids are dropped here too, by the sequential part of the pipeline
//! ([`super::run`]), keeping the first occurrence in input order.

use serde_json::json;

use super::Drop;
use crate::tasks::facts::Facts;

/// Thresholds of the rules stage (each is a CLI flag; defaults in [`RuleSettings::default`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSettings {
    pub min_statement_chars: usize,
    pub max_statement_chars: usize,
    pub min_patch_lines: u32,
    pub max_patch_lines: u32,
    pub max_patch_files: u32,
    pub max_test_patch_lines: u32,
    pub max_test_patch_files: u32,
    /// Drop a task whose test patch touches a non-test file or whose gold patch touches a test file.
    pub check_test_files: bool,
    /// Allowed languages, lower-case; empty = any.
    pub languages: Vec<String>,
    /// Allowed licences, lower-case; empty = any.
    pub licenses: Vec<String>,
}

impl Default for RuleSettings {
    fn default() -> Self {
        RuleSettings {
            min_statement_chars: 20,
            max_statement_chars: 50_000,
            min_patch_lines: 1,
            max_patch_lines: 500,
            max_patch_files: 10,
            max_test_patch_lines: 2_000,
            max_test_patch_files: 20,
            check_test_files: true,
            languages: Vec::new(),
            licenses: Vec::new(),
        }
    }
}

fn drop(reason: &str, evidence: serde_json::Value) -> Drop {
    Drop {
        reason: reason.to_string(),
        evidence,
    }
}

fn is_repo_name(r: &str) -> bool {
    let mut parts = r.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

fn is_commit(c: &str) -> bool {
    (7..=64).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Checks every rule except duplicates; the first failing rule is the reason.
pub fn check(s: &RuleSettings, f: &Facts) -> Result<(), Drop> {
    if f.instruction_chars < s.min_statement_chars {
        return Err(drop(
            "statement_too_short",
            json!({"chars": f.instruction_chars, "min": s.min_statement_chars}),
        ));
    }
    if f.instruction_chars > s.max_statement_chars {
        return Err(drop(
            "statement_too_long",
            json!({"chars": f.instruction_chars, "max": s.max_statement_chars}),
        ));
    }
    if f.harbor {
        if f.multi_step {
            return Err(drop("unsupported:multi_step", json!({})));
        }
    } else {
        check_patch_task(s, f)?;
    }
    allow_list("language", &s.languages, f.language.as_deref())?;
    allow_list("license", &s.licenses, f.license.as_deref())?;
    Ok(())
}

fn allow_list(what: &str, allowed: &[String], value: Option<&str>) -> Result<(), Drop> {
    if allowed.is_empty() {
        return Ok(());
    }
    match value {
        None => Err(drop(&format!("{what}_unknown"), json!({"allowed": allowed}))),
        Some(v) if allowed.iter().any(|a| a == v) => Ok(()),
        Some(v) => Err(drop(
            &format!("{what}_not_allowed"),
            json!({what: v, "allowed": allowed}),
        )),
    }
}

fn check_patch_task(s: &RuleSettings, f: &Facts) -> Result<(), Drop> {
    match f.repo.as_deref() {
        None => return Err(drop("missing_field:repo", json!({}))),
        Some(r) if !is_repo_name(r) => return Err(drop("malformed:repo", json!({"repo": r}))),
        _ => {}
    }
    match f.base_commit.as_deref() {
        None => return Err(drop("missing_field:base_commit", json!({}))),
        Some(c) if !is_commit(c) => return Err(drop("malformed:base_commit", json!({"base_commit": c}))),
        _ => {}
    }
    let patch = f
        .patch
        .as_ref()
        .ok_or_else(|| drop("missing_field:patch", json!({})))?;
    if patch.files == 0 {
        return Err(drop("malformed:patch", json!({"detail": "no file headers"})));
    }
    let test = f
        .test_patch
        .as_ref()
        .ok_or_else(|| drop("missing_field:test_patch", json!({})))?;
    if test.files == 0 {
        return Err(drop("malformed:test_patch", json!({"detail": "no file headers"})));
    }
    match f.fail_to_pass {
        None => return Err(drop("missing_field:FAIL_TO_PASS", json!({}))),
        Some(0) => return Err(drop("empty:FAIL_TO_PASS", json!({}))),
        _ => {}
    }
    if f.pass_to_pass.is_none() {
        return Err(drop("missing_field:PASS_TO_PASS", json!({})));
    }
    if patch.changed_lines < s.min_patch_lines {
        return Err(drop(
            "patch_too_small",
            json!({"changed_lines": patch.changed_lines, "min": s.min_patch_lines}),
        ));
    }
    if patch.changed_lines > s.max_patch_lines {
        return Err(drop(
            "patch_too_many_lines",
            json!({"changed_lines": patch.changed_lines, "max": s.max_patch_lines}),
        ));
    }
    if patch.files > s.max_patch_files {
        return Err(drop(
            "patch_too_many_files",
            json!({"files": patch.files, "max": s.max_patch_files}),
        ));
    }
    if test.changed_lines > s.max_test_patch_lines {
        return Err(drop(
            "test_patch_too_many_lines",
            json!({"changed_lines": test.changed_lines, "max": s.max_test_patch_lines}),
        ));
    }
    if test.files > s.max_test_patch_files {
        return Err(drop(
            "test_patch_too_many_files",
            json!({"files": test.files, "max": s.max_test_patch_files}),
        ));
    }
    if s.check_test_files {
        if let Some(file) = &test.first_non_test_file {
            return Err(drop("test_patch_touches_non_test_file", json!({"file": file})));
        }
        if let Some(file) = &patch.first_test_file {
            return Err(drop("gold_patch_touches_test_file", json!({"file": file})));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::patch;

    fn facts() -> Facts {
        let mut f = Facts {
            id: "o__r-1".into(),
            repo: Some("o/r".into()),
            base_commit: Some("0123456789abcdef".into()),
            instruction_chars: 100,
            fail_to_pass: Some(1),
            pass_to_pass: Some(0),
            ..Facts::default()
        };
        f.set_gold_patch("diff --git a/m.py b/m.py\n@@ -1 +1 @@\n-a\n+b\n");
        f.test_patch = Some(patch::stats(
            "diff --git a/tests/t.py b/tests/t.py\n@@ -1 +1 @@\n-a\n+b\n",
        ));
        f
    }

    fn reason(s: &RuleSettings, f: &Facts) -> String {
        check(s, f).err().map(|d| d.reason).unwrap_or_default()
    }

    #[test]
    fn each_rule_fires_with_its_reason() {
        let s = RuleSettings::default();
        assert_eq!(reason(&s, &facts()), "");
        let mut f = facts();
        f.instruction_chars = 5;
        assert_eq!(reason(&s, &f), "statement_too_short");
        let mut f = facts();
        f.base_commit = Some("xyz".into());
        assert_eq!(reason(&s, &f), "malformed:base_commit");
        let mut f = facts();
        f.fail_to_pass = Some(0);
        assert_eq!(reason(&s, &f), "empty:FAIL_TO_PASS");
        let mut f = facts();
        f.test_patch = Some(patch::stats(
            "diff --git a/setup.py b/setup.py\n@@ -1 +1 @@\n-a\n+b\n",
        ));
        assert_eq!(reason(&s, &f), "test_patch_touches_non_test_file");
        let mut f = facts();
        f.set_gold_patch("diff --git a/tests/x.py b/tests/x.py\n@@ -1 +1 @@\n-a\n+b\n");
        assert_eq!(reason(&s, &f), "gold_patch_touches_test_file");
        let tight = RuleSettings {
            max_patch_lines: 1,
            ..RuleSettings::default()
        };
        assert_eq!(reason(&tight, &facts()), "patch_too_many_lines");
        let java_only = RuleSettings {
            languages: vec!["java".into()],
            ..RuleSettings::default()
        };
        assert_eq!(reason(&java_only, &facts()), "language_not_allowed");
        let mit_only = RuleSettings {
            licenses: vec!["mit".into()],
            ..RuleSettings::default()
        };
        assert_eq!(reason(&mit_only, &facts()), "license_unknown");
    }
}
