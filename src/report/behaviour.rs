//! Agent behaviour read back from the requests the proxy captured: the conversation of each
//! thread, its tool calls and their outputs, and the diagnostics the paper used to explain its
//! gains.
//!
//! How it is inferred (documented in the report page too):
//! - The conversation of a thread is built by [`super::conversation`] from all its captures:
//!   the requests (each carries the history) and the answers the proxy recorded. OpenAI: assistant `tool_calls[].function{name,
//!   arguments}` and `role: tool` results by `tool_call_id`. Anthropic: `tool_use` blocks and
//!   `tool_result` blocks (with `is_error`) by `tool_use_id`. A harness without tool calls
//!   (mini-swe-agent) has its ```` ```bash ```` blocks taken as shell calls, their output being
//!   the next user message.
//! - Each call is classified as a **view** of a file (`Read`/`view`-like tools, an editor tool
//!   with `command: view`, or a shell `cat`/`head`/`tail`/`nl`/`less`/`sed -n` of a file), an
//!   **edit** (`Edit`/`Write`/`MultiEdit`/`apply_patch`, an editor `create`/`str_replace`/
//!   `insert`, shell `sed -i`, or a `>`/`tee` redirection into a file), or a **run** of any other
//!   shell command. Paths are the same file when equal after dropping `./`, or when one ends
//!   with `/` + the other.
//! - A run failed when its result has `is_error`, or its output reports a non-zero exit code
//!   (`exit code N`, `exit_code: N`, `<returncode>N</returncode>`, `returncode: N`); zero is a
//!   success; anything else is unknown and not counted.
//! - **Re-read after edit**: a trajectory with an edit views an edited file after editing it.
//!   **Files viewed before the first edit**: distinct files viewed before it (trajectories with
//!   an edit). **Success after a failed command**: of failed runs followed by another run with a
//!   known outcome, the fraction where that next run succeeded.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use serde_json::Value;

/// What a tool call did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    View { path: String },
    Edit { paths: Vec<String> },
    Run { command: String },
    Other,
}

/// One tool call with its output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// Arguments as JSON text.
    pub args: String,
    pub output: Option<String>,
    pub is_error: bool,
    pub action: Action,
    /// For runs: Some(true) when it failed, Some(false) when it succeeded.
    pub failed: Option<bool>,
}

/// One message of a conversation, normalized across APIs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Turn {
    pub role: String,
    pub text: String,
    pub calls: Vec<Call>,
    /// True when the message only carries tool results (already shown under their calls).
    pub only_results: bool,
}

/// The conversation of one thread.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Thread {
    pub thread: u32,
    pub api: String,
    pub turns: Vec<Turn>,
}

/// The behaviour diagnostics of one trajectory.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Behaviour {
    pub tool_calls: u64,
    pub views: u64,
    pub edits: u64,
    pub runs: u64,
    /// Some when the trajectory edits a file.
    pub reread_after_edit: Option<bool>,
    pub files_viewed_before_edit: Option<u64>,
    pub failed_runs_followed: u64,
    pub recovered: u64,
    pub tool_names: BTreeMap<String, u64>,
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.clone()),
                _ => match p.get("type").and_then(Value::as_str) {
                    Some("text") | None => p.get("text").and_then(Value::as_str).map(str::to_string),
                    Some("tool_result") => Some(text_of(p.get("content").unwrap_or(&Value::Null))),
                    _ => None,
                },
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The ```` ```bash ```` blocks of a message (a harness without tool calls runs them).
pub(crate) fn bash_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("```bash") {
        let body = &rest[i + 7..];
        let Some(end) = body.find("```") else { break };
        out.push(body[..end].trim().to_string());
        rest = &body[end + 3..];
    }
    out
}

/// Normalizes one request's messages (and system prompt) into turns with calls and outputs.
pub fn turns_of(api: &str, request: &Value) -> Vec<Turn> {
    let mut turns: Vec<Turn> = Vec::new();
    if let Some(sys) = request.get("system") {
        turns.push(Turn {
            role: "system".into(),
            text: text_of(sys),
            calls: vec![],
            only_results: false,
        });
    }
    let empty = Vec::new();
    let messages = request
        .get("messages")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    // call id → (turn, call) index, to attach outputs.
    let mut by_id: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut pending_text_calls: Vec<(usize, usize)> = Vec::new();
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("").to_string();
        let content = m.get("content").unwrap_or(&Value::Null);
        let mut results: Vec<(String, String, bool)> = Vec::new();
        let mut turn = Turn {
            role: role.clone(),
            text: String::new(),
            calls: vec![],
            only_results: false,
        };
        if role == "tool" {
            let id = m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            results.push((id, text_of(content), false));
        } else {
            turn.text = text_of(content);
            for tc in m.get("tool_calls").and_then(Value::as_array).unwrap_or(&empty) {
                let f = tc.get("function").unwrap_or(&Value::Null);
                let args = match f.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                    None => String::new(),
                };
                turn.calls.push(new_call(
                    tc.get("id").and_then(Value::as_str).unwrap_or(""),
                    f.get("name").and_then(Value::as_str).unwrap_or(""),
                    args,
                ));
            }
            for block in content.as_array().unwrap_or(&empty) {
                match block.get("type").and_then(Value::as_str) {
                    Some("tool_use") => turn.calls.push(new_call(
                        block.get("id").and_then(Value::as_str).unwrap_or(""),
                        block.get("name").and_then(Value::as_str).unwrap_or(""),
                        block.get("input").map(Value::to_string).unwrap_or_default(),
                    )),
                    Some("tool_result") => results.push((
                        block
                            .get("tool_use_id")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        text_of(block.get("content").unwrap_or(&Value::Null)),
                        block.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                    )),
                    _ => {}
                }
            }
            if role == "assistant" && turn.calls.is_empty() && api != "none" {
                for (i, cmd) in bash_blocks(&turn.text).into_iter().enumerate() {
                    let args = serde_json::json!({ "command": cmd }).to_string();
                    turn.calls
                        .push(new_call(&format!("text-{}-{i}", turns.len()), "bash", args));
                }
            }
        }
        // A user message after text-block calls is their output (mini-swe-agent style).
        if role == "user" && results.is_empty() && !pending_text_calls.is_empty() {
            for (ti, ci) in pending_text_calls.drain(..) {
                set_output(&mut turns[ti].calls[ci], turn.text.clone(), false);
            }
        }
        pending_text_calls.clear();
        let plain_text = content
            .as_array()
            .map(|blocks| {
                blocks
                    .iter()
                    .any(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            })
            .unwrap_or(role != "tool");
        turn.only_results = !results.is_empty() && turn.calls.is_empty() && !plain_text;
        for (id, out, err) in results {
            if let Some(&(ti, ci)) = by_id.get(&id) {
                set_output(&mut turns[ti].calls[ci], out.clone(), err);
            }
            if role == "tool" {
                turn.text = out;
            }
        }
        let ti = turns.len();
        for (ci, c) in turn.calls.iter().enumerate() {
            if c.id.starts_with("text-") {
                pending_text_calls.push((ti, ci));
            } else {
                by_id.insert(c.id.clone(), (ti, ci));
            }
        }
        turns.push(turn);
    }
    turns
}

fn set_output(c: &mut Call, out: String, is_error: bool) {
    c.is_error = is_error;
    if matches!(c.action, Action::Run { .. }) {
        c.failed = if is_error {
            Some(true)
        } else {
            exit_code(&out).map(|code| code != 0)
        };
    }
    c.output = Some(out);
}

/// The exit code a tool output reports, if any.
pub fn exit_code(out: &str) -> Option<i64> {
    let lower = out.to_ascii_lowercase();
    for key in [
        "exit code",
        "exit_code",
        "exitcode",
        "<returncode>",
        "returncode",
        "exit status",
    ] {
        if let Some(i) = lower.rfind(key) {
            let rest = lower[i + key.len()..].trim_start_matches([':', '=', '"', ' ']);
            let digits: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '-')
                .collect();
            if let Ok(v) = digits.parse() {
                return Some(v);
            }
        }
    }
    None
}

/// A call of tool `name` with arguments `args`, classified, without output yet.
pub(crate) fn new_call(id: &str, name: &str, args: String) -> Call {
    let parsed: Value = serde_json::from_str(&args).unwrap_or(Value::Null);
    Call {
        id: id.to_string(),
        name: name.to_string(),
        action: classify(name, &parsed),
        args,
        output: None,
        is_error: false,
        failed: None,
    }
}

fn str_arg(v: &Value, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| v.get(*k).and_then(Value::as_str))
        .map(str::to_string)
}

/// Classifies a tool call by its name and arguments.
pub fn classify(name: &str, args: &Value) -> Action {
    let n = name.to_ascii_lowercase();
    let path = str_arg(args, &["file_path", "path", "filename", "file", "target_file"]);
    if let (Some(cmd), Some(p)) = (str_arg(args, &["command"]), path.clone()) {
        if n.contains("editor") || n.contains("edit") || n == "file" {
            return match cmd.as_str() {
                "view" => Action::View { path: p },
                _ => Action::Edit { paths: vec![p] },
            };
        }
    }
    match n.as_str() {
        "read" | "read_file" | "view" | "view_file" | "open" | "open_file" => {
            return path.map_or(Action::Other, |path| Action::View { path })
        }
        "edit" | "write" | "multiedit" | "write_file" | "edit_file" | "create_file" | "str_replace"
        | "replace" | "notebookedit" => {
            return path.map_or(Action::Other, |p| Action::Edit { paths: vec![p] })
        }
        "apply_patch" => {
            let text = str_arg(args, &["input", "patch"]).unwrap_or_default();
            let paths: Vec<String> = text
                .lines()
                .filter_map(|l| {
                    ["*** Update File: ", "*** Add File: ", "+++ b/"]
                        .iter()
                        .find_map(|p| l.strip_prefix(p))
                })
                .map(|p| p.trim().to_string())
                .collect();
            return Action::Edit { paths };
        }
        _ => {}
    }
    let command = match args.get("command").or_else(|| args.get("cmd")) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(a)) => Some(a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" ")),
        _ => None,
    };
    match command {
        Some(c)
            if [
                "bash",
                "execute_bash",
                "shell",
                "run",
                "terminal",
                "exec",
                "run_command",
                "local_shell",
                "container.exec",
            ]
            .contains(&n.as_str()) =>
        {
            classify_shell(&c)
        }
        _ => Action::Other,
    }
}

/// Classifies a shell command line.
pub fn classify_shell(cmd: &str) -> Action {
    let c = cmd.trim();
    // `bash -lc "..."` (Codex) wraps the real command.
    let c = c
        .strip_prefix("bash -lc ")
        .or_else(|| c.strip_prefix("bash -c "))
        .map(|s| s.trim_matches(|q| q == '"' || q == '\''))
        .unwrap_or(c);
    let words: Vec<&str> = c.split_whitespace().collect();
    let last_path = |ws: &[&str]| {
        ws.iter()
            .rev()
            .find(|w| !w.starts_with('-') && !w.contains('\''))
            .map(|w| w.trim_matches('"').to_string())
    };
    if let Some(i) = c.find(" > ").or_else(|| c.find(" >> ")) {
        let target = c[i..]
            .trim_start_matches([' ', '>'])
            .split_whitespace()
            .next()
            .unwrap_or("");
        if !target.is_empty() && !target.starts_with("/dev/") && !target.starts_with('&') {
            return Action::Edit {
                paths: vec![target.trim_matches(|q| q == '"' || q == '\'').to_string()],
            };
        }
    }
    let single = !c.contains('|') && !c.contains("&&") && !c.contains(';');
    match words.first().copied() {
        Some("sed") if words.contains(&"-i") => {
            if let Some(p) = last_path(&words[1..]) {
                return Action::Edit { paths: vec![p] };
            }
        }
        Some("cat" | "head" | "tail" | "nl" | "less" | "more") if single && words.len() >= 2 => {
            if let Some(p) = last_path(&words[1..]) {
                return Action::View { path: p };
            }
        }
        Some("sed") if single && words.get(1) == Some(&"-n") => {
            if let Some(p) = last_path(&words[2..]) {
                return Action::View { path: p };
            }
        }
        _ => {}
    }
    Action::Run {
        command: cmd.to_string(),
    }
}

fn norm(p: &str) -> &str {
    p.trim_start_matches("./")
}

/// Whether two paths name the same file (equal, or one ends with `/` + the other).
pub fn same_file(a: &str, b: &str) -> bool {
    let (a, b) = (norm(a), norm(b));
    a == b || a.ends_with(&format!("/{b}")) || b.ends_with(&format!("/{a}"))
}

/// The diagnostics of a trajectory from its threads (thread 0 drives the diagnostics; calls of
/// all threads are counted).
pub fn behaviour(threads: &[Thread]) -> Behaviour {
    let mut b = Behaviour::default();
    for th in threads {
        for c in th.turns.iter().flat_map(|t| &t.calls) {
            b.tool_calls += 1;
            *b.tool_names.entry(c.name.clone()).or_default() += 1;
            match c.action {
                Action::View { .. } => b.views += 1,
                Action::Edit { .. } => b.edits += 1,
                Action::Run { .. } => b.runs += 1,
                Action::Other => {}
            }
        }
    }
    let Some(main) = threads.iter().find(|t| t.thread == 0).or(threads.first()) else {
        return b;
    };
    let calls: Vec<&Call> = main.turns.iter().flat_map(|t| &t.calls).collect();
    let mut viewed: HashSet<&str> = HashSet::new();
    let mut edited: Vec<&str> = Vec::new();
    let mut reread = false;
    for c in &calls {
        match &c.action {
            Action::View { path } => {
                if edited.is_empty() {
                    if !viewed.iter().any(|v| same_file(v, path)) {
                        viewed.insert(path);
                    }
                } else if edited.iter().any(|e| same_file(e, path)) {
                    reread = true;
                }
            }
            Action::Edit { paths } => {
                if edited.is_empty() {
                    b.files_viewed_before_edit = Some(viewed.len() as u64);
                }
                edited.extend(paths.iter().map(String::as_str));
                if paths.is_empty() {
                    edited.push("");
                }
            }
            _ => {}
        }
    }
    if b.files_viewed_before_edit.is_some() {
        b.reread_after_edit = Some(reread);
    }
    let runs: Vec<bool> = calls.iter().filter_map(|c| c.failed).collect();
    for w in runs.windows(2) {
        if w[0] {
            b.failed_runs_followed += 1;
            b.recovered += u64::from(!w[1]);
        }
    }
    b
}

#[cfg(test)]
#[path = "behaviour_tests.rs"]
mod tests;
