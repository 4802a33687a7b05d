//! `report` on synthetic runs: CSV tables, the HTML page opened in headless Chromium (plots
//! rendered, a trajectory opened via `#traj=<id>` showing its tool calls, no script errors, a
//! screenshot), and the live server following a growing run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use lego_rl::io::AppendWriter;

use crate::common::lego;
use crate::synth::{trajectory, write_run, Synth};

/// The Chromium binary; missing is a failure in CI and a skip (with a message) elsewhere.
pub(crate) fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("which").arg(name).output() {
            if out.status.success() {
                return Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
            }
        }
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "chromium is missing in CI: run scripts/install-test-deps.sh"
    );
    eprintln!("SKIPPED: chromium not installed (scripts/install-test-deps.sh installs it)");
    None
}

fn headless(bin: &Path, profile: &Path) -> Command {
    headless_for(bin, profile, 5000)
}

/// Headless Chromium whose page runs `budget_ms` of virtual time (time that fast-forwards
/// while the page waits on nothing but timers) before the command acts.
fn headless_for(bin: &Path, profile: &Path, budget_ms: u32) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--disable-dev-shm-usage",
    ])
    .arg(format!("--virtual-time-budget={budget_ms}"))
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

pub(crate) fn dump_dom(bin: &Path, profile: &Path, url: &str) -> String {
    dump_dom_for(bin, profile, url, 5000)
}

/// [`dump_dom`] after `budget_ms` of virtual time.
pub(crate) fn dump_dom_for(bin: &Path, profile: &Path, url: &str, budget_ms: u32) -> String {
    let out = headless_for(bin, profile, budget_ms)
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn attr_number(dom: &str, id: &str) -> u64 {
    let at = dom
        .find(&format!("id=\"{id}\" data-points=\""))
        .unwrap_or_else(|| panic!("no #{id}"));
    let rest = &dom[at + id.len() + 19..];
    rest[..rest.find('"').unwrap()].parse().unwrap()
}

/// Rendered tool calls (not the script's template text).
fn tool_calls(dom: &str) -> usize {
    dom.matches("class=\"tool-call\" data-name=").count()
        + dom.matches("class=\"tool-call failed\" data-name=").count()
}

pub(crate) fn enc(id: &str) -> String {
    id.replace('/', "%2F")
}

#[test]
fn static_report_writes_csv_and_a_page_that_renders() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    write_run(
        &run,
        &Synth {
            git_every: 4,
            test_edit_every: 8,
            ..Default::default()
        },
    );
    // A validation report so the page shows a validation score and gates.
    let out = lego()
        .arg("validate")
        .arg(&run)
        .arg("--eval")
        .arg(run.join("trajectories/step-000002.jsonl.zst"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the audit gates fail on this run: {out:?}"
    );
    // Held-out trajectories of checkpoint 3 (a copy of step 1's batch): their own row and series,
    // never mixed into the training aggregates.
    std::fs::create_dir_all(run.join("eval")).unwrap();
    std::fs::copy(
        run.join("trajectories/step-000001.jsonl.zst"),
        run.join("eval/step-000003.jsonl.zst"),
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let out = lego()
        .args(["report", "--max-trajectories", "12", "-o"])
        .arg(&out_dir)
        .arg(&run)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // CSV: one row per step with behaviour and metrics columns.
    let steps = std::fs::read_to_string(out_dir.join("steps.csv")).unwrap();
    let mut rdr = csv::Reader::from_reader(steps.as_bytes());
    let header: Vec<String> = rdr.headers().unwrap().iter().map(str::to_string).collect();
    let rows: Vec<csv::StringRecord> = rdr.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 4);
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("{name} in {header:?}"))
    };
    assert_eq!(&rows[2][col("metrics_logprob_pearson")], "0.997");
    assert_eq!(&rows[0][col("trajectories")], "16");
    assert_eq!(&rows[0][col("audit_git_history")], "4");
    assert_eq!(&rows[2][col("validation_passed")], "false");
    assert_eq!(&rows[3][col("trajectories")], "0");
    assert_eq!(&rows[3][col("eval_trajectories")], &rows[1][col("trajectories")]);
    assert_eq!(&rows[3][col("eval_reward_mean")], &rows[1][col("reward_mean")]);
    assert_eq!(&rows[1][col("eval_trajectories")], "0");
    assert_eq!(&rows[1][col("eval_reward_mean")], "");
    // Every trajectory edits; half (Claude Code) never re-read, and the OpenHands ones re-read
    // unless (task + sample + step) % 3 == 0.
    let reread: f64 = rows[0][col("reread_after_edit")].parse().unwrap();
    let expect = (0..4)
        .flat_map(|t| (0..4).map(move |s| (t, s)))
        .filter(|(t, s)| s % 2 == 0 && (t + s) % 3 != 0)
        .count() as f64
        / 16.0;
    assert_eq!(reread, expect);
    assert_eq!(
        &rows[0][col("files_viewed_before_edit")],
        "1.5",
        "OpenHands views 2 files, Claude Code 1"
    );
    let harnesses = std::fs::read_to_string(out_dir.join("harnesses.csv")).unwrap();
    assert!(harnesses.starts_with("harness,trajectories"), "{harnesses}");
    assert!(harnesses.contains("claude-code,24,"), "{harnesses}");
    let terms = std::fs::read_to_string(out_dir.join("terminations.csv")).unwrap();
    assert!(terms.contains("max_turns,12,"), "{terms}");
    let tasks = std::fs::read_to_string(out_dir.join("tasks.csv")).unwrap();
    assert_eq!(tasks.lines().count(), 5);
    // Staleness: per step in long form, and summed over the run into the page's bar chart.
    let stale = std::fs::read_to_string(out_dir.join("staleness.csv")).unwrap();
    assert!(
        stale.starts_with("step,versions_behind,tokens\n0,0,100\n1,0,70\n1,1,30\n"),
        "{stale}"
    );
    assert!(
        !header.iter().any(|h| h == "metrics_staleness_histogram"),
        "{header:?}"
    );

    // Run-health advisories: every synth step ends a quarter of its trajectories at max_turns
    // (Miles' truncation threshold, 0.25, fires) and a quarter read git history (any audit event
    // fires); its Pearson (0.998 then 0.997) stays above 0.995 and declines by less than 0.002.
    let adv: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("advisories.json")).unwrap()).unwrap();
    assert_eq!(adv["schema"], "lego-rl/advisories/v1");
    assert_eq!(adv["thresholds"]["values"]["truncated_fraction"], 0.25);
    let fired: Vec<(String, u64, f64)> = adv["advisories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap().to_string(),
                a["step"].as_u64().unwrap(),
                a["value"].as_f64().unwrap(),
            )
        })
        .collect();
    for step in 0..3 {
        for name in ["truncated_fraction", "audit:git_history"] {
            assert!(
                fired.contains(&(name.to_string(), step, 0.25)),
                "{name} at step {step}: {fired:?}"
            );
        }
    }
    assert!(
        fired.iter().all(|(n, ..)| !n.starts_with("logprob_pearson")),
        "{fired:?}"
    );
    // Thresholds are the user's: raised or switched off, those advisories are quiet.
    let quiet_dir = dir.path().join("quiet");
    lego()
        .args([
            "report",
            "--advisory",
            "truncated_fraction=0.3",
            "--advisory",
            "audit=off",
            "-o",
        ])
        .arg(&quiet_dir)
        .arg(&run)
        .assert()
        .success();
    let quiet = std::fs::read_to_string(quiet_dir.join("advisories.json")).unwrap();
    assert!(
        !quiet.contains("\"truncated_fraction\",") && !quiet.contains("\"audit:"),
        "{quiet}"
    );
    let out = lego()
        .args(["report", "--advisory", "truncation=0.3", "-o"])
        .arg(dir.path().join("bad"))
        .arg(&run)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown advisory \"truncation\""), "{err}");
    assert!(!dir.path().join("bad").exists(), "nothing written on a bad flag");

    let html = std::fs::read_to_string(out_dir.join("index.html")).unwrap();
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no network references"
    );
    let Some(bin) = chromium() else { return };
    let id = "owner__repo0-100/100/0";
    assert!(
        html.contains(&format!("\"{id}\"")),
        "the first trajectory of step 1 is embedded"
    );
    let profile = dir.path().join("profile");
    let url = format!("file://{}#traj={}", out_dir.join("index.html").display(), enc(id));
    let dom = dump_dom(&bin, &profile, &url);
    assert!(
        dom.contains("<div id=\"errors\"></div>"),
        "script errors: {}",
        &dom[dom.find("id=\"errors\"").unwrap()..][..400]
    );
    for plot in [
        "plot-reward",
        "plot-logprob",
        "plot-clip",
        "plot-grad",
        "plot-zvar",
        "plot-audit",
        "plot-behaviour",
        "plot-viewed",
        "plot-turns",
    ] {
        assert!(attr_number(&dom, plot) >= 3, "{plot} has points");
    }
    assert!(
        dom.contains("class=\"pt\" data-series=\"Pearson\" data-x=\"2\" data-y=\"0.997\""),
        "Pearson point of step 2"
    );
    assert!(
        dom.contains("data-series=\"held-out pass@1\""),
        "validation score plotted"
    );
    assert!(
        dom.contains("class=\"pt\" data-series=\"held-out reward (eval/)\" data-x=\"3\""),
        "eval/ rewards plotted at the evaluated checkpoint's step"
    );
    assert!(
        attr_number(&dom, "bar-termination") == 2 && attr_number(&dom, "bar-tools") == 5,
        "termination and tool bars"
    );
    assert!(
        attr_number(&dom, "bar-staleness") == 2
            && dom.contains("data-key=\"0 behind\" data-value=\"240\"")
            && dom.contains("data-key=\"1 behind\" data-value=\"60\""),
        "the run's staleness histogram (100 + 70 + 70 current, 30 + 30 one version old)"
    );
    assert!(
        dom.contains(&format!("id=\"detail-title\">Trajectory {id}")),
        "trajectory opened"
    );
    assert!(
        dom.contains("<tr class=\"advisory\" data-name=\"truncated_fraction\">"),
        "advisories shown on the page"
    );
    assert_eq!(tool_calls(&dom), 6, "its six tool calls");
    assert!(dom.contains("data-name=\"str_replace_editor\" data-action=\"edit\""));
    assert!(dom.contains("class=\"tool-call failed\" data-name=\"execute_bash\" data-action=\"run\""));
    assert!(dom.contains("1 failed\n[Command finished with exit code 1]"));
    assert!(dom.contains("id=\"logprob-heat\""), "per-token differences");
    assert!(dom.contains("id=\"stages\""), "stage timings");
    // The trajectory list holds the embedded sample, and its rows link to details.
    assert_eq!(dom.matches("class=\"traj-row\" data-id=\"owner").count(), 12);
    // Screenshot for a human (a CI artifact).
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    for (name, hash) in [
        ("report.png", String::new()),
        ("report-trajectory.png", format!("#traj={}", enc(id))),
    ] {
        let png = shots.join(name);
        let _ = std::fs::remove_file(&png);
        let url = format!("file://{}{hash}", out_dir.join("index.html").display());
        let out = headless(&bin, &profile)
            .arg(format!("--screenshot={}", png.display()))
            .arg("--window-size=1400,2600")
            .arg(url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(std::fs::metadata(&png).unwrap().len() > 10_000, "a real image");
        eprintln!("screenshot: {}", png.display());
    }
}

/// The report data a static page embeds (`const EMBEDDED = {...};`, one line).
fn page_data(html: &str) -> serde_json::Value {
    let start = html.find("const EMBEDDED = ").expect("data slot") + "const EMBEDDED = ".len();
    let line = &html[start..start + html[start..].find('\n').unwrap()];
    serde_json::from_str(line.trim_end_matches(';')).expect("embedded JSON")
}

/// `loop.sh --refilter`'s pool files: per batch, the pool's size, what the re-filter dropped and
/// why, and its tasks' recent pass rates by band, in pool_steps.csv and the page's data; a run
/// without them has a header-only table and no rows on the page.
#[test]
fn the_task_pools_difficulty_band_is_reported_per_step() {
    use lego_rl::records::{PassRate, Record, Task, TaskDecision};
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    write_run(&run, &Synth::default());
    let report = |out: &Path| {
        lego()
            .arg("report")
            .arg(&run)
            .arg("-o")
            .arg(out)
            .assert()
            .success();
        let csv = std::fs::read_to_string(out.join("pool_steps.csv")).unwrap();
        let data = page_data(&std::fs::read_to_string(out.join("index.html")).unwrap());
        (csv, data)
    };
    let (csv, data) = report(&dir.path().join("plain"));
    assert_eq!(csv.lines().count(), 1, "header only: {csv}");
    assert_eq!(data["pool_steps"], serde_json::json!([]));

    let task = |id: &str, rate: Option<(u32, u32)>| {
        let mut t = Task::new(id, "fix it");
        t.pass_rate = rate.map(|(s, n)| PassRate::new(s, n));
        t
    };
    let drop = |id: &str, reason: Option<&str>| TaskDecision {
        schema: TaskDecision::SCHEMA.into(),
        task_id: id.into(),
        kept: reason.is_none(),
        stage: "saturation".into(),
        reason: reason.map(str::to_string),
        evidence: serde_json::Value::Null,
    };
    fn write<R: Record + Sync>(p: &Path, records: &[R]) {
        let mut w = lego_rl::io::AtomicWriter::create(p).unwrap();
        w.write_all(records).unwrap();
        w.finish().unwrap();
    }
    let pool = run.join("pool");
    std::fs::create_dir_all(&pool).unwrap();
    // Batch 1: a solved-out and a failed-out task dropped, 4 left (one without a rate yet);
    // batch 2: one more solved-out task dropped, 3 left in the middle band.
    write(
        &pool.join("step-000001.jsonl.zst"),
        &[
            task("t-never", Some((0, 4))),
            task("t-middle", Some((2, 4))),
            task("t-easy", Some((7, 8))),
            task("t-new", None),
        ],
    );
    write(
        &pool.join("step-000001.decisions.jsonl.zst"),
        &[
            drop("t-solved", Some("saturated_solved")),
            drop("t-failed", Some("saturated_failed")),
            drop("t-middle", None),
        ],
    );
    write(
        &pool.join("step-000002.jsonl.zst"),
        &[
            task("t-never", Some((1, 4))),
            task("t-middle", Some((2, 4))),
            task("t-new", Some((3, 4))),
        ],
    );
    write(
        &pool.join("step-000002.decisions.jsonl.zst"),
        &[drop("t-easy", Some("saturated_solved"))],
    );
    let (csv, data) = report(&dir.path().join("pool-report"));
    assert_eq!(
        csv,
        "step,pool_tasks,dropped_saturated_solved,dropped_saturated_failed,dropped_other,\
         unrated,never_solved,hard,middle,easy,always_solved,pass_rate_mean\n\
         1,4,1,1,0,1,1,0,1,1,0,0.4583333333333333\n\
         2,3,1,0,0,0,0,0,3,0,0,0.5\n"
    );
    let rows = data["pool_steps"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{data}");
    assert_eq!(rows[0]["step"], 1);
    assert_eq!(rows[0]["tasks"], 4);
    assert_eq!(
        rows[0]["dropped"],
        serde_json::json!({"saturated_failed": 1, "saturated_solved": 1})
    );
    assert_eq!(
        rows[0]["bands"],
        serde_json::json!({"unrated": 1, "never_solved": 1, "hard": 0, "middle": 1, "easy": 1, "always_solved": 0})
    );
    assert_eq!(rows[1]["bands"]["middle"], 3);
    assert_eq!(rows[1]["pass_rate_mean"], 0.5);
    // steps.csv's pool_dropped column agrees (step 0 had no re-filter).
    let steps = std::fs::read_to_string(dir.path().join("pool-report/steps.csv")).unwrap();
    let mut rdr = csv::Reader::from_reader(steps.as_bytes());
    let col = rdr
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == "pool_dropped")
        .unwrap();
    let dropped: Vec<String> = rdr.records().map(|r| r.unwrap()[col].to_string()).collect();
    assert_eq!(dropped, ["", "2", "1"]);
}

pub(crate) fn http_get(addr: &str, path: &str) -> (u16, String) {
    http(addr, "GET", path, None)
}

/// One HTTP/1.1 request with an optional JSON body, as the page sends it (same-origin `Origin`
/// on a POST): (status, body).
pub(crate) fn http(addr: &str, method: &str, path: &str, json: Option<&serde_json::Value>) -> (u16, String) {
    let body = json.map(|v| v.to_string()).unwrap_or_default();
    let head = if json.is_some() {
        format!(
            "Origin: http://{addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        )
    } else {
        String::new()
    };
    let (status, _, body) = raw_http(
        addr,
        &format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{head}"),
        &body,
    );
    (status, body)
}

/// One request of head `head` (request line and headers, each ending in CRLF; `Connection:
/// close` is added) and `body` to `addr`: (status, response head, body).
pub(crate) fn raw_http(addr: &str, head: &str, body: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "{head}Connection: close\r\n\r\n{body}").unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let status = buf[9..12].parse().unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    (status, head.to_string(), body.to_string())
}

pub(crate) struct Server(pub(crate) Child);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `report --serve` on a free port with `extra` arguments; returns the server and its
/// address.
pub(crate) fn serve(run: &Path, extra: &[String]) -> (Server, String) {
    serve_with(run, extra, &[])
}

/// [`serve`] with environment variables `envs` set for the server.
pub(crate) fn serve_with(run: &Path, extra: &[String], envs: &[(&str, &str)]) -> (Server, String) {
    let child = crate::common::lego_process()
        .args(["report", "--serve", "--bind", "127.0.0.1:0"])
        .arg(run)
        .args(extra)
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut server = Server(child);
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    assert!(addr.starts_with("127.0.0.1:"), "server did not start: {line:?}");
    (server, addr)
}

#[test]
fn live_server_follows_a_growing_run() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let s = Synth {
        steps: 1,
        ..Default::default()
    };
    write_run(&run, &s);
    let (_server, addr) = serve(&run, &[]);
    let summary = |addr: &str| -> serde_json::Value {
        let (status, body) = http_get(addr, "/api/summary");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let v = summary(&addr);
    assert_eq!(v["trajectory_count"], 16);
    assert_eq!(v["live"], true);
    assert!(
        v["advisories"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["name"] == "truncated_fraction"),
        "the live summary carries the advisories: {}",
        v["advisories"]
    );
    assert_eq!(v["steps"].as_array().unwrap().len(), 1);
    // A producer appends a new step's file, one committed frame, plus a torn tail.
    let path = run.join("trajectories/step-000001.jsonl.zst");
    let (mut w, _) = AppendWriter::open(&path).unwrap();
    for i in 0..3 {
        w.push(&trajectory(&s, 1, i, 0, i)).unwrap();
    }
    w.commit().unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&[0x28, 0xb5, 0x2f, 0xfd, 0x00])
        .unwrap();
    let v = summary(&addr);
    assert_eq!(v["trajectory_count"], 19, "new records seen, torn frame ignored");
    assert_eq!(v["steps"][1]["trajectories"], 3);
    // A held-out evaluation of checkpoint 1 appears too (eval/ is part of the cache key).
    std::fs::create_dir_all(run.join("eval")).unwrap();
    let (mut w, _) = AppendWriter::open(&run.join("eval/step-000001.jsonl.zst")).unwrap();
    for i in 0..2 {
        w.push(&trajectory(&s, 1, i, 0, i)).unwrap();
    }
    w.commit().unwrap();
    let v = summary(&addr);
    assert_eq!(v["steps"][1]["eval_trajectories"], 2, "{}", v["steps"][1]);
    // Details load lazily, by id.
    let id = "owner__repo1-101/101/0";
    let (status, body) = http_get(&addr, &format!("/api/trajectory?id={}", enc(id)));
    assert_eq!(status, 200, "{body}");
    let d: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(d["summary"]["id"], id);
    assert_eq!(d["behaviour"]["tool_calls"], 6);
    let (status, _) = http_get(&addr, "/api/trajectory?id=nope");
    assert_eq!(status, 404);
    let (status, page) = http_get(&addr, "/");
    assert_eq!(status, 200);
    assert!(page.contains("\"live\":true") && page.contains("\"trajectory_count\":19"));
    // The page in a browser opens a trajectory fetched from the server.
    let Some(chrome) = chromium() else { return };
    let dom = dump_dom(
        &chrome,
        &dir.path().join("profile"),
        &format!("http://{addr}/#traj={}", enc(id)),
    );
    assert!(dom.contains("<div id=\"errors\"></div>"), "script errors");
    assert!(
        dom.contains(&format!("id=\"detail-title\">Trajectory {id}")),
        "opened lazily"
    );
    assert_eq!(tool_calls(&dom), 6);
}
