//! Sandboxes on the real Docker engine: build-images, task validity (no patch → 0, gold → 1),
//! isolation gates probed from inside a trial as the agent user, cheating diffs, stage timeouts and
//! failure classes, and cleanup by label. Fails loudly when Docker is missing and `CI` is set.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt;
use lego_rl::chat::ChatFormat;
use lego_rl::engine::embedded::EmbeddedBackend;
use lego_rl::io::{read_all, ReadOptions};
use lego_rl::proxy::{Proxy, ProxyConfig};
use lego_rl::records::{ImageRecord, Task, Termination};
use lego_rl::sandbox::{relay, Engine, Trial, TrialLimits, TrialResult, LABEL_RUN};

use crate::common::lego;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn task_root() -> PathBuf {
    root().join("testdata/tasks")
}

pub(crate) fn tasks() -> Vec<Task> {
    read_all(&task_root().join("tasks.jsonl"), ReadOptions::default()).expect("testdata tasks")
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The engine, or `None` (test skipped) when Docker is unreachable outside CI.
pub(crate) fn engine(rt: &tokio::runtime::Runtime) -> Option<Engine> {
    match rt.block_on(Engine::connect()) {
        Ok(e) => Some(e),
        Err(e) if std::env::var_os("CI").is_some() => panic!("Docker is required under CI: {e}"),
        Err(e) => {
            eprintln!("SKIPPED: no Docker engine ({e})");
            None
        }
    }
}

/// Builds every testdata image once per test binary (through the CLI), bootstrapping the base image
/// when the engine lacks it.
pub(crate) fn images() -> &'static HashMap<String, ImageRecord> {
    static IMAGES: OnceLock<HashMap<String, ImageRecord>> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let have_base = Command::new("docker")
            .args(["image", "inspect", "lego-rl/base:trixie"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !have_base {
            let st = Command::new(root().join("scripts/bootstrap-base-image.sh"))
                .status()
                .expect("bootstrap script runs");
            assert!(st.success(), "bootstrap-base-image.sh failed");
        }
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sandbox-images.jsonl.zst");
        let assert = lego()
            .args(["build-images", "-j", "2", "-i"])
            .arg(task_root().join("tasks.jsonl"))
            .arg("-o")
            .arg(&out)
            .assert();
        let output = assert.get_output();
        assert!(
            output.status.success(),
            "build-images failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let recs: Vec<ImageRecord> = read_all(&out, ReadOptions::default()).expect("manifest");
        recs.into_iter().map(|r| (r.task_id.clone(), r)).collect()
    })
}

pub(crate) fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// An agent script that applies the task's reference solution.
pub(crate) fn gold_script(task: &Task) -> String {
    if let Some(p) = &task.gold_patch {
        return format!("echo {} | base64 -d | git apply", b64(p));
    }
    let dir = task.metadata["solution_dir"]
        .as_str()
        .expect("harbor solution_dir");
    let solve = std::fs::read_to_string(task_root().join(dir).join("solve.sh")).expect("solve.sh");
    format!(
        "echo {} | base64 -d > /tmp/solve.sh && bash /tmp/solve.sh",
        b64(&solve)
    )
}

pub(crate) async fn trial(
    engine: &Engine,
    task: &Task,
    run: &str,
    name: &str,
    limits: TrialLimits,
    binds: Vec<String>,
    script: &str,
) -> TrialResult {
    let image = images()[&task.id].image.clone();
    Trial::new(
        engine.clone(),
        task.clone(),
        task_root(),
        image,
        run,
        name,
        limits,
        Vec::new(),
        binds,
    )
    .run(script)
    .await
}

pub(crate) async fn assert_no_leftovers(engine: &Engine, run: &str) {
    assert_eq!(
        engine.containers_with_label(LABEL_RUN, run).await.expect("list"),
        Vec::<String>::new(),
        "containers left"
    );
    assert_eq!(
        engine.networks_with_label(LABEL_RUN, run).await.expect("list"),
        Vec::<String>::new(),
        "networks left"
    );
}

pub(crate) fn run_id(what: &str) -> String {
    format!("it-{what}-{}", std::process::id())
}

#[test]
fn build_images_second_run_is_all_cache_hits() {
    let rt = rt();
    let Some(_engine) = engine(&rt) else { return };
    let first = images();
    assert_eq!(first.len(), tasks().len());
    assert!(
        first.values().all(|r| r.error.is_none() && r.image_id.is_some()),
        "{first:?}"
    );
    let swe: BTreeSet<_> = first
        .values()
        .filter_map(|r| r.environment_image.clone())
        .collect();
    assert_eq!(swe.len(), 6, "one environment layer per repository");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sandbox-images-2.jsonl.zst");
    lego()
        .args(["build-images", "-i"])
        .arg(task_root().join("tasks.jsonl"))
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    let second: Vec<ImageRecord> = read_all(&out, ReadOptions::default()).expect("manifest");
    for r in &second {
        assert!(r.cache_hit, "{} rebuilt", r.task_id);
        assert_eq!(r.image, first[&r.task_id].image, "tag of {} changed", r.task_id);
    }
}

#[test]
fn build_images_reports_a_failed_build_and_continues() {
    let rt = rt();
    let Some(_engine) = engine(&rt) else { return };
    let dir = tempfile::tempdir().expect("tmp");
    let good = tasks()
        .into_iter()
        .find(|t| t.id == "harbor__hello-world")
        .expect("hello");
    let mut bad = good.clone();
    bad.id = "broken".into();
    bad.environment.dockerfile = Some("FROM lego-rl/base:trixie\nRUN exit 7\n".into());
    bad.environment.context = None;
    let mut good = good;
    good.environment.context = Some(
        task_root()
            .join("harbor/hello-world/environment")
            .display()
            .to_string(),
    );
    let input = dir.path().join("tasks.jsonl");
    let lines: Vec<String> = [&bad, &good]
        .iter()
        .map(|t| serde_json::to_string(t).expect("json"))
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").expect("write");
    let out = dir.path().join("images.jsonl.zst");
    lego()
        .args(["build-images", "-i"])
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .assert()
        .code(1);
    let recs: Vec<ImageRecord> = read_all(&out, ReadOptions::default()).expect("manifest");
    assert_eq!(recs.len(), 2);
    assert!(
        recs[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("non-zero code") || e.contains("7")),
        "{:?}",
        recs[0]
    );
    let log = std::fs::read_to_string(recs[0].log_path.as_deref().expect("log path")).expect("build log");
    assert!(log.contains("exit 7"), "{log}");
    assert!(recs[1].error.is_none() && recs[1].image_id.is_some());
}

#[test]
fn every_testdata_task_is_valid() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let tasks = tasks();
    assert!(tasks.len() >= 8);
    images();
    let run = run_id("validity");
    let jobs: Vec<(Task, bool)> = tasks
        .iter()
        .flat_map(|t| [(t.clone(), false), (t.clone(), true)])
        .collect();
    let results: Vec<(String, bool, TrialResult)> = rt.block_on(
        futures::stream::iter(jobs)
            .map(|(task, gold)| {
                let engine = engine.clone();
                let run = run.clone();
                async move {
                    let script = if gold {
                        gold_script(&task)
                    } else {
                        "true".to_string()
                    };
                    let name = format!("{}-{}", task.id, if gold { "gold" } else { "none" });
                    let r = trial(
                        &engine,
                        &task,
                        &run,
                        &name,
                        TrialLimits::for_task(&task),
                        Vec::new(),
                        &script,
                    )
                    .await;
                    (task.id.clone(), gold, r)
                }
            })
            .buffer_unordered(3)
            .collect(),
    );
    for (id, gold, r) in &results {
        assert_eq!(
            r.termination,
            Termination::Finished,
            "{id} gold={gold}: {:?}",
            r.agent_log
        );
        assert!(!r.infra_failure);
        let reward = r.reward.expect("graded");
        if id == "harbor__multi-reward" && *gold {
            // Its performance dimension is a wall-clock bound (< 2 s); correctness must hold.
            assert_eq!(r.grader.as_ref().expect("grader").tests["correctness"], "1");
            assert!(reward >= 0.5, "{id}: {reward}");
        } else {
            assert_eq!(
                reward,
                if *gold { 1.0 } else { 0.0 },
                "{id} gold={gold}: {:?}",
                r.grader
            );
        }
        for stage in ["setup", "agent", "extract", "evaluate", "cleanup"] {
            let s = &r.stages[stage];
            assert!(s.end >= s.start && s.outcome == "ok", "{id} {stage}: {s:?}");
        }
        if *gold && id != "harbor__hello-world" && id != "harbor__multi-reward" {
            assert!(r.diff.as_deref().is_some_and(|d| d.contains("diff --git")));
            assert_eq!(
                r.grader.as_ref().and_then(|g| g.apply.as_deref()),
                Some("git apply")
            );
        }
    }
    rt.block_on(assert_no_leftovers(&engine, &run));
}

/// Objects added to the repository after the base commit (the fix and everything later).
fn leaked_objects(task: &Task) -> BTreeSet<String> {
    let dir = tempfile::tempdir().expect("tmp");
    let bundle = task_root().join("repos").join(format!("{}.bundle", task.id));
    let ok = Command::new("git")
        .args(["clone", "-q", "--mirror"])
        .arg(&bundle)
        .arg(dir.path().join("r"))
        .status()
        .expect("git");
    assert!(ok.success());
    let base = task.base_commit.as_deref().expect("base");
    let out = Command::new("git")
        .args(["rev-list", "--objects", "--all", &format!("^{base}")])
        .current_dir(dir.path().join("r"))
        .output()
        .expect("git");
    let set: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    assert!(set.len() >= 4, "the bundle leaks the fix: {set:?}");
    set
}

#[test]
fn gates_hold_from_inside_a_trial() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let task = tasks()
        .into_iter()
        .find(|t| t.id == "xmltodict__attr-namespace")
        .expect("task");
    images();
    let run = run_id("gates");
    // A canary on this machine, and one in a second container on the default bridge.
    let canary = std::net::TcpListener::bind("0.0.0.0:0").expect("canary");
    let port = canary.local_addr().expect("addr").port();
    let side = format!("lego-rl-it-canary-{}", std::process::id());
    let st = Command::new("docker")
        .args([
            "run",
            "-d",
            "--rm",
            "--name",
            &side,
            "--label",
            &format!("{LABEL_RUN}={run}"),
            "lego-rl/base:trixie",
            "python3",
            "-m",
            "http.server",
            "8000",
        ])
        .output()
        .expect("docker run");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let side_ip = String::from_utf8_lossy(
        &Command::new("docker")
            .args([
                "inspect",
                "-f",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                &side,
            ])
            .output()
            .expect("inspect")
            .stdout,
    )
    .trim()
    .to_string();
    let host_ips = String::from_utf8_lossy(
        &Command::new("hostname")
            .arg("-I")
            .output()
            .expect("hostname")
            .stdout,
    )
    .to_string();
    let mut targets: Vec<String> = host_ips
        .split_whitespace()
        .filter(|ip| !ip.contains(':'))
        .map(|ip| format!("{ip}:{port}"))
        .collect();
    targets.push(format!("{side_ip}:8000"));
    targets.push(format!("127.0.0.1:{port}"));
    let runtime_dir = tempfile::tempdir().expect("runtime dir");
    std::fs::write(runtime_dir.path().join("harness.txt"), "runtime\n").expect("write");
    // The real proxy (embedded tiny model) on a unix socket: the trial's only way out.
    let sock_dir = tempfile::tempdir().expect("socket dir");
    let sock = sock_dir.path().join("proxy.sock");
    let proxy = rt.block_on(async {
        let backend =
            Arc::new(EmbeddedBackend::start(&crate::model::tiny_moe(), tch::Device::Cpu).expect("engine"));
        let dir = root().join("testdata/tokenizer/qwen3");
        let chat = ChatFormat::from_parts(
            &dir.join("tokenizer.json"),
            &dir.join("tokenizer_config.json"),
            None,
        )
        .expect("chat format");
        let mut cfg = ProxyConfig::default();
        cfg.sampling.max_tokens = Some(3);
        let proxy = Proxy::new(Arc::new(chat), backend, cfg);
        proxy.serve_unix(&sock).await.expect("serve on a unix socket");
        proxy
    });
    let (token, captured) = proxy.register_trial("gates");
    let url = relay::proxy_url(&token);
    // The second request (`ask2`, argument 2) says "hi2": a body equal to the thread's last one is
    // a client retry, answered from the first generation without a new capture (proxy/flight.rs).
    let ask = format!(
        r#"python3 - <<'EOF'
import json, sys, urllib.request
req = urllib.request.Request("{url}/v1/chat/completions", method="POST",
    data=json.dumps({{"model": "policy", "max_tokens": 3, "messages": [{{"role": "user", "content": "hi" + "".join(sys.argv[1:])}}]}}).encode(),
    headers={{"content-type": "application/json"}})
try:
    r = urllib.request.urlopen(req, timeout=60)
    print("PROXY%s=%d %s" % (sys.argv[1] if len(sys.argv) > 1 else "", r.status, json.load(r)["object"]))
except Exception as e:
    print("PROXY=failed %r" % e)
EOF"#
    );
    let probe = format!(
        r#"
{ask}
pkill -KILL -u root python3 2>/dev/null; echo "RELAYUP=$(pgrep -u root -c python3)"
{ask2}
echo "FILE=$(cat /home/agent/.config/probe/config.txt) $(stat -c %U /home/agent/.config/probe/config.txt)"
echo "UID=$(id -u)"
echo "COMMITS=$(git log --all --oneline | wc -l)"
echo "REFLOG=$(git reflog | wc -l)"
echo "REFS=$(git for-each-ref | wc -l)"
echo "FSCK=$(git fsck --lost-found 2>&1 | grep -c -E 'dangling|unreachable')"
git cat-file --batch-all-objects --batch-check='%(objectname)' | sed 's/^/OBJ=/'
test -e tests_lego/test_regression.py && echo HIDDEN=no || echo HIDDEN=yes
test -e /var/run/docker.sock && echo SOCK=yes || echo SOCK=no
touch /opt/lego-agent/x 2>/dev/null && echo RO=no || echo RO=yes
cat /opt/lego-agent/harness.txt | sed 's/^/RUNTIME=/'
getent hosts {side} >/dev/null && echo DNS=resolved || echo DNS=failed
for t in {targets}; do
  python3 -c "import socket,sys; h,p=sys.argv[1].rsplit(':',1); s=socket.socket(); s.settimeout(3); s.connect((h,int(p))); print('NET=open', sys.argv[1])" $t 2>/dev/null || echo "NET=blocked $t"
done
python3 - <<'EOF'
import os, time
n = 0
try:
    while n < 3000:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError:
    pass
print("FORKS=%d" % n)
os.system("pkill -KILL -u agent sleep; pkill -KILL -P %d" % os.getpid())
EOF
python3 -c "b = b'x' * (400 * 1024 * 1024); print('MEM=survived')" 2>/dev/null; echo "MEMEXIT=$?"
"#,
        targets = targets.join(" "),
        ask2 = ask.replace("python3 - <<'EOF'", "python3 - 2 <<'EOF'"),
    );
    let mut limits = TrialLimits::for_task(&task);
    limits.memory_bytes = 256 << 20;
    limits.pids = 256;
    let bind = format!("{}:/opt/lego-agent:ro", runtime_dir.path().display());
    let r = rt.block_on(
        Trial::new(
            engine.clone(),
            task.clone(),
            task_root(),
            images()[&task.id].image.clone(),
            &run,
            "gates",
            limits,
            Vec::new(),
            vec![bind],
        )
        .with_proxy_socket(sock.clone())
        .with_files(vec![(
            "/home/agent/.config/probe/config.txt".into(),
            b"written".to_vec(),
        )])
        .run(&probe),
    );
    let _ = Command::new("docker").args(["rm", "-f", &side]).output();
    drop(canary);
    let log = r.agent_log.clone().unwrap_or_default();
    let val = |k: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{k} missing in {log}"))
    };
    assert_ne!(val("UID"), "0", "agent runs as root");
    // The proxy answers through the relay, and the agent cannot kill the relay.
    assert_eq!(val("PROXY"), "200 chat.completion", "{log}");
    assert_eq!(val("RELAYUP"), "1", "the agent killed the relay: {log}");
    assert_eq!(val("PROXY2"), "200 chat.completion", "{log}");
    assert_eq!(captured.generations().len(), 2, "both requests captured");
    assert_eq!(val("FILE"), "written agent");
    assert_eq!(val("COMMITS"), "1", "history not squashed");
    assert_eq!(val("REFS"), "1");
    assert!(val("REFLOG").parse::<u32>().expect("n") <= 1);
    assert_eq!(val("FSCK"), "0");
    let objs: BTreeSet<String> = log
        .lines()
        .filter_map(|l| l.strip_prefix("OBJ="))
        .map(str::to_string)
        .collect();
    assert!(!objs.is_empty());
    let fix_objects = leaked_objects(&task);
    let leaked: Vec<_> = objs.intersection(&fix_objects).collect();
    assert!(leaked.is_empty(), "fix objects visible in the trial: {leaked:?}");
    assert_eq!(val("HIDDEN"), "yes");
    assert_eq!(val("SOCK"), "no");
    assert_eq!(val("RO"), "yes");
    assert_eq!(val("RUNTIME"), "runtime");
    assert_eq!(val("DNS"), "failed");
    let net: Vec<&str> = log.lines().filter(|l| l.starts_with("NET=")).collect();
    assert_eq!(net.len(), targets.len(), "{log}");
    assert!(
        net.iter().all(|l| l.starts_with("NET=blocked")),
        "reachable: {net:?}"
    );
    assert!(
        val("FORKS").parse::<u32>().expect("forks") < 256,
        "pids limit did not stop the fork loop"
    );
    assert_eq!(
        val("MEMEXIT"),
        "137",
        "memory over the limit must be killed: {log}"
    );
    // bash reports the killed command line on stderr, so look for the print at a line start.
    assert!(!log.lines().any(|l| l.starts_with("MEM=survived")), "{log}");
    rt.block_on(assert_no_leftovers(&engine, &run));
}

#[test]
fn cheating_diffs_do_not_get_reward() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let task = tasks()
        .into_iter()
        .find(|t| t.id == "inflection__ordinal-teens")
        .expect("task");
    images();
    let run = run_id("cheat");
    let conftest = "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n    \
                    outcome = yield\n    rep = outcome.get_result()\n    rep.outcome = 'passed'\n";
    let cheats = [
        (
            "conftest",
            format!("echo {} | base64 -d > conftest.py", b64(conftest)),
            "collection_hook",
        ),
        (
            "edit-tests",
            "mkdir -p tests_lego && printf 'def test_x():\\n    pass\\n' > tests_lego/test_regression.py && \
             sed -i 's/^def test_/def _disabled_test_/' test_inflection.py"
                .to_string(),
            "test_edit",
        ),
    ];
    for (name, script, audit) in cheats {
        let r = rt.block_on(trial(
            &engine,
            &task,
            &run,
            name,
            TrialLimits::for_task(&task),
            Vec::new(),
            &script,
        ));
        assert_eq!(r.termination, Termination::Finished, "{name}: {:?}", r.agent_log);
        assert_eq!(r.reward, Some(0.0), "{name} got rewarded: {:?}", r.grader);
        assert!(r.audit.iter().any(|a| a.kind == audit), "{name}: {:?}", r.audit);
    }
    rt.block_on(assert_no_leftovers(&engine, &run));
}

#[test]
fn stage_failures_are_classified() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let task = tasks()
        .into_iter()
        .find(|t| t.id == "ordered-set__discard-index")
        .expect("task");
    images();
    let run = run_id("classes");
    let mut limits = TrialLimits::for_task(&task);
    limits.agent = Duration::from_secs(3);
    let r = rt.block_on(trial(
        &engine,
        &task,
        &run,
        "timeout",
        limits.clone(),
        Vec::new(),
        "sleep 120",
    ));
    assert_eq!(r.termination, Termination::AgentTimeout);
    assert!(!r.infra_failure);
    let agent = &r.stages["agent"];
    assert!(agent.end - agent.start < 60.0, "timeout did not fire: {agent:?}");
    assert_eq!(
        r.reward,
        Some(0.0),
        "a timed-out trial is still graded on its diff"
    );

    let r = rt.block_on(trial(
        &engine,
        &task,
        &run,
        "crash",
        limits.clone(),
        Vec::new(),
        "exit 3",
    ));
    assert_eq!(r.termination, Termination::AgentCrash);
    assert!(!r.infra_failure);

    // A missing image is an infrastructure failure of the setup stage, with exactly one result.
    let r = rt.block_on(
        Trial::new(
            engine.clone(),
            task.clone(),
            task_root(),
            "lego-rl/does-not-exist:0".into(),
            &run,
            "noimage",
            limits.clone(),
            Vec::new(),
            Vec::new(),
        )
        .run("true"),
    );
    assert_eq!(r.termination, Termination::Infra("setup".into()));
    assert!(r.infra_failure && r.reward.is_none());

    // The container removed mid-agent: the trial ends as an infrastructure failure, not a crash.
    // (Regression: a fixed 4 s delay removed it during a slow setup, giving infra:setup.)
    let r = rt.block_on(async {
        let engine2 = engine.clone();
        let run2 = run.clone();
        let killer = tokio::spawn(async move {
            let id = agent_started(&engine2, &run2).await;
            if let Some(id) = &id {
                engine2.remove_container(id).await.expect("rm");
            }
            id.is_some()
        });
        let mut l = limits.clone();
        l.agent = Duration::from_secs(120);
        let r = trial(&engine, &task, &run, "killed", l, Vec::new(), AGENT_STARTS).await;
        assert!(killer.await.expect("killer"), "the agent never started");
        r
    });
    assert!(r.infra_failure, "{:?}", r.termination);
    assert!(
        matches!(r.termination, Termination::Infra(ref s) if s == "agent"),
        "{:?}",
        r.termination
    );
    rt.block_on(assert_no_leftovers(&engine, &run));
}

#[test]
fn sweep_removes_labelled_leftovers() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let run = run_id("sweep");
    let task = tasks()
        .into_iter()
        .find(|t| t.id == "harbor__hello-world")
        .expect("task");
    let image = images()[&task.id].image.clone();
    rt.block_on(async {
        let mut t = Trial::new(
            engine.clone(),
            task.clone(),
            task_root(),
            image,
            &run,
            "left",
            TrialLimits::for_task(&task),
            Vec::new(),
            Vec::new(),
        );
        t.setup().await.expect("setup");
        // Simulate a crashed process: forget the trial without cleanup.
        std::mem::forget(t);
        assert_eq!(
            engine
                .containers_with_label(LABEL_RUN, &run)
                .await
                .expect("list")
                .len(),
            1
        );
        assert_eq!(engine.sweep(Some(&run)).await.expect("sweep"), 2);
        assert_no_leftovers(&engine, &run).await;
    });
}

pub(crate) fn task(id: &str) -> Task {
    tasks().into_iter().find(|t| t.id == id).expect("task")
}

#[test]
fn memory_over_the_limit_is_killed_and_classified() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let task = task("harbor__hello-world");
    images();
    let run = run_id("oom");
    let mut limits = TrialLimits::for_task(&task);
    limits.memory_bytes = 256 << 20;
    let hog = "python3 -c \"b = b'x' * (600 << 20); print('MEM=survived')\"";
    let cases = [
        // The agent itself runs out of memory: its own fault.
        ("oom-crash", hog.to_string()),
        // A command the agent ran was OOM-killed; the agent carried on and exited 0.
        ("oom-survived", format!("{hog}; echo \"HOG=$?\"; exit 0")),
        // Exit 137 without an OOM kill is a plain crash, not an OOM.
        ("kill9", "kill -9 $$".to_string()),
    ];
    for (name, script) in cases {
        let r = rt.block_on(trial(
            &engine,
            &task,
            &run,
            name,
            limits.clone(),
            Vec::new(),
            &script,
        ));
        let log = r.agent_log.clone().unwrap_or_default();
        let ooms: Vec<_> = r.audit.iter().filter(|a| a.kind == "oom_kill").collect();
        assert!(!r.infra_failure, "{name}: {:?} {log}", r.termination);
        assert!(
            !log.lines().any(|l| l.starts_with("MEM=survived")),
            "{name}: {log}"
        );
        match name {
            "oom-crash" => {
                assert_eq!(r.termination, Termination::AgentCrash, "{name}: {log}");
                assert_eq!(r.stages["agent"].outcome, "exit Some(137)");
                assert_eq!(ooms.len(), 1, "{name}: {:?}", r.audit);
                assert!(ooms[0].detail.contains("256 MiB"), "{:?}", ooms[0]);
                // Still graded (on an empty diff), like any agent outcome.
                assert!(r.reward.is_some() && r.grader.is_some());
            }
            "oom-survived" => {
                assert_eq!(r.termination, Termination::Finished, "{name}: {log}");
                assert!(log.contains("HOG=137"), "{log}");
                assert_eq!(ooms.len(), 1, "{name}: {:?}", r.audit);
            }
            _ => {
                assert_eq!(r.termination, Termination::AgentCrash, "{name}: {log}");
                assert_eq!(r.stages["agent"].outcome, "exit Some(137)");
                assert!(ooms.is_empty(), "{name}: {:?}", r.audit);
            }
        }
    }
    rt.block_on(assert_no_leftovers(&engine, &run));
}

/// An agent that marks its start and then waits (for tests that kill its container).
const AGENT_STARTS: &str = "touch /tmp/agent-started; sleep 100";

/// The id of `run`'s container once its agent ([`AGENT_STARTS`]) is running; `None` after ~60 s.
async fn agent_started(engine: &Engine, run: &str) -> Option<String> {
    for _ in 0..300 {
        for id in engine.containers_with_label(LABEL_RUN, run).await.expect("list") {
            let started = engine
                .exec(
                    &id,
                    "root",
                    "/",
                    &[],
                    "test -e /tmp/agent-started",
                    Duration::from_secs(5),
                )
                .await
                .is_ok_and(|o| o.ok());
            if started {
                return Some(id);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

#[test]
fn container_killed_mid_agent_is_one_infra_result() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let task = task("harbor__hello-world");
    images();
    let run = run_id("killed");
    let mut limits = TrialLimits::for_task(&task);
    limits.agent = Duration::from_secs(120);
    let r = rt.block_on(async {
        let engine2 = engine.clone();
        let run2 = run.clone();
        // `docker kill` once the agent has started: the container stops but still exists.
        let killer = tokio::spawn(async move {
            let id = agent_started(&engine2, &run2).await;
            if let Some(id) = &id {
                let out = Command::new("docker")
                    .args(["kill", id])
                    .output()
                    .expect("docker kill");
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            }
            id.is_some()
        });
        let r = trial(&engine, &task, &run, "sigkill", limits, Vec::new(), AGENT_STARTS).await;
        assert!(killer.await.expect("killer"), "the agent never started");
        r
    });
    assert_eq!(
        r.termination,
        Termination::Infra("agent".into()),
        "{:?}",
        r.agent_log
    );
    assert!(r.infra_failure && r.reward.is_none() && r.grader.is_none());
    assert!(
        r.agent_log
            .as_deref()
            .is_some_and(|l| l.contains("container stopped during the agent stage")),
        "{:?}",
        r.agent_log
    );
    assert!(!r.audit.iter().any(|a| a.kind == "oom_kill"), "{:?}", r.audit);
    assert_eq!(r.stages["cleanup"].outcome, "ok");
    rt.block_on(assert_no_leftovers(&engine, &run));
}

#[test]
fn blocked_egress_is_audited() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let task = task("harbor__hello-world");
    images();
    let run = run_id("egress");
    // The relay needs a socket to forward to; nothing here talks to the proxy.
    let sock_dir = tempfile::tempdir().expect("socket dir");
    let sock = sock_dir.path().join("proxy.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    // Only names under the reserved `.example` TLD, TEST-NET-3 / documentation addresses, and an
    // unused address of the trial's own subnet: none of these can lead anywhere even with a route.
    let probe = r#"
echo "RESOLV=$(grep -c '^nameserver 127.0.0.1$' /etc/resolv.conf)"
getent hosts lego-rl-egress-probe.example >/dev/null && echo DNS=resolved || echo DNS=failed
python3 - <<'PY'
import socket, urllib.request
# The container's own address comes from /etc/hosts (no DNS involved); .250 of its subnet is nobody.
own = socket.gethostbyname(socket.gethostname())
for addr in [("203.0.113.1", 80), ("2001:db8::1", 443), (own.rsplit(".", 1)[0] + ".250", 8080)]:
    try:
        socket.create_connection(addr, timeout=5)
        print("NET=open %s" % (addr,))
    except OSError as e:
        print("NET=blocked %s %s" % (addr, e.errno))
try:
    urllib.request.urlopen("http://lego-rl-egress-http.example/", timeout=5)
    print("HTTP=open")
except Exception as e:
    print("HTTP=blocked %r" % e)
PY
"#;
    let trial_with_relay = |name: &str, script: &str| {
        rt.block_on(
            Trial::new(
                engine.clone(),
                task.clone(),
                task_root(),
                images()[&task.id].image.clone(),
                &run,
                name,
                TrialLimits::for_task(&task),
                Vec::new(),
                Vec::new(),
            )
            .with_proxy_socket(sock.clone())
            .run(script),
        )
    };
    let r = trial_with_relay("egress", probe);
    let log = r.agent_log.clone().unwrap_or_default();
    assert_eq!(r.termination, Termination::Finished, "{log}");
    assert!(
        log.contains("RESOLV=1"),
        "the relay's DNS stub is not the resolver: {log}"
    );
    assert!(log.contains("DNS=failed"), "{log}");
    let net: Vec<&str> = log.lines().filter(|l| l.starts_with("NET=")).collect();
    assert_eq!(net.len(), 3, "{log}");
    assert!(net.iter().all(|l| l.starts_with("NET=blocked")), "{net:?}");
    assert!(log.contains("HTTP=blocked"), "{log}");
    let egress: Vec<&str> = r
        .audit
        .iter()
        .filter(|a| a.kind == "blocked_egress")
        .map(|a| a.detail.as_str())
        .collect();
    for name in ["lego-rl-egress-probe.example", "lego-rl-egress-http.example"] {
        assert!(
            egress.iter().any(|d| d.starts_with(&format!("dns {name} ("))),
            "{name} not audited: {egress:?}"
        );
    }
    assert!(
        egress
            .iter()
            .any(|d| d.starts_with("tcp connect to 203.0.113.1 port 80 (")),
        "the connect to 203.0.113.1 is not audited: {egress:?}"
    );
    // Docker's internal networks route outside addresses to a gateway address nobody holds; an
    // engine without that route fails them with ENETUNREACH. Either way the kernel saw it.
    assert!(
        egress
            .iter()
            .any(|d| d.contains("gateway address") || (d.contains("had no route") && !d.contains("IPv4 0,"))),
        "{egress:?}"
    );
    assert!(
        egress
            .iter()
            .any(|d| d.ends_with(".250 on the trial network: no such host (ARP unanswered)")),
        "the on-subnet attempt is not audited: {egress:?}"
    );
    // Nothing is reported for a trial that does not try to leave.
    let quiet = trial_with_relay("quiet", "echo hello > /tmp/x");
    assert_eq!(quiet.termination, Termination::Finished);
    assert!(
        !quiet.audit.iter().any(|a| a.kind == "blocked_egress"),
        "{:?}",
        quiet.audit
    );
    rt.block_on(assert_no_leftovers(&engine, &run));
}
