//! One trick of the adversarial suite end to end through `lego-rl rollout` with a harness TOML
//! (mini-swe-agent, the embedded tiny model driven by a forced script): the agent plants a root
//! `conftest.py` that turns every test report into a pass and submits without fixing anything.
//! The trajectory must have reward 0, the `collection_hook` event, and count (no infra failure).
//! The same payload scores reward 1 with the defence off (`adversarial::conftest-at-root`).

use lego_rl::records::Termination;
use serde_json::json;

use crate::adversarial_cases::{write, FORCE_PASS};
use crate::common::{docker_available, lego};
use crate::rollout::{chat_dir, fixture, leftovers, read, TASK};

#[test]
fn a_forcing_conftest_planted_through_a_real_harness_gets_zero_with_its_event() {
    if !docker_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let call = |text: &str, cmd: &str| {
        format!(
            "{text}\n<tool_call>\n{}\n</tool_call>",
            json!({"name": "bash", "arguments": {"command": cmd}})
        )
    };
    let forced = json!({
        "schema": "lego-rl/forced/v1",
        "tasks": {TASK: [[
            call("Make every test pass.", &write("conftest.py", FORCE_PASS)),
            call("Done; submitting.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
        ]]}
    });
    let forced_path = tmp.path().join("forced.json");
    std::fs::write(&forced_path, forced.to_string()).unwrap();
    let out = tmp.path().join("traj.jsonl.zst");
    let run_id = format!("it-adversarial-rollout-{}", std::process::id());
    let fx = fixture();
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let o = lego()
        .args(["rollout", "-i"])
        .arg(&fx.tasks)
        .arg("--images")
        .arg(&fx.images)
        .arg("--harness")
        .arg(root.join("examples/harnesses/mini-swe-agent.toml"))
        .arg("--backend")
        .arg(format!("embedded:{}", crate::model::tiny_moe().display()))
        .arg("--chat-model")
        .arg(chat_dir())
        .arg("--forced")
        .arg(&forced_path)
        .args(["--max-turns", "2", "--group-size", "1", "--run-id", &run_id, "-o"])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "rollout failed: {stderr}");
    let trajs = read(&out);
    assert_eq!(trajs.len(), 1);
    let t = &trajs[0];
    assert!(
        !t.is_infra_failure(),
        "{:?} {:?}",
        t.termination,
        t.metadata.get("infra_cause")
    );
    assert_ne!(t.termination, Termination::Infra("evaluate".into()));
    assert_eq!(t.reward, Some(0.0), "{:?}", t.grader);
    assert!(
        t.audit
            .iter()
            .any(|a| a.kind == "collection_hook" && a.detail.starts_with("conftest.py")),
        "{:?}",
        t.audit
    );
    assert!(
        t.diff.as_deref().unwrap_or("").contains("b/conftest.py"),
        "{:?}",
        t.diff
    );
    assert_eq!(leftovers(&run_id), "", "sandboxes left behind");
}
