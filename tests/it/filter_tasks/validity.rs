//! The validity stage on the real Docker engine: the testdata tasks (6 SWE-style, 2 Harbor) are
//! kept; `invalid.jsonl`'s broken grader (its FAIL_TO_PASS test passes without the fix) is
//! rejected as `passes_without_fix`, and its flaky task (a set-order test in PASS_TO_PASS) is
//! rejected at one run and named `flaky` with `--validity-runs 3`; a Harbor task whose working
//! directory only its image names is checked there. Images come from `build-images` through the
//! CLI. Skipped without Docker unless `CI` is set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::{ImageRecord, Task};
use lego_rl::sandbox::images::{trial_workdir, DEFAULT_WORKDIR};
use lego_rl::sandbox::Engine;
use serde_json::Value;

use super::{filter, read_jsonl, testdata};
use crate::common::{docker_available, lego};

/// The manifests of `tasks.jsonl` and `invalid.jsonl`, built once per test binary through the CLI
/// (bootstrapping the base image when the engine lacks it).
fn manifests() -> &'static [PathBuf; 2] {
    static M: OnceLock<[PathBuf; 2]> = OnceLock::new();
    M.get_or_init(|| {
        let have_base = Command::new("docker")
            .args(["image", "inspect", "lego-rl/base:trixie"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !have_base {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bootstrap-base-image.sh");
            assert!(Command::new(script).status().expect("bootstrap").success());
        }
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        ["tasks", "invalid"].map(|name| {
            let out = tmp.join(format!("validity-images-{name}.jsonl.zst"));
            let o = lego()
                .args(["build-images", "-j", "2", "-i"])
                .arg(testdata(&format!("tasks/{name}.jsonl")))
                .arg("-o")
                .arg(&out)
                .arg("--log-dir")
                .arg(tmp.join("validity-build-logs"))
                .output()
                .expect("build-images runs");
            assert!(
                o.status.success(),
                "build-images {name}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            out
        })
    })
}

fn images_args() -> Vec<String> {
    manifests()
        .iter()
        .flat_map(|m| ["--images".to_string(), m.display().to_string()])
        .collect()
}

fn decision<'a>(decisions: &'a [Value], id: &str) -> &'a Value {
    decisions
        .iter()
        .find(|d| d["task_id"] == id)
        .unwrap_or_else(|| panic!("no decision for {id}"))
}

#[test]
fn validity_keeps_real_tasks_and_rejects_a_grader_that_passes_without_the_fix() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kept.jsonl");
    let funnel = dir.path().join("funnel.csv");
    let decisions = dir.path().join("decisions.jsonl");
    let mut args: Vec<String> = [
        "-o",
        out.to_str().unwrap(),
        "--funnel",
        funnel.to_str().unwrap(),
        "--decisions",
        decisions.to_str().unwrap(),
        "--stages",
        "validity",
        "-j",
        "2",
    ]
    .map(String::from)
    .to_vec();
    args.extend(images_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = filter(
        &[testdata("tasks/tasks.jsonl"), testdata("tasks/invalid.jsonl")],
        &args,
    );
    assert_eq!(code, 0, "{stderr}");
    let kept: Vec<String> = read_jsonl(&out)
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kept,
        [
            "inflection__ordinal-teens",
            "semver__bump-minor-patch",
            "cachetools__lru-recency",
            "ordered-set__discard-index",
            "iniconfig__semicolon-comments",
            "xmltodict__attr-namespace",
            "harbor__hello-world",
            "harbor__multi-reward",
            "harbor__reward-txt",
        ],
        "{stdout}"
    );
    let dec = read_jsonl(&decisions);
    assert_eq!(dec.len(), 11);
    // The broken grader: its FAIL_TO_PASS test passes on the unfixed code.
    let b = decision(&dec, "inflection__broken-grader");
    assert_eq!(
        (b["kept"].as_bool(), b["stage"].as_str(), b["reason"].as_str()),
        (Some(false), Some("validity"), Some("passes_without_fix")),
        "{b}"
    );
    assert_eq!(b["evidence"]["reward"], 1.0);
    assert_eq!(
        b["evidence"]["fail_to_pass_passing"]["tests"][0],
        "tests_lego/test_regression.py::test_other_suffixes_unchanged"
    );
    // The flaky task is rejected at one run too, by whichever check its coin flips failed.
    let f = decision(&dec, "inflection__flaky-order");
    assert_eq!(
        (f["kept"].as_bool(), f["stage"].as_str()),
        (Some(false), Some("validity"))
    );
    assert!(
        ["p2p_fails_without_fix", "gold_does_not_resolve"].contains(&f["reason"].as_str().unwrap()),
        "{f}"
    );
    // Kept tasks carry what the runs showed.
    let s = decision(&dec, "semver__bump-minor-patch");
    assert_eq!(s["kept"], true);
    let v = &s["evidence"]["validity"];
    assert_eq!(
        (
            v["runs"].as_u64(),
            v["reward_without_fix"].as_f64(),
            v["reward_with_fix"].as_f64()
        ),
        (Some(1), Some(0.0), Some(1.0)),
        "{s}"
    );
    assert_eq!(v["gold_apply"], "git apply");
    assert_eq!(v["fail_to_pass"], 5);
    let h = decision(&dec, "harbor__multi-reward");
    assert_eq!(h["evidence"]["validity"]["reward_with_fix"], 1.0, "{h}");
    let csv = std::fs::read_to_string(&funnel).unwrap();
    assert!(
        csv.starts_with("stage,in,out,dropped,reason,count\ningest,11,11,0,,0\n"),
        "{csv}"
    );
    assert!(csv.contains("validity,11,9,2,passes_without_fix,1\n"), "{csv}");
    assert!(stdout.contains("passes_without_fix"), "{stdout}");
}

/// A subset of the testdata records with their relative paths made absolute (so it can live in
/// a temporary directory).
fn subset(ids: &[&str], to: &Path) {
    let root = testdata("tasks");
    let mut lines = String::new();
    for file in ["tasks.jsonl", "invalid.jsonl"] {
        for mut t in read_jsonl(&root.join(file)) {
            if !ids.contains(&t["id"].as_str().unwrap()) {
                continue;
            }
            for ptr in [
                "/environment/repo_source/path",
                "/environment/context",
                "/grader/tests_dir",
                "/metadata/solution_dir",
            ] {
                if let Some(v) = t.pointer_mut(ptr) {
                    *v = Value::String(root.join(v.as_str().unwrap()).display().to_string());
                }
            }
            lines.push_str(&format!("{t}\n"));
        }
    }
    std::fs::write(to, lines).unwrap();
}

#[test]
fn validity_runs_detect_a_flaky_test() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("tasks.jsonl");
    subset(
        &[
            "inflection__flaky-order",
            "semver__bump-minor-patch",
            "harbor__hello-world",
        ],
        &input,
    );
    let out = dir.path().join("kept.jsonl");
    let funnel = dir.path().join("funnel.csv");
    let decisions = dir.path().join("decisions.jsonl");
    let mut args: Vec<String> = [
        "-o",
        out.to_str().unwrap(),
        "--funnel",
        funnel.to_str().unwrap(),
        "--decisions",
        decisions.to_str().unwrap(),
        "--validity-runs",
        "3",
        "-j",
        "2",
    ]
    .map(String::from)
    .to_vec();
    args.extend(images_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, stderr) = filter(&[input], &args);
    assert_eq!(code, 0, "{stderr}");
    let dec = read_jsonl(&decisions);
    let f = decision(&dec, "inflection__flaky-order");
    assert_eq!(
        (f["kept"].as_bool(), f["stage"].as_str(), f["reason"].as_str()),
        (Some(false), Some("validity"), Some("flaky")),
        "{f}"
    );
    let ev = &f["evidence"];
    assert_eq!(ev["runs"], 3);
    let tests = ev["tests"].as_object().unwrap();
    assert!(!tests.is_empty());
    for (name, per_check) in tests {
        // Only the set-order cases flip; every listed check saw both outcomes in 3 runs.
        assert!(name.starts_with("tests_lego/test_flaky.py::"), "{name}");
        for statuses in per_check.as_object().unwrap().values() {
            let s: Vec<&str> = statuses
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(s.len(), 3);
            assert!(s.contains(&"PASSED") && s.contains(&"FAILED"), "{name}: {s:?}");
        }
    }
    // Tasks without flaky tests are stable over 3 runs of both checks.
    for id in ["semver__bump-minor-patch", "harbor__hello-world"] {
        let d = decision(&dec, id);
        assert_eq!(d["kept"], true, "{d}");
        assert_eq!(d["evidence"]["validity"]["runs"], 3, "{d}");
    }
    let csv = std::fs::read_to_string(&funnel).unwrap();
    assert!(csv.contains("validity,3,2,1,flaky,1\n"), "{csv}");
    assert_eq!(read_jsonl(&out).len(), 2);
}

/// A Harbor task whose working directory only its image knows: the Dockerfile's final stage
/// inherits `WORKDIR /app` from an earlier stage (as from a prebuilt base), and neither task.toml
/// nor the record names it. The solution writes `hello.txt` where it runs and the verifier reads
/// `/app/hello.txt`, so the task is valid only when the trial works where the image says (Harbor's
/// behaviour). Without that it ran in /testbed and was rejected as `gold_does_not_resolve`.
#[test]
fn validity_runs_a_harbor_task_in_the_working_directory_its_image_sets() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (input, images) = crate::harbor_workdir::task_and_images(dir.path());
    // What rollout's trials use: the image's WORKDIR; the base image sets none (the default).
    let record: Vec<ImageRecord> = read_all(&images, ReadOptions::default()).unwrap();
    let task_record: Task = read_all(&input, ReadOptions::default()).unwrap().remove(0);
    let rt = crate::sandbox::rt();
    let engine = rt.block_on(Engine::connect()).expect("engine");
    let workdir = |image: &str| rt.block_on(trial_workdir(&engine, &task_record, image)).unwrap();
    assert_eq!(workdir(&record[0].image), ("/app".to_string(), true));
    assert_eq!(
        workdir("lego-rl/base:trixie"),
        (DEFAULT_WORKDIR.to_string(), false)
    );
    let out = dir.path().join("kept.jsonl");
    let decisions = dir.path().join("decisions.jsonl");
    let args = [
        "-o",
        out.to_str().unwrap(),
        "--decisions",
        decisions.to_str().unwrap(),
        "--stages",
        "validity",
        "--images",
        images.to_str().unwrap(),
    ];
    let (code, stdout, stderr) = filter(&[input], &args);
    assert_eq!(code, 0, "{stderr}");
    let dec = read_jsonl(&decisions);
    let d = decision(&dec, crate::harbor_workdir::ID);
    assert_eq!(d["kept"], true, "{d}\n{stdout}");
    assert_eq!(read_jsonl(&out).len(), 1);
}
