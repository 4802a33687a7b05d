//! The report's diagnostic assistant: the live UI's Ask box in headless Chromium with the
//! assistant served by the embedded engine (the tiny model's words are noise, but the path is
//! real), the prompt budget on a long real Claude Code episode, no Ask box and no endpoint
//! without `--assistant`, and `--summarize` against an endpoint that always fails. The summary
//! of a real run with the embedded assistant is in pipeline.rs (the demo run).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use lego_rl::io::AppendWriter;
use lego_rl::records::Trajectory;
use serde_json::{json, Value};

use crate::common::{lego, root};
use crate::report::{chromium, dump_dom, enc, http, http_get, serve};
use crate::synth::{trajectory, write_run, Synth};

/// The rendered Ask box (its question filled in; the script's template has a placeholder).
const ASK_BOX: &str = "<textarea id=\"ask-q\" rows=\"2\">Why did this trajectory";

fn http_post(addr: &str, path: &str, body: &Value) -> (u16, String) {
    http(addr, "POST", path, Some(body))
}

/// A synthetic run of one group of two trajectories in `dir/run`.
pub(crate) fn small_run(dir: &Path) -> (PathBuf, Synth) {
    let run = dir.join("run");
    let s = Synth {
        steps: 1,
        tasks: 1,
        group_size: 2,
        ..Default::default()
    };
    write_run(&run, &s);
    (run, s)
}

/// The longest request of the real Claude Code capture in testdata, as one trajectory's
/// generation: a long instruction with system reminders, file reads and edits.
pub(crate) fn claude_code_trajectory(s: &Synth) -> Trajectory {
    let path = root().join("testdata/harness-traffic/claude-code/requests.jsonl");
    let body = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["method"] == "POST" && v["body"]["messages"].is_array())
        .max_by_key(|v| v["body"]["messages"].as_array().unwrap().len())
        .unwrap()["body"]
        .clone();
    let mut t = trajectory(s, 0, 1, 1, 1);
    t.task_id = "claude__code-1".into();
    t.id = Trajectory::make_id(&t.task_id, 900, 0);
    t.harness = "claude-code".into();
    t.reward = Some(0.0);
    let mut g = t.generations[0].clone();
    g.api = "anthropic".into();
    g.request = body;
    t.generations = vec![g];
    t
}

/// [`small_run`] with [`claude_code_trajectory`] appended to its first step's trajectories.
pub(crate) fn run_with_long_episode(dir: &Path) -> (PathBuf, Trajectory) {
    let (run, s) = small_run(dir);
    let long = claude_code_trajectory(&s);
    let (mut w, _) = AppendWriter::open(&run.join("trajectories/step-000000.jsonl.zst")).unwrap();
    w.push(&long).unwrap();
    w.commit().unwrap();
    (run, long)
}

#[test]
fn ask_box_streams_an_embedded_answer_about_a_long_episode_and_saves_it() {
    let dir = tempfile::tempdir().unwrap();
    let (run, long) = run_with_long_episode(dir.path());
    let conversations = dir.path().join("saved/conversations.jsonl");
    let (context, max_tokens) = (1024usize, 24usize);
    let (_server, addr) = serve(
        &run,
        &[
            format!("--assistant=embedded:{}", crate::model::tiny_moe().display()),
            format!("--assistant-chat-model={}", crate::rollout::chat_dir().display()),
            format!("--assistant-context={context}"),
            format!("--assistant-max-tokens={max_tokens}"),
            format!("--conversations={}", conversations.display()),
        ],
    );
    let (status, body) = http_get(&addr, "/api/summary");
    assert_eq!(status, 200, "{body}");
    let summary: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        summary["assistant"]["context"], context,
        "{}",
        summary["assistant"]
    );
    // The exact prompt, counted by the tokenizer, fits the budget left after the answer; the
    // episode does not fit whole, and the prompt says what it left out.
    let (status, body) = http_get(&addr, &format!("/api/ask/prompt?id={}", enc(&long.id)));
    assert_eq!(status, 200, "{body}");
    let p: Value = serde_json::from_str(&body).unwrap();
    let (tokens, budget) = (p["tokens"].as_u64().unwrap(), p["budget"].as_u64().unwrap());
    assert_eq!(p["exact"], true);
    assert!(budget as usize <= context - max_tokens, "{budget}");
    assert!(
        tokens <= budget,
        "prompt of {tokens} tokens over its budget of {budget}"
    );
    let user = p["user"].as_str().unwrap();
    let left_out = p["left_out"].as_array().unwrap();
    assert!(
        left_out
            .iter()
            .any(|l| l.as_str().unwrap().contains("cut") || l.as_str().unwrap().contains("middle")),
        "{left_out:?}"
    );
    for section in [
        "## Instruction",
        "## Outcome",
        "## Grader",
        "## Rollout-vs-trainer agreement",
        "## Left out",
        "## Question",
    ] {
        assert!(user.contains(section), "no {section} in\n{user}");
    }
    assert!(user.contains("→ "), "tool calls are in the prompt:\n{user}");
    // The answer streams as server-sent events: the prompt, then text, then the end.
    let (status, sse) = http_post(&addr, "/api/ask", &json!({"id": long.id}));
    assert_eq!(status, 200, "{sse}");
    let events: Vec<&str> = sse.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(events.first(), Some(&"prompt"), "{sse}");
    assert_eq!(events.last(), Some(&"end"), "{sse}");
    assert!(
        events.iter().any(|e| *e == "delta" || *e == "reasoning"),
        "streamed pieces: {sse}"
    );
    assert!(!events.contains(&"error"), "{sse}");
    // In the browser: the deep link opens the trajectory with the Ask box armed; a click asks
    // the default question, and the conversation is saved after the answer.
    let Some(chrome) = chromium() else { return };
    let mut b = crate::cdp::Browser::open(
        &chrome,
        &dir.path().join("profile"),
        &[],
        &format!("http://{addr}/#traj={}&ask=save", enc(&long.id)),
    );
    assert!(b.wait_for("document.getElementById('ask-go')", 60), "{}", b.dom());
    b.eval("document.getElementById('ask-go').click()");
    assert!(
        b.wait_for("document.getElementById('ask-saved')", 600),
        "{}",
        b.dom()
    );
    let dom = b.dom();
    assert!(dom.contains("<div id=\"errors\"></div>"), "script errors");
    assert!(dom.contains(ASK_BOX), "the Ask box is shown");
    let answer = dom
        .split("<pre class=\"ask-text\">")
        .nth(1)
        .and_then(|a| a.split("</pre>").next())
        .unwrap_or_default();
    let reasoning = dom
        .split("<pre class=\"ask-reasoning\">")
        .nth(1)
        .and_then(|a| a.split("</pre>").next())
        .unwrap_or_default();
    assert!(
        dom.contains("data-done=\"1\"") && !(answer.is_empty() && reasoning.is_empty()),
        "a streamed answer: {}",
        &dom[dom.find("id=\"ask\"").unwrap()..]
    );
    assert!(dom.contains("id=\"ask-saved\""), "saved");
    let saved = std::fs::read_to_string(&conversations).unwrap();
    let lines: Vec<Value> = saved.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "{saved}");
    let c = &lines[0];
    assert_eq!(c["schema"], "lego-rl/conversation/v1");
    assert_eq!(c["trajectory_id"], long.id.as_str());
    assert_eq!(c["turns"].as_array().unwrap().len(), 2, "{c}");
    assert_eq!(c["turns"][0]["content"], summary["assistant"]["default_question"]);
    assert!(!c["turns"][1]["content"].as_str().unwrap().is_empty());
    assert_eq!(
        c["prompt"]["user"].as_str(),
        Some(user),
        "the prompt asked is the one shown"
    );
}

#[test]
fn without_an_assistant_there_is_no_ask_box_and_nothing_to_send_to() {
    let dir = tempfile::tempdir().unwrap();
    let (run, s) = small_run(dir.path());
    let (_server, addr) = serve(&run, &[]);
    let (_, body) = http_get(&addr, "/api/summary");
    let summary: Value = serde_json::from_str(&body).unwrap();
    assert!(summary.get("assistant").is_none(), "{}", summary["assistant"]);
    let id = trajectory(&s, 0, 0, 0, 0).id;
    let (status, body) = http_post(&addr, "/api/ask", &json!({ "id": id }));
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no assistant configured"), "{body}");
    let (status, _) = http_get(&addr, &format!("/api/ask/prompt?id={}", enc(&id)));
    assert_eq!(status, 404);
    let (status, _) = http_post(&addr, "/api/conversations", &json!({"id": id, "turns": []}));
    assert_eq!(status, 404);
    let Some(chrome) = chromium() else { return };
    let dom = dump_dom(
        &chrome,
        &dir.path().join("profile"),
        &format!("http://{addr}/#traj={}&ask=save", enc(&id)),
    );
    assert!(dom.contains("<div id=\"errors\"></div>"), "script errors");
    assert!(dom.contains(&format!("id=\"detail-title\">Trajectory {id}")));
    assert!(!dom.contains(ASK_BOX), "no Ask box without --assistant");
}

/// An OpenAI-compatible endpoint that answers every request 503, counting them.
pub(crate) fn failing_endpoint() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut len = 0usize;
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            c.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 38\r\nConnection: close\r\n\r\n{\"error\":{\"message\":\"overloaded now\"}}",
            );
        }
    });
    (format!("http://{addr}/v1"), count)
}

#[test]
fn summarize_records_unknown_causes_when_every_request_fails() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let s = Synth {
        steps: 2,
        tasks: 2,
        group_size: 2,
        infra_every: 3,
        ..Default::default()
    };
    write_run(&run, &s);
    let mut failed = Vec::new();
    for step in 0..2 {
        let ts: Vec<Trajectory> = lego_rl::io::read_all(
            &run.join(format!("trajectories/step-{step:06}.jsonl.zst")),
            Default::default(),
        )
        .unwrap();
        failed.extend(
            ts.into_iter()
                .filter(|t| t.is_infra_failure() || t.reward.is_none_or(|r| r < 0.5))
                .map(|t| t.id),
        );
    }
    assert!(failed.len() >= 3, "{failed:?}");
    let (url, requests) = failing_endpoint();
    let out_dir: PathBuf = dir.path().join("report");
    let o = lego()
        .args(["report", "-o"])
        .arg(&out_dir)
        .arg(&run)
        .args(["--summarize", "--summarize-retries", "1", "--assistant", &url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2 * failed.len(),
        "each failed trial asked once and retried once"
    );
    let mut rows = csv::Reader::from_path(out_dir.join("diagnosis.csv")).unwrap();
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    let mut ids: Vec<&str> = rows.iter().map(|r| &r[0]).collect();
    ids.sort();
    let mut want: Vec<&str> = failed.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(ids, want, "every failed trial exactly once");
    assert!(
        rows.iter()
            .all(|r| &r[6] == "false" && r[7].starts_with("unknown (")),
        "{rows:?}"
    );
    assert!(rows[0][7].contains("503"), "{:?}", &rows[0]);
    let md = std::fs::read_to_string(out_dir.join("diagnosis.md")).unwrap();
    assert!(
        md.contains(&format!("| unknown | {} | 100.0% |", failed.len())),
        "{md}"
    );
    assert!(out_dir.join("index.html").is_file(), "the report is written too");
}
