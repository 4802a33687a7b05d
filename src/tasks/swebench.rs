//! SWE-bench-style instance → `Task`. Official field names (`instance_id`, `repo`,
//! `base_commit`, `problem_statement`, `patch`, `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`,
//! `version`, `environment_setup_commit`, ...). Every field that has no `Task` field of its own —
//! `version` (always a string: "0.20" ≠ 0.2), `environment_setup_commit`, `hints_text`,
//! `created_at` and any dataset-specific extra — is kept verbatim in `metadata`, in input order.
//!
//! `grader` is left unset: the test command depends on repo and version (SWE-bench's
//! MAP_REPO_VERSION_TO_SPECS), which the sandbox side resolves.

use std::path::Path;

use serde_json::{Map, Value};

use super::json::string_list;
use super::TaskError;
use crate::records::{Environment, RepoSource, Task, TaskSource};

/// Fields mapped onto `Task` fields (all others go to metadata).
const MAPPED: [&str; 8] = [
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
];

/// Converts one SWE-bench line (already known to be a JSON object with an `instance_id`).
pub fn to_task(path: &Path, line: u64, text: &str) -> Result<Task, TaskError> {
    let map: Map<String, Value> = serde_json::from_str(text).map_err(|e| TaskError::NotJson {
        path: path.to_path_buf(),
        line,
        msg: e.to_string(),
    })?;
    from_map(path, line, map)
}

/// Converts a parsed SWE-bench record.
pub fn from_map(path: &Path, line: u64, mut map: Map<String, Value>) -> Result<Task, TaskError> {
    let bad = |field: &str, msg: String| TaskError::BadField {
        path: path.to_path_buf(),
        line,
        field: field.to_string(),
        msg,
    };
    let take_str = |map: &mut Map<String, Value>, field: &str| -> Result<Option<String>, TaskError> {
        match map.shift_remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(bad(
                field,
                format!("expected a string, found {}", type_name(&other)),
            )),
        }
    };
    let id = take_str(&mut map, "instance_id")?.ok_or_else(|| TaskError::MissingField {
        path: path.to_path_buf(),
        line,
        field: "instance_id",
    })?;
    let repo = take_str(&mut map, "repo")?;
    let base_commit = take_str(&mut map, "base_commit")?;
    let instruction = take_str(&mut map, "problem_statement")?.unwrap_or_default();
    let gold_patch = take_str(&mut map, "patch")?;
    let test_patch = take_str(&mut map, "test_patch")?;
    let mut list = |field: &str| -> Result<Vec<String>, TaskError> {
        match map.shift_remove(field) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(v) => {
                let raw = serde_json::value::to_raw_value(&v).map_err(|e| bad(field, e.to_string()))?;
                string_list(&raw).map_err(|m| bad(field, m))
            }
        }
    };
    let fail_to_pass = list("FAIL_TO_PASS")?;
    let pass_to_pass = list("PASS_TO_PASS")?;
    if let Some(v) = map.get_mut("version") {
        if let Value::Number(n) = v {
            *v = Value::String(n.to_string());
        }
    }
    debug_assert!(MAPPED.iter().all(|k| !map.contains_key(*k)));
    let environment = Environment {
        repo_source: repo.as_ref().map(|r| RepoSource::Git {
            url: format!("https://github.com/{r}.git"),
        }),
        workdir: Some("/testbed".into()),
        ..Environment::default()
    };
    let mut task = Task::new(id, instruction);
    task.source = TaskSource::Swebench;
    task.repo = repo;
    task.base_commit = base_commit;
    task.gold_patch = gold_patch;
    task.test_patch = test_patch;
    task.fail_to_pass = fail_to_pass;
    task.pass_to_pass = pass_to_pass;
    task.environment = environment;
    task.metadata = map;
    Ok(task)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn official_fields_map_and_extras_are_kept() {
        let line = r#"{"repo":"o/r","instance_id":"o__r-1","base_commit":"abc","patch":"P","test_patch":"T","problem_statement":"S","hints_text":"","created_at":"2018-07-16T22:39:16Z","version":"0.20","FAIL_TO_PASS":"[\"a\", \"b\"]","PASS_TO_PASS":["c"],"environment_setup_commit":"def","query":{"q":1}}"#;
        let t = to_task(Path::new("x.jsonl"), 1, line).unwrap();
        assert_eq!(t.id, "o__r-1");
        assert_eq!(t.source, TaskSource::Swebench);
        assert_eq!(t.instruction, "S");
        assert_eq!(t.gold_patch.as_deref(), Some("P"));
        assert_eq!(t.fail_to_pass, vec!["a", "b"]);
        assert_eq!(t.pass_to_pass, vec!["c"]);
        let keys: Vec<&str> = t.metadata.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "hints_text",
                "created_at",
                "version",
                "environment_setup_commit",
                "query"
            ]
        );
        assert_eq!(t.metadata["version"], Value::String("0.20".into()));
        let num = to_task(Path::new("x"), 1, r#"{"instance_id":"a__b-1","version":4.2}"#).unwrap();
        assert_eq!(num.metadata["version"], Value::String("4.2".into()));
    }
}
