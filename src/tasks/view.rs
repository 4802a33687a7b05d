//! The hot path: one JSONL line viewed through borrowed raw fields, turned into [`Facts`]
//! without building a `Task`. Field types are checked one by one so an error names the field.

use std::cell::RefCell;
use std::path::Path;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::facts::{normalize_repo, Facts};
use super::json::{kind_of, scalar_text, string_list, unescape_into};
use super::patch;
use super::TaskError;
use crate::records::TaskSource;

/// The fields of a line that classification and the stages read; everything else is skipped
/// by the parser without being decoded.
#[derive(Deserialize, Default)]
#[expect(non_snake_case, reason = "SWE-bench's official field names")]
pub struct LineView<'a> {
    #[serde(borrow, default)]
    pub schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub instance_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub repo: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub base_commit: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub problem_statement: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub patch: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub test_patch: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub FAIL_TO_PASS: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub PASS_TO_PASS: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub version: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub language: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub license: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub license_name: Option<&'a RawValue>,
}

thread_local! {
    static BUF: RefCell<String> = RefCell::new(String::with_capacity(64 << 10));
}

/// Parses a line's view; the error says why it is not a JSON object.
pub fn parse_view<'a>(path: &Path, line: u64, text: &'a str) -> Result<LineView<'a>, TaskError> {
    serde_json::from_str::<LineView<'a>>(text).map_err(|e| TaskError::NotJson {
        path: path.to_path_buf(),
        line,
        msg: e.to_string(),
    })
}

/// Facts of a SWE-bench-style record from its view.
pub fn swebench_facts(path: &Path, line: u64, v: &LineView<'_>) -> Result<Facts, TaskError> {
    let bad = |field: &str, msg: String| TaskError::BadField {
        path: path.to_path_buf(),
        line,
        field: field.to_string(),
        msg,
    };
    let id_raw = v.instance_id.ok_or_else(|| TaskError::MissingField {
        path: path.to_path_buf(),
        line,
        field: "instance_id",
    })?;
    let id = scalar_string(id_raw).map_err(|m| bad("instance_id", m))?;
    if id.trim().is_empty() {
        return Err(bad("instance_id", "is empty".into()));
    }
    let opt_str = |field: &str, raw: Option<&RawValue>| -> Result<Option<String>, TaskError> {
        raw.map(|r| scalar_string(r).map_err(|m| bad(field, m))).transpose()
    };
    let mut f = Facts {
        id,
        source: TaskSource::Swebench,
        repo: opt_str("repo", v.repo)?.map(|r| normalize_repo(&r)),
        base_commit: opt_str("base_commit", v.base_commit)?,
        language: opt_str("language", v.language)?.map(|s| s.trim().to_ascii_lowercase()),
        license: match opt_str("license", v.license)? {
            Some(l) => Some(l),
            None => opt_str("license_name", v.license_name)?,
        }
        .map(|s| s.trim().to_ascii_lowercase()),
        ..Facts::default()
    };
    if let Some(r) = v.version {
        scalar_text(r).map_err(|m| bad("version", m))?;
    }
    f.fail_to_pass = v
        .FAIL_TO_PASS
        .map(|r| string_list(r).map(|l| l.len()).map_err(|m| bad("FAIL_TO_PASS", m)))
        .transpose()?;
    f.pass_to_pass = v
        .PASS_TO_PASS
        .map(|r| string_list(r).map(|l| l.len()).map_err(|m| bad("PASS_TO_PASS", m)))
        .transpose()?;
    BUF.with(|buf| -> Result<(), TaskError> {
        let mut buf = buf.borrow_mut();
        if let Some(r) = v.problem_statement {
            unescape_into(r.get(), &mut buf).map_err(|m| bad("problem_statement", m))?;
            f.instruction_chars = buf.chars().count();
        }
        if let Some(r) = v.patch {
            unescape_into(r.get(), &mut buf).map_err(|m| bad("patch", m))?;
            f.set_gold_patch(&buf);
        }
        if let Some(r) = v.test_patch {
            unescape_into(r.get(), &mut buf).map_err(|m| bad("test_patch", m))?;
            f.test_patch = Some(patch::stats(&buf));
        }
        Ok(())
    })?;
    Ok(f)
}

fn scalar_string(raw: &RawValue) -> Result<String, String> {
    match raw.get().as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(raw.get()).map_err(|e| e.to_string()),
        _ => Err(format!("expected a string, found {}", kind_of(raw.get()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_from_a_line_name_the_bad_field() {
        let p = Path::new("pool.jsonl");
        let line = r#"{"instance_id":"o__r-1","repo":"O/R","base_commit":"abc","problem_statement":"x\ny","patch":"diff --git a/m.py b/m.py\n@@ -1 +1 @@\n-a\n+b\n","FAIL_TO_PASS":"[\"t\"]","PASS_TO_PASS":[],"extra":{"k":[1,2]}}"#;
        let v = parse_view(p, 3, line).unwrap();
        let f = swebench_facts(p, 3, &v).unwrap();
        assert_eq!(f.id, "o__r-1");
        assert_eq!(f.repo.as_deref(), Some("o/r"));
        assert_eq!(f.instruction_chars, 3);
        assert_eq!(f.fail_to_pass, Some(1));
        assert_eq!(f.pass_to_pass, Some(0));
        assert_eq!(f.patch.as_ref().map(|p| p.changed_lines), Some(2));
        assert_eq!(f.language.as_deref(), Some("python"));
        assert!(f.test_patch.is_none());

        let bad = r#"{"instance_id":"o__r-1","FAIL_TO_PASS":5}"#;
        let err = swebench_facts(p, 7, &parse_view(p, 7, bad).unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pool.jsonl: record 7: field `FAIL_TO_PASS`: expected an array of strings, found a number"
        );
        let missing = r#"{"repo":"o/r"}"#;
        let err = swebench_facts(p, 2, &parse_view(p, 2, missing).unwrap()).unwrap_err();
        assert_eq!(err.to_string(), "pool.jsonl: record 2: missing required field `instance_id`");
        assert!(parse_view(p, 1, "not json").is_err());
        assert!(parse_view(p, 1, "[1,2]").is_err());
    }
}
