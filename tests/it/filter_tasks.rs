//! filter-tasks through the binary: rules and decontamination on real SWE-bench records and on
//! a generated pool, the difficulty band and saturation from synthetic trajectories, bad input.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::lego;

fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(rel)
}

fn real_pool() -> Vec<PathBuf> {
    [
        "swebench/swebench_full_test__swe-agent-debug.jsonl",
        "swebench/swebench_lite_test__swe-agent.jsonl",
        "swebench/swebench_dev__swe-agent-dev-easy.jsonl",
    ]
    .iter()
    .map(|p| testdata(p))
    .collect()
}

fn read_jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn write_jsonl(path: &Path, records: &[Value]) {
    let text: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// Runs filter-tasks; returns (exit code, raw stdout, stderr).
fn filter_raw(inputs: &[PathBuf], extra: &[&str]) -> (i32, Vec<u8>, String) {
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
fn filter(inputs: &[PathBuf], extra: &[&str]) -> (i32, String, String) {
    let (code, stdout, stderr) = filter_raw(inputs, extra);
    (code, String::from_utf8(stdout).unwrap(), stderr)
}

fn read_zst(bytes: &[u8]) -> Vec<Value> {
    let text = zstd::decode_all(bytes).unwrap();
    text.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

fn ids(records: &[Value], key: &str) -> Vec<String> {
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
fn record(i: usize) -> Value {
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

fn trajectory(
    task: &str,
    group: u64,
    sample: u32,
    reward: Option<f64>,
    termination: &str,
    version: u64,
) -> Value {
    json!({
        "schema": "lego-rl/trajectory/v1",
        "id": format!("{task}/{group}/{sample}"),
        "task_id": task,
        "group_id": group,
        "sample_index": sample,
        "harness": "mini-swe-agent",
        "backend": "reference",
        "policy_version": version,
        "termination": termination,
        "infra_failure": termination.starts_with("infra:"),
        "reward": reward,
    })
}

/// A pool of `n` generated tasks as a lego-rl task file (the ids are `org*__proj*-i`).
fn generated_tasks(dir: &Path, n: usize) -> (PathBuf, Vec<String>) {
    let pool = dir.join("pool.jsonl");
    let recs: Vec<Value> = (0..n).map(record).collect();
    write_jsonl(&pool, &recs);
    let tasks = dir.join("tasks.jsonl");
    let (code, _, stderr) = filter(&[pool], &["-o", tasks.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    let ids = ids(&read_jsonl(&tasks), "id");
    assert_eq!(ids.len(), n);
    (tasks, ids)
}

#[test]
fn difficulty_band_from_known_pass_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, id) = generated_tasks(dir.path(), 8);
    let mut trials = Vec::new();
    // Tasks 0..=4 solved 0..=4 times out of 4.
    for (t, solved) in (0..=4).enumerate() {
        for s in 0..4u32 {
            trials.push(trajectory(
                &id[t],
                1,
                s,
                Some(if s < solved { 1.0 } else { 0.0 }),
                "finished",
                0,
            ));
        }
    }
    // Task 5: two infra failures, only 2 counted trials.
    for s in 0..4u32 {
        let infra = s >= 2;
        trials.push(trajectory(
            &id[5],
            1,
            s,
            if infra { None } else { Some(1.0) },
            if infra { "infra:setup" } else { "finished" },
            0,
        ));
    }
    // Task 6: six counted trials; the first four (by group, sample) decide: 2 solved.
    for s in 0..6u32 {
        trials.push(trajectory(
            &id[6],
            1,
            s,
            Some(if s % 2 == 0 { 1.0 } else { 0.0 }),
            "finished",
            0,
        ));
    }
    // Task 7: no trials at all.
    let file = dir.path().join("trials.jsonl");
    write_jsonl(&file, &trials);
    let out = dir.path().join("kept.jsonl");
    let funnel = dir.path().join("funnel.csv");
    let decisions = dir.path().join("dec.jsonl");
    let args = |extra: &[&str]| {
        let mut v = vec![
            "-o",
            out.to_str().unwrap(),
            "--trials",
            file.to_str().unwrap(),
            "--funnel",
            funnel.to_str().unwrap(),
            "--decisions",
            decisions.to_str().unwrap(),
        ];
        v.extend_from_slice(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        filter(
            std::slice::from_ref(&tasks),
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    };
    let (code, _, stderr) = run(&[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        ids(&read_jsonl(&out), "id"),
        [id[1].clone(), id[2].clone(), id[3].clone(), id[6].clone()]
    );
    assert_eq!(
        std::fs::read_to_string(&funnel).unwrap(),
        "stage,in,out,dropped,reason,count\ningest,8,8,0,,0\nrules,8,8,0,,0\n\
         difficulty,8,4,4,always_solved,1\ndifficulty,8,4,4,never_solved,1\n\
         difficulty,8,4,4,trials_incomplete,1\ndifficulty,8,4,4,trials_missing,1\n"
    );
    let dec = read_jsonl(&decisions);
    assert_eq!(dec[5]["reason"], "trials_incomplete");
    assert_eq!(
        dec[5]["evidence"],
        json!({"solved": 2, "counted": 2, "infra": 2, "k": 4, "band": [1, 3]})
    );
    assert_eq!(dec[2]["evidence"]["difficulty"]["solved"], 2);
    assert_eq!(dec[2]["kept"], true);

    // A narrower band, and incomplete tasks kept on request (recorded in their decision).
    let (code, _, _) = run(&[
        "--min-solved",
        "2",
        "--max-solved",
        "2",
        "--incomplete-trials",
        "keep",
    ]);
    assert_eq!(code, 0);
    assert_eq!(
        ids(&read_jsonl(&out), "id"),
        [id[2].clone(), id[5].clone(), id[6].clone(), id[7].clone()]
    );
    let dec = read_jsonl(&decisions);
    assert_eq!(
        dec[7]["evidence"]["difficulty"]["kept_incomplete"],
        "trials_missing"
    );
    assert_eq!(dec[1]["reason"], "below_band");

    // --incomplete-trials fail stops with the list and writes nothing.
    std::fs::remove_file(&out).unwrap();
    let (code, _, stderr) = run(&["--incomplete-trials", "fail"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("2 task(s) have fewer than 4 counted trials"),
        "{stderr}"
    );
    assert!(stderr.contains(&id[5]) && stderr.contains(&id[7]), "{stderr}");
    assert!(!out.exists());
}

#[test]
fn saturated_tasks_are_dropped_from_recent_groups() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, id) = generated_tasks(dir.path(), 4);
    let mut traj = Vec::new();
    let mut group = |task: &str, g: u64, version: u64, solved: &[bool]| {
        for (s, ok) in solved.iter().enumerate() {
            traj.push(trajectory(
                task,
                g,
                s as u32,
                Some(if *ok { 1.0 } else { 0.0 }),
                "finished",
                version,
            ));
        }
    };
    // 0: varied long ago, then two all-solved groups → saturated_solved.
    group(&id[0], 1, 0, &[true, false]);
    group(&id[0], 7, 3, &[true, true]);
    group(&id[0], 9, 4, &[true, true]);
    // 1: two all-failed groups → saturated_failed (an infra failure in a group does not count).
    group(&id[1], 2, 1, &[false, false]);
    group(&id[1], 8, 2, &[false, false]);
    // 2: the latest group has variance → kept.
    group(&id[2], 3, 1, &[true, true]);
    group(&id[2], 10, 5, &[true, false]);
    // 3: a single group → not enough evidence, kept.
    group(&id[3], 4, 1, &[true, true]);
    traj.push(trajectory(&id[1], 8, 2, None, "infra:agent", 2));
    let file = dir.path().join("train.jsonl");
    write_jsonl(&file, &traj);
    let out = dir.path().join("kept.jsonl");
    let funnel = dir.path().join("funnel.csv");
    let (code, _, stderr) = filter(
        &[tasks],
        &[
            "--no-rules",
            "-o",
            out.to_str().unwrap(),
            "--drop-saturated",
            file.to_str().unwrap(),
            "--funnel",
            funnel.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(ids(&read_jsonl(&out), "id"), [id[2].clone(), id[3].clone()]);
    assert_eq!(
        std::fs::read_to_string(&funnel).unwrap(),
        "stage,in,out,dropped,reason,count\ningest,4,4,0,,0\n\
         saturation,4,2,2,saturated_failed,1\nsaturation,4,2,2,saturated_solved,1\n"
    );
}

#[test]
fn bad_input_names_file_record_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool.jsonl");
    let mut missing = record(1);
    missing.as_object_mut().unwrap().remove("instance_id");
    let mut wrong_type = record(3);
    wrong_type["FAIL_TO_PASS"] = json!(5);
    let text = format!(
        "{}\n{}\nthis is not json\n{}\n{}\n",
        record(0),
        missing,
        wrong_type,
        record(4)
    );
    std::fs::write(&pool, text).unwrap();
    let out = dir.path().join("kept.jsonl");

    let (code, _, stderr) = filter(std::slice::from_ref(&pool), &["-o", out.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains(&format!(
            "{}: record 2: missing required field `instance_id`",
            pool.display()
        )),
        "{stderr}"
    );
    assert!(!out.exists(), "nothing is written when the run fails");

    let (code, _, stderr) = filter(
        std::slice::from_ref(&pool),
        &[
            "-o",
            out.to_str().unwrap(),
            "--no-rules",
            "-i",
            "/nonexistent/tasks",
        ],
    );
    assert_eq!(code, 2);
    assert!(
        stderr.contains("record 2: missing required field `instance_id`"),
        "{stderr}"
    );

    // An unreadable task directory (a directory without task.toml).
    let not_tasks = dir.path().join("empty-dir");
    std::fs::create_dir(&not_tasks).unwrap();
    let (code, _, stderr) = filter(std::slice::from_ref(&not_tasks), &["-o", out.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains(&format!("{}: cannot read task directory", not_tasks.display())),
        "{stderr}"
    );

    // --keep-going: every problem in the funnel and the decisions, good records written, exit 1.
    let funnel = dir.path().join("funnel.csv");
    let decisions = dir.path().join("dec.jsonl");
    let (code, _, stderr) = filter(
        &[pool.clone(), not_tasks.clone(), testdata("harbor/hello-world")],
        &[
            "-o",
            out.to_str().unwrap(),
            "--keep-going",
            "--funnel",
            funnel.to_str().unwrap(),
            "--decisions",
            decisions.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        ids(&read_jsonl(&out), "id"),
        ["org0__proj0-0", "org4__proj1-4", "hello-world"]
    );
    assert_eq!(
        std::fs::read_to_string(&funnel).unwrap(),
        "stage,in,out,dropped,reason,count\ningest,7,3,4,bad_field:FAIL_TO_PASS,1\n\
         ingest,7,3,4,missing_field:instance_id,1\ningest,7,3,4,not_json,1\ningest,7,3,4,unreadable_task_dir,1\n\
         rules,3,3,0,,0\n"
    );
    let dec = read_jsonl(&decisions);
    let bad: Vec<&Value> = dec.iter().filter(|d| d["stage"] == "ingest").collect();
    assert_eq!(bad.len(), 4);
    assert_eq!(bad[0]["task_id"], format!("{}:2", pool.display()));
    assert_eq!(bad[1]["task_id"], format!("{}:3", pool.display()));
    assert!(bad[2]["evidence"]["error"]
        .as_str()
        .unwrap()
        .contains("record 4: field `FAIL_TO_PASS`: expected an array of strings"));
}

#[test]
fn harbor_directories_and_task_records_are_inputs_too() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kept.jsonl");
    let funnel = dir.path().join("funnel.csv");
    let (code, _, stderr) = filter(
        &[testdata("harbor")],
        &["-o", out.to_str().unwrap(), "--funnel", funnel.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stderr}");
    // Every Harbor fixture is read; the multi-step one is reported, not silently dropped.
    assert_eq!(
        ids(&read_jsonl(&out), "id"),
        ["hello-world", "multi-container", "multi-reward", "simple-task"]
    );
    assert!(std::fs::read_to_string(&funnel)
        .unwrap()
        .contains("rules,5,4,1,unsupported:multi_step,1"));
    // Kept records are valid input again and pass through unchanged.
    let again = dir.path().join("again.jsonl");
    let (code, _, stderr) = filter(std::slice::from_ref(&out), &["-o", again.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
}

#[test]
fn validity_stage_says_it_needs_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kept.jsonl");
    let (code, _, stderr) = filter(
        &real_pool(),
        &["-o", out.to_str().unwrap(), "--validity-runs", "3"],
    );
    assert_eq!(code, 2);
    assert!(
        stderr.contains("validity stage requires sandbox support (not yet available)"),
        "{stderr}"
    );
    assert!(!out.exists());
    let (code, _, stderr) = filter(
        &real_pool(),
        &["-o", out.to_str().unwrap(), "--stages", "rules,difficulty"],
    );
    assert_eq!(code, 2);
    assert!(
        stderr.contains("stage difficulty needs --trials FILE"),
        "{stderr}"
    );
}
