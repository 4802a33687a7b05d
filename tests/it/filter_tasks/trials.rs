//! The difficulty band and saturation from synthetic trajectories with known pass counts.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::{filter, ids, read_jsonl, record, write_jsonl};

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
    let kept = read_jsonl(&out);
    assert_eq!(
        ids(&kept, "id"),
        [id[1].clone(), id[2].clone(), id[3].clone(), id[6].clone()]
    );
    // Each kept task carries its pass rate over the k counted trials (for --pool-order curriculum).
    let rates: Vec<&Value> = kept.iter().map(|t| &t["pass_rate"]).collect();
    assert_eq!(
        rates,
        [
            &json!({"rate": 0.25, "solved": 1, "trials": 4}),
            &json!({"rate": 0.5, "solved": 2, "trials": 4}),
            &json!({"rate": 0.75, "solved": 3, "trials": 4}),
            &json!({"rate": 0.5, "solved": 2, "trials": 4}),
        ]
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

    // A file of the wrong kind given as --trials is named with its first record.
    let (code, _, stderr) = filter(
        std::slice::from_ref(&tasks),
        &["-o", out.to_str().unwrap(), "--trials", tasks.to_str().unwrap()],
    );
    assert_eq!(code, 2);
    assert!(
        stderr.contains(&format!("{}: record 1: not a trajectory record", tasks.display())),
        "{stderr}"
    );

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
    let kept = read_jsonl(&out);
    assert_eq!(ids(&kept, "id"), [id[2].clone(), id[3].clone()]);
    // The kept tasks' pass rates over the same last 2 groups (1 when there is only one).
    assert_eq!(
        kept[0]["pass_rate"],
        json!({"rate": 0.75, "solved": 3, "trials": 4})
    );
    assert_eq!(
        kept[1]["pass_rate"],
        json!({"rate": 1.0, "solved": 2, "trials": 2})
    );
    // A re-filter of that pool with newer trajectories replaces the rates, whatever the input says.
    let newer = dir.path().join("newer.jsonl");
    write_jsonl(
        &newer,
        &[
            trajectory(&id[2], 11, 0, Some(0.0), "finished", 6),
            trajectory(&id[2], 11, 1, Some(1.0), "finished", 6),
        ],
    );
    let again = dir.path().join("again.jsonl");
    let (code, _, stderr) = filter(
        std::slice::from_ref(&out),
        &[
            "--stages",
            "saturation",
            "-o",
            again.to_str().unwrap(),
            "--drop-saturated",
            newer.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let again = read_jsonl(&again);
    assert_eq!(
        again[0]["pass_rate"],
        json!({"rate": 0.5, "solved": 1, "trials": 2})
    );
    assert_eq!(
        again[1]["pass_rate"], kept[1]["pass_rate"],
        "no newer groups: kept as it was"
    );
    assert_eq!(
        std::fs::read_to_string(&funnel).unwrap(),
        "stage,in,out,dropped,reason,count\ningest,4,4,0,,0\n\
         saturation,4,2,2,saturated_failed,1\nsaturation,4,2,2,saturated_solved,1\n"
    );
}
