//! Chat layer against its references: transformers' renders (testdata/chat/expected.jsonl, and a
//! fresh run of scripts/chat_reference.py when the venv exists) and the real harness requests in
//! testdata/harness-traffic/.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use lego_rl::chat::anthropic::MessagesRequest;
use lego_rl::chat::openai::ChatCompletionRequest;
use lego_rl::chat::{ChatFormat, Conversation, RenderOptions, Role};
use serde_json::Value;

use crate::common::root;

fn format(template: &str) -> ChatFormat {
    let tok = root().join("testdata/tokenizer/qwen3");
    ChatFormat::from_parts(
        &tok.join("tokenizer.json"),
        &tok.join("tokenizer_config.json"),
        Some(&root().join(format!("testdata/tokenizer/{template}/chat_template.jinja"))),
    )
    .expect("chat format loads")
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("valid JSON line"))
        .collect()
}

/// The conversation a reference row names: `<id>` of conversations.jsonl, or
/// `harness:<file>:<line>` of a captured OpenAI request.
fn reference_conversation(id: &str, convs: &BTreeMap<String, Value>) -> Conversation {
    let body = match id.strip_prefix("harness:") {
        Some(rest) => {
            let (file, line) = rest.rsplit_once(':').unwrap();
            let recs = jsonl(&root().join("testdata/harness-traffic").join(file));
            let line: usize = line.parse().unwrap();
            recs[line - 1]["body_raw"].as_str().unwrap().to_string()
        }
        None => convs[id].to_string(),
    };
    ChatCompletionRequest::from_json(&body)
        .unwrap()
        .to_conversation()
        .unwrap()
}

#[test]
fn rendering_matches_transformers_byte_for_byte() {
    use sha2::{Digest, Sha256};
    let convs: BTreeMap<String, Value> = jsonl(&root().join("testdata/chat/conversations.jsonl"))
        .into_iter()
        .map(|c| (c["id"].as_str().unwrap().to_string(), c))
        .collect();
    let formats: BTreeMap<&str, ChatFormat> = ["qwen3", "qwen3-coder", "qwen3.5"]
        .into_iter()
        .map(|t| (t, format(t)))
        .collect();
    let rows = jsonl(&root().join("testdata/chat/expected.jsonl"));
    let mut distinct = HashSet::new();
    let (mut with_tools, mut hashed) = (0, 0);
    for row in &rows {
        let id = row["conversation"].as_str().unwrap();
        let fmt = &formats[row["template"].as_str().unwrap()];
        let conv = reference_conversation(id, &convs);
        distinct.insert(id.to_string());
        with_tools += usize::from(!conv.tools.is_empty());
        let opts = RenderOptions {
            add_generation_prompt: row["add_generation_prompt"].as_bool().unwrap(),
            enable_thinking: row["enable_thinking"].as_bool(),
            ..Default::default()
        };
        let got = fmt.render(&conv, &opts);
        if let Some(want_hash) = row.get("sha256").and_then(Value::as_str) {
            let got = got.unwrap_or_else(|e| panic!("{id}: {e:#}"));
            assert_eq!(
                got.len() as u64,
                row["bytes"].as_u64().unwrap(),
                "{id} / {}: length",
                row["template"]
            );
            assert_eq!(
                hex::encode(Sha256::digest(got.as_bytes())),
                want_hash,
                "{id} / {}",
                row["template"]
            );
            hashed += 1;
            continue;
        }
        match (row.get("text").and_then(Value::as_str), got) {
            (Some(want), Ok(got)) => {
                if want != got {
                    let at = want.bytes().zip(got.bytes()).take_while(|(a, b)| a == b).count();
                    panic!(
                        "{id} / {} / {opts:?}: differs at byte {at}\nwant: {:?}\n got: {:?}",
                        row["template"],
                        want.get(at.saturating_sub(40)..(at + 40).min(want.len())),
                        got.get(at.saturating_sub(40)..(at + 40).min(got.len()))
                    );
                }
            }
            (None, Err(_)) => {}
            (want, got) => panic!(
                "{id} / {}: transformers {want:?}, lego-rl {got:?}",
                row["template"]
            ),
        }
    }
    assert!(
        distinct.len() >= 30,
        "only {} distinct conversations",
        distinct.len()
    );
    assert!(
        rows.len() >= 220 && hashed >= 100 && with_tools >= 80,
        "{} rows, {hashed} hashed, {with_tools} with tools",
        rows.len()
    );
}

fn venv_python() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let venv = std::env::var_os("LEGO_RL_VENV")
        .map(PathBuf::from)
        .unwrap_or(home.join(".cache/lego-rl/venv"));
    [root().join(".venv/bin/python"), venv.join("bin/python")]
        .into_iter()
        .find(|p| p.exists())
}

#[test]
fn reference_script_reproduces_committed_expectations() {
    let Some(python) = venv_python() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but the venv is missing: run scripts/setup.sh"
        );
        eprintln!("skipping: no venv python (run scripts/setup.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("expected.jsonl");
    let status = std::process::Command::new(python)
        .arg(root().join("scripts/chat_reference.py"))
        .arg("--out")
        .arg(&out)
        .status()
        .expect("running chat_reference.py");
    assert!(status.success(), "chat_reference.py failed");
    let fresh = std::fs::read_to_string(&out).unwrap();
    let committed = std::fs::read_to_string(root().join("testdata/chat/expected.jsonl")).unwrap();
    assert!(
        fresh == committed,
        "transformers now renders differently: rerun scripts/chat_reference.py and review"
    );
}

fn request_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            request_files(&path, out);
        } else if path.file_name().is_some_and(|n| n == "requests.jsonl") {
            out.push(path);
        }
    }
}

/// Every tool result answers a call made earlier in the same conversation.
fn assert_results_link_to_calls(conv: &Conversation, what: &str) {
    let mut calls = HashSet::new();
    for m in &conv.messages {
        calls.extend(m.tool_calls.iter().map(|c| c.id.clone()));
        if m.role == Role::Tool {
            let id = m.tool_call_id.as_deref().unwrap_or("");
            assert!(calls.contains(id), "{what}: tool result for unknown call {id:?}");
        }
    }
}

#[test]
fn every_captured_harness_request_converts_and_renders() {
    let mut files = Vec::new();
    request_files(&root().join("testdata/harness-traffic"), &mut files);
    files.sort();
    assert_eq!(files.len(), 7, "{files:?}");
    let qwen3 = format("qwen3");
    let coder = format("qwen3-coder");
    let (mut converted, mut anthropic, mut tool_results, mut reasoning) = (0, 0, 0, 0);
    for file in &files {
        for (line, rec) in jsonl(file).iter().enumerate() {
            let what = format!("{}:{}", file.display(), line + 1);
            let path = rec["path"].as_str().unwrap_or("");
            let body = rec["body_raw"].as_str().unwrap_or("");
            let conv = if path.starts_with("/v1/messages") {
                anthropic += 1;
                MessagesRequest::from_json(body).and_then(|r| r.to_conversation())
            } else if path.starts_with("/v1/chat/completions") {
                ChatCompletionRequest::from_json(body).and_then(|r| r.to_conversation())
            } else {
                continue; // HEAD / probe
            };
            let conv = conv.unwrap_or_else(|e| panic!("{what}: {e:#}"));
            assert!(
                conv.messages.iter().any(|m| m.role == Role::User),
                "{what}: no user message"
            );
            assert_results_link_to_calls(&conv, &what);
            tool_results += conv.messages.iter().filter(|m| m.role == Role::Tool).count();
            reasoning += conv.messages.iter().filter(|m| m.reasoning.is_some()).count();
            for fmt in [&qwen3, &coder] {
                let text = fmt
                    .render(&conv, &RenderOptions::generation(conv.thinking))
                    .unwrap_or_else(|e| panic!("{what}: {e:#}"));
                assert!(
                    text.ends_with("<|im_start|>assistant\n") || text.ends_with("</think>\n\n"),
                    "{what}"
                );
            }
            converted += 1;
        }
    }
    assert_eq!((converted, anthropic), (39, 5));
    // Claude Code echoes 10 tool results over its 5 requests, thinking blocks 6 times (see README there).
    assert!(tool_results >= 40, "{tool_results}");
    assert!(reasoning >= 15, "{reasoning}");
}

/// Faithful splicing over real harness threads: each request is spliced onto the latest earlier
/// request whose conversation it extends, with the echoed assistant turn (given reasoning) as
/// "generation k" (its output tokens = the template's own rendering of that turn), while the
/// request keeps the harness's copy. Returns (spliced, breaks by kind).
fn splice_real_thread(fmt: &ChatFormat, convs: &[Conversation]) -> (usize, BTreeMap<String, usize>) {
    use lego_rl::chat::{PreviousGeneration, SpliceBreak};
    let (mut ok, mut breaks) = (0, BTreeMap::new());
    for k in 1..convs.len() {
        let new = &convs[k];
        let Some(j) = (0..k).rev().find(|&j| {
            let n = convs[j].messages.len();
            n < new.messages.len() && new.messages[n].role == Role::Assistant
        }) else {
            *breaks.entry("no earlier request".to_string()).or_default() += 1;
            continue;
        };
        let prev_conv = &convs[j];
        let opts = RenderOptions::generation(prev_conv.thinking);
        // A thinking model's turn always carries reasoning; the scripted fixtures' turns often do not.
        let mut assistant = new.messages[prev_conv.messages.len()].clone();
        if assistant.reasoning.as_deref().is_none_or(str::is_empty) {
            assistant.reasoning = Some("I should continue.".into());
        }
        let g = fmt.render(prev_conv, &opts).unwrap();
        let mut with_turn = prev_conv.clone();
        with_turn.messages.push(assistant.clone());
        let p = fmt
            .render(
                &with_turn,
                &RenderOptions {
                    add_generation_prompt: false,
                    ..opts.clone()
                },
            )
            .unwrap();
        let turn = p
            .strip_prefix(g.as_str())
            .expect("assistant turn extends the generation prompt");
        let output = &turn[..turn.rfind("<|im_end|>").unwrap() + "<|im_end|>".len()];
        let prompt_ids = fmt.prompt_ids(prev_conv, &opts).unwrap();
        let output_ids = fmt.encode(output).unwrap();
        let prev = PreviousGeneration {
            conversation: prev_conv,
            options: &opts,
            prompt_ids: &prompt_ids,
            output_ids: &output_ids,
            assistant: &assistant,
        };
        match fmt.faithful_prompt(&prev, new, &opts) {
            Ok(fp) => {
                assert!(fp
                    .prompt_ids
                    .starts_with(&[prompt_ids.as_slice(), output_ids.as_slice()].concat()));
                ok += 1;
            }
            Err(e) => {
                let kind = match e {
                    SpliceBreak::HistoryChanged { .. } => "history changed",
                    SpliceBreak::NotAppendOnly { .. } => "not append-only",
                    SpliceBreak::NotThePreviousGeneration { .. } => "not the previous generation",
                    SpliceBreak::SettingsChanged => "settings changed",
                    SpliceBreak::Chat(e) => panic!("{e:#}"),
                };
                *breaks.entry(kind.to_string()).or_default() += 1;
            }
        }
    }
    (ok, breaks)
}

#[test]
fn faithful_splicing_on_real_harness_threads() {
    let mut files = Vec::new();
    request_files(&root().join("testdata/harness-traffic"), &mut files);
    files.sort();
    let qwen3 = format("qwen3");
    let mut summary = BTreeMap::new();
    for file in &files {
        let convs: Vec<Conversation> = jsonl(file)
            .iter()
            .filter_map(|rec| {
                let body = rec["body_raw"].as_str()?;
                let path = rec["path"].as_str()?;
                if path.starts_with("/v1/messages") {
                    Some(
                        MessagesRequest::from_json(body)
                            .and_then(|r| r.to_conversation())
                            .unwrap(),
                    )
                } else if path.starts_with("/v1/chat/completions") {
                    Some(
                        ChatCompletionRequest::from_json(body)
                            .and_then(|r| r.to_conversation())
                            .unwrap(),
                    )
                } else {
                    None
                }
            })
            .collect();
        let rel = file
            .strip_prefix(root().join("testdata/harness-traffic"))
            .unwrap()
            .display()
            .to_string();
        summary.insert(rel, splice_real_thread(&qwen3, &convs));
    }
    let count = |pairs: &[(&str, usize)]| -> BTreeMap<String, usize> {
        pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    };
    // Tool-calling threads splice every turn; mini-swe-agent's text-based mode sends observations
    // as user messages, after which Qwen3 drops earlier <think> blocks (a new segment each turn);
    // title side requests and compaction (OpenCode auto-compact, OpenHands condenser) break.
    let want: BTreeMap<String, (usize, BTreeMap<String, usize>)> = [
        ("claude-code/requests.jsonl", 4, count(&[])),
        ("mini-swe-agent/requests.jsonl", 4, count(&[])),
        (
            "mini-swe-agent/textbased/requests.jsonl",
            0,
            count(&[("not append-only", 4)]),
        ),
        (
            "opencode/autocompact/requests.jsonl",
            3,
            count(&[("no earlier request", 2), ("settings changed", 1)]),
        ),
        ("opencode/requests.jsonl", 4, count(&[("no earlier request", 1)])),
        (
            "openhands-sdk/condenser/requests.jsonl",
            3,
            count(&[("no earlier request", 1), ("settings changed", 1)]),
        ),
        ("openhands-sdk/requests.jsonl", 4, count(&[])),
    ]
    .into_iter()
    .map(|(f, ok, breaks)| (f.to_string(), (ok, breaks)))
    .collect();
    assert_eq!(summary, want);
}
