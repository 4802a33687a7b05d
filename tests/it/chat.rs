//! Chat layer against its references: transformers' renders (testdata/chat/expected.jsonl, and a
//! fresh run of scripts/chat_reference.py when the venv exists) and the real harness requests in
//! testdata/harness-traffic/.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use lego_rl::chat::anthropic::MessagesRequest;
use lego_rl::chat::openai::ChatCompletionRequest;
use lego_rl::chat::{ChatFormat, Conversation, RenderOptions, Role};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

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
    let formats: BTreeMap<&str, ChatFormat> =
        [("qwen3", format("qwen3")), ("qwen3-coder", format("qwen3-coder"))].into();
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
        rows.len() >= 150 && hashed >= 60 && with_tools >= 80,
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
