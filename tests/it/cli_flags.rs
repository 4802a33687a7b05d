//! CLI flag checks: each subcommand refuses a flag its mode ignores, a bad value or a missing
//! companion flag with exit 2, naming the flag, before any work (nothing read, built or written).

use crate::common::lego;

#[test]
fn plan_only_flags_need_plan() {
    for flag in [["--world-size", "8"], ["--format", "json"]] {
        let o = lego()
            .args(["train-step", "--checkpoint", "x", "-i", "x", "--out", "x"])
            .args(flag)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{flag:?}: {o:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains("--plan"), "{flag:?}: {e}");
    }
}

/// `rollout` checks its flags before any work: a bad `--device`, a backend missing the flag it
/// needs, or a flag the backend would ignore exits 2 naming the flag, before the task file is read
/// (it does not exist here), the output is opened or the harness runtime is built into the cache.
/// Regression: a missing --chat-model or --vllm-python surfaced only after the Docker sweep and
/// the runtime build, and --vllm-arg or --reload-tolerance on another backend was dropped.
#[test]
fn rollout_rejects_bad_flags_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let (out, cache) = (dir.path().join("traj.jsonl.zst"), dir.path().join("cache"));
    let harness = crate::common::root().join("examples/harnesses/mini-swe-agent.toml");
    let ckpt = "embedded:/nonexistent";
    let cases: [(&[&str], &str); 11] = [
        (
            &["--backend", ckpt, "--device", "gpu0"],
            "--device gpu0: expected cpu, cuda or cuda:N",
        ),
        (&["--backend", ckpt, "--device", "cuda:99"], "--device cuda:99: "),
        (
            &["--backend", "vllm:http://127.0.0.1:1"],
            "--backend vllm: needs --chat-model DIR",
        ),
        (
            &["--backend", "sglang:http://127.0.0.1:1"],
            "--backend sglang: needs --chat-model DIR",
        ),
        (
            &["--backend", "vllm-serve:/nonexistent"],
            "--backend vllm-serve: needs --vllm-python",
        ),
        (
            &["--backend", ckpt, "--vllm-arg=--dtype=float32"],
            "--vllm-arg: only --backend vllm-serve",
        ),
        (
            &["--backend", ckpt, "--reload-tolerance", "0.1"],
            "--reload-tolerance: only a vLLM backend",
        ),
        // Sampling values that keep no token or are no probability.
        (&["--backend", ckpt, "--top-k", "0"], "--top-k <TOP_K>"),
        (&["--backend", ckpt, "--min-p", "1.5"], "1.5 is outside [0, 1]"),
        (&["--backend", ckpt, "--top-p", "0"], "0 keeps no token"),
        // Two harnesses split by sample in groups of one: the second would never run.
        (
            &[
                "--backend",
                ckpt,
                "--harness",
                "/nonexistent/second.toml",
                "--harness-mix",
                "sample",
                "--group-size",
                "1",
            ],
            "--harness-mix sample puts sample i on harness i mod 2: --group-size 1",
        ),
    ];
    for (flags, msg) in cases {
        let o = lego()
            .env_remove("LEGO_RL_VLLM")
            .args([
                "rollout",
                "-i",
                "/nonexistent/tasks.jsonl",
                "--images",
                "/nonexistent/images.jsonl",
            ])
            .arg("--harness")
            .arg(&harness)
            .arg("-o")
            .arg(&out)
            .arg("--cache-dir")
            .arg(&cache)
            .args(flags)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {e}");
        assert!(e.contains(msg), "{flags:?}: expected `{msg}` in: {e}");
        assert!(
            !e.contains("/nonexistent/tasks.jsonl"),
            "{flags:?}: the tasks were read first: {e}"
        );
        assert!(
            !out.exists() && !cache.exists(),
            "{flags:?}: work started before the check"
        );
    }
}

/// `build-images`, `align` and `report` check their flags before any work: a flag the chosen mode
/// ignores, a zero count or a bad address exits 2 naming the flag, before a build, an alignment,
/// a model load or a report file. Regression: `--jobs 0` was taken as 1, `-o`/`--log-dir`
/// without `--input`, `--max-trajectories` with `--serve`, the summarize flags without
/// `--summarize` and `--assistant-model` with an embedded assistant were silently dropped, and a
/// missing second align input or a bad `--bind` surfaced only after the work before it.
#[test]
fn build_images_align_and_report_reject_bad_flags_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let root = crate::common::root();
    let harness = root.join("examples/harnesses/mini-swe-agent.toml");
    let out = dir.path().join("out.jsonl.zst");
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("trajectories")).unwrap();
    let traj = dir.path().join("traj.jsonl");
    std::fs::write(&traj, "").unwrap();
    let (h, t, r, o) = (
        harness.to_str().unwrap(),
        traj.to_str().unwrap(),
        run.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let url = "--assistant=http://127.0.0.1:1/v1";
    let embedded = "--assistant=embedded:/nonexistent/ckpt";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["build-images", "--harness", h, "-o", o], "--input"),
        (
            vec!["build-images", "--harness", h, "--log-dir", "logs"],
            "--input",
        ),
        (vec!["build-images", "--harness", h, "-j", "3"], "--input"),
        (
            vec!["build-images", "-i", t, "-o", o, "-j", "0"],
            "--jobs 0: need at least 1",
        ),
        (
            vec!["--strict", "build-images", "--harness", h],
            "--strict: build-images reads records only from --input",
        ),
        (
            vec!["align", "-i", t, "/nonexistent/second.jsonl", "-o", o],
            "-i /nonexistent/second.jsonl: no such file",
        ),
        (
            vec!["align", "-i", t, "-o", o, "-j", "0"],
            "--jobs 0: need at least 1",
        ),
        (
            vec!["align", "-i", t, "--stats", "-"],
            "--stats -: the samples already go to stdout",
        ),
        (
            vec!["align", "-i", t, "-o", o, "--stats", o],
            "the same file as -o",
        ),
        (
            vec!["report", r, "--serve", "--max-trajectories", "5"],
            "--max-trajectories",
        ),
        (vec!["report", r, "--summarize-jobs", "2"], "--summarize"),
        (vec!["report", r, "--summarize-retries", "0"], "--summarize"),
        (vec!["report", r, "--assistant-max-tokens", "8"], "--assistant"),
        (vec!["report", r, "--assistant-api-key-env", "KEY"], "--assistant"),
        (
            vec!["report", r, "--summarize", url, "--summarize-tokens", "0"],
            "--summarize-tokens 0: need at least 1",
        ),
        (
            vec!["report", r, "--serve", url, "--assistant-context", "0"],
            "--assistant-context 0: need at least 1",
        ),
        (
            vec!["report", r, "--serve", "--bind", "nonsense"],
            "--bind nonsense: expected HOST:PORT",
        ),
        (
            vec!["report", r, "--serve", embedded, "--assistant-model", "m"],
            "--assistant-model: only an assistant URL is sent a model name",
        ),
        (
            vec![
                "report",
                r,
                "--summarize",
                embedded,
                "--assistant-api-key-env",
                "KEY",
            ],
            "--assistant-api-key-env: only an assistant URL is sent an API key",
        ),
        (
            vec!["--strict", "report", r, "--serve"],
            "--strict: report --serve follows files still being written",
        ),
    ];
    for (args, msg) in cases {
        let o = lego().current_dir(dir.path()).args(&args).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(msg), "{args:?}: expected `{msg}` in: {e}");
        assert!(
            !e.contains("/nonexistent/ckpt"),
            "{args:?}: the assistant was loaded first: {e}"
        );
        assert!(
            o.stdout.is_empty()
                && !out.exists()
                && !run.join("report").exists()
                && !dir.path().join("logs").exists(),
            "{args:?}: work started before the check: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

/// `validate` and `filter-tasks` refuse a flag that the chosen mode or stage set would ignore:
/// exit 2 naming the flag (and, for filter-tasks, its stage), before any file is judged or
/// filtered: no table, no validation report appended, no kept tasks, decisions or funnel.
/// Regression: `validate FILE...` dropped the gate and report flags, `--eval` alone the gate
/// flags and `--no-report`, `--health` without files and files beside `--eval` were ignored;
/// filter-tasks dropped the flags of every stage that did not run, and took `-j 0` as 1.
#[test]
fn validate_and_filter_tasks_reject_flags_their_mode_ignores() {
    let dir = tempfile::tempdir().unwrap();
    let root = crate::common::root();
    let run = dir.path().join("run");
    crate::synth::write_run(&run, &crate::synth::Synth::default());
    let traj = run.join("trajectories/step-000000.jsonl.zst");
    let report = dir.path().join("report.jsonl.zst");
    let gates = root.join("examples/gates.toml");
    let (r, t, rep, g) = (
        run.to_str().unwrap(),
        traj.to_str().unwrap(),
        report.to_str().unwrap(),
        gates.to_str().unwrap(),
    );
    let records = |flag: &str| format!("{flag}: `validate FILE...` checks records only");
    let eval_gates = |flag: &str| format!("{flag}: --eval/--compare judge no gates");
    let validate: Vec<(Vec<&str>, String)> = vec![
        (vec![t, "--all-steps"], records("--all-steps")),
        (vec![t, "--gates", g], records("--gates")),
        (vec![t, "--gate", "logprob_pearson=0.5"], records("--gate")),
        (vec![t, "--report-out", rep], records("--report-out")),
        (vec![t, "--no-report"], records("--no-report")),
        (
            vec!["--health", "--eval", t],
            "--health: needs the record files".into(),
        ),
        (
            vec![r, "--health"],
            "--health: a run directory is judged as a run already".into(),
        ),
        (
            vec![t, "--eval", t],
            format!("{t}: files beside --eval/--compare are judged as a run only with --health"),
        ),
        (
            vec!["--eval", t, "--gate", "logprob_pearson=0.5"],
            eval_gates("--gate"),
        ),
        (vec!["--eval", t, "--gates", g], eval_gates("--gates")),
        (vec!["--compare", t, t, "--all-steps"], eval_gates("--all-steps")),
        (
            vec!["--eval", t, "--no-report"],
            "--no-report: --eval/--compare without a run append no report".into(),
        ),
    ];
    let validation = run.join("validation.jsonl.zst");
    for (args, msg) in validate {
        let o = lego().arg("validate").args(&args).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(&msg), "{args:?}: expected `{msg}` in: {e}");
        assert!(
            o.stdout.is_empty() && !validation.exists() && !report.exists(),
            "{args:?}: work started before the check: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    // The combinations that work stay working: run health with eval, and eval with --report-out.
    let o = lego()
        .args(["validate", "--no-report", r, "--eval", t, "--compare", t, t])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let o = lego()
        .args(["validate", "--eval", t, "--report-out", rep])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(report.exists(), "--eval alone appends its report to --report-out");

    let pool = root.join("testdata/tasks/tasks.jsonl");
    let ids = root.join("testdata/swebench/swebench_verified_ids.txt");
    let (out, decisions, funnel) = (
        dir.path().join("kept.jsonl"),
        dir.path().join("decisions.jsonl"),
        dir.path().join("funnel.csv"),
    );
    let (ids, tr) = (ids.to_str().unwrap(), traj.to_str().unwrap());
    let filter: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--stages", "rules", "--validity-runs", "3"],
            "--validity-runs: a flag of stage validity, which does not run (--stages rules)",
        ),
        (
            vec!["--stages", "rules", "--images", "images.jsonl.zst"],
            "--images: a flag of stage validity",
        ),
        (
            vec!["-j", "4"],
            "-j/--jobs: a flag of stage validity, which does not run (validity runs with --images FILE)",
        ),
        (
            vec!["--stages", "validity", "--images", "images.jsonl.zst", "-j", "0"],
            "--jobs 0: need at least 1",
        ),
        (
            vec!["--min-solved", "2"],
            "--min-solved: a flag of stage difficulty, which does not run (difficulty runs with --trials FILE)",
        ),
        (vec!["--max-solved", "2"], "--max-solved: a flag of stage difficulty"),
        (vec!["--trials-per-task", "8"], "--trials-per-task: a flag of stage difficulty"),
        (
            vec!["--incomplete-trials", "keep"],
            "--incomplete-trials: a flag of stage difficulty",
        ),
        (
            vec!["--stages", "rules", "--trials", tr],
            "--trials: a flag of stage difficulty, which does not run (--stages rules)",
        ),
        (
            vec!["--saturation-groups", "3"],
            "--saturation-groups: a flag of stage saturation, which does not run (saturation runs with --drop-saturated FILE)",
        ),
        (
            vec!["--stages", "rules", "--drop-saturated", tr],
            "--drop-saturated: a flag of stage saturation",
        ),
        (
            vec!["--solved-threshold", "0.5"],
            "--solved-threshold: a flag of stage difficulty or saturation",
        ),
        (
            vec!["--no-rules", "--no-test-file-check"],
            "--no-test-file-check: a flag of stage rules, which does not run (--no-rules)",
        ),
        (
            vec!["--no-rules", "--languages", "python"],
            "--languages: a flag of stage rules, which does not run (--no-rules)",
        ),
        (
            vec!["--stages", "decontamination", "--exclude-instances", ids, "--max-patch-lines", "9"],
            "--max-patch-lines: a flag of stage rules, which does not run (--stages decontamination)",
        ),
        (
            vec!["--stages", "rules", "--exclude-instances", ids],
            "--exclude-instances: a flag of stage decontamination",
        ),
    ];
    for (args, msg) in filter {
        let o = lego()
            .current_dir(dir.path())
            .arg("filter-tasks")
            .arg("-i")
            .arg(&pool)
            .arg("-o")
            .arg(&out)
            .arg("--decisions")
            .arg(&decisions)
            .arg("--funnel")
            .arg(&funnel)
            .args(&args)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(msg), "{args:?}: expected `{msg}` in: {e}");
        assert!(
            o.stdout.is_empty() && !out.exists() && !decisions.exists() && !funnel.exists(),
            "{args:?}: work started before the check: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}
