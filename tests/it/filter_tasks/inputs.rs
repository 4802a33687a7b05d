//! Bad input (named by file, record and field; collected with --keep-going), Harbor
//! directories and task records as inputs, and the validity stage's refusal.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::{filter, ids, read_jsonl, real_pool, record, testdata};

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
fn a_swebench_task_repository_filters_like_its_jsonl() {
    // testdata/swebench/task-repo holds the records of this JSONL file in the swebench 5.x layout.
    let dir = tempfile::tempdir().unwrap();
    let ids_file = testdata("swebench/swebench_verified_ids.txt");
    let run = |input: PathBuf, name: &str| {
        let out = dir.path().join(format!("{name}.jsonl"));
        let funnel = dir.path().join(format!("{name}.csv"));
        let decisions = dir.path().join(format!("{name}.dec.jsonl"));
        let (code, _, stderr) = filter(
            &[input],
            &[
                "-o",
                out.to_str().unwrap(),
                "--exclude-instances",
                ids_file.to_str().unwrap(),
                "--funnel",
                funnel.to_str().unwrap(),
                "--decisions",
                decisions.to_str().unwrap(),
            ],
        );
        assert_eq!(code, 0, "{stderr}");
        let decided: Vec<(String, String, bool)> = read_jsonl(&decisions)
            .iter()
            .map(|d| {
                (
                    d["task_id"].as_str().unwrap().to_string(),
                    d["reason"].as_str().unwrap_or("").to_string(),
                    d["kept"].as_bool().unwrap(),
                )
            })
            .collect();
        (
            read_jsonl(&out),
            std::fs::read_to_string(&funnel).unwrap(),
            decided,
        )
    };
    let (repo_kept, repo_funnel, repo_decided) = run(testdata("swebench/task-repo"), "repo");
    let (line_kept, line_funnel, mut line_decided) = run(
        testdata("swebench/swebench_full_test__swe-agent-debug.jsonl"),
        "jsonl",
    );
    assert_eq!(repo_funnel, line_funnel);
    // Directories are read in name order, JSONL lines in file order.
    line_decided.sort();
    let mut sorted = repo_decided.clone();
    sorted.sort();
    assert_eq!(sorted, line_decided);
    // django__django-17029 is a SWE-bench Verified instance.
    assert!(repo_decided.contains(&("django__django-17029".into(), "eval_instance".into(), false)));
    assert_eq!(repo_kept.len(), line_kept.len());
    assert!(!repo_kept.is_empty());
    for t in &repo_kept {
        let same = line_kept.iter().find(|l| l["id"] == t["id"]).unwrap();
        for k in [
            "repo",
            "base_commit",
            "instruction",
            "gold_patch",
            "test_patch",
            "fail_to_pass",
            "pass_to_pass",
        ] {
            assert_eq!(t[k], same[k], "{}: {k}", t["id"]);
        }
        assert_eq!(t["metadata"]["version"], same["metadata"]["version"]);
        assert_eq!(t["metadata"]["split"], "test");
        assert!(t["environment"]["dockerfile"]
            .as_str()
            .unwrap()
            .starts_with("FROM swebench/"));
    }
    // One task directory alone is an input too.
    let one = testdata("swebench/task-repo/tasks/django__django-15136");
    let out = dir.path().join("one.jsonl");
    let (code, _, stderr) = filter(&[one], &["-o", out.to_str().unwrap(), "--no-rules"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(ids(&read_jsonl(&out), "id"), ["django__django-15136"]);
}

#[test]
fn stages_say_what_input_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kept.jsonl");
    let (code, _, stderr) = filter(
        &real_pool(),
        &["-o", out.to_str().unwrap(), "--validity-runs", "3"],
    );
    assert_eq!(code, 2);
    assert!(stderr.contains("stage validity needs --images FILE"), "{stderr}");
    assert!(!out.exists());
    let (code, _, stderr) = filter(
        &real_pool(),
        &[
            "-o",
            out.to_str().unwrap(),
            "--validity-runs",
            "0",
            "--images",
            "x",
        ],
    );
    assert_eq!(code, 2);
    assert!(stderr.contains("--validity-runs"), "{stderr}");
    let missing = dir.path().join("no-such-manifest.jsonl.zst");
    let (code, _, stderr) = filter(
        &real_pool(),
        &["-o", out.to_str().unwrap(), "--images", missing.to_str().unwrap()],
    );
    assert_eq!(code, 2);
    assert!(stderr.contains("no-such-manifest.jsonl.zst"), "{stderr}");
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
