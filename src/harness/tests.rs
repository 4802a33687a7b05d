//! The example adapters load and render as each harness's documented invocation expects.

use super::*;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/harnesses")
}

fn ctx() -> TrialContext {
    TrialContext {
        instruction: "Fix {workdir}: the {parser} drops tokens".into(),
        workdir: "/testbed".into(),
        home: "/home/agent".into(),
        runtime: "/opt/lego-agent".into(),
        proxy_url: "http://10.0.0.1:8470/t/tok123/".into(),
        model: "policy".into(),
    }
}

#[test]
fn every_example_adapter_loads() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(examples()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let h = Harness::load(&path).unwrap_or_else(|e| panic!("{e}"));
            names.push(h.config.name.clone());
        }
    }
    names.sort();
    assert_eq!(
        names,
        ["claude-code", "mini-swe-agent", "opencode", "openhands-sdk"]
    );
    // The learning benchmark's variant, and where both read mini-swe-agent's exit status.
    let short = examples().join("../learn/mini-swe-agent-short.toml");
    let short = Harness::load(&short).unwrap_or_else(|e| panic!("{e}"));
    let full = Harness::load(&examples().join("mini-swe-agent.toml")).unwrap();
    assert_eq!(
        short.config.runtime, full.config.runtime,
        "the same runtime image"
    );
    for h in [&short, &full] {
        let l = h.render(&ctx());
        assert_eq!(
            l.exit_status_file.as_deref(),
            Some("/tmp/lego-agent-logs/trajectory.json"),
            "{}",
            h.config.name
        );
        assert!(l
            .argv
            .contains(&"/tmp/lego-agent-logs/trajectory.json".to_string()));
    }
}

#[test]
fn mini_swe_agent_points_litellm_at_the_trial_proxy() {
    let h = Harness::load(&examples().join("mini-swe-agent.toml")).unwrap();
    assert_eq!(h.config.api, ApiFlavor::Openai);
    let l = h.render(&ctx());
    assert_eq!(l.argv[0], "/opt/lego-agent/bin/mini");
    assert!(l
        .argv
        .contains(&"model.model_kwargs.api_base=http://10.0.0.1:8470/t/tok123/v1".to_string()));
    assert!(l.argv.contains(&"agent.step_limit=50".to_string()));
    // The instruction is passed verbatim: braces inside it are not placeholders.
    let i = l.argv.iter().position(|a| a == "-t").unwrap();
    assert_eq!(l.argv[i + 1], "Fix {workdir}: the {parser} drops tokens");
    assert_eq!(l.env["HOME"], "/home/agent");
    assert_eq!(l.stdin, None);
}

#[test]
fn claude_code_gets_the_anthropic_base_url_without_v1() {
    let h = Harness::load(&examples().join("claude-code.toml")).unwrap();
    assert_eq!(h.config.api, ApiFlavor::Anthropic);
    let l = h.render(&ctx());
    // The CLI's own argv, unchanged, behind a bash that tees its stdout into the logs.
    let i = l
        .argv
        .iter()
        .position(|a| a == "/opt/lego-agent/bin/claude")
        .unwrap();
    assert_eq!(
        l.argv[..i],
        [
            "bash",
            "-o",
            "pipefail",
            "-c",
            "\"$@\" | tee '/tmp/lego-agent-logs/claude-stream.jsonl'",
            "claude"
        ]
    );
    assert_eq!(
        l.argv[i + 1..i + 3],
        ["-p", "Fix {workdir}: the {parser} drops tokens"]
    );
    assert!(l.argv.ends_with(&["--max-turns".to_string(), "50".to_string()]));
    assert_eq!(l.env["ANTHROPIC_BASE_URL"], "http://10.0.0.1:8470/t/tok123");
    assert_eq!(l.env["IS_SANDBOX"], "1");
    assert_eq!(l.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"], "1");
    assert_eq!(
        h.config.runtime.links["claude"],
        "claude_agent_sdk/_bundled/claude"
    );
}

#[test]
fn openhands_gets_its_instruction_as_a_file_and_a_launcher() {
    let h = Harness::load(&examples().join("openhands-sdk.toml")).unwrap();
    let l = h.render(&ctx());
    assert_eq!(l.files["/tmp/lego-agent-logs/instruction.md"], ctx().instruction);
    let script = &l.files["/tmp/lego-agent-logs/run_openhands.py"];
    assert!(
        script.contains("base_url=\"http://10.0.0.1:8470/t/tok123/v1\""),
        "{script}"
    );
    assert!(script.contains("workspace=\"/testbed\""));
    assert_eq!(h.config.runtime.python.as_deref(), Some("3.12"));
}

#[test]
fn opencode_config_has_the_shape_opencode_accepted_in_the_capture() {
    let h = Harness::load(&examples().join("opencode.toml")).unwrap();
    assert!(h.config.runtime.unavailable.is_some());
    let l = h.render(&ctx());
    let ours: serde_json::Value = serde_json::from_str(&l.files["/home/agent/lego-opencode.json"]).unwrap();
    let captured: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/harness/opencode-captured.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let (_, ours_p) = ours["provider"].as_object().unwrap().iter().next().unwrap();
    let (_, cap_p) = captured["provider"].as_object().unwrap().iter().next().unwrap();
    assert_eq!(ours_p["npm"], cap_p["npm"]);
    assert_eq!(ours_p["options"]["baseURL"], "http://10.0.0.1:8470/t/tok123/v1");
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&ours), keys(&captured));
    assert_eq!(keys(&ours_p["models"]["policy"]), keys(&cap_p["models"]["qwen3"]));
    assert_eq!(l.env["OPENCODE_CONFIG"], "/home/agent/lego-opencode.json");
    assert_eq!(l.argv[..2], ["opencode", "run"]);
}

#[test]
fn bad_adapters_are_rejected_naming_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "name='x'\ndescription='x'\napi='openai'\ncommand=['run','{instruction}']\n[runtime]\n[env]\nURL='{proxy}'\n",
    )
    .unwrap();
    let err = Harness::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("bad.toml: field `env.URL` uses unknown placeholder `{proxy}`"),
        "{err}"
    );
    std::fs::write(
        &path,
        "name='x'\ndescription='x'\napi='grpc'\ncommand=['x']\n[runtime]\n",
    )
    .unwrap();
    let err = Harness::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("bad.toml: invalid harness config") && err.contains("grpc"),
        "{err}"
    );
    std::fs::write(
        &path,
        "name='x'\ndescription='x'\napi='openai'\ncommand=['run']\n[runtime]\n",
    )
    .unwrap();
    let err = Harness::load(&path).unwrap_err().to_string();
    assert!(err.contains("no `{instruction}` in `command`"), "{err}");
}

/// The exit-status rules of the real adapters, fed the status records the real harnesses write
/// (strings verified against the wheels; see the comments in each adapter).
#[test]
fn example_exit_status_rules_map_the_harnesses_own_words() {
    fn rule(name: &str) -> (Harness, ExitStatusConfig) {
        let h = Harness::load(&examples().join(format!("{name}.toml"))).unwrap();
        let rule = h
            .config
            .exit_status
            .clone()
            .unwrap_or_else(|| panic!("{name}: no [exit_status]"));
        (h, rule)
    }
    fn kind(rule: &ExitStatusConfig, status: &str) -> &'static str {
        let listed = |l: &[String]| l.iter().any(|s| s == status);
        match (
            listed(&rule.finished),
            listed(&rule.max_turns),
            listed(&rule.agent_crash),
        ) {
            (true, false, false) => "finished",
            (false, true, false) => "max_turns",
            (false, false, true) => "agent_crash",
            (false, false, false) => "unlisted",
            _ => panic!("`{status}` listed twice"),
        }
    }

    // mini-swe-agent: its trajectory file.
    let (h, mini) = rule("mini-swe-agent");
    assert_eq!(
        h.render(&ctx()).exit_status_file.as_deref(),
        Some("/tmp/lego-agent-logs/trajectory.json")
    );
    for (status, want) in [("Submitted", "finished"), ("LimitsExceeded", "max_turns")] {
        let file = format!(r#"{{"info": {{"exit_status": "{status}"}}, "messages": []}}"#);
        assert_eq!(mini.status_in(&file).as_deref(), Some(status));
        assert_eq!(kind(&mini, status), want);
    }

    // OpenHands SDK: the status.json our launcher writes after conversation.run(); these are the
    // records it wrote against openhands-sdk 1.58.2 with a finishing, a looping and a
    // never-finishing model, and with the model unreachable.
    let (h, oh) = rule("openhands-sdk");
    let l = h.render(&ctx());
    assert_eq!(
        l.exit_status_file.as_deref(),
        Some("/tmp/lego-agent-logs/status.json")
    );
    let script = &l.files["/tmp/lego-agent-logs/run_openhands.py"];
    assert!(
        script.contains("open(\"/tmp/lego-agent-logs/status.json\", \"w\")"),
        "{script}"
    );
    assert!(script.contains("finally:\n    write_status()"), "{script}");
    for (record, want) in [
        (
            r#"{"execution_status": "finished", "status": "finished"}"#,
            "finished",
        ),
        (
            r#"{"execution_status": "stuck", "status": "stuck"}"#,
            "agent_crash",
        ),
        (
            r#"{"execution_status": "error", "error_code": "MaxIterationsReached", "error_detail": "Agent reached maximum iterations limit (3).", "status": "MaxIterationsReached"}"#,
            "max_turns",
        ),
        (
            r#"{"execution_status": "error", "error_code": "LLMServiceUnavailableError", "error_detail": "litellm.InternalServerError: OpenAIException - Connection error.", "status": "LLMServiceUnavailableError"}"#,
            "unlisted",
        ),
    ] {
        let status = oh.status_in(record).unwrap_or_else(|| panic!("{record}"));
        assert_eq!(kind(&oh, &status), want, "{record}");
    }

    // Claude Code: the last `result` record of its teed stream-json stdout, as CLI 2.1.327 wrote
    // it (trimmed) when answering and when out of turns; `error_during_execution` is from its
    // result schema, not reproduced. (After an API error it wrote subtype "success" with
    // is_error and exited 1: `finished` needs a clean exit, so the sandbox's agent_crash stands.)
    let (h, cc) = rule("claude-code");
    assert_eq!(cc.format, StatusFormat::Jsonl);
    assert_eq!(
        h.render(&ctx()).exit_status_file.as_deref(),
        Some("/tmp/lego-agent-logs/claude-stream.jsonl")
    );
    let init = r#"{"type":"system","subtype":"init","cwd":"/testbed","session_id":"s"}"#;
    let assistant = r#"{"type":"assistant","message":{"role":"assistant","content":[]},"session_id":"s"}"#;
    for (result, status, want) in [
        (
            r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"done","terminal_reason":"completed"}"#,
            "success",
            "finished",
        ),
        (
            r#"{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":3,"terminal_reason":"max_turns","errors":["Reached maximum number of turns (2)"]}"#,
            "error_max_turns",
            "max_turns",
        ),
        (
            r#"{"type":"result","subtype":"error_during_execution","is_error":true,"num_turns":2,"errors":["boom"]}"#,
            "error_during_execution",
            "agent_crash",
        ),
    ] {
        let stream = format!("{init}\n{assistant}\n{result}\n");
        assert_eq!(cc.status_in(&stream).as_deref(), Some(status), "{stream}");
        assert_eq!(kind(&cc, status), want);
    }
    // Killed before its result: no status (not the init record's subtype).
    assert_eq!(cc.status_in(&format!("{init}\n{assistant}\n")), None);

    // OpenCode: no verified machine-readable status (see its adapter).
    let opencode = Harness::load(&examples().join("opencode.toml")).unwrap();
    assert!(opencode.config.exit_status.is_none());
}

#[test]
fn bad_exit_status_rules_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    let base = "name='x'\ndescription='x'\napi='openai'\ncommand=['run','{instruction}']\n[runtime]\n";
    let load = |rule: &str| {
        std::fs::write(&path, format!("{base}[exit_status]\n{rule}")).unwrap();
        Harness::load(&path).map(|_| ()).map_err(|e| e.to_string())
    };
    assert_eq!(
        load("file='{logs}/s.json'\npointer='/status'\nagent_crash=['stuck']"),
        Ok(())
    );
    let err = load("file='{logs}/s.json'\npointer='status'").unwrap_err();
    assert!(
        err.contains("`exit_status.pointer` must be a JSON pointer"),
        "{err}"
    );
    let err = load("file='{logs}/s.jsonl'\nformat='jsonl'\npointer='/subtype'\nrecord={type='result'}")
        .unwrap_err();
    assert!(
        err.contains("`exit_status.record.\"type\"` must be a JSON pointer"),
        "{err}"
    );
    let err = load("file='{logs}/s.json'\npointer='/subtype'\nrecord={'/type'='result'}").unwrap_err();
    assert!(err.contains("needs `format = \"jsonl\"`"), "{err}");
    let err = load("file='{logs}/s.json'\nformat='yaml'\npointer='/s'").unwrap_err();
    assert!(
        err.contains("invalid harness config") && err.contains("yaml"),
        "{err}"
    );
}
