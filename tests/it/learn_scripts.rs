//! The learn benchmark's summary scripts (`examples/learn/seeds.py`, `words.py` and their shared
//! reader `evalfiles.py`) on a small synthetic learn run, with the venv's Python.
//!
//! examples/learn/README.md's numbers (held-out counts with their standard errors, pooled over
//! seeds, and the per-word tables) are these scripts' output on run directories that are not
//! committed, so nothing else checks the scripts. The run built here has known rewards and the
//! traps of real runs: evaluation files written as several zstd frames (the append-mode writer of
//! `rollout -o`), infra-failed and ungraded trials that must not count, an intermediate
//! evaluation, and an evaluation still being written (no `.done` marker). The expected numbers are
//! computed here from the counts, independently of the scripts.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use lego_rl::chat::ChatFormat;
use serde_json::{json, Value};

use crate::common::{self, root};

/// The warm start's version (`RUN/warmstart/version`).
const V0: u64 = 40;
/// The last finished evaluation.
const V1: u64 = 50;

/// The Qwen3 tokenizer, which the learn run's model copies (make_model.py).
fn qwen3() -> PathBuf {
    root().join("testdata/tokenizer/qwen3")
}

/// Token ids of a model output, as the proxy captures them (loaded once for all the tests).
fn encode(output: &str) -> Vec<u32> {
    static FORMAT: OnceLock<ChatFormat> = OnceLock::new();
    let fmt = FORMAT.get_or_init(|| ChatFormat::from_model_dir(&qwen3()).unwrap());
    fmt.encode(output).unwrap()
}

/// Runs `examples/learn/{name} ARGS` with the venv's Python.
fn script<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(name: &str, args: I) -> Output {
    Command::new(common::python())
        .arg(root().join("examples/learn").join(name))
        .args(args)
        .env("PYTHONIOENCODING", "utf-8")
        .output()
        .unwrap_or_else(|e| panic!("running {name} (the venv: scripts/setup.sh): {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 output")
}

/// The model's text of one bash tool call, shaped as make_tasks.py's demonstrations (Qwen3's
/// `<tool_call>` JSON, `json.dumps` spacing), ending in the end-of-turn token it samples last.
fn call(command: &str) -> String {
    format!(
        "<tool_call>\n{{\"name\": \"bash\", \"arguments\": {{\"command\": {}}}}}\n</tool_call><|im_end|>",
        json!(command)
    )
}

/// The intended answer: the submit marker, then the word into /app/answer.txt.
fn submit(word: &str) -> String {
    call(&format!(
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo {word} > /app/answer.txt"
    ))
}

/// A call mini-swe-agent cannot parse (README.md, run 11): the command is there but never runs.
fn misnamed(word: &str) -> String {
    submit(word).replace("\"name\"", "\"namecommand\"")
}

/// Broken JSON with no command at all (README.md, run 11).
fn garbled() -> String {
    "<tool_call>\n{\"name\": \"bash\", \"bash\", \"bash\"}\n</tool_call><|im_end|>".into()
}

/// One trajectory with the fields the scripts read, as rollout writes them: one generation per
/// output (its `output_ids`, tokenized as the proxy captures them), `infra_failure` set exactly
/// for an `infra:STAGE` termination, `reward` null when the trial was not graded.
fn traj(task: &str, outputs: &[String], termination: &str, reward: Option<f64>) -> Value {
    let generations: Vec<Value> = outputs
        .iter()
        .map(|o| json!({ "output_ids": encode(o) }))
        .collect();
    json!({
        "task_id": task,
        "generations": generations,
        "termination": termination,
        "infra_failure": termination.starts_with("infra:"),
        "reward": reward,
    })
}

fn lines(records: &[Value]) -> Vec<String> {
    records.iter().map(|r| r.to_string()).collect()
}

fn eval_path(run: &Path, version: u64) -> PathBuf {
    run.join(format!("eval/step-{version:06}.jsonl.zst"))
}

/// Writes `RUN/eval/step-V.jsonl.zst` with each group of lines as its own zstd frame, and its
/// `.done` marker (run.sh touches it once the evaluation is complete) when `done`.
fn write_eval(run: &Path, version: u64, frames: &[Vec<String>], done: bool) -> PathBuf {
    let path = eval_path(run, version);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut bytes = Vec::new();
    for frame in frames {
        let plain: String = frame.iter().map(|l| format!("{l}\n")).collect();
        bytes.extend(zstd::encode_all(plain.as_bytes(), 3).unwrap());
    }
    std::fs::write(&path, bytes).unwrap();
    if done {
        std::fs::write(format!("{}.done", path.display()), "").unwrap();
    }
    path
}

/// A run directory holding the warm start's version and the model's tokenizer.
fn run_dir(parent: &Path, name: &str) -> PathBuf {
    let run = parent.join(name);
    std::fs::create_dir_all(run.join("warmstart")).unwrap();
    std::fs::create_dir_all(run.join("model")).unwrap();
    std::fs::write(run.join("warmstart/version"), format!("{V0}\n")).unwrap();
    std::fs::copy(qwen3().join("tokenizer.json"), run.join("model/tokenizer.json")).unwrap();
    run
}

const BLUE: &str = "echo-blue-p09";
const GREEN: &str = "echo-green-p18";
const RED: &str = "echo-red-p00";

/// The warm start's evaluation, in two frames. Graded and not infra: 10, rewarded 4; left out:
/// an ungraded trial and an infra failure at setup (no generations).
fn warm_start() -> Vec<Vec<String>> {
    vec![
        lines(&[
            traj(BLUE, &[submit("blue")], "finished", Some(1.0)),
            traj(BLUE, &[submit("blue")], "finished", Some(1.0)),
            traj(BLUE, &[misnamed("blue")], "max_turns", Some(0.0)),
            traj(BLUE, &[garbled()], "max_turns", Some(0.0)),
            traj(GREEN, &[submit("red")], "finished", Some(0.0)),
            traj(GREEN, &[submit("green")], "finished", Some(1.0)),
            traj(GREEN, &[submit("green")], "finished", None),
        ]),
        lines(&[
            traj(RED, &[submit("red")], "finished", Some(1.0)),
            traj(RED, &[submit("green")], "finished", Some(0.0)),
            traj(RED, &[submit("purple")], "finished", Some(0.0)),
            traj(RED, &[], "infra:setup", None),
            traj(GREEN, &[garbled()], "max_turns", Some(0.0)),
        ]),
    ]
}

/// The final evaluation. Graded and not infra: 10, rewarded 7; left out: an infra failure of the
/// agent stage after its model call, and one of grading that carries a reward 0 (rollout leaves
/// it null; `report` and seeds.py leave any infra failure out whatever its reward).
fn final_eval() -> Vec<Vec<String>> {
    // The word the verifier reads is the last one written.
    let two_writes = call(concat!(
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; ",
        "echo green > /app/answer.txt; echo red > /app/answer.txt"
    ));
    vec![
        lines(&[
            traj(BLUE, &[submit("blue")], "finished", Some(1.0)),
            traj(BLUE, &[submit("blue")], "finished", Some(1.0)),
            traj(BLUE, &[submit("blue")], "finished", Some(1.0)),
            traj(BLUE, &[misnamed("blue")], "max_turns", Some(0.0)),
            traj(GREEN, &[submit("green")], "finished", Some(1.0)),
            traj(GREEN, &[submit("green")], "finished", Some(1.0)),
        ]),
        lines(&[
            // Two turns: the last write of the whole trajectory is the word.
            traj(
                GREEN,
                &[call("echo green > /app/answer.txt"), submit("blue")],
                "finished",
                Some(0.0),
            ),
            traj(GREEN, &[submit("green")], "infra:agent", None),
            traj(RED, &[submit("red")], "finished", Some(1.0)),
            traj(RED, &[two_writes], "finished", Some(1.0)),
            traj(RED, &[submit("red")], "infra:evaluate", Some(0.0)),
            traj(RED, &[garbled()], "max_turns", Some(0.0)),
        ]),
    ]
}

/// Every sample rewarded: an evaluation whose numbers must not show up.
fn all_rewarded() -> Vec<Vec<String>> {
    vec![lines(&[BLUE, GREEN, RED].map(|task| {
        traj(task, &[submit(&task[5..task.len() - 4])], "finished", Some(1.0))
    }))]
}

/// The learn run: the warm start's and the final evaluations, an intermediate one, and one still
/// being written (no `.done`).
fn learn_run(parent: &Path) -> PathBuf {
    let run = run_dir(parent, "learn-s1");
    write_eval(&run, V0, &warm_start(), true);
    write_eval(&run, 45, &all_rewarded(), true);
    write_eval(&run, V1, &final_eval(), true);
    write_eval(&run, 55, &all_rewarded(), false);
    run
}

/// seeds.py's row for counts a → b, computed here: k/n at both ends, the difference, its standard
/// error sqrt(p0 q0 / n0 + p1 q1 / n1) and their ratio.
fn seeds_row(name: &str, versions: &str, (k0, n0): (u32, u32), (k1, n1): (u32, u32)) -> String {
    let (p0, p1) = (f64::from(k0) / f64::from(n0), f64::from(k1) / f64::from(n1));
    let d = p1 - p0;
    let se = (p0 * (1.0 - p0) / f64::from(n0) + p1 * (1.0 - p1) / f64::from(n1)).sqrt();
    let z = if se > 0.0 {
        format!("{:+.1}", d / se)
    } else {
        "-".into()
    };
    format!("| {name} | {versions} | {k0}/{n0} = {p0:.3} | {k1}/{n1} = {p1:.3} | {d:+.3} ± {se:.3} | {z} |")
}

#[test]
fn seeds_compares_warm_start_with_last_finished_evaluation_and_pools() {
    let dir = tempfile::tempdir().unwrap();
    let run = learn_run(dir.path());
    // A second seed still at its warm start: its next evaluation is being written.
    let early = run_dir(dir.path(), "learn-s2");
    write_eval(&early, V0, &warm_start(), true);
    write_eval(&early, 45, &all_rewarded(), false);

    let out = script(
        "seeds.py",
        [
            run.as_os_str(),
            early.as_os_str(),
            OsStr::new("run10=38/96,50/96"),
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "seeds.py failed:\n{stderr}\n{stdout}");
    assert_eq!(
        stderr,
        format!(
            "{}: only the warm start is evaluated so far; skipped\n",
            early.display()
        )
    );
    let expected = [
        "| run | versions | warm start | end | Δ ± SE | Δ / SE |".to_string(),
        "|---|---|---|---|---|---|".into(),
        seeds_row(&run.display().to_string(), "40 → 50", (4, 10), (7, 10)),
        seeds_row("run10", "- → -", (38, 96), (50, 96)),
        seeds_row("pooled (2 runs)", "- → -", (42, 106), (57, 106)),
    ];
    assert_eq!(stdout, expected.join("\n") + "\n");
    // The same numbers by hand, so the formula above is not merely the script's mirrored.
    assert!(
        expected[2].ends_with("| 4/10 = 0.400 | 7/10 = 0.700 | +0.300 ± 0.212 | +1.4 |"),
        "{}",
        expected[2]
    );
    assert!(
        expected[3].ends_with("| 38/96 = 0.396 | 50/96 = 0.521 | +0.125 ± 0.071 | +1.8 |"),
        "{}",
        expected[3]
    );
    assert!(
        expected[4].ends_with("| 42/106 = 0.396 | 57/106 = 0.538 | +0.142 ± 0.068 | +2.1 |"),
        "{}",
        expected[4]
    );
}

#[test]
fn words_tabulates_the_last_written_word_per_task_word() {
    let dir = tempfile::tempdir().unwrap();
    let run = learn_run(dir.path());
    let out = script("words.py", [run.as_os_str(), OsStr::new("40"), OsStr::new("50")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "words.py failed:\n{stderr}\n{stdout}");
    assert_eq!(stderr, "");
    // Infra-failed and ungraded trials are left out, as in seeds.py; a word outside
    // blue/green/red (purple) is "none"; the last write wins, across the turns of a trajectory too.
    let expected = "\
| version | task word | blue / green / red / none | rewarded |
|---|---|---|---|
| 40 | blue | 3 / 0 / 0 / 1 | 2/4 |
| 40 | green | 0 / 1 / 1 / 1 | 1/3 |
| 40 | red | 0 / 1 / 1 / 1 | 1/3 |
| 50 | blue | 4 / 0 / 0 / 0 | 3/4 |
| 50 | green | 1 / 2 / 0 / 0 | 2/3 |
| 50 | red | 0 / 0 / 2 / 1 | 2/3 |
";
    assert_eq!(stdout, expected);
    // Without versions: every finished evaluation (40, 45, 50), not the one still being
    // written (55, no .done).
    let out = script("words.py", [run.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let versions: Vec<String> = text(&out.stdout)
        .lines()
        .skip(2)
        .map(|l| {
            l.split(" | ")
                .next()
                .unwrap_or_default()
                .trim_start_matches("| ")
                .to_string()
        })
        .collect();
    assert_eq!(versions, ["40", "40", "40", "45", "45", "45", "50", "50", "50"]);
}

#[test]
fn a_line_that_is_not_json_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = learn_run(dir.path());
    // Line 3 (the first of the second frame) is a record cut short.
    let good = lines(&[
        traj(RED, &[submit("red")], "finished", Some(1.0)),
        traj(RED, &[submit("red")], "finished", Some(0.0)),
    ]);
    let torn = traj(BLUE, &[submit("blue")], "finished", Some(1.0)).to_string();
    let torn = torn[..torn.len() / 2].to_string();
    let path = write_eval(&run, V1, &[good.clone(), vec![torn, good[0].clone()]], true);
    let prefix = format!("{}: line 3: not JSON: ", path.display());
    for (name, args) in [("seeds.py", vec![]), ("words.py", vec!["50"])] {
        let out = script(
            name,
            [run.as_os_str()].into_iter().chain(args.iter().map(OsStr::new)),
        );
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.starts_with(&prefix) && stderr.lines().count() == 1,
            "{name}: {stderr}"
        );
        // Nothing half-printed before the error (words.py prints the header first).
        if name == "seeds.py" {
            assert_eq!(text(&out.stdout), "");
        }
    }
}

#[test]
fn a_malformed_counts_argument_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = learn_run(dir.path());
    for arg in [
        "run10=38/96",
        "run10=38/96,50",
        "run10=38/96,fifty/96",
        "run10=38/96,50/96,1/2",
        "run10=97/96,50/96",
        "run10=38/96,0/0",
    ] {
        let out = script("seeds.py", [run.as_os_str(), OsStr::new(arg)]);
        assert_eq!(out.status.code(), Some(1), "{arg}: {out:?}");
        assert_eq!(
            text(&out.stderr),
            format!("{arg}: expected NAME=K0/N0,K1/N1 (rewarded/graded at the warm start, at the end)\n")
        );
        assert_eq!(text(&out.stdout), "", "{arg}");
    }
}

/// serde_json writes U+2028, U+2029 and U+0085 unescaped (JSON allows them raw), and a trial's
/// text fields can hold any character the policy or its tools produced; such a
/// record must not be reported as "not JSON" (evalfiles.py splits at "\n" only, not with
/// `str.splitlines()`).
#[test]
fn a_line_separator_inside_a_string_is_not_a_line_break() {
    let dir = tempfile::tempdir().unwrap();
    let run = learn_run(dir.path());
    let mut records = final_eval();
    let mut odd = traj(RED, &[submit("red")], "finished", Some(1.0));
    odd["metadata"] = json!({ "agent_log_tail": "red\u{2028}red\u{85}red" });
    records[1].push(odd.to_string());
    assert!(odd.to_string().contains('\u{2028}'));
    write_eval(&run, V1, &records, true);
    let out = script("seeds.py", [run.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("| 8/11 = 0.727 |"),
        "{}",
        text(&out.stdout)
    );
}

/// One group of a GSPO batch: its task, group id, extra-group index under dynamic sampling, and
/// its trials' rewards (None: an infra failure).
type Group<'a> = (&'a str, u64, Option<u64>, &'a [Option<f64>]);

/// One GSPO batch file `RUN/trajectories/step-V.jsonl.zst`; `dynamic`: the trajectories carry
/// rollout's `dynamic_sampling` marks.
fn write_batch(run: &Path, version: u64, dynamic: bool, groups: &[Group]) {
    let mut records = Vec::new();
    for &(task, group, extra, rewards) in groups {
        for &reward in rewards {
            let termination = if reward.is_some() {
                "finished"
            } else {
                "infra:agent"
            };
            let mut t = traj(task, &[submit("red")], termination, reward);
            t["group_id"] = json!(group);
            if dynamic {
                t["dynamic_sampling"] = json!({ "informative": true, "extra_group": extra, "pool": 3 });
            }
            records.push(t);
        }
    }
    let path = run.join(format!("trajectories/step-{version:06}.jsonl.zst"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let plain: String = lines(&records).iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, zstd::encode_all(plain.as_bytes(), 3).unwrap()).unwrap();
}

/// `RUN/metrics.jsonl.zst` with one line per optimizer update.
fn write_updates(run: &Path, updates: usize) {
    let plain: String = (0..updates).map(|k| format!("{{\"step\":{k}}}\n")).collect();
    let bytes = zstd::encode_all(plain.as_bytes(), 3).unwrap();
    std::fs::write(run.join("metrics.jsonl.zst"), bytes).unwrap();
}

/// arms.py's row of one arm: seeds.py's cells for the held-out reward (without its Δ / SE
/// column), then (trials, groups, zero-variance groups, extra groups) and updates.
fn arms_row(arm: &str, run: &str, ends: [(u32, u32); 2], batches: [u32; 4], updates: u32) -> String {
    let held = seeds_row(arm, &format!("{run} | 40 → 50"), ends[0], ends[1]);
    let held = &held[..held.trim_end_matches(" |").rfind(" | ").unwrap()];
    let [trials, groups, flat, extra] = batches;
    let share = f64::from(flat) / f64::from(groups);
    format!("{held} | {trials} | {groups} | {flat} ({share:.2}) | {extra} | {updates} |")
}

#[test]
fn arms_compares_plain_and_dynamic_runs_per_seed_and_pooled() {
    let dir = tempfile::tempdir().unwrap();
    let (one, zero, lost) = (Some(1.0), Some(0.0), None);
    let mut runs = Vec::new();
    for (name, end) in [
        ("s1-plain", final_eval()),
        ("s1-dyn", all_rewarded()),
        ("s2-plain", final_eval()),
        ("s2-dyn", final_eval()),
    ] {
        let run = run_dir(dir.path(), name);
        write_eval(&run, V0, &warm_start(), true);
        write_eval(&run, V1, &end, true);
        // An evaluation still being written is not the end.
        write_eval(&run, 55, &all_rewarded(), false);
        runs.push(run);
    }
    // Plain: 12 trials in 6 groups; zero variance: (BLUE, 40) all pass, (RED, 40) one fail and
    // an infra failure (left out), (GREEN, 41) all pass, (RED, 41) all fail.
    for plain in [&runs[0], &runs[2]] {
        let b40: [Group; 3] = [
            (BLUE, 40, None, &[one, one]),
            (GREEN, 40, None, &[one, zero]),
            (RED, 40, None, &[zero, lost]),
        ];
        let b41: [Group; 3] = [
            (BLUE, 41, None, &[one, zero]),
            (GREEN, 41, None, &[one, one]),
            (RED, 41, None, &[zero, zero]),
        ];
        write_batch(plain, 40, false, &b40);
        write_batch(plain, 41, false, &b41);
        write_updates(plain, 2);
    }
    // Dynamic: a planned group that does not vary and an extra group that does, then a batch of
    // one informative planned group: 6 trials, 3 groups, 1 without variance, 1 extra, 2 updates.
    for dynamic in [&runs[1], &runs[3]] {
        let b40: [Group; 2] = [(BLUE, 0, None, &[one, one]), (GREEN, 1, Some(0), &[zero, one])];
        write_batch(dynamic, 40, true, &b40);
        write_batch(dynamic, 41, true, &[(RED, 13, None, &[one, zero])]);
        write_updates(dynamic, 2);
    }
    let out = script("arms.py", &runs);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "arms.py failed:\n{stderr}\n{stdout}");
    assert_eq!(stderr, "");
    let (plain, dynamic) = ([12, 6, 4, 0], [6, 3, 1, 1]);
    let expected = [
        "| arm | run | versions | warm start | end | Δ ± SE | train trials | groups | zero-variance | extra groups | updates |".to_string(),
        "|---|---|---|---|---|---|---|---|---|---|---|".into(),
        arms_row("plain", "s1-plain", [(4, 10), (7, 10)], plain, 2),
        arms_row("dynamic", "s1-dyn", [(4, 10), (3, 3)], dynamic, 2),
        arms_row("plain", "s2-plain", [(4, 10), (7, 10)], plain, 2),
        arms_row("dynamic", "s2-dyn", [(4, 10), (7, 10)], dynamic, 2),
        String::new(),
        "pooled over 2 seed(s), held-out reward at the end: plain 14/20 = 0.700, dynamic 10/13 = 0.769".into(),
        // By hand: 10/13 - 14/20 = 0.0692; sqrt(0.7 * 0.3 / 20 + (10/13)(3/13) / 13) = 0.1554;
        // (10/13) / 0.7 = 1.0989.
        "dynamic - plain: +0.069 ± 0.155 (+0.4 SE); dynamic / plain: 1.099".into(),
    ];
    assert_eq!(stdout, expected.join("\n") + "\n");
    assert_eq!(
        expected[3],
        "| dynamic | s1-dyn | 40 → 50 | 4/10 = 0.400 | 3/3 = 1.000 | +0.600 ± 0.155 | 6 | 3 | 1 (0.33) | 1 | 2 |"
    );

    // An odd number of runs is not a set of pairs; a run without a finished final evaluation is
    // named, before anything is printed.
    let out = script("arms.py", &runs[..3]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("arms.py PLAIN_RUN DYN_RUN"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_file(eval_path(&runs[3], V1).with_extension("zst.done")).unwrap();
    let out = script("arms.py", &runs);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "{}/eval: needs finished evaluations of the warm start (version 40) and of a later version\n",
            runs[3].display()
        )
    );
    assert_eq!(text(&out.stdout), "");
}
