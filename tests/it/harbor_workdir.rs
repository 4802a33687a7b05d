//! A Harbor task whose working directory only its image names (the Dockerfile's final stage
//! inherits `WORKDIR /app` from an earlier one, as from a prebuilt base; neither task.toml nor the
//! record names it), through `rollout`: the agent works where the image says, as under Harbor.
//! The forced script writes `hello.txt` in the agent's working directory and the verifier reads
//! `/app/hello.txt`, so the reward is 1 only there (in the old fallback, /testbed, it was 0).

use std::path::{Path, PathBuf};

use lego_rl::io::{read_all, ReadOptions};
use lego_rl::records::{Task, Trajectory};
use serde_json::json;

use crate::common::{docker_available, lego, root};

pub(crate) const ID: &str = "harbor__inherited-workdir";

/// The hello-world task under [`ID`] with the inherited-WORKDIR Dockerfile, and its images (also
/// filter-tasks' validity test's).
pub(crate) fn task_and_images(dir: &Path) -> (PathBuf, PathBuf) {
    let all: Vec<Task> =
        read_all(&root().join("testdata/tasks/tasks.jsonl"), ReadOptions::default()).unwrap();
    let mut task = all.into_iter().find(|t| t.id == "harbor__hello-world").unwrap();
    task.absolutize_paths(&root().join("testdata/tasks"));
    task.id = ID.into();
    task.environment.dockerfile = Some("FROM lego-rl/base:trixie AS app\nWORKDIR /app\nFROM app\n".into());
    task.environment.workdir = None;
    let tasks = dir.join("tasks.jsonl");
    std::fs::write(&tasks, serde_json::to_string(&task).unwrap() + "\n").unwrap();
    let images = dir.join("images.jsonl.zst");
    lego()
        .args(["build-images", "-i"])
        .arg(&tasks)
        .arg("-o")
        .arg(&images)
        .arg("--log-dir")
        .arg(dir.join("logs"))
        .assert()
        .success();
    (tasks, images)
}

fn call(text: &str, command: &str) -> String {
    let args = json!({"name": "bash", "arguments": {"command": command}});
    format!("{text}\n<tool_call>\n{args}\n</tool_call>")
}

#[test]
fn rollout_runs_the_agent_in_the_working_directory_its_image_sets() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (tasks, images) = task_and_images(dir.path());
    let forced = dir.path().join("forced.json");
    let script = [
        call(
            "Writing the file here.",
            "echo 'Hello, world!' > hello.txt && pwd",
        ),
        call("Done; submitting.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    ];
    let doc = json!({"schema": "lego-rl/forced/v1", "tasks": {ID: [script]}});
    std::fs::write(&forced, doc.to_string()).unwrap();
    let out = dir.path().join("out.jsonl.zst");
    lego()
        .arg("rollout")
        .arg("-i")
        .arg(&tasks)
        .arg("--images")
        .arg(&images)
        .arg("--harness")
        .arg(root().join("examples/harnesses/mini-swe-agent.toml"))
        .arg("--backend")
        .arg(format!("embedded:{}", crate::model::tiny_moe().display()))
        .arg("--chat-model")
        .arg(crate::rollout::chat_dir())
        .arg("--forced")
        .arg(&forced)
        .args([
            "--max-turns",
            "4",
            "--group-size",
            "1",
            "--run-id",
            "it-harbor-workdir",
            "-o",
        ])
        .arg(&out)
        .assert()
        .success();
    let t: Vec<Trajectory> = crate::rollout::read(&out);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].metadata["workdir"], "/app", "{:?}", t[0].metadata);
    assert_eq!(t[0].reward, Some(1.0), "{:?} {:?}", t[0].termination, t[0].grader);
}
