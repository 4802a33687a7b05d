//! One trial of a rollout: a proxy trial token, the harness rendered for it, a sandbox running it,
//! and the [`Trajectory`] that comes out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::Shared;
use crate::chat::ToolCallIds;
use crate::harness::{HarnessConfig, Launch, TrialContext};
use crate::records::{
    AuditEvent, Generation, Record, Task, Termination, Trajectory, CHAT_MODEL, CONTEXT_LIMIT,
    CONTEXT_REFUSALS, MALFORMED_TOOL_CALLS,
};
use crate::sandbox::{relay, Trial as Sandbox, TrialLimits, TrialResult};

/// Where the harness runtime is mounted in the container.
pub const RUNTIME_DIR: &str = "/opt/lego-agent";
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

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

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
    pub policy_version: u64,
}

/// Runs one trial to its trajectory; never fails (infrastructure problems become `infra:*`).
pub async fn run_trial(shared: Arc<Shared>, spec: TrialSpec) -> Trajectory {
    let trial_id = Trajectory::make_id(&spec.task.id, spec.group_id, spec.sample);
    let (token, captures) = shared.proxy.register_trial(&trial_id);
    captures.push_script(shared.forced.script(&spec.task.id, spec.sample).to_vec());
    let workdir = spec
        .task
        .environment
        .workdir
        .clone()
        .unwrap_or_else(|| crate::sandbox::images::DEFAULT_WORKDIR.to_string());
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
            termination: Termination::Infra("timeout".into()),
            infra_failure: true,
            reward: None,
            grader: None,
            stages: BTreeMap::new(),
            audit: Vec::new(),
            diff: None,
            agent_log: None,
            infra_cause: Some(format!(
                "timeout: the trial exceeded its budget of {}s",
                budget.as_secs()
            )),
            outputs: BTreeMap::new(),
        },
    };
    shared.proxy.finish_trial(&token);
    let generations = captures.generations();
    trajectory(&shared, &spec, &workdir, &launch, result, generations)
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
    let exit_code = result
        .stages
        .get("agent")
        .and_then(|s| s.outcome.strip_prefix("exit Some("))
        .and_then(|s| s.strip_suffix(')'))
        .and_then(|s| s.parse::<i64>().ok());
    let termination = classify(
        &result.termination,
        exit_code,
        &generations,
        &shared.harness.config,
        status.as_deref(),
    );
    let mut audit = result.audit.clone();
    audit.extend(audit_tool_calls(shared, &generations, workdir));
    let mut metadata = serde_json::Map::new();
    metadata.insert("run_id".into(), json!(shared.run_id));
    metadata.insert("image".into(), json!(spec.image));
    // align finds the policy's tokenizer here without --model.
    metadata.insert(CHAT_MODEL.into(), json!(shared.chat_dir));
    let refused = generations
        .iter()
        .filter(|g| g.status.as_deref() == Some(CONTEXT_LIMIT))
        .count();
    if refused > 0 {
        metadata.insert(CONTEXT_REFUSALS.into(), json!(refused));
    }
    let malformed: u64 = generations.iter().map(Generation::malformed_tool_calls).sum();
    if malformed > 0 {
        metadata.insert(MALFORMED_TOOL_CALLS.into(), json!(malformed));
    }
    if let Some(code) = exit_code {
        metadata.insert("agent_exit_code".into(), json!(code));
    }
    if let Some(status) = &status {
        metadata.insert(AGENT_EXIT_STATUS.into(), json!(status));
    }
    let forced = shared.forced.script(&spec.task.id, spec.sample).len();
    if forced > 0 {
        metadata.insert("forced_outputs".into(), json!(forced));
    }
    if let Some(cache) = prefix_cache(&generations) {
        metadata.insert("prefix_cache".into(), cache);
    }
    if let Some(log) = &result.agent_log {
        metadata.insert("agent_log_tail".into(), Value::String(tail(log, 4000)));
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

fn tail(s: &str, n: usize) -> String {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    s[i..].to_string()
}

/// How a trial ended, refining the sandbox's view with the captures and the harness's own exit
/// status (`status`, from [`HarnessConfig::exit_status`]): a model-side failure is
/// `infra:model`; a trial whose last request was refused for the context is `context_limit`
/// (one that recovered from an earlier refusal is judged on); a status the adapter lists
/// decides `finished` / `max_turns` / `agent_crash`; otherwise an adapter's turn-budget exit
/// code, or a main thread that used the whole turn budget, is `max_turns`.
pub fn classify(
    sandbox: &Termination,
    exit_code: Option<i64>,
    generations: &[Generation],
    harness: &HarnessConfig,
    status: Option<&str>,
) -> Termination {
    if sandbox.is_infra() {
        return sandbox.clone();
    }
    // The proxy records a prompt it refused for the context as `status: "context_limit"`. A
    // harness that recovers (compacts and goes on) is judged by what it did next; one whose last
    // request was refused ended on the context limit, whatever it then printed.
    if generations
        .last()
        .is_some_and(|g| g.status.as_deref() == Some(CONTEXT_LIMIT))
    {
        return Termination::ContextLimit;
    }
    if generations
        .iter()
        .any(|g| g.status.as_deref() == Some("infra_error"))
    {
        return Termination::Infra("model".into());
    }
    if matches!(sandbox, Termination::AgentTimeout) {
        return sandbox.clone();
    }
    if let (Some(status), Some(rule)) = (status, &harness.exit_status) {
        let listed = |l: &[String]| l.iter().any(|s| s == status);
        if listed(&rule.max_turns) {
            return Termination::MaxTurns;
        }
        if listed(&rule.agent_crash) && matches!(sandbox, Termination::Finished | Termination::AgentCrash) {
            // The harness gave up, in its own words, whatever its exit code (OpenHands' stuck
            // detector exits 0) and however many turns it used.
            return Termination::AgentCrash;
        }
        if listed(&rule.finished) && matches!(sandbox, Termination::Finished) {
            // Submitted, possibly on its last allowed turn: not a budget stop.
            return Termination::Finished;
        }
    }
    if exit_code.is_some_and(|c| harness.max_turns_exit_codes.contains(&c)) {
        return Termination::MaxTurns;
    }
    let main_turns = generations.iter().filter(|g| g.thread == 0).count();
    if harness.max_turns > 0 && main_turns >= harness.max_turns as usize {
        return Termination::MaxTurns;
    }
    sandbox.clone()
}

/// Paths a command may touch without being counted as reading outside the repository.
const OWN_PREFIXES: &[&str] = &[
    "/tmp",
    "/dev/",
    "/usr/",
    "/bin/",
    "/sbin/",
    "/lib",
    "/etc/alternatives",
    "/proc/self/fd",
    "/opt/lego-agent",
];

/// Audit events from the commands the agent ran (tool-call arguments of its generations):
/// `git_history` for commands touching `.git` or git history, `outside_read` for absolute paths
/// outside the repository, home, /tmp and system directories.
pub fn audit_tool_calls(shared: &Shared, generations: &[Generation], workdir: &str) -> Vec<AuditEvent> {
    let mut out = Vec::new();
    for g in generations {
        let Ok(parsed) = shared.chat.parse_output(
            &g.output_ids,
            ToolCallIds::new("audit", u64::from(g.index)),
            false,
            &[],
            &g.sampling.stop,
        ) else {
            continue;
        };
        for call in &parsed.tool_calls {
            let text = serde_json::from_str::<Value>(&call.arguments)
                .ok()
                .and_then(|v| {
                    v.as_object().map(|o| {
                        o.values()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                })
                .unwrap_or_else(|| call.arguments.clone());
            out.extend(
                audit_command(&text, workdir)
                    .into_iter()
                    .map(|(kind, detail)| AuditEvent {
                        kind: kind.into(),
                        detail,
                        generation: Some(g.index),
                    }),
            );
        }
    }
    out
}

/// Audit kinds found in one command text.
pub fn audit_command(cmd: &str, workdir: &str) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let short: String = cmd.chars().take(300).collect();
    let touches_git_dir = cmd.match_indices(".git").any(|(i, _)| {
        let after = cmd[i + 4..].chars().next();
        !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    });
    let history = [
        "git log",
        "git reflog",
        "git show",
        "git fsck",
        "git cat-file",
        "git stash list",
        "git checkout ",
    ]
    .iter()
    .any(|p| cmd.contains(p));
    if touches_git_dir || history {
        out.push(("git_history", short.clone()));
    }
    let home = format!("{AGENT_HOME}/");
    for word in cmd.split(|c: char| {
        c.is_whitespace()
            || matches!(
                c,
                '"' | '\'' | '<' | '>' | ';' | '|' | '&' | '(' | ')' | '=' | ','
            )
    }) {
        if !word.starts_with('/') || word.len() < 2 {
            continue;
        }
        let inside = word == workdir
            || word.starts_with(&format!("{}/", workdir.trim_end_matches('/')))
            || word.starts_with(&home)
            || word == AGENT_HOME
            || OWN_PREFIXES.iter().any(|p| word.starts_with(p));
        if !inside {
            out.push(("outside_read", word.to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(thread: u32, status: &str) -> Generation {
        Generation {
            thread,
            status: Some(status.into()),
            ..Default::default()
        }
    }

    /// mini-swe-agent's exit-status rule.
    const MINI_RULE: &str =
        "[exit_status]\nfile = \"{logs}/trajectory.json\"\npointer = \"/info/exit_status\"\n\
                             finished = [\"Submitted\"]\nmax_turns = [\"LimitsExceeded\"]\n";

    /// An adapter with a turn budget, turn-budget exit codes and optionally mini-swe-agent's
    /// exit-status rule.
    fn harness(max_turns: u32, codes: &[i64], status_rule: bool) -> HarnessConfig {
        harness_with(max_turns, codes, if status_rule { MINI_RULE } else { "" })
    }

    /// An adapter with a turn budget, turn-budget exit codes and the given `[exit_status]` text.
    fn harness_with(max_turns: u32, codes: &[i64], rule: &str) -> HarnessConfig {
        let text = format!(
            "name = \"h\"\ndescription = \"d\"\napi = \"openai\"\ncommand = [\"run\", \"{{instruction}}\"]\n\
             max_turns = {max_turns}\nmax_turns_exit_codes = {codes:?}\n[runtime]\n{rule}"
        );
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn classification_refines_the_sandbox() {
        let ok = vec![gen(0, "ok"), gen(0, "ok"), gen(1, "ok")];
        let fin = Termination::Finished;
        assert_eq!(classify(&fin, Some(0), &ok, &harness(50, &[], false), None), fin);
        assert_eq!(
            classify(&fin, Some(0), &ok, &harness(2, &[], false), None),
            Termination::MaxTurns
        );
        assert_eq!(
            classify(
                &Termination::AgentCrash,
                Some(3),
                &ok,
                &harness(50, &[3], false),
                None
            ),
            Termination::MaxTurns
        );
        assert_eq!(
            classify(
                &Termination::AgentCrash,
                Some(1),
                &ok,
                &harness(50, &[3], false),
                None
            ),
            Termination::AgentCrash
        );
        // The last request refused for the context: `context_limit`, however the harness exited;
        // a refusal the harness recovered from (it compacted and went on) does not decide.
        let mut ctx = ok.clone();
        ctx.push(gen(0, CONTEXT_LIMIT));
        for sandbox in [Termination::AgentCrash, Termination::Finished] {
            assert_eq!(
                classify(&sandbox, Some(1), &ctx, &harness(50, &[], false), None),
                Termination::ContextLimit
            );
        }
        let mut recovered = ctx.clone();
        recovered.push(gen(1, "ok"));
        assert_eq!(
            classify(&fin, Some(0), &recovered, &harness(50, &[], false), None),
            fin
        );
        let mut down = ok.clone();
        down.push(gen(0, "infra_error"));
        assert_eq!(
            classify(
                &Termination::AgentCrash,
                Some(1),
                &down,
                &harness(50, &[], false),
                None
            ),
            Termination::Infra("model".into())
        );
        let setup = Termination::Infra("setup".into());
        assert_eq!(classify(&setup, None, &[], &harness(50, &[], false), None), setup);
    }

    #[test]
    fn the_harness_exit_status_decides_between_finished_and_max_turns() {
        let two = vec![gen(0, "ok"), gen(0, "ok")];
        let fin = Termination::Finished;
        let h = harness(2, &[], true);
        // Submitted on the last allowed turn: finished, not a budget stop.
        assert_eq!(classify(&fin, Some(0), &two, &h, Some("Submitted")), fin);
        // The harness says its budget ran out, whatever the turn count.
        assert_eq!(
            classify(&fin, Some(0), &two[..1], &h, Some("LimitsExceeded")),
            Termination::MaxTurns
        );
        // An unlisted status, or none (no file), falls back to the turn count.
        assert_eq!(
            classify(&fin, Some(0), &two, &h, Some("KeyError")),
            Termination::MaxTurns
        );
        assert_eq!(classify(&fin, Some(0), &two, &h, None), Termination::MaxTurns);
        // "Submitted" does not hide a crash, a timeout or an infra failure.
        assert_eq!(
            classify(&Termination::AgentCrash, Some(1), &two, &h, Some("Submitted")),
            Termination::MaxTurns
        );
        assert_eq!(
            classify(&Termination::AgentTimeout, None, &two[..1], &h, Some("Submitted")),
            Termination::AgentTimeout
        );
        let rule = h.exit_status.as_ref().unwrap();
        let file = r#"{"info": {"exit_status": "Submitted", "submission": ""}, "messages": []}"#;
        assert_eq!(rule.status_in(file).as_deref(), Some("Submitted"));
        assert_eq!(rule.status_in("{\"info\": {}}"), None);
        assert_eq!(rule.status_in("not json"), None);
        // JSON Lines (Claude Code's teed stream-json stdout): the last `result` record decides.
        let h = harness_with(
            2,
            &[],
            "[exit_status]\nfile = \"{logs}/claude.jsonl\"\nformat = \"jsonl\"\npointer = \"/subtype\"\n\
             record = { \"/type\" = \"result\" }\nfinished = [\"success\"]\nmax_turns = [\"error_max_turns\"]\n",
        );
        let rule = h.exit_status.as_ref().unwrap();
        let init = "{\"type\":\"system\",\"subtype\":\"init\"}";
        let stream = format!(
            "{init}\n[SandboxDebug] not json\n{{\"subtype\":\"success\",\"is_error\":false,\"type\":\"result\"}}\n\
             {{\"type\":\"system\",\"subtype\":\"post_turn_summary\"}}\n\n"
        );
        let status = rule.status_in(&stream);
        assert_eq!(status.as_deref(), Some("success"));
        assert_eq!(classify(&fin, Some(0), &two, &h, status.as_deref()), fin);
        let out_of_turns = format!("{init}\n{{\"type\":\"result\",\"subtype\":\"error_max_turns\"}}\n");
        let status = rule.status_in(&out_of_turns);
        assert_eq!(status.as_deref(), Some("error_max_turns"));
        assert_eq!(
            classify(
                &Termination::AgentCrash,
                Some(1),
                &two[..1],
                &h,
                status.as_deref()
            ),
            Termination::MaxTurns
        );
        // Killed mid-write, before any result: no status, not the `init` record's subtype.
        assert_eq!(
            rule.status_in(&format!("{init}\n{{\"type\":\"result\",\"sub")),
            None
        );
        assert_eq!(rule.status_in(""), None);
        // Without `record`, the last JSON record is read.
        let mut any = rule.clone();
        any.record.clear();
        assert_eq!(any.status_in(&stream).as_deref(), Some("post_turn_summary"));
    }

    #[test]
    fn an_agent_crash_status_overrides_a_clean_exit_and_the_turn_count() {
        let two = vec![gen(0, "ok"), gen(0, "ok")];
        let h = harness_with(
            2,
            &[],
            "[exit_status]\nfile = \"{logs}/status.json\"\npointer = \"/status\"\n\
             finished = [\"finished\"]\nmax_turns = [\"MaxIterationsReached\"]\nagent_crash = [\"stuck\"]\n",
        );
        let fin = Termination::Finished;
        // OpenHands' stuck detector ends run() normally: exit 0, yet the agent did not finish.
        assert_eq!(
            classify(&fin, Some(0), &two[..1], &h, Some("stuck")),
            Termination::AgentCrash
        );
        assert_eq!(
            classify(&fin, Some(0), &two, &h, Some("stuck")),
            Termination::AgentCrash
        );
        assert_eq!(
            classify(&Termination::AgentCrash, Some(1), &two, &h, Some("stuck")),
            Termination::AgentCrash
        );
        // Timeouts and the model's failures still come first.
        assert_eq!(
            classify(&Termination::AgentTimeout, None, &two, &h, Some("stuck")),
            Termination::AgentTimeout
        );
        let down = vec![gen(0, "infra_error")];
        assert_eq!(
            classify(&fin, Some(0), &down, &h, Some("stuck")),
            Termination::Infra("model".into())
        );
        assert_eq!(
            classify(&fin, Some(0), &two[..1], &h, Some("MaxIterationsReached")),
            Termination::MaxTurns
        );
    }

    #[test]
    fn audit_finds_git_and_outside_paths() {
        let kinds =
            |c: &str| -> Vec<&str> { audit_command(c, "/testbed").into_iter().map(|(k, _)| k).collect() };
        assert_eq!(kinds("ls -la .git/refs"), ["git_history"]);
        assert_eq!(kinds("git log --oneline"), ["git_history"]);
        assert!(kinds("cat .gitignore").is_empty());
        assert!(kinds("grep -n foo /testbed/src/a.py /tmp/x 2>/dev/null").is_empty());
        assert_eq!(kinds("cat /etc/passwd"), ["outside_read"]);
        assert_eq!(kinds("ls /root/.ssh"), ["outside_read"]);
        assert!(kinds("sed -i 's/a/b/' x.py").is_empty());
    }

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
