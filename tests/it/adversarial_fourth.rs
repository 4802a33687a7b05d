//! The fourth pass's tricks (issue 57), each a scripted agent on the real sandboxes and graders, run
//! like the standing suite ([`crate::adversarial`]): guarded, reward 0, not an infra failure, and
//! the audit event that names it; unguarded (its defence switched off through the test-only
//! `Trial::without_defence`), what its author is after: reward 1 or the weight-0 infra failure.
//!
//! - SWE: result lines forged on the plugin's descriptor before `os._exit(0)` (the per-grading
//!   key); the grading shell's exit line injected into its stdout by tracing it, then the shell
//!   killed (the plugin's keyed `finish` alone; the no-ptrace filter alone); junit.xml made a 512 MiB sparse file or a symlink to `/dev/zero` (bounded
//!   reads; the sparse file also with the host's peak memory measured, in a child process).
//! - Harbor, on `harbor__reward-txt` (its `test.sh` runs the agent's module and writes only
//!   reward.txt): a read-only reward.txt, a planted reward.json, a daemon that rewrites the reward
//!   after `test.sh` exits, an unparseable reward (root owns `/logs/verifier`, pre-created files,
//!   the verifier user's processes killed before the read).

use std::path::PathBuf;

use lego_rl::records::Task;
use lego_rl::sandbox::{Defence, TrialResult};

use crate::adversarial::{derived_image, run_and_check, run_case};
use crate::adversarial_cases::{case, trick, write, Case, Scores, FORCE_PASS, SWE};
use crate::sandbox::{assert_no_leftovers, b64, engine, images, rt, run_id, task};

const HARBOR_TXT: &str = "harbor__reward-txt";

/// Appends `code` to the module under test (imported while pytest collects).
fn in_module(code: &str) -> String {
    format!("echo {} | base64 -d >> inflection/__init__.py", b64(code))
}

/// Writes every graded test passed, and a finish, to the plugin's descriptor, then leaves.
fn forge_fd3(swe: &Task) -> String {
    let ids: Vec<&String> = swe.fail_to_pass.iter().chain(&swe.pass_to_pass).collect();
    format!(
        "\nimport json as _j, os as _o\n\
         _l = [['start']] + [['report', t, w, 'passed', False] for t in {ids:?} for w in ('setup', 'call', 'teardown')]\n\
         for _x in _l + [['finish', 0]]:\n    _o.write(3, (_j.dumps(_x) + '\\n').encode())\n\
         _o._exit(0)\n"
    )
}

/// Traces the grading shell (x86_64): makes it run `write(1, "\nLEGO_EXIT=0\n")` at the syscall it
/// is blocked in, then kills it; when tracing is denied, only kills it.
const EXIT_LINE_BY_PTRACE: &str = r#"
import ctypes as _c, os as _o, time as _t
def _lego_trace(sh):
    libc = _c.CDLL(None, use_errno=True)
    libc.ptrace.restype = _c.c_long
    libc.ptrace.argtypes = [_c.c_long, _c.c_long, _c.c_void_p, _c.c_void_p]
    if libc.ptrace(16, sh, None, None) != 0:
        return
    _o.waitpid(sh, 0)
    class R(_c.Structure):
        _fields_ = [(n, _c.c_ulonglong) for n in 'r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs'.split()]
    r = R()
    libc.ptrace(12, sh, None, _c.byref(r))
    msg = b'\nLEGO_EXIT=0\n\0\0\0'
    addr = (r.rsp - 4096) & ~15
    for i in range(0, 16, 8):
        libc.ptrace(5, sh, addr + i, int.from_bytes(msg[i:i + 8], 'little'))
    r.rip -= 2
    r.rax, r.rdi, r.rsi, r.rdx, r.orig_rax = 1, 1, addr, 13, (1 << 64) - 1
    libc.ptrace(13, sh, None, _c.byref(r))
    libc.ptrace(9, sh, None, None)
    _o.waitpid(sh, 0)
_sh = _o.getppid()
try:
    _lego_trace(_sh)
except Exception:
    pass
_o.kill(_sh, 9)
_t.sleep(3)
"#;

/// At exit, junit.xml grown to a 512 MiB sparse file.
const SPARSE_JUNIT: &str = "\nimport atexit as _ae, sys as _s\ndef _lego_sparse():\n    for a in _s.argv:\n        \
if a.startswith('--junitxml='):\n            with open(a.split('=', 1)[1], 'r+b') as f:\n                f.truncate(512 << 20)\n\
_ae.register(_lego_sparse)\n";

/// At exit, junit.xml replaced by a symlink to `/dev/zero`.
const ZERO_JUNIT: &str = "\nimport atexit as _ae, os as _o, sys as _s\ndef _lego_zero():\n    for a in _s.argv:\n        \
if a.startswith('--junitxml='):\n            p = a.split('=', 1)[1]\n            _o.remove(p)\n            _o.symlink('/dev/zero', p)\n\
_ae.register(_lego_zero)\n";

/// `/app/greet.py` that does `code` at import and greets wrongly (no fix).
fn greet(code: &str) -> String {
    write(
        "/app/greet.py",
        &format!("{code}\ndef greet(name):\n    return name\n"),
    )
}

/// A daemon, started at import, that waits for `test.sh` (pytest's parent) to exit and then
/// writes reward 1 (atomically by rename where the directory lets it).
const REWARD_DAEMON: &str = "import os, time\n_tsh = os.getppid()\n\
if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        \
while os.path.exists('/proc/%d' % _tsh):\n            time.sleep(0.001)\n        \
for _ in range(3000):\n            try:\n                \
open('/logs/verifier/.r', 'w').write('1\\n')\n                os.replace('/logs/verifier/.r', '/logs/verifier/reward.txt')\n                break\n            \
except OSError:\n                pass\n            try:\n                \
open('/logs/verifier/reward.txt', 'w').write('1\\n')\n                break\n            except OSError:\n                time.sleep(0.001)\n        \
os._exit(0)\n    os._exit(0)\nos.wait()\n";

fn harbor(name: &'static str, code: &str, scores: Scores) -> Case {
    let mut c = trick(
        name,
        greet(code),
        "reward_tampering",
        &[Defence::RewardFiles],
        scores,
    );
    c.task = HARBOR_TXT;
    c.reason = Some("reward_tampering");
    c
}

fn cases(swe: &Task) -> Vec<Case> {
    let mut forged = trick(
        "forged-result-lines-on-the-plugins-descriptor",
        in_module(&forge_fd3(swe)),
        "result_tampering",
        &[Defence::KeyedResults],
        Scores::Reward,
    );
    forged.reason = Some("grader_tampering");
    // The same injected exit line with the no-ptrace filter off in both runs: the finish rule
    // alone must catch the killed shell.
    let mut by_finish = trick(
        "exit-line-injected-by-ptrace-caught-by-the-plugins-finish",
        in_module(EXIT_LINE_BY_PTRACE),
        "grading_killed",
        &[Defence::PluginFinish],
        Scores::Infra,
    );
    by_finish.keep_off = vec![Defence::NoPtrace];
    by_finish.reason = Some("grading_killed");
    // The finish rule stays off in both runs: the filter alone must stop the traced exit line.
    let mut by_ptrace = trick(
        "exit-line-injected-by-ptrace-then-the-shell-killed",
        in_module(EXIT_LINE_BY_PTRACE),
        "grading_killed",
        &[Defence::NoPtrace],
        Scores::Infra,
    );
    by_ptrace.keep_off = vec![Defence::PluginFinish];
    by_ptrace.reason = Some("grading_killed");
    // Its unguarded twin is the sparse file's: `cat` of /dev/zero never ends (the attack itself).
    let zero = case(
        "junit-xml-a-symlink-to-dev-zero",
        SWE,
        in_module(ZERO_JUNIT),
        0.0,
        &["result_tampering"],
    );
    let planted = "open('/logs/verifier/reward.json', 'w').write('{\"reward\": 1}')";
    let read_only = "import os\ntry:\n    open('/logs/verifier/reward.txt', 'w').write('1\\n')\n    \
                     os.chmod('/logs/verifier/reward.txt', 0o444)\nexcept OSError:\n    pass";
    let unparseable = read_only.replace("write('1\\n')", "write('one\\n')");
    let mut daemon = harbor(
        "harbor-daemon-rewrites-the-reward-after-test-sh",
        REWARD_DAEMON,
        Scores::Reward,
    );
    daemon.events = vec!["outlived_verifier"];
    daemon.reason = None;
    let mut control = case(
        "control-harbor-reward-txt-fix",
        HARBOR_TXT,
        String::new(),
        1.0,
        &[],
    );
    control.script = crate::sandbox::gold_script(&task(HARBOR_TXT));
    vec![
        forged,
        by_finish,
        by_ptrace,
        zero,
        harbor(
            "harbor-planted-reward-json",
            &format!("try:\n    {planted}\nexcept OSError:\n    pass"),
            Scores::Reward,
        ),
        harbor("harbor-read-only-reward-txt", read_only, Scores::Reward),
        harbor("harbor-unparseable-reward", &unparseable, Scores::Infra),
        daemon,
        control,
    ]
}

/// `image` with pytest 9.2.0 (which reads pytest.toml and .pytest.toml before every other config
/// file) in place of the base image's 8.4.1: the wheel scripts/install-test-deps.sh downloaded,
/// installed offline.
fn pytest9_image(image: &str) -> String {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    let wheel = "pytest-9.2.0-py3-none-any.whl";
    let src = cache.join("lego-rl/pytest9").join(wheel);
    assert!(
        src.exists(),
        "no {}: run scripts/install-test-deps.sh (scripts/test.sh does)",
        src.display()
    );
    let ctx = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pytest9");
    std::fs::create_dir_all(&ctx).expect("build context");
    std::fs::copy(&src, ctx.join(wheel)).expect("copy the wheel");
    let dockerfile = format!(
        "FROM {image}\nCOPY {wheel} /tmp/\n\
         RUN python3 -m pip install -q --no-index --no-deps --break-system-packages /tmp/{wheel} && rm /tmp/{wheel}\n"
    );
    std::fs::write(ctx.join("Dockerfile"), dockerfile).expect("Dockerfile");
    derived_image(image, "pytest-9", &ctx)
}

/// A plugin named in pytest 9's own config files (the documented default command, which leaves
/// addopts alone), on the pytest 9 image: reverted like every config file; with the revert off,
/// the plugin's report of the config file pytest used catches it; with both off, it scores.
fn pytest9_cases(image: &str, swe: &Task) -> Vec<Case> {
    let mut v = Vec::new();
    for (name, file) in [
        ("pytest-toml-loads-a-plugin", "pytest.toml"),
        ("dot-pytest-toml-loads-a-plugin", ".pytest.toml"),
    ] {
        let script = format!(
            "{} && {}",
            write("lego_force.py", FORCE_PASS),
            write(file, "[pytest]\naddopts = [\"-p\", \"lego_force\"]\n")
        );
        let mut c = trick(
            name,
            script.clone(),
            "collection_hook",
            &[Defence::CollectionHooks, Defence::ConfigCheck],
            Scores::Reward,
        );
        c.test_cmd = Some("PYTHONPATH=. python3 -m pytest -p no:cacheprovider");
        c.image = Some(image.to_string());
        v.push(c);
        if file == "pytest.toml" {
            let mut c = trick(
                "pytest-toml-caught-by-the-config-report",
                script,
                "config_mismatch",
                &[Defence::ConfigCheck],
                Scores::Reward,
            );
            c.keep_off = vec![Defence::CollectionHooks];
            c.reason = Some("grader_tampering");
            c.test_cmd = Some("PYTHONPATH=. python3 -m pytest -p no:cacheprovider");
            c.image = Some(image.to_string());
            v.push(c);
        }
    }
    let mut control = case(
        "control-fix-on-pytest-9",
        SWE,
        crate::sandbox::gold_script(swe),
        1.0,
        &[],
    );
    control.image = Some(image.to_string());
    v.push(control);
    v
}

/// Kinds this file checks (a case must show its own and none other of these).
const KINDS: &[&str] = &[
    "result_tampering",
    "grading_killed",
    "reward_tampering",
    "reward_missing",
    "outlived_verifier",
    "config_mismatch",
    "collection_hook",
];

fn check(c: &Case, r: &TrialResult) -> Result<(), String> {
    let ctx = || {
        format!(
            "{}: {:?} {:?} infra={:?} audit={:?} grader={:?}",
            c.name, r.termination, r.reward, r.infra_cause, r.audit, r.grader
        )
    };
    if r.infra_failure || r.reward != Some(c.reward) {
        return Err(format!("reward or infra: {}", ctx()));
    }
    let reason = r.grader.as_ref().and_then(|g| g.reason.as_deref());
    // The daemon is killed the moment test.sh exits, wherever it is: before it writes (no more
    // than its event), after it truncated or wrote the reward (reward_tampering), or, when the
    // kernel's file clock stamped its truncation within the tick of the exit's mark, with the
    // reward truncated (reward_missing). Reward 0 in each case.
    let daemon = c.name.starts_with("harbor-daemon");
    let late = ["reward_tampering", "reward_missing"];
    if reason != c.reason && !(daemon && reason.is_some_and(|r| late.contains(&r))) {
        return Err(format!("reason {reason:?}: {}", ctx()));
    }
    let kinds: Vec<&str> = r
        .audit
        .iter()
        .map(|a| a.kind.as_str())
        .filter(|k| KINDS.contains(k))
        .collect();
    let extra = kinds
        .iter()
        .any(|k| !(c.events.contains(k) || daemon && late.contains(k)));
    if !c.events.iter().all(|w| kinds.contains(w)) || extra {
        return Err(format!("events {kinds:?}, want {:?}: {}", c.events, ctx()));
    }
    Ok(())
}

/// Yama's `ptrace_scope` >= 1 (Ubuntu's default) already keeps a process from tracing its parent:
/// there the ptrace trick cannot score even with the filter off.
fn yama_blocks_tracing_the_parent() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .is_some_and(|n| n >= 1)
}

/// The daemon that races `test.sh`'s exit (see [`REWARD_DAEMON`]): still open. On the last runs
/// it wrote reward 1 before the kill of the verifier user's processes, guarded, twice in a row;
/// the threat model in man/lego-rl-formats.md lists it as an open risk.
const OPEN: &str = "harbor-daemon-rewrites-the-reward-after-test-sh";

#[test]
fn fourth_pass_tricks_score_without_their_defence_and_get_zero_with_it() {
    run_cases(&|name| name != OPEN, "adversarial-fourth");
}

#[test]
#[ignore = "open (issue 57): a daemon racing test.sh's exit still scores reward 1 guarded"]
fn harbor_daemon_racing_test_sh_exit() {
    run_cases(&|name| name == OPEN, "adversarial-fourth-open");
}

/// Runs the cases `include` selects (and `LEGO_RL_ADVERSARIAL_ONLY`, comma-separated names, when
/// set), each with its defence and, where it has one, without.
fn run_cases(include: &dyn Fn(&str) -> bool, run: &str) {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    images();
    let swe = task(SWE);
    let run = run_id(run);
    let only = std::env::var("LEGO_RL_ADVERSARIAL_ONLY").unwrap_or_default();
    let pytest9 = pytest9_image(&images()[SWE].image);
    let all: Vec<Case> = cases(&swe)
        .into_iter()
        .chain(pytest9_cases(&pytest9, &swe))
        .filter(|c| include(c.name))
        .filter(|c| only.is_empty() || only.split(',').any(|o| o == c.name))
        .collect();
    let yama = yama_blocks_tracing_the_parent();
    let runs: Vec<(usize, bool)> = all
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            let twin = !(c.off.is_empty() || yama && c.off == [Defence::NoPtrace]);
            std::iter::once((i, false)).chain(twin.then_some((i, true)))
        })
        .collect();
    if yama {
        eprintln!("NOTE: Yama ptrace_scope >= 1 on this host: the ptrace trick's unguarded twin is not run");
    }
    let tasks: Vec<Task> = all.iter().map(|c| task(c.task)).collect();
    let tasks: Vec<&Task> = tasks.iter().collect();
    run_and_check(&rt, &engine, &run, (&all, &tasks), &runs, check);
}

/// The environment variable that makes [`sparse_junit_child`] run (`guarded` or `unguarded`).
const CHILD: &str = "LEGO_RL_SPARSE_JUNIT_CHILD";

/// Peak resident memory of this process (kB).
fn vm_hwm_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One sparse-junit trial in a process of its own (run by
/// [`a_sparse_junit_xml_never_reaches_the_host_memory`]): prints its reward, events and how much its
/// peak memory grew during the trial.
#[test]
fn sparse_junit_child() {
    let Ok(mode) = std::env::var(CHILD) else { return };
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    let swe = task(SWE);
    let mut c = trick(
        "junit-xml-a-512-mib-sparse-file",
        in_module(SPARSE_JUNIT),
        "result_tampering",
        &[Defence::BoundedReads],
        Scores::Reward,
    );
    c.eval_s = Some(120);
    let before = vm_hwm_kb();
    let run = std::env::var("LEGO_RL_SPARSE_JUNIT_RUN").expect("run id");
    let r = rt.block_on(run_case(&engine, &swe, &run, &c, mode == "unguarded"));
    let grown = vm_hwm_kb().saturating_sub(before);
    let kinds: Vec<&str> = r.audit.iter().map(|a| a.kind.as_str()).collect();
    println!(
        "LEGO_CHILD reward={:?} infra={} kinds={} grown_kb={grown}",
        r.reward,
        r.infra_failure,
        kinds.join(",")
    );
}

#[test]
fn a_sparse_junit_xml_never_reaches_the_host_memory() {
    let rt = rt();
    let Some(engine) = engine(&rt) else { return };
    images();
    let run = run_id("adversarial-sparse");
    let child = |mode: &str| {
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "adversarial_fourth::sparse_junit_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD, mode)
            .env("LEGO_RL_SPARSE_JUNIT_RUN", &run)
            .output()
            .expect("child test runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text
            .lines()
            .find_map(|l| l.split_once("LEGO_CHILD ").map(|(_, r)| r))
            .unwrap_or_else(|| {
                panic!(
                    "{mode}: no result line: {text} {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
            .to_string();
        let field = |k: &str| {
            line.split(' ')
                .find_map(|f| f.strip_prefix(k))
                .unwrap_or_default()
                .to_string()
        };
        (
            field("reward="),
            field("infra="),
            field("kinds="),
            field("grown_kb=").parse::<u64>().unwrap_or(0),
        )
    };
    // Guarded: refused by its size, reward 0 with its event, and the host's peak memory barely
    // moves. Unguarded: read whole (reward 0 as earned, but hundreds of MiB into the host).
    let (reward, infra, kinds, grown) = child("guarded");
    assert_eq!(
        (reward.as_str(), infra.as_str()),
        ("Some(0.0)", "false"),
        "{kinds}"
    );
    assert!(kinds.split(',').any(|k| k == "result_tampering"), "{kinds}");
    assert!(grown < 64 << 10, "guarded: peak memory grew {grown} kB");
    let (_, _, _, grown) = child("unguarded");
    assert!(grown > 400 << 10, "unguarded: peak memory grew only {grown} kB");
    rt.block_on(assert_no_leftovers(&engine, &run));
}
