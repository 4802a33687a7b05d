//! CLI behaviour: help, unimplemented subcommands, exit codes.

use crate::common::lego;

const SUBCOMMANDS: [&str; 7] = [
    "filter-tasks",
    "build-images",
    "rollout",
    "align",
    "train-step",
    "validate",
    "report",
];

#[test]
fn top_level_help_lists_the_seven_subcommands() {
    let out = lego().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for sub in SUBCOMMANDS {
        assert!(
            text.contains(&format!("  {sub} ")),
            "--help does not list {sub}:\n{text}"
        );
    }
    assert!(
        !text.contains("generate-docs"),
        "maintainer command must stay hidden"
    );
}

#[test]
fn every_subcommand_help_works_and_shows_an_example() {
    for sub in SUBCOMMANDS {
        let out = lego().args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "{sub} --help failed");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("Example:"), "{sub} --help has no example:\n{text}");
        assert!(
            text.contains(&format!("lego-rl {sub}")),
            "{sub} example does not invoke it"
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    let out = lego().args(["validate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = lego().args(["no-such-command"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A pipe whose read end is already closed: every write to it fails (EPIPE), as stderr does for a
/// process whose parent died.
fn closed_pipe() -> std::process::Stdio {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills both descriptors; each is owned exactly once below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors from pipe(2), not owned elsewhere.
    drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fds[0]) });
    std::process::Stdio::from(unsafe { std::os::fd::OwnedFd::from_raw_fd(fds[1]) })
}

/// With stderr gone, exit codes stay what they would be: a warning logged on the main thread
/// (align skipping a bad record, exit 0) and the final error line (exit 2) used to panic in
/// `eprintln!` and exit 101.
#[test]
fn exit_codes_do_not_depend_on_stderr_being_writable() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("traj.jsonl");
    let s = crate::synth::Synth::default();
    let mut text = String::new();
    for i in 0..2 {
        let t = crate::synth::trajectory(&s, 0, 1, i, i as usize);
        text.push_str(&serde_json::to_string(&t).unwrap());
        text.push('\n');
    }
    text.push_str("not json\n");
    std::fs::write(&input, text).unwrap();
    let out = dir.path().join("samples.jsonl.zst");
    // std's Command: assert_cmd's cannot redirect stderr.
    let bin = || {
        let mut c = crate::common::lego_process();
        c.env("LEGO_RL_NO_PROGRESS", "1").env_remove("RUST_LOG");
        c
    };
    let align = |stderr: std::process::Stdio| {
        bin()
            .args(["align", "-i"])
            .arg(&input)
            .arg("-o")
            .arg(&out)
            .stderr(stderr)
            .status()
            .unwrap()
            .code()
    };
    let warned = lego()
        .args(["align", "-i"])
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(warned.status.code(), Some(0), "{warned:?}");
    assert!(
        String::from_utf8_lossy(&warned.stderr).contains("skipped 1 bad record"),
        "{warned:?}"
    );
    assert_eq!(align(closed_pipe()), Some(0));
    assert!(out.exists());
    let missing = bin()
        .args(["align", "-i", "/nonexistent/traj.jsonl", "-o"])
        .arg(dir.path().join("x.jsonl.zst"))
        .stderr(closed_pipe())
        .status()
        .unwrap();
    assert_eq!(missing.code(), Some(2));
}

/// A task file whose first line is not a record and whose second is a task on a prebuilt image.
fn tasks_with_a_bad_line(dir: &std::path::Path) -> std::path::PathBuf {
    let root = crate::common::root();
    let good = std::fs::read_to_string(root.join("testdata/tasks/tasks.jsonl"))
        .unwrap()
        .lines()
        .find(|l| l.contains("\"id\": \"harbor__hello-world\""))
        .unwrap()
        .to_string();
    let mut task: serde_json::Value = serde_json::from_str(&good).unwrap();
    task["environment"] = serde_json::json!({"image": "lego-rl/base:trixie", "workdir": "/app"});
    let path = dir.join("tasks.jsonl");
    std::fs::write(
        &path,
        format!("{{\"schema\": \"lego-rl/task/v1\", \"id\": 7\n{task}\n"),
    )
    .unwrap();
    path
}

#[test]
fn strict_stops_build_images_and_rollout_at_a_bad_record_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = tasks_with_a_bad_line(dir.path());
    let images = dir.path().join("images.jsonl.zst");
    let named = |stderr: &[u8]| {
        let e = String::from_utf8_lossy(stderr).to_string();
        assert!(
            e.contains(&format!("{}: record 1", tasks.display())),
            "the error names the file and record: {e}"
        );
    };
    let o = lego()
        .args(["--strict", "build-images", "-i"])
        .arg(&tasks)
        .arg("-o")
        .arg(&images)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    named(&o.stderr);
    assert!(!images.exists(), "nothing written");
    let root = crate::common::root();
    let o = lego()
        .args(["rollout", "--strict", "-i"])
        .arg(&tasks)
        .arg("--images")
        .arg(&tasks)
        .arg("--harness")
        .arg(root.join("examples/harnesses/mini-swe-agent.toml"))
        .args(["--backend", "embedded:/nonexistent", "-o"])
        .arg(dir.path().join("traj.jsonl.zst"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    named(&o.stderr);
    // Without --strict the bad line is skipped and counted, and the good task is built.
    if !crate::common::docker_available() {
        return;
    }
    let o = lego()
        .args(["build-images", "-i"])
        .arg(&tasks)
        .arg("-o")
        .arg(&images)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let recs: Vec<lego_rl::records::ImageRecord> =
        lego_rl::io::read_all(&images, Default::default()).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].task_id, "harbor__hello-world");
}

/// `--strict` in the three other subcommands that read records: align, validate (record check)
/// and report stop at a bad record with exit 2, naming the file and record, and write nothing;
/// without it align and report skip and count the record, and validate reports it as a failure.
#[test]
fn strict_stops_align_validate_and_report_at_a_bad_record() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("trajectories")).unwrap();
    let bad = run.join("trajectories/step-000000.jsonl.zst");
    let line = "{\"schema\":\"lego-rl/trajectory/v1\",\"id\":\"x\"}\n";
    std::fs::write(&bad, zstd::encode_all(line.as_bytes(), 3).unwrap()).unwrap();
    let named = |o: &std::process::Output| {
        let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(
            text.contains(&format!("{}: record 1: missing field `task_id`", bad.display())),
            "the error names the file and record: {text}"
        );
        assert!(
            !text.contains("more bad record"),
            "the fatal record is not counted twice: {text}"
        );
    };
    let samples = dir.path().join("samples.jsonl.zst");
    let align = |strict: bool| {
        let mut c = lego();
        if strict {
            c.arg("--strict");
        }
        c.args(["align", "-i"])
            .arg(&bad)
            .arg("-o")
            .arg(&samples)
            .output()
            .unwrap()
    };
    let o = align(true);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    named(&o);
    assert!(!samples.exists(), "align --strict wrote nothing");
    let o = align(false);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(samples.exists(), "align without --strict skips the record");

    let o = lego().args(["--strict", "validate"]).arg(&bad).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    named(&o);
    let o = lego().arg("validate").arg(&bad).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "a bad record is a failure: {o:?}");

    let o = lego().args(["--strict", "report"]).arg(&run).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    named(&o);
    assert!(!run.join("report").exists(), "report --strict wrote nothing");
    let o = lego().arg("report").arg(&run).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(run.join("report").is_dir());
}
