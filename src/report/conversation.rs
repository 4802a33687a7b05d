//! The whole conversation of every thread of a trajectory, from all of its captures.
//!
//! Each request a harness sends carries the history so far, so a thread's last request holds
//! every turn but one: the answer to it, the thread's last turn, which is often the agent's last
//! tool call (a final `git diff`, the edit that made the tests pass). The proxy records each
//! answer as parsed (`Generation::response`), and the thread ends with it here. When a harness
//! rewrites its history (a compaction: a request with fewer messages than the one before), the
//! turns before it are kept, with the answer they led to, and a marker turn says where the
//! history was rewritten. Captures that predate `response` end with a turn that says how many
//! tokens the last answer had and that its text was not recorded.

use std::collections::BTreeMap;

use serde_json::Value;

use super::behaviour::{bash_blocks, new_call, turns_of, Thread, Turn};
use crate::records::{Generation, Trajectory};

/// Text of the marker turn where a harness rewrote its history.
pub const REWRITTEN: &str =
    "[the harness rewrote its history here: the turns below are a new, shorter conversation]";

fn messages(g: &Generation) -> usize {
    g.request
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

fn note(role: &str, text: String) -> Turn {
    Turn {
        role: role.into(),
        text,
        calls: vec![],
        only_results: false,
    }
}

/// The answer of `g` as a turn (None when it produced nothing).
pub fn answer(g: &Generation) -> Option<Turn> {
    let Some(r) = &g.response else {
        return (!g.output_ids.is_empty()).then(|| {
            note(
                "assistant",
                format!(
                    "[the last answer, {} tokens, is not in this capture (recorded before answers were)]",
                    g.output_ids.len()
                ),
            )
        });
    };
    let mut calls: Vec<_> = r
        .tool_calls
        .iter()
        .map(|c| new_call(&c.id, &c.name, c.arguments.clone()))
        .collect();
    if calls.is_empty() && g.api != "none" {
        for (i, cmd) in bash_blocks(&r.text).into_iter().enumerate() {
            let args = serde_json::json!({ "command": cmd }).to_string();
            calls.push(new_call(&format!("text-answer-{}-{i}", g.index), "bash", args));
        }
    }
    let text = match (&r.reasoning, r.text.trim().is_empty()) {
        (Some(think), true) if calls.is_empty() => format!("(reasoning) {think}"),
        _ => r.text.clone(),
    };
    if text.trim().is_empty() && calls.is_empty() {
        return None;
    }
    Some(Turn {
        role: "assistant".into(),
        text,
        calls,
        only_results: false,
    })
}

fn thread_turns(gens: &[&Generation]) -> Vec<Turn> {
    let mut turns = Vec::new();
    for (i, g) in gens.iter().enumerate() {
        // The next request carries this answer unless the history shrank before it.
        let echoed = gens.get(i + 1).is_some_and(|next| messages(next) > messages(g));
        if echoed {
            continue;
        }
        turns.extend(turns_of(&g.api, &g.request));
        turns.extend(answer(g));
        if i + 1 < gens.len() {
            turns.push(note("system", REWRITTEN.into()));
        }
    }
    turns
}

/// Every thread of `t` with every turn, its last answer included (threads in order, 0 first).
pub fn threads(t: &Trajectory) -> Vec<Thread> {
    threads_of(&t.generations)
}

/// [`threads`] of the generations `gens` of one trial.
pub fn threads_of(gens: &[Generation]) -> Vec<Thread> {
    let mut by: BTreeMap<u32, Vec<&Generation>> = BTreeMap::new();
    for g in gens {
        by.entry(g.thread).or_default().push(g);
    }
    by.into_iter()
        .map(|(thread, mut gens)| {
            gens.sort_by_key(|g| g.index);
            Thread {
                thread,
                api: gens.last().map(|g| g.api.clone()).unwrap_or_default(),
                turns: thread_turns(&gens),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::records::{CapturedCall, CapturedResponse};

    fn gen(index: u32, messages: Value, response: Option<CapturedResponse>) -> Generation {
        Generation {
            index,
            api: "openai".into(),
            request: json!({ "messages": messages }),
            output_ids: vec![1, 2, 3],
            response,
            ..Default::default()
        }
    }

    fn call(id: &str, cmd: &str) -> CapturedResponse {
        CapturedResponse {
            tool_calls: vec![CapturedCall {
                id: id.into(),
                name: "bash".into(),
                arguments: json!({ "command": cmd }).to_string(),
            }],
            ..Default::default()
        }
    }

    fn tc(id: &str, cmd: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "bash", "arguments": json!({"command": cmd}).to_string()}})
    }

    fn commands(th: &Thread) -> Vec<String> {
        th.turns
            .iter()
            .flat_map(|t| &t.calls)
            .map(|c| {
                serde_json::from_str::<Value>(&c.args).unwrap()["command"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn the_last_answer_ends_the_thread() {
        let first = vec![json!({"role": "user", "content": "fix it"})];
        let mut second = first.clone();
        second.push(json!({"role": "assistant", "content": null, "tool_calls": [tc("a", "ls")]}));
        second.push(json!({"role": "tool", "tool_call_id": "a", "content": "x.py"}));
        let th = threads_of(&[
            gen(0, json!(first), Some(call("a", "ls"))),
            gen(1, json!(second), Some(call("b", "git diff"))),
        ]);
        assert_eq!(commands(&th[0]), ["ls", "git diff"], "{:?}", th[0].turns);
        assert_eq!(th[0].turns.len(), 4);
    }

    #[test]
    fn a_rewritten_history_keeps_the_turns_before_it() {
        let long = json!([
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": null, "tool_calls": [tc("a", "ls")]},
            {"role": "tool", "tool_call_id": "a", "content": "x.py"}
        ]);
        let short = json!([{"role": "user", "content": "summary: listed files"}]);
        let th = threads_of(&[
            gen(0, long, Some(call("b", "cat x.py"))),
            gen(1, short, Some(call("c", "pytest"))),
        ]);
        assert_eq!(commands(&th[0]), ["ls", "cat x.py", "pytest"]);
        assert!(th[0].turns.iter().any(|t| t.text == REWRITTEN));
    }

    #[test]
    fn an_old_capture_says_its_last_answer_is_missing() {
        let th = threads_of(&[gen(0, json!([{"role": "user", "content": "go"}]), None)]);
        assert!(
            th[0].turns.last().unwrap().text.contains("3 tokens"),
            "{:?}",
            th[0].turns
        );
    }
}
