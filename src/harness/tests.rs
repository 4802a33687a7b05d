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
