//! swebench 5.x task repository → `Task`.
//!
//! Since swebench 5.0 a dataset's source of truth is a task repository (SWE-bench's
//! `swebench.task.repo` module and its 5.0.0/5.0.1 changelog): `sweb.yaml` at the root names the
//! datasets and splits it publishes, and each instance is a directory `tasks/<instance_id>/`:
//!
//! | file | dataset column |
//! |---|---|
//! | `task.yaml` | the short fields: `instance_id`, `repo`, `base_commit`, `version`, `split`, `datasets`, `image`, ... |
//! | `tests.json` | `FAIL_TO_PASS`, `PASS_TO_PASS` (JSON arrays) |
//! | `problem_statement.md` | `problem_statement` |
//! | `hints.md` (absent when empty) | `hints_text` |
//! | `gold.patch` | `patch` |
//! | `test.patch` | `test_patch` |
//! | `eval.sh` | `eval_script` |
//! | `Dockerfile` | — (the instance's image; it may `COPY` from its own directory) |
//!
//! A directory is read into the instance record the swebench harness builds from it (the
//! fields of `task.yaml`, each file as its column, then `tests.json`'s lists), which converts
//! like a SWE-bench JSONL record ([`super::swebench::from_map`]): unmapped fields such as
//! `version`, `split`, `datasets`, `image` and `eval_script` stay in `metadata`. The Dockerfile
//! becomes `environment.dockerfile` with the task directory as its build context; without one,
//! `image` becomes `environment.image`. Every task directory of a repository is read, whatever
//! its split (`metadata.split` says which), so the filter decides, not the layout.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::TaskError;
use crate::records::Task;

/// The file that makes a directory a swebench task directory.
pub const TASK_FILE: &str = "task.yaml";

/// Dataset columns kept as files of their own (all required, as in swebench's loader).
const AS_FILE: [(&str, &str); 4] = [
    ("patch", "gold.patch"),
    ("test_patch", "test.patch"),
    ("eval_script", "eval.sh"),
    ("problem_statement", "problem_statement.md"),
];

/// Whether `dir` is a swebench task directory (`tasks/<id>/` with a `task.yaml`).
pub fn is_task_dir(dir: &Path) -> bool {
    dir.join(TASK_FILE).is_file()
}

/// The task directories of a swebench task repository (a directory with `tasks/`), sorted;
/// None when `dir` is not one.
pub fn repo_task_dirs(dir: &Path) -> Result<Option<Vec<PathBuf>>, TaskError> {
    let root = dir.join("tasks");
    if !root.is_dir() {
        return Ok(None);
    }
    let out = super::source::subdirs(&root, is_task_dir)?;
    if out.is_empty() {
        return Err(TaskError::TaskDir {
            path: root,
            msg: format!("no task directory (no tasks/<id>/{TASK_FILE})"),
        });
    }
    Ok(Some(out))
}

/// Reads one task directory.
pub fn load(dir: &Path) -> Result<Task, TaskError> {
    let err = |msg: String| TaskError::TaskDir {
        path: dir.to_path_buf(),
        msg,
    };
    let dir = std::fs::canonicalize(dir).map_err(|e| err(e.to_string()))?;
    let read = |name: &str| -> Result<Option<String>, TaskError> {
        // Read as bytes and checked as UTF-8 here, so CRLF inside a patch survives verbatim.
        match std::fs::read(dir.join(name)) {
            Ok(b) => String::from_utf8(b)
                .map(Some)
                .map_err(|e| err(format!("{name}: not UTF-8: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(err(format!("{name}: {e}"))),
        }
    };
    let required = |name: &str| read(name)?.ok_or_else(|| err(format!("{name} is missing")));

    let yaml = required(TASK_FILE)?;
    let mut map: Map<String, Value> = match serde_yaml_ng::from_str::<Value>(&yaml) {
        Ok(Value::Object(m)) => m,
        Ok(other) => {
            return Err(err(format!(
                "{TASK_FILE}: expected a mapping of fields, found {}",
                kind(&other)
            )))
        }
        Err(e) => return Err(err(format!("{TASK_FILE}: {e}"))),
    };
    for (column, file) in AS_FILE {
        map.insert(column.into(), Value::String(required(file)?));
    }
    map.insert(
        "hints_text".into(),
        Value::String(read("hints.md")?.unwrap_or_default()),
    );
    let tests = required("tests.json")?;
    match serde_json::from_str::<Value>(&tests) {
        Ok(Value::Object(t)) => {
            for (k, v) in t {
                map.insert(k, v);
            }
        }
        Ok(other) => {
            return Err(err(format!(
                "tests.json: expected an object with FAIL_TO_PASS and PASS_TO_PASS, found {}",
                kind(&other)
            )))
        }
        Err(e) => return Err(err(format!("tests.json: {e}"))),
    }
    for key in ["FAIL_TO_PASS", "PASS_TO_PASS"] {
        if !map.contains_key(key) {
            return Err(err(format!("tests.json: no `{key}`")));
        }
    }
    let mut task = super::swebench::from_map(&dir, 0, map).map_err(|e| match e {
        TaskError::MissingField { field, .. } => {
            err(format!("{TASK_FILE}: missing required field `{field}`"))
        }
        TaskError::BadField { field, msg, .. } => err(format!("field `{field}`: {msg}")),
        other => other,
    })?;
    if let Some(dockerfile) = read("Dockerfile")? {
        task.environment.dockerfile = Some(dockerfile);
        task.environment.context = Some(dir.display().to_string());
    } else if let Some(Value::String(image)) = task.metadata.get("image") {
        task.environment.image = Some(image.clone());
    }
    Ok(task)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::TaskSource;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/swebench/task-repo")
    }

    /// The task repository fixture holds the 5 records of swebench_full_test__swe-agent-debug.jsonl
    /// in the 5.x layout: each directory must give the task its JSONL line gives, plus the
    /// directory's own extras.
    #[test]
    fn task_dirs_convert_like_their_jsonl_records() {
        let jsonl = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/swebench/swebench_full_test__swe-agent-debug.jsonl");
        let dirs = repo_task_dirs(&fixture()).unwrap().unwrap();
        assert_eq!(dirs.len(), 5);
        for (line, text) in std::fs::read_to_string(&jsonl).unwrap().lines().enumerate() {
            let want = super::super::swebench::to_task(&jsonl, line as u64 + 1, text).unwrap();
            let dir = dirs
                .iter()
                .find(|d| d.file_name().unwrap() == want.id.as_str())
                .unwrap_or_else(|| panic!("no directory for {}", want.id));
            let got = load(dir).unwrap();
            assert_eq!(got.source, TaskSource::Swebench);
            assert_eq!(
                (&got.id, &got.repo, &got.base_commit, &got.instruction),
                (&want.id, &want.repo, &want.base_commit, &want.instruction)
            );
            assert_eq!(got.gold_patch, want.gold_patch);
            assert_eq!(got.test_patch, want.test_patch);
            assert_eq!(got.fail_to_pass, want.fail_to_pass);
            assert_eq!(got.pass_to_pass, want.pass_to_pass);
            for k in ["version", "environment_setup_commit", "created_at", "hints_text"] {
                assert_eq!(got.metadata.get(k), want.metadata.get(k), "{}: {k}", want.id);
            }
            assert_eq!(got.metadata["split"], "test");
            assert!(got.metadata["eval_script"]
                .as_str()
                .unwrap()
                .starts_with("#!/bin/bash"));
            assert!(got
                .environment
                .dockerfile
                .as_deref()
                .unwrap()
                .starts_with("FROM "));
            assert_eq!(
                got.environment.context.as_deref(),
                Some(std::fs::canonicalize(dir).unwrap().to_str().unwrap())
            );
        }
    }

    #[test]
    fn a_broken_task_directory_names_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("tasks").join("o__r-1");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(TASK_FILE),
            "instance_id: o__r-1\nrepo: o/r\nbase_commit: abc1234\n",
        )
        .unwrap();
        let e = load(&d).unwrap_err().to_string();
        assert!(
            e.ends_with("o__r-1: cannot read task directory: gold.patch is missing"),
            "{e}"
        );
        for (f, text) in [
            ("gold.patch", "diff --git a/m.py b/m.py\r\n"),
            ("test.patch", "diff --git a/tests/t.py b/tests/t.py\n"),
            ("eval.sh", "#!/bin/bash\n"),
            ("problem_statement.md", "Fix it.\n"),
        ] {
            std::fs::write(d.join(f), text).unwrap();
        }
        let e = load(&d).unwrap_err().to_string();
        assert!(e.ends_with("tests.json is missing"), "{e}");
        std::fs::write(d.join("tests.json"), r#"{"FAIL_TO_PASS": 3, "PASS_TO_PASS": []}"#).unwrap();
        let e = load(&d).unwrap_err().to_string();
        assert!(
            e.contains("field `FAIL_TO_PASS`: expected an array of strings"),
            "{e}"
        );
        std::fs::write(
            d.join("tests.json"),
            r#"{"FAIL_TO_PASS": ["t"], "PASS_TO_PASS": []}"#,
        )
        .unwrap();
        std::fs::write(d.join(TASK_FILE), "- not\n- a mapping\n").unwrap();
        let e = load(&d).unwrap_err().to_string();
        assert!(
            e.ends_with("task.yaml: expected a mapping of fields, found a list"),
            "{e}"
        );
        std::fs::write(
            d.join(TASK_FILE),
            "instance_id: o__r-1\nrepo: o/r\nbase_commit: abc1234\nversion: '1.0'\nimage: swebench/x:latest\n",
        )
        .unwrap();
        let t = load(&d).unwrap();
        // CRLF survives; a quoted version stays a string; no Dockerfile: the image is used.
        assert_eq!(t.gold_patch.as_deref(), Some("diff --git a/m.py b/m.py\r\n"));
        assert_eq!(t.metadata["version"], "1.0");
        assert_eq!(t.metadata["hints_text"], "");
        assert_eq!(t.environment.image.as_deref(), Some("swebench/x:latest"));
        assert_eq!(repo_task_dirs(tmp.path()).unwrap().unwrap(), vec![d]);
        assert!(repo_task_dirs(&tmp.path().join("tasks")).unwrap().is_none());
    }
}
