//! One trial of a rollout: a proxy trial token, the harness rendered for it, a sandbox running it,
//! and the [`Trajectory`] that comes out.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::audit::audit_tool_calls;
use super::judge::classify;
use super::Shared;
use crate::harness::{Launch, TrialContext};
use crate::records::{
    Generation, Record, Task, Termination, Trajectory, CHAT_MODEL, CONTEXT_LIMIT, CONTEXT_REFUSALS,
    HARNESS_SAMPLING, MALFORMED_TOOL_CALLS, REPLAYS, SAMPLING_OVERRIDES,
};
use crate::sandbox::images::{trial_workdir, DEFAULT_WORKDIR};
use crate::sandbox::{relay, Trial as Sandbox, TrialLimits, TrialResult, RUNTIME_DIR};
use crate::text::{sh_quote, tail_bytes};

/// The agent user's home directory in the base image.
pub const AGENT_HOME: &str = "/home/agent";
/// The model name harnesses are told to send.
pub const MODEL_NAME: &str = "policy";
/// Where a harness's standard input is written when the instruction goes there.
pub const STDIN_FILE: &str = "/tmp/lego-agent-stdin";
/// Trajectory metadata key of an infra failure's cause (`<stage>: <error>`).
pub const INFRA_CAUSE: &str = "infra_cause";

/// Metadata key of the harness's own exit status (e.g. mini-swe-agent's `Submitted`), where its
/// adapter says where to read it.
pub const AGENT_EXIT_STATUS: &str = "agent_exit_status";

/// Why trajectory `t` is an infra failure, as rollout recorded it.
pub fn infra_cause(t: &Trajectory) -> Option<&str> {
    t.metadata.get(INFRA_CAUSE).and_then(Value::as_str)
}

/// Time the whole trial may take beyond its stage limits (container start, extract, cleanup)
/// before the watchdog ends it as `infra:timeout`.
const TRIAL_SLACK: Duration = Duration::from_secs(120);

/// The shell script the sandbox runs as the agent user: the harness's environment, its command
/// line, its standard input, in the repository.
pub fn agent_script(launch: &Launch, workdir: &str) -> String {
    let mut s = String::from("set -u\n");
    s.push_str(&format!("mkdir -p {}\n", sh_quote(&launch.logs)));
    s.push_str(&format!("cd {} || exit 125\n", sh_quote(workdir)));
    for (k, v) in &launch.env {
        s.push_str(&format!("export {k}={}\n", sh_quote(v)));
    }
    let argv: Vec<String> = launch.argv.iter().map(|a| sh_quote(a)).collect();
    let stdin = if launch.stdin.is_some() {
        STDIN_FILE
    } else {
        "/dev/null"
    };
    s.push_str(&format!("exec {} < {}\n", argv.join(" "), sh_quote(stdin)));
    s
}

/// The files written into the container before the agent stage: the adapter's files (relative
/// paths are relative to the agent's home) and the standard-input file.
pub fn launch_files(launch: &Launch) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = launch
        .files
        .iter()
        .map(|(path, text)| {
            let path = if path.starts_with('/') {
                path.clone()
            } else {
                format!("{AGENT_HOME}/{path}")
            };
            (path, text.clone().into_bytes())
        })
        .collect();
    if let Some(stdin) = &launch.stdin {
        files.push((STDIN_FILE.to_string(), stdin.clone().into_bytes()));
    }
    files
}

/// One (task, group, sample) to run.
pub struct TrialSpec {
    pub task: Task,
    pub image: String,
    pub group_id: u64,
    pub sample: u32,
    /// The forced script this trial gets: the sample's rank among the group's samples on its
    /// harness (`sample` itself when the whole group is on one harness).
    pub script: u32,
    pub policy_version: u64,
    /// The reload that brought `policy_version` in, when this run made one (its time and
    /// verification go into the trajectory's metadata as `reload`).
    pub reload: Option<Arc<crate::engine::ReloadReport>>,
}

/// Runs one trial to its trajectory; never fails (infrastructure problems become `infra:*`).
pub async fn run_trial(shared: Arc<Shared>, mut spec: TrialSpec) -> Trajectory {
    let trial_id = Trajectory::make_id(&spec.task.id, spec.group_id, spec.sample);
    let workdir = resolve_workdir(&shared, &spec).await;
    spec.task.environment.workdir = Some(workdir.clone());
    let (token, captures) = shared.proxy.register_trial(&trial_id);
    captures.push_script(shared.forced.script(&spec.task.id, spec.script).to_vec());
    let launch = shared.harness.render(&TrialContext {
        instruction: spec.task.instruction.clone(),
        workdir: workdir.clone(),
        home: AGENT_HOME.into(),
        runtime: RUNTIME_DIR.into(),
        proxy_url: relay::proxy_url(&token),
        model: MODEL_NAME.into(),
    });
    let script = agent_script(&launch, &workdir);
    let mut limits = TrialLimits::for_task(&spec.task);
    if let Some(agent) = shared.agent_timeout {
        limits.agent = agent;
    }
    let budget = limits.setup + limits.agent + limits.eval + TRIAL_SLACK;
    let sandbox = Sandbox::new(
        shared.engine.clone(),
        spec.task.clone(),
        shared.task_root.clone(),
        spec.image.clone(),
        &shared.run_id,
        &trial_id,
        limits,
        Vec::new(),
        shared.binds.clone(),
    )
    .with_proxy_socket(shared.socket.clone())
    .with_files(launch_files(&launch))
    .with_outputs(launch.exit_status_file.iter().cloned().collect());
    let result = match tokio::time::timeout(budget, sandbox.run(&script)).await {
        Ok(r) => r,
        Err(_) => TrialResult {
            infra_failure: true,
            infra_cause: Some(format!(
                "timeout: the trial exceeded its budget of {}s",
                budget.as_secs()
            )),
            ..TrialResult::new(Termination::Infra("timeout".into()))
        },
    };
    shared.proxy.finish_trial(&token);
    let generations = captures.generations();
    trajectory(&shared, &spec, &workdir, &launch, result, generations)
}

/// Where the trial's agent works and its diff is taken: see [`trial_workdir`]. The fallback to
/// the default is warned about once per image; an engine error falls back too (the sandbox's
/// setup then fails on the same engine and the trial becomes an infra failure).
async fn resolve_workdir(shared: &Shared, spec: &TrialSpec) -> String {
    static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    match trial_workdir(&shared.engine, &spec.task, &spec.image).await {
        Ok((dir, true)) => dir,
        Ok((dir, false)) => {
            let first = WARNED
                .lock()
                .map(|mut w| w.insert(spec.image.clone()))
                .unwrap_or(false);
            if first {
                tracing::warn!(
                    "task {}: neither the task nor its image {} names a working directory; the agent \
                     runs and is graded in {dir}",
                    spec.task.id,
                    spec.image
                );
            }
            dir
        }
        Err(e) => {
            tracing::warn!("task {}: {e}; the agent runs in {DEFAULT_WORKDIR}", spec.task.id);
            DEFAULT_WORKDIR.to_string()
        }
    }
}

/// The trajectory of a finished trial: the sandbox's result refined by the captures (context
/// limit, turn budget, model-side infrastructure errors) and audit events from the tool calls.
fn trajectory(
    shared: &Shared,
    spec: &TrialSpec,
    workdir: &str,
    launch: &Launch,
    result: TrialResult,
    generations: Vec<Generation>,
) -> Trajectory {
    // The harness's own word on how it ended, where its adapter says where to find it.
    let status = shared.harness.config.exit_status.as_ref().and_then(|e| {
        let file = launch.exit_status_file.as_ref()?;
        e.status_in(result.outputs.get(file)?)
    });
    let termination = classify(
        &result.termination,
        result.agent_exit_code,
        &generations,
        &shared.harness.config,
        status.as_deref(),
    );
    let mut audit = result.audit.clone();
    audit.extend(audit_tool_calls(shared, &generations, workdir));
    // Every rewarded trial is checked for the shapes a hack takes past the gates.
    if let (Some(r), Some(diff)) = (result.reward, &result.diff) {
        if r > 0.0 {
            audit.extend(super::hack_signals::signals(
                diff,
                spec.task.test_patch.as_deref(),
                &spec.task.instruction,
            ));
        }
    }
    let mut metadata = serde_json::Map::new();
    metadata.insert("run_id".into(), json!(shared.run_id));
    metadata.insert("image".into(), json!(spec.image));
    metadata.insert("workdir".into(), json!(workdir));
    if let Some(r) = &spec.reload {
        metadata.insert("reload".into(), json!(r.as_ref()));
    }
    // align finds the policy's tokenizer here without --model.
    metadata.insert(CHAT_MODEL.into(), json!(shared.chat_dir));
    let refused = generations
        .iter()
        .filter(|g| g.status.as_deref() == Some(CONTEXT_LIMIT))
        .count();
    if refused > 0 {
        metadata.insert(CONTEXT_REFUSALS.into(), json!(refused));
    }
    metadata.insert(HARNESS_SAMPLING.into(), json!(shared.harness_sampling.as_str()));
    let overrides = generations.iter().filter(|g| g.sampling_overridden()).count();
    if overrides > 0 {
        metadata.insert(SAMPLING_OVERRIDES.into(), json!(overrides));
    }
    let replays: u64 = generations
        .iter()
        .filter_map(|g| g.extra.get(REPLAYS).and_then(Value::as_u64))
        .sum();
    if replays > 0 {
        metadata.insert(REPLAYS.into(), json!(replays));
    }
    let malformed: u64 = generations.iter().map(Generation::malformed_tool_calls).sum();
    if malformed > 0 {
        metadata.insert(MALFORMED_TOOL_CALLS.into(), json!(malformed));
    }
    if let Some(code) = result.agent_exit_code {
        metadata.insert("agent_exit_code".into(), json!(code));
    }
    if let Some(status) = &status {
        metadata.insert(AGENT_EXIT_STATUS.into(), json!(status));
    }
    let forced = shared.forced.script(&spec.task.id, spec.script).len();
    if forced > 0 {
        metadata.insert("forced_outputs".into(), json!(forced));
    }
    if let Some(cache) = prefix_cache(&generations) {
        metadata.insert("prefix_cache".into(), cache);
    }
    if let Some(log) = &result.agent_log {
        metadata.insert("agent_log_tail".into(), Value::String(tail_bytes(log, 4000)));
    }
    if let Some(cause) = &result.infra_cause {
        metadata.insert(INFRA_CAUSE.into(), json!(cause));
    }
    Trajectory {
        schema: <Trajectory as Record>::SCHEMA.into(),
        id: Trajectory::make_id(&spec.task.id, spec.group_id, spec.sample),
        task_id: spec.task.id.clone(),
        group_id: spec.group_id,
        sample_index: spec.sample,
        harness: shared.harness.config.name.clone(),
        backend: shared.backend_id.clone(),
        policy_version: spec.policy_version,
        sampling: shared.sampling.clone(),
        generations,
        infra_failure: termination.is_infra(),
        termination,
        reward: result.reward,
        grader: result.grader,
        stages: result.stages,
        audit,
        diff: result.diff,
        mode: Some(shared.mode.clone()),
        metadata,
        dynamic_sampling: None,
    }
}

/// `{prompt_tokens, cached_tokens}` summed over the generations whose backend said how many of
/// their prompt tokens came from its prefix cache (None when none did).
fn prefix_cache(generations: &[Generation]) -> Option<Value> {
    let (mut prompt, mut cached, mut any) = (0u64, 0u64, false);
    for g in generations {
        if let Some(n) = g.extra.get("cached_tokens").and_then(Value::as_u64) {
            prompt += g.prompt_ids.len() as u64;
            cached += n;
            any = true;
        }
    }
    any.then(|| json!({"prompt_tokens": prompt, "cached_tokens": cached}))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn agent_script_quotes_everything() {
        let launch = Launch {
            argv: vec![
                "/opt/lego-agent/bin/mini".into(),
                "-t".into(),
                "it's a task".into(),
            ],
            env: BTreeMap::from([("HOME".to_string(), "/home/agent".to_string())]),
            files: BTreeMap::from([("cfg.yaml".to_string(), "a: 1".to_string())]),
            stdin: Some("hello".into()),
            logs: "/tmp/logs".into(),
            exit_status_file: None,
        };
        let s = agent_script(&launch, "/testbed");
        assert!(s.contains("export HOME='/home/agent'\n"), "{s}");
        assert!(s.contains(r"'it'\''s a task'"), "{s}");
        assert!(s.contains(&format!("< '{STDIN_FILE}'")), "{s}");
        let files = launch_files(&launch);
        assert_eq!(files[0].0, "/home/agent/cfg.yaml");
        assert_eq!(files[1], (STDIN_FILE.to_string(), b"hello".to_vec()));
    }
}
