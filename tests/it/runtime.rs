//! Agent runtimes on the real Docker engine, installed from real PyPI packages: each is built once
//! into a volume, mounted read-only at /opt/lego-agent into a trial-like container from the base
//! image, and run there as the non-root agent user with no network. Wheels are downloaded on the
//! host and cached under ~/.cache/lego-rl/runtime-wheels; volumes persist as a cache between runs
//! (the mini-swe-agent test builds a fresh, uniquely named one every time and removes it).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use lego_rl::harness::Harness;
use lego_rl::sandbox::runtime::{default_cache_dir, ensure_runtime, RuntimeVolume, RUNTIME_DIR};
use lego_rl::sandbox::{ContainerSpec, Engine, ExecOutput, SandboxError, DEFAULT_BASE_IMAGE, LABEL_RUN};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn harness(name: &str) -> Harness {
    Harness::load(&root().join("examples/harnesses").join(format!("{name}.toml"))).expect("harness loads")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The engine with the base image present, or `None` (test skipped) when Docker is unreachable
/// outside CI.
fn engine(rt: &tokio::runtime::Runtime) -> Option<Engine> {
    let engine = match rt.block_on(Engine::connect()) {
        Ok(e) => e,
        Err(e) if std::env::var_os("CI").is_some() => panic!("Docker is required under CI: {e}"),
        Err(e) => {
            eprintln!("SKIPPED: no Docker engine ({e})");
            return None;
        }
    };
    if rt
        .block_on(engine.image_id(DEFAULT_BASE_IMAGE))
        .expect("inspect")
        .is_none()
    {
        let st = Command::new(root().join("scripts/bootstrap-base-image.sh"))
            .status()
            .expect("bootstrap script runs");
        assert!(st.success(), "bootstrap-base-image.sh failed");
    }
    Some(engine)
}

fn volume_exists(name: &str) -> bool {
    Command::new("docker")
        .args(["volume", "inspect", name])
        .output()
        .expect("docker cli")
        .status
        .success()
}

/// A trial-like container: the base image, no network, pids/memory limits, the runtime bound
/// read-only. Runs each script (as `user`) and removes the container.
async fn in_trial(engine: &Engine, vol: &RuntimeVolume, scripts: &[(&str, &str)]) -> Vec<ExecOutput> {
    let run = format!("it-runtime-{}", std::process::id());
    let spec = ContainerSpec {
        name: format!("{run}-{}", uuid::Uuid::new_v4().simple()),
        image: DEFAULT_BASE_IMAGE.into(),
        labels: [(LABEL_RUN.to_string(), run.clone())].into(),
        env: vec!["HOME=/home/agent".into()],
        network: "none".into(),
        memory_bytes: Some(2 << 30),
        pids_limit: Some(512),
        binds: vec![vol.bind()],
        ..Default::default()
    };
    let id = engine.create_container(&spec).await.expect("create");
    engine.start_container(&id).await.expect("start");
    let mut outs = Vec::new();
    for (user, script) in scripts {
        outs.push(
            engine
                .exec(&id, user, "/tmp", &[], script, Duration::from_secs(120))
                .await
                .expect("exec"),
        );
    }
    engine.remove_container(&id).await.expect("remove");
    outs
}

#[test]
fn mini_swe_agent_runtime_is_built_once_and_mounted_read_only() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    // A uniquely named copy of the real adapter, so this test always exercises a real build (the
    // wheels themselves come from the host cache after the first run).
    let mut h = harness("mini-swe-agent");
    h.config.name = format!("it-mini-{}", std::process::id());
    let cache = default_cache_dir();
    let vol = rt
        .block_on(ensure_runtime(&engine, &h, DEFAULT_BASE_IMAGE, &cache))
        .expect("mini-swe-agent runtime builds");
    assert!(!vol.cache_hit, "a fresh name is a build");
    assert!(vol
        .name
        .starts_with(&format!("lego-rl-runtime-it-mini-{}-", std::process::id())));
    assert!(
        vol.packages.iter().any(|p| p == "mini-swe-agent==2.4.6"),
        "{:?}",
        vol.packages
    );

    let outs = rt.block_on(in_trial(
        &engine,
        &vol,
        &[
            ("agent", &format!("{RUNTIME_DIR}/bin/mini --help")),
            (
                "agent",
                &format!(
                    "{RUNTIME_DIR}/bin/python -c 'import minisweagent; print(minisweagent.__version__)'"
                ),
            ),
            ("agent", &format!("id -u; touch {RUNTIME_DIR}/x")),
            ("root", &format!("touch {RUNTIME_DIR}/bin/x")),
        ],
    ));
    assert!(outs[0].ok(), "mini --help: {outs:?}");
    assert!(outs[0].stdout.contains("--task"), "{}", outs[0].stdout);
    assert!(outs[1].ok(), "{outs:?}");
    // mini-swe-agent prints a banner on import; the version is the last line.
    assert_eq!(
        outs[1].stdout.trim().lines().last(),
        Some("2.4.6"),
        "{}",
        outs[1].stdout
    );
    assert_eq!(outs[2].stdout.trim(), "1000", "agent is not root");
    assert!(!outs[2].ok());
    assert!(
        outs[2].stderr.contains("Read-only file system"),
        "{}",
        outs[2].stderr
    );
    assert!(!outs[3].ok(), "even root cannot write the runtime");
    assert!(
        outs[3].stderr.contains("Read-only file system"),
        "{}",
        outs[3].stderr
    );

    // A cache, not a run object: labelled as a runtime, without the run/trial labels the
    // per-run cleanup sweep removes by.
    let labels = Command::new("docker")
        .args(["volume", "inspect", "--format", "{{json .Labels}}", &vol.name])
        .output()
        .expect("docker cli");
    let labels: std::collections::HashMap<String, String> =
        serde_json::from_slice(&labels.stdout).expect("labels json");
    assert_eq!(labels.get("lego-rl.runtime"), Some(&h.config.name));
    assert_eq!(labels.get("lego-rl.runtime-hash"), Some(&vol.hash));
    assert!(
        !labels.contains_key(LABEL_RUN) && !labels.contains_key("lego-rl.trial"),
        "{labels:?}"
    );

    let again = rt
        .block_on(ensure_runtime(&engine, &h, DEFAULT_BASE_IMAGE, &cache))
        .expect("second ensure");
    assert!(again.cache_hit);
    assert_eq!(again.name, vol.name);
    assert_eq!(again.packages, vol.packages);
    let st = Command::new("docker")
        .args(["volume", "rm", &vol.name])
        .status()
        .expect("docker cli");
    assert!(st.success());
}

#[test]
fn openhands_sdk_runtime_imports() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let vol = rt
        .block_on(ensure_runtime(
            &engine,
            &harness("openhands-sdk"),
            DEFAULT_BASE_IMAGE,
            &default_cache_dir(),
        ))
        .expect("openhands runtime builds");
    let outs = rt.block_on(in_trial(
        &engine,
        &vol,
        &[(
            "agent",
            &format!(
                "{RUNTIME_DIR}/bin/python -c 'import openhands.sdk, openhands.tools.terminal, \
                 openhands.tools.file_editor; from importlib.metadata import version; \
                 print(version(\"openhands-sdk\"))'"
            ),
        )],
    ));
    assert!(outs[0].ok(), "{outs:?}");
    assert_eq!(outs[0].stdout.trim(), "1.58.2");
}

#[test]
fn claude_code_cli_is_linked_from_the_sdk_wheel() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let vol = rt
        .block_on(ensure_runtime(
            &engine,
            &harness("claude-code"),
            DEFAULT_BASE_IMAGE,
            &default_cache_dir(),
        ))
        .expect("claude runtime builds");
    let outs = rt.block_on(in_trial(
        &engine,
        &vol,
        &[
            ("agent", &format!("{RUNTIME_DIR}/bin/claude --version")),
            ("agent", &format!("readlink {RUNTIME_DIR}/bin/claude")),
        ],
    ));
    assert!(outs[0].ok(), "{outs:?}");
    assert!(outs[0].stdout.contains("Claude Code"), "{}", outs[0].stdout);
    assert!(
        outs[1]
            .stdout
            .trim()
            .ends_with("site-packages/claude_agent_sdk/_bundled/claude"),
        "{}",
        outs[1].stdout
    );
}

#[test]
fn unavailable_and_impossible_runtimes_fail_naming_the_harness_file() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let cache = default_cache_dir();
    let opencode = harness("opencode");
    let e = rt
        .block_on(ensure_runtime(&engine, &opencode, DEFAULT_BASE_IMAGE, &cache))
        .expect_err("npm runtime");
    assert!(matches!(e, SandboxError::Runtime { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("examples/harnesses/opencode.toml"), "{msg}");
    assert!(msg.contains("npm"), "{msg}");

    // A Python the base image does not have: found in the build container, reported with the
    // file, and the half-made volume is gone.
    let mut h = harness("mini-swe-agent");
    h.config.name = format!("it-py399-{}", std::process::id());
    h.config.runtime.python = Some("3.99".into());
    let e = rt
        .block_on(ensure_runtime(&engine, &h, DEFAULT_BASE_IMAGE, &cache))
        .expect_err("python 3.99");
    let msg = e.to_string();
    assert!(msg.contains("mini-swe-agent.toml"), "{msg}");
    assert!(msg.contains("Python >= 3.99") && msg.contains("3.13"), "{msg}");
    let base = rt
        .block_on(engine.image_id(DEFAULT_BASE_IMAGE))
        .expect("inspect")
        .expect("base");
    let name = lego_rl::sandbox::runtime::volume_name(
        &h.config.name,
        &lego_rl::sandbox::runtime::runtime_hash(&h.config.runtime, &base),
    );
    assert!(!volume_exists(&name), "{name} left behind");
}
