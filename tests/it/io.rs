//! IO through the binary and across processes: piping, truncated files, corrupt lines, and an
//! append-mode writer killed with SIGKILL.

use std::path::Path;
use std::time::{Duration, Instant};

use lego_rl::io::{read_all, AppendWriter, AtomicWriter, ReadOptions, TornTail};
use lego_rl::records::Task;

use crate::common::lego;

fn task(i: usize) -> Task {
    Task::new(format!("t{i}"), format!("instruction {i}"))
}

fn write_tasks(path: &Path, n: usize) {
    let mut w = AtomicWriter::create(path).unwrap();
    for i in 0..n {
        w.write(&task(i)).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn validate_accepts_good_files_and_reads_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.jsonl.zst");
    write_tasks(&path, 100);
    let out = lego().arg("validate").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("task:100"), "{text}");
    // The same bytes through a pipe (`-` = stdin).
    let out = lego()
        .args(["validate", "-"])
        .pipe_stdin(&path)
        .unwrap()
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8(out.stdout).unwrap().contains("task:100"));
}

#[test]
fn validate_counts_bad_records_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.jsonl");
    let good = serde_json::to_string(&task(0)).unwrap();
    std::fs::write(
        &path,
        format!("{good}\nnot json\n{{\"schema\":\"lego-rl/nope/v1\"}}\n{good}\n"),
    )
    .unwrap();
    let out = lego().arg("validate").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("mixed.jsonl: record 2: not JSON"), "{text}");
    assert!(
        text.contains("mixed.jsonl: record 3: unknown schema `lego-rl/nope/v1`"),
        "{text}"
    );
    assert!(text.contains("4 record(s), 2 bad"), "{text}");
    // --strict makes the first bad record fatal (exit 2).
    let out = lego().args(["--strict", "validate"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("lego-rl: error:") && err.contains("record 2"),
        "{err}"
    );
}

#[test]
fn truncated_zstd_file_is_an_error_naming_file_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.jsonl.zst");
    let (mut w, _) = AppendWriter::open(&path).unwrap();
    for i in 0..20 {
        w.push(&task(i)).unwrap();
        w.commit().unwrap();
    }
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let out = lego().arg("validate").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("cut.jsonl.zst: truncated zstd data after record 19"),
        "{err}"
    );
    // A stream cut inside a frame (no file to scan) is caught too.
    let mut one_frame = AtomicWriter::create(&dir.path().join("whole.jsonl.zst")).unwrap();
    for i in 0..1000 {
        one_frame.write(&task(i)).unwrap();
    }
    one_frame.finish().unwrap();
    let bytes = std::fs::read(dir.path().join("whole.jsonl.zst")).unwrap();
    let out = lego()
        .args(["validate", "-"])
        .write_stdin(&bytes[..bytes.len() / 2])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("-: compressed stream ends inside a zstd frame"),
        "{err}"
    );
}

#[test]
fn missing_file_is_an_error() {
    let out = lego()
        .args(["validate", "/nonexistent/x.jsonl.zst"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("/nonexistent/x.jsonl.zst: cannot open"), "{err}");
}

#[test]
fn broken_pipe_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<_> = (0..200).map(|i| dir.path().join(format!("f{i}.jsonl"))).collect();
    for p in &paths {
        write_tasks(p, 1);
    }
    // `validate ... | head -1`: the table is longer than what head reads.
    let bin = assert_cmd::cargo::cargo_bin("lego-rl");
    let script = format!(
        "set -o pipefail; {} validate {} | head -c 10 >/dev/null",
        bin.display(),
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let status = std::process::Command::new("bash")
        .args(["-c", &script])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// Child process of `append_writer_survives_sigkill` (runs only when the parent sets the env).
#[test]
#[ignore = "child process of append_writer_survives_sigkill"]
fn append_child() {
    let Ok(path) = std::env::var("LEGO_RL_TEST_APPEND_PATH") else {
        return;
    };
    let (mut w, _) = AppendWriter::open(Path::new(&path)).unwrap();
    for i in 0.. {
        w.push(&task(i)).unwrap();
        if i % 3 == 2 {
            w.commit().unwrap();
        }
    }
}

#[test]
fn append_writer_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.jsonl.zst");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "io::append_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LEGO_RL_TEST_APPEND_PATH", &path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let live = ReadOptions {
        torn_tail: TornTail::Stop,
        ..Default::default()
    };
    let start = Instant::now();
    // A reader of the growing file sees every committed record, in order.
    loop {
        if path.exists() {
            let seen: Vec<Task> = read_all(&path, live).unwrap();
            assert!(seen.iter().enumerate().all(|(i, t)| *t == task(i)));
            if seen.len() >= 300 {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "child wrote too little"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let before: Vec<Task> = read_all(&path, live).unwrap();
    assert!(
        before.len() >= 300 && before.len() % 3 == 0,
        "commits are whole: {}",
        before.len()
    );
    let (mut w, _cut) = AppendWriter::open(&path).unwrap();
    let n = before.len();
    for i in n..n + 5 {
        w.push(&task(i)).unwrap();
    }
    w.commit().unwrap();
    let after: Vec<Task> = read_all(
        &path,
        ReadOptions {
            strict: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(after.len(), n + 5);
    assert!(
        after.iter().enumerate().all(|(i, t)| *t == task(i)),
        "no record lost or duplicated"
    );
}

#[test]
fn example_records_of_every_kind_validate() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/records/examples.jsonl");
    let out = lego().args(["validate", "--json", path]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds = v[0]["kinds"].as_object().unwrap();
    assert_eq!(kinds.len(), lego_rl::records::KNOWN_SCHEMAS.len(), "{kinds:?}");
    assert_eq!(v[0]["bad"], 0);
}
