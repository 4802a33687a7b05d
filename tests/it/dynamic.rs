//! `rollout --min-informative-groups` (dynamic sampling) end to end: real Docker sandboxes, the
//! real mini-swe-agent, the embedded tiny model, forced scripts that make one task always solved,
//! one never, one solved by sample 0 only (the shared inflection fixture under three ids, so no
//! new image is built), then align on the result.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::{ImageRecord, Sample, Task, Trajectory};
use serde_json::{json, Value};

use crate::common::{docker_available, lego, root};
use crate::rollout::{chat_dir, fixture, leftovers, read, wait_for_a_sandbox, TASK};

const ALWAYS: &str = "ds-always";
const MIXED: &str = "ds-mixed";
const NEVER: &str = "ds-never";

/// Tasks (the inflection task under `ids`), their image manifest (the fixture's image for each)
/// and forced scripts: ALWAYS gets the fixing script, NEVER the wrong edit, MIXED both (sample 0
/// fixes, sample 1 does not).
struct Pool {
    images: PathBuf,
    forced: PathBuf,
}

fn tasks_file(dir: &Path, name: &str, ids: &[&str]) -> PathBuf {
    let fx = fixture();
    let base: Vec<Task> = read_all(&fx.tasks, ReadOptions::default()).unwrap();
    let mut text = String::new();
    for id in ids {
        let mut t = base[0].clone();
        t.id = id.to_string();
        text += &(serde_json::to_string(&t).unwrap() + "\n");
    }
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn pool(dir: &Path) -> Pool {
    let fx = fixture();
    let recs: Vec<ImageRecord> = read_all(&fx.images, ReadOptions::default()).unwrap();
    let rec = recs.into_iter().find(|r| r.task_id == TASK).unwrap();
    let mut text = String::new();
    for id in [ALWAYS, MIXED, NEVER] {
        let r = ImageRecord {
            task_id: id.into(),
            ..rec.clone()
        };
        text += &(serde_json::to_string(&r).unwrap() + "\n");
    }
    let images = dir.join("images.jsonl");
    std::fs::write(&images, text).unwrap();
    let f: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("testdata/rollout/inflection.json")).unwrap(),
    )
    .unwrap();
    let scripts = &f["tasks"][TASK];
    let (good, bad) = (scripts[0].clone(), scripts[1].clone());
    let forced = dir.join("forced.json");
    let doc = json!({"schema": "lego-rl/forced/v1", "tasks": {
        ALWAYS: [good.clone()], NEVER: [bad.clone()], MIXED: [good, bad],
    }});
    std::fs::write(&forced, doc.to_string()).unwrap();
    Pool { images, forced }
}

fn args(p: &Pool, tasks: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "rollout",
        "-i",
        &tasks.display().to_string(),
        "--images",
        &p.images.display().to_string(),
        "--harness",
        &root()
            .join("examples/harnesses/mini-swe-agent.toml")
            .display()
            .to_string(),
        "--backend",
        &format!("embedded:{}", crate::model::tiny_moe().display()),
        "--chat-model",
        &chat_dir().display().to_string(),
        "--forced",
        &p.forced.display().to_string(),
        "--max-turns",
        "8",
        "--group-size",
        "2",
        "-o",
        &out.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// (task, group) → (informative, extra index) of the marked trajectories; every trajectory marked.
fn marks(trajs: &[Trajectory]) -> BTreeMap<(String, u64), (bool, Option<u64>)> {
    let mut m = BTreeMap::new();
    for t in trajs {
        let d = t
            .dynamic_sampling
            .unwrap_or_else(|| panic!("{} is not marked", t.id));
        assert_eq!(d.pool, 3, "{}", t.id);
        let prev = m.insert((t.task_id.clone(), t.group_id), (d.informative, d.extra_group));
        assert!(
            prev.is_none_or(|p| p == (d.informative, d.extra_group)),
            "{}",
            t.id
        );
    }
    m
}

fn keys(trajs: &[Trajectory]) -> Vec<(String, u64, u32)> {
    let mut k: Vec<_> = trajs
        .iter()
        .map(|t| (t.task_id.clone(), t.group_id, t.sample_index))
        .collect();
    k.sort();
    k
}

fn key(task: &str, group: u64) -> (String, u64) {
    (task.to_string(), group)
}

/// N = 2 informative groups: a run whose one extra group is spent before N is reached, a rerun with
/// a larger budget SIGKILLed while its extra group runs, and the rerun after it, which ends at
/// exactly N without running any group twice; then align skips the uninformative groups.
#[test]
fn dynamic_sampling_refills_to_exactly_n_within_the_budget_and_align_skips_zero_variance_groups() {
    if !docker_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let p = pool(tmp.path());
    let tasks = tasks_file(tmp.path(), "tasks.jsonl", &[ALWAYS, MIXED, NEVER]);
    let out = tmp.path().join("traj.jsonl.zst");
    let run_id = format!("it-dynamic-{}", std::process::id());
    let dynamic = |m: &str| {
        let a = [
            "--min-informative-groups",
            "2",
            "--max-extra-groups",
            m,
            "-j",
            "2",
            "--run-id",
        ];
        let mut a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        a.push(run_id.clone());
        a
    };
    let run = |m: &str| {
        let extra = dynamic(m);
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let o = lego().args(args(&p, &tasks, &out, &extra)).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "rollout: {stderr}");
        stderr
    };

    // The budget runs out first: the planned groups hold one informative group (MIXED), the one
    // extra group allowed (extra 0: ALWAYS, group 1) is saturated.
    let stderr = run("1");
    let first = read(&out);
    assert_eq!(first.len(), 8, "3 planned groups and 1 extra of 2");
    let want: BTreeMap<_, _> = [
        (key(ALWAYS, 0), (false, None)),
        (key(ALWAYS, 1), (false, Some(0))),
        (key(MIXED, 0), (true, None)),
        (key(NEVER, 0), (false, None)),
    ]
    .into();
    assert_eq!(marks(&first), want);
    for t in &first {
        let solved = t.task_id == ALWAYS || (t.task_id == MIXED && t.sample_index == 0);
        assert!(!t.infra_failure, "{t:#?}");
        assert_eq!(t.reward, Some(if solved { 1.0 } else { 0.0 }), "{}", t.id);
    }
    assert!(
        stderr.contains(
            "dynamic sampling: 1 of 4 groups informative (wanted 2), 1 of 1 extra groups spent, pool of 3 tasks; the budget ran out first"
        ),
        "{stderr}"
    );

    // A rerun with a larger budget resumes: extra 0 is spent, extra 1 (MIXED, group 1) makes the
    // second informative group, and nothing more starts. It is first SIGKILLed while extra 1 runs
    // (its sandboxes up): nothing it started is written, and the next rerun runs extra 1 once.
    let budget = dynamic("4");
    let mut child = crate::common::lego_process()
        .args(args(
            &p,
            &tasks,
            &out,
            &budget.iter().map(String::as_str).collect::<Vec<_>>(),
        ))
        .env("LEGO_RL_NO_PROGRESS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_a_sandbox(
        &mut child,
        &run_id,
        Duration::from_secs(600),
        "extra group 1 never started",
    );
    std::thread::sleep(Duration::from_secs(2));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(read(&out), first, "the killed run wrote nothing");
    let stderr = run("4");
    let all = read(&out);
    assert_eq!(&all[..8], &first[..], "the first run's records are untouched");
    assert_eq!(all.len(), 10, "{:?}", keys(&all));
    let mut want = want;
    want.insert(key(MIXED, 1), (true, Some(1)));
    let got = marks(&all);
    assert_eq!(got, want);
    assert_eq!(
        got.values().filter(|(i, _)| *i).count(),
        2,
        "exactly N informative groups"
    );
    let unique: BTreeSet<_> = keys(&all).into_iter().collect();
    assert_eq!(unique.len(), all.len(), "no trial twice");
    assert!(
        stderr.contains("dynamic sampling: 2 of 5 groups informative (wanted 2), 2 of 4 extra groups spent, pool of 3 tasks\n"),
        "{stderr}"
    );
    assert_eq!(
        leftovers(&run_id),
        "",
        "the rerun removed the killed run's sandboxes"
    );

    // align trains the informative groups only, and counts what it skipped.
    let samples = tmp.path().join("samples.jsonl.zst");
    let stats = tmp.path().join("stats.jsonl.zst");
    crate::align::align(&[
        "-i",
        out.to_str().unwrap(),
        "-o",
        samples.to_str().unwrap(),
        "--stats",
        stats.to_str().unwrap(),
    ]);
    let total = crate::align::total(&stats);
    assert_eq!((total.trajectories, total.skipped_uninformative), (10, 6));
    let s: Vec<Sample> = read_all(&samples, ReadOptions::default()).unwrap();
    let from: BTreeSet<&str> = s.iter().map(|s| s.trajectory_id.as_str()).collect();
    let want: BTreeSet<&str> = ["ds-mixed/0/0", "ds-mixed/0/1", "ds-mixed/1/0", "ds-mixed/1/1"].into();
    assert_eq!(from, want, "samples of the informative groups only");
}

/// `scripts/loop.sh --min-informative-groups 1 --refilter 1` for 2 steps: each batch is refilled
/// to one informative group from the pool, align trains only that group, the re-filter between the
/// steps drops the task saturated in batch 0, and the report's steps.csv shows the figures.
#[test]
fn the_loop_refills_batches_and_refilters_the_pool_between_steps() {
    if !docker_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let p = pool(tmp.path());
    let tasks = tasks_file(tmp.path(), "tasks.jsonl", &[ALWAYS, MIXED, NEVER]);
    let run = tmp.path().join("run");
    let out = crate::common::script("scripts/loop.sh")
        .env("LEGO_RL_BIN", assert_cmd::cargo::cargo_bin("lego-rl"))
        .env("LEGO_RL_NO_PROGRESS", "1")
        .arg("--run")
        .arg(&run)
        .arg("--tasks")
        .arg(&tasks)
        .arg("--images")
        .arg(&p.images)
        .arg("--checkpoint")
        .arg(crate::model::tiny_moe())
        .args([
            "--steps",
            "2",
            "--group-size",
            "2",
            "--tasks-per-step",
            "1",
            "--concurrency",
            "2",
        ])
        .args(["--min-informative-groups", "1", "--refilter", "1"])
        .arg("--rollout-args")
        .arg(format!("--forced {} --max-turns 8", p.forced.display()))
        .output()
        .unwrap();
    let log = std::fs::read_to_string(run.join("logs/rollout.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "loop.sh failed:\n{}\nrollout log:\n{log}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Batch 0: ALWAYS planned, then extras from the pool of 3 (group stride 4 + 1 = 5): ALWAYS/1
    // saturated, MIXED/1 informative.
    let step0 = read(&run.join("trajectories/step-000000.jsonl.zst"));
    let want: BTreeMap<_, _> = [
        (key(ALWAYS, 0), (false, None)),
        (key(ALWAYS, 1), (false, Some(0))),
        (key(MIXED, 1), (true, Some(1))),
    ]
    .into();
    assert_eq!(marks(&step0), want);
    // The re-filter dropped ALWAYS (its last group all solved); NEVER has no group yet and stays.
    let pool1: Vec<Task> = read_all(&run.join("pool/step-000001.jsonl.zst"), ReadOptions::default()).unwrap();
    let ids: Vec<&str> = pool1.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, [MIXED, NEVER]);
    let decisions: Vec<lego_rl::records::TaskDecision> = read_all(
        &run.join("pool/step-000001.decisions.jsonl.zst"),
        ReadOptions::default(),
    )
    .unwrap();
    let dropped: Vec<(&str, Option<&str>)> = decisions
        .iter()
        .filter(|d| !d.kept)
        .map(|d| (d.task_id.as_str(), d.reason.as_deref()))
        .collect();
    assert_eq!(dropped, [(ALWAYS, Some("saturated_solved"))]);
    // Batch 1 from the pool of 2: NEVER planned (group 5), MIXED/6 its first extra.
    let step1 = read(&run.join("trajectories/step-000001.jsonl.zst"));
    let want: BTreeMap<_, _> = [(key(NEVER, 5), (false, None)), (key(MIXED, 6), (true, Some(0)))].into();
    let got: BTreeMap<_, _> = step1
        .iter()
        .map(|t| {
            let d = t.dynamic_sampling.unwrap();
            assert_eq!(d.pool, 2);
            ((t.task_id.clone(), t.group_id), (d.informative, d.extra_group))
        })
        .collect();
    assert_eq!(got, want);
    for (step, skipped) in [(0, 4), (1, 2)] {
        let t = crate::align::total(&run.join(format!("align-stats/step-{step:06}.jsonl.zst")));
        assert_eq!(t.skipped_uninformative, skipped, "step {step}");
        let s: Vec<Sample> = read_all(
            &run.join(format!("samples/step-{step:06}.jsonl.zst")),
            ReadOptions::default(),
        )
        .unwrap();
        assert!(
            s.iter().all(|s| s.trajectory_id.starts_with("ds-mixed/")),
            "step {step}"
        );
    }
    // The report's steps table: sampled, informative and extra groups, pool size, re-filter drops.
    let csv = std::fs::read_to_string(run.join("report/steps.csv")).unwrap();
    let mut rows = csv.lines().map(|l| l.split(',').collect::<Vec<_>>());
    let header = rows.next().unwrap();
    let col = |r: &[&str], name: &str| r[header.iter().position(|h| *h == name).unwrap()].to_string();
    let rows: Vec<Vec<&str>> = rows.collect();
    let fig = |r: &[&str]| {
        [
            "groups",
            "informative_groups",
            "extra_groups",
            "task_pool",
            "pool_dropped",
        ]
        .map(|c| col(r, c))
    };
    assert_eq!(fig(&rows[0]), ["3", "1", "2", "3", ""]);
    assert_eq!(fig(&rows[1]), ["2", "1", "1", "2", "1"]);
    // The pool's difficulty band: batch 1's pool of 2 after ALWAYS was dropped as all solved,
    // MIXED in the middle band (1 of its last group's 2 solved), NEVER not rated yet.
    let pool = std::fs::read_to_string(run.join("report/pool_steps.csv")).unwrap();
    assert_eq!(
        pool.lines().collect::<Vec<_>>(),
        [
            "step,pool_tasks,dropped_saturated_solved,dropped_saturated_failed,dropped_other,\
             unrated,never_solved,hard,middle,easy,always_solved,pass_rate_mean",
            "1,2,1,0,0,1,0,0,1,0,0,0.5",
        ],
        "{pool}"
    );
}

/// `--pool-order curriculum`: filter-tasks writes each kept task's recent pass rate from training
/// trajectories, and rollout's extra groups take the middle of the difficulty band first. With a
/// budget of one extra group it is MIXED (2 of 4 solved), not the pool file's first task, ALWAYS
/// (3 of 4), which the file's order would draw (and which the forced script always solves).
#[test]
fn the_curriculum_draws_the_middle_band_task_first() {
    if !docker_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let p = pool(tmp.path());
    let tasks = tasks_file(tmp.path(), "tasks.jsonl", &[ALWAYS, NEVER, MIXED]);
    // Two recent groups per task; none saturated, so the re-filter keeps all three.
    let recent = tmp.path().join("recent.jsonl");
    let mut text = String::new();
    let groups = [
        (ALWAYS, [[1.0, 1.0], [1.0, 0.0]]),
        (NEVER, [[0.0, 0.0], [1.0, 0.0]]),
        (MIXED, [[1.0, 0.0], [0.0, 1.0]]),
    ];
    for (task, rewards) in groups {
        for (g, rs) in rewards.iter().enumerate() {
            for (i, r) in rs.iter().enumerate() {
                let t = Trajectory {
                    reward: Some(*r),
                    ..Trajectory::new(task, g as u64, i as u32, "mini-swe-agent", "embedded", Vec::new())
                };
                text += &(serde_json::to_string(&t).unwrap() + "\n");
            }
        }
    }
    std::fs::write(&recent, text).unwrap();
    let kept = tmp.path().join("pool.jsonl");
    let o = lego()
        .args(["filter-tasks", "--stages", "saturation", "-i"])
        .arg(&tasks)
        .arg("-o")
        .arg(&kept)
        .arg("--drop-saturated")
        .arg(&recent)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pool_tasks: Vec<Task> = read_all(&kept, ReadOptions::default()).unwrap();
    let rates: Vec<(&str, Option<(u32, u32)>)> = pool_tasks
        .iter()
        .map(|t| (t.id.as_str(), t.pass_rate.map(|r| (r.solved, r.trials))))
        .collect();
    assert_eq!(
        rates,
        [
            (ALWAYS, Some((3, 4))),
            (NEVER, Some((1, 4))),
            (MIXED, Some((2, 4)))
        ]
    );

    // No planned group (--epochs 0): the one extra group allowed is the pool's middle-band task.
    let out = tmp.path().join("traj.jsonl.zst");
    let run_id = format!("it-curriculum-{}", std::process::id());
    let extra = [
        "--epochs",
        "0",
        "--min-informative-groups",
        "1",
        "--max-extra-groups",
        "1",
        "--pool-order",
        "curriculum",
        "-j",
        "2",
        "--run-id",
        &run_id,
    ];
    let o = lego().args(args(&p, &kept, &out, &extra)).output().unwrap();
    assert!(
        o.status.success(),
        "rollout: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let want: BTreeMap<_, _> = [(key(MIXED, 0), (true, Some(0)))].into();
    assert_eq!(marks(&read(&out)), want);
}
