//! filter-tasks through the binary: rules and decontamination on real SWE-bench records and on
//! a generated pool (here), the difficulty band and saturation from synthetic trajectories
//! ([`trials`]), bad input and the other input formats ([`inputs`]), the validity stage in
//! sandboxes ([`validity`]).

mod inputs;
mod trials;
mod validity;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::lego;

pub(super) fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(rel)
}

pub(super) fn real_pool() -> Vec<PathBuf> {
    [
        "swebench/swebench_full_test__swe-agent-debug.jsonl",
        "swebench/swebench_lite_test__swe-agent.jsonl",
        "swebench/swebench_dev__swe-agent-dev-easy.jsonl",
    ]
    .iter()
    .map(|p| testdata(p))
    .collect()
}

pub(super) fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub(super) fn write_jsonl(path: &Path, records: &[Value]) {
    let text: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// Runs filter-tasks; returns (exit code, raw stdout, stderr).
pub(super) fn filter_raw(inputs: &[PathBuf], extra: &[&str]) -> (i32, Vec<u8>, String) {
    let mut cmd = lego();
    cmd.arg("filter-tasks");
    for i in inputs {
        cmd.arg("-i").arg(i);
    }
    let out = cmd.args(extra).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Runs filter-tasks with the inputs and extra args; returns (exit code, stdout, stderr).
pub(super) fn filter(inputs: &[PathBuf], extra: &[&str]) -> (i32, String, String) {
    let (code, stdout, stderr) = filter_raw(inputs, extra);
    (code, String::from_utf8(stdout).unwrap(), stderr)
}

pub(super) fn read_zst(bytes: &[u8]) -> Vec<Value> {
    let text = zstd::decode_all(bytes).unwrap();
    text.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

pub(super) fn ids(records: &[Value], key: &str) -> Vec<String> {
    records
        .iter()
        .map(|r| r[key].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn real_swebench_records_pass_rules_and_normalise() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kept.jsonl");
    let funnel = dir.path().join("funnel.csv");
    let (code, stdout, stderr) = filter(
        &real_pool(),
        &["-o", out.to_str().unwrap(), "--funnel", funnel.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stderr}");
    let kept = read_jsonl(&out);
    assert_eq!(kept.len(), 14);
    assert_eq!(
        std::fs::read_to_string(&funnel).unwrap(),
        "stage,in,out,dropped,reason,count\ningest,14,14,0,,0\nrules,14,14,0,,0\n"
    );
    // The table goes to stdout when -o is a file.
    assert!(
        stdout.starts_with("stage   in  out  dropped  reason  count\ningest  14   14        0"),
        "{stdout}"
    );
    let t = kept
        .iter()
        .find(|t| t["id"] == "scikit-learn__scikit-learn-11574")
        .unwrap();
    assert_eq!(t["schema"], "lego-rl/task/v1");
    assert_eq!(t["source"], "swebench");
    assert_eq!(t["repo"], "scikit-learn/scikit-learn");
    assert_eq!(t["metadata"]["version"], "0.20");
    assert_eq!(t["fail_to_pass"].as_array().unwrap().len(), 1);
    assert_eq!(t["pass_to_pass"].as_array().unwrap().len(), 28);
    assert!(t["gold_patch"]
        .as_str()
        .unwrap()
        .starts_with("diff --git a/sklearn/ensemble/iforest.py"));
    // Extra fields of the dev file are kept.
    let d = kept.iter().find(|t| t["id"] == "pydicom__pydicom-1458").unwrap();
    assert!(d["metadata"]["query"].is_string() && d["metadata"]["task_id"].is_string());
    assert_eq!(
        d["metadata"]["environment_setup_commit"].as_str().unwrap().len(),
        40
    );
}

#[test]
fn hf_string_encoded_lists_equal_arrays() {
    let dir = tempfile::tempdir().unwrap();
    let src = real_pool()[0].clone();
    let mut recs = read_jsonl(&src);
    for r in &mut recs {
        for k in ["FAIL_TO_PASS", "PASS_TO_PASS"] {
            r[k] = Value::String(r[k].to_string());
        }
    }
    let hf = dir.path().join("hf.jsonl");
    write_jsonl(&hf, &recs);
    let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    assert_eq!(filter(&[src], &["-o", a.to_str().unwrap()]).0, 0);
    assert_eq!(filter(&[hf], &["-o", b.to_str().unwrap()]).0, 0);
    // Same tasks (raw arrays are copied as written, so only whitespace may differ).
    let (a, b) = (read_jsonl(&a), read_jsonl(&b));
    assert_eq!(a.len(), 5);
    assert_eq!(a, b);
}

#[test]
fn decontamination_against_swebench_verified() {
    let dir = tempfile::tempdir().unwrap();
    let verified = testdata("swebench/swebench_verified_ids.txt");
    let out = dir.path().join("kept.jsonl");
    let funnel = dir.path().join("funnel.csv");
    let decisions = dir.path().join("decisions.jsonl");
    let v = verified.to_str().unwrap();
    let (code, _, stderr) = filter(
        &real_pool(),
        &[
            "-o",
            out.to_str().unwrap(),
            "--exclude-instances",
            v,
            "--exclude-repos-of",
            v,
            "--funnel",
            funnel.to_str().unwrap(),
            "--decisions",
            decisions.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        ids(&read_jsonl(&out), "id"),
        [
            "pydicom__pydicom-1458",
            "pylint-dev__astroid-1268",
            "pydicom__pydicom-1194",
            "sqlfluff__sqlfluff-2386"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&funnel).unwrap(),
        "stage,in,out,dropped,reason,count\ningest,14,14,0,,0\nrules,14,14,0,,0\n\
         decontamination,14,4,10,eval_repo,7\ndecontamination,14,4,10,eval_instance,3\n"
    );
    let dec = read_jsonl(&decisions);
    assert_eq!(dec.len(), 14);
    let d = dec
        .iter()
        .find(|d| d["task_id"] == "django__django-17029")
        .unwrap();
    assert_eq!(
        (d["kept"].as_bool(), d["stage"].as_str(), d["reason"].as_str()),
        (Some(false), Some("decontamination"), Some("eval_instance"))
    );
    let d = dec.iter().find(|d| d["task_id"] == "sympy__sympy-13031").unwrap();
    assert_eq!(d["reason"], "eval_instance");
    let d = dec
        .iter()
        .find(|d| d["task_id"] == "pytest-dev__pytest-11143")
        .unwrap();
    assert_eq!(
        (d["reason"].as_str(), d["evidence"]["repo"].as_str()),
        (Some("eval_repo"), Some("pytest-dev/pytest"))
    );
    assert_eq!(dec.iter().filter(|d| d["kept"] == true).count(), 4);

    // An evaluation set given as records works like the id list, and also catches a renamed copy.
    let mut renamed = read_jsonl(&real_pool()[1]);
    renamed.truncate(1);
    renamed[0]["instance_id"] = json!("someone__else-1");
    let pool = dir.path().join("renamed.jsonl");
    write_jsonl(&pool, &renamed);
    let (code, _, _) = filter(
        &[pool],
        &[
            "-o",
            out.to_str().unwrap(),
            "--exclude-instances",
            real_pool()[1].to_str().unwrap(),
            "--decisions",
            decisions.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0);
    assert_eq!(read_jsonl(&out).len(), 0);
    assert_eq!(read_jsonl(&decisions)[0]["reason"], "eval_instance_patch");
}

/// A well-formed generated SWE-bench record.
pub(super) fn record(i: usize) -> Value {
    let file = format!("pkg{}/mod_{i}.py", i % 7);
    json!({
        "repo": format!("org{}/proj{}", i % 5, i % 3),
        "instance_id": format!("org{}__proj{}-{i}", i % 5, i % 3),
        "base_commit": format!("{:040x}", i as u128 * 7919 + 1),
        "patch": format!("diff --git a/{file} b/{file}\n--- a/{file}\n+++ b/{file}\n@@ -1,2 +1,2 @@\n ctx\n-old {i}\n+new {i}\n"),
        "test_patch": format!("diff --git a/tests/test_{i}.py b/tests/test_{i}.py\n--- /dev/null\n+++ b/tests/test_{i}.py\n@@ -0,0 +1 @@\n+def test(): pass\n"),
        "problem_statement": format!("Problem {i}: calling the function returns the wrong value for negative input."),
        "hints_text": "",
        "created_at": "2023-01-01T00:00:00Z",
        "version": "1.0",
        "FAIL_TO_PASS": format!("[\"tests/test_{i}.py::test\"]"),
        "PASS_TO_PASS": "[]",
        "environment_setup_commit": format!("{:040x}", 1),
    })
}

#[test]
fn rules_on_a_generated_pool_count_every_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool: Vec<Value> = (0..100).map(record).collect();
    // Known defects, one kind per block of records.
    for r in pool.iter_mut().take(5) {
        r["problem_statement"] = json!("too short");
    }
    for r in pool.iter_mut().take(9).skip(5) {
        let f = "setup.py";
        r["test_patch"] = json!(format!("diff --git a/{f} b/{f}\n@@ -1 +1 @@\n-a\n+b\n"));
    }
    for r in pool.iter_mut().take(12).skip(9) {
        r["patch"] = json!("diff --git a/tests/conftest.py b/tests/conftest.py\n@@ -1 +1 @@\n-a\n+b\n");
    }
    let big: String = (0..600).map(|n| format!("+line {n}\n")).collect();
    pool[12]["patch"] = json!(format!("diff --git a/m.py b/m.py\n@@ -0,0 +1,600 @@\n{big}"));
    pool[13]["FAIL_TO_PASS"] = json!([]);
    pool[14]["base_commit"] = json!("not-a-commit");
    pool[15].as_object_mut().unwrap().remove("repo");
    // Exact duplicates of record 20 under new ids, and a repeated id.
    for n in 0..3 {
        let mut d = pool[20].clone();
        d["instance_id"] = json!(format!("dup__dup-{n}"));
        pool.push(d);
    }
    pool.push(pool[30].clone());
    let input = dir.path().join("pool.jsonl");
    write_jsonl(&input, &pool);
    let out = dir.path().join("kept.jsonl.zst");
    let funnel = dir.path().join("funnel.csv");
    let (code, _, stderr) = filter(
        &[input],
        &["-o", out.to_str().unwrap(), "--funnel", funnel.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&funnel).unwrap(),
        "stage,in,out,dropped,reason,count\ningest,104,104,0,,0\nrules,104,84,20,statement_too_short,5\n\
         rules,104,84,20,test_patch_touches_non_test_file,4\nrules,104,84,20,duplicate,3\n\
         rules,104,84,20,gold_patch_touches_test_file,3\nrules,104,84,20,duplicate_id,1\n\
         rules,104,84,20,empty:FAIL_TO_PASS,1\nrules,104,84,20,malformed:base_commit,1\n\
         rules,104,84,20,missing_field:repo,1\nrules,104,84,20,patch_too_many_lines,1\n"
    );
    // zstd output reads back as task records, first occurrence of duplicates kept, input order.
    let kept = read_zst(&std::fs::read(&out).unwrap());
    assert_eq!(kept.len(), 84);
    assert_eq!(kept[0]["id"], "org1__proj1-16");
    assert!(kept.iter().any(|t| t["id"] == "org0__proj2-20"));
    assert!(!kept
        .iter()
        .any(|t| t["id"].as_str().unwrap().starts_with("dup__")));

    // Thresholds are flags: a wider patch bound keeps the big patch.
    let (code, _, _) = filter(
        &[dir.path().join("pool.jsonl")],
        &[
            "-o",
            dir.path().join("k2.jsonl").to_str().unwrap(),
            "--max-patch-lines",
            "1000",
            "--funnel",
            funnel.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0);
    assert!(!std::fs::read_to_string(&funnel)
        .unwrap()
        .contains("patch_too_many_lines"));
    assert_eq!(read_jsonl(&dir.path().join("k2.jsonl")).len(), 85);
}

#[test]
fn output_is_deterministic_and_stdout_carries_only_tasks() {
    let (code, stdout, stderr) = filter_raw(&real_pool(), &["-o", "-"]);
    assert_eq!(code, 0, "{stderr}");
    // stdout is a pipe here, so `-` carries zstd JSONL: only the tasks, the table is on stderr.
    let tasks = read_zst(&stdout);
    assert_eq!(tasks.len(), 14);
    assert!(tasks.iter().all(|t| t["schema"] == "lego-rl/task/v1"));
    assert!(stderr.contains("\nrules   14   14        0\n"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl");
    filter(&real_pool(), &["-o", a.to_str().unwrap()]);
    filter(&real_pool(), &["-o", b.to_str().unwrap()]);
    assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
}

/// Regression: relative paths in task records (repo bundles, Harbor tests) pointed nowhere once
/// filter-tasks wrote the kept tasks into a run directory, so build-images failed on every task.
#[test]
fn kept_task_records_carry_paths_that_resolve_from_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kept.jsonl");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tasks/tasks.jsonl");
    let run = lego()
        .args(["filter-tasks", "-i"])
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    let kept: Vec<lego_rl::records::Task> = lego_rl::io::read_all(
        &out,
        lego_rl::io::ReadOptions {
            strict: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(kept.len(), 9);
    let mut checked = 0;
    for t in &kept {
        if let Some(lego_rl::records::RepoSource::Bundle { path }) = &t.environment.repo_source {
            assert!(
                Path::new(path).is_absolute() && Path::new(path).is_file(),
                "{path}"
            );
            checked += 1;
        }
        if let Some(c) = &t.environment.context {
            assert!(Path::new(c).is_absolute() && Path::new(c).is_dir(), "{c}");
            checked += 1;
        }
    }
    assert!(checked >= 8, "{checked}");
}
