//! Behaviour diagnostics on hand-built conversations with known answers.

use serde_json::{json, Value};

use super::*;

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
}

fn openai(messages: Vec<Value>) -> Vec<Thread> {
    vec![Thread {
        thread: 0,
        api: "openai".into(),
        turns: turns_of("openai", &json!({ "messages": messages })),
    }]
}

#[test]
fn openai_view_edit_fail_recover_reread() {
    let th = openai(vec![
        json!({"role": "user", "content": "fix it"}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            call("a", "str_replace_editor", json!({"command": "view", "path": "/testbed/x.py"})),
            call("b", "execute_bash", json!({"command": "cat src/y.py"}))]}),
        json!({"role": "tool", "tool_call_id": "a", "content": "x"}),
        json!({"role": "tool", "tool_call_id": "b", "content": "y"}),
        // Viewing x.py again before any edit does not count twice.
        json!({"role": "assistant", "content": null, "tool_calls": [call("c", "execute_bash", json!({"command": "head -n 5 ./x.py"}))]}),
        json!({"role": "tool", "tool_call_id": "c", "content": "x"}),
        json!({"role": "assistant", "content": null, "tool_calls": [call("d", "execute_bash", json!({"command": "sed -i 's/a/b/' /testbed/x.py"}))]}),
        json!({"role": "tool", "tool_call_id": "d", "content": ""}),
        json!({"role": "assistant", "content": null, "tool_calls": [call("e", "execute_bash", json!({"command": "pytest"}))]}),
        json!({"role": "tool", "tool_call_id": "e", "content": "FAILED\n[Command finished with exit code 1]"}),
        json!({"role": "assistant", "content": null, "tool_calls": [call("f", "execute_bash", json!({"command": "pytest -x"}))]}),
        json!({"role": "tool", "tool_call_id": "f", "content": "ok\n[Command finished with exit code 0]"}),
        json!({"role": "assistant", "content": null, "tool_calls": [call("g", "execute_bash", json!({"command": "sed -n '1,20p' x.py"}))]}),
        json!({"role": "tool", "tool_call_id": "g", "content": "x"}),
    ]);
    let b = behaviour(&th);
    assert_eq!(b.tool_calls, 7);
    assert_eq!((b.views, b.edits, b.runs), (4, 1, 2));
    assert_eq!(b.files_viewed_before_edit, Some(2));
    assert_eq!(b.reread_after_edit, Some(true));
    assert_eq!((b.failed_runs_followed, b.recovered), (1, 1));
    assert_eq!(b.tool_names["execute_bash"], 6);
    let calls: Vec<&Call> = th[0].turns.iter().flat_map(|t| &t.calls).collect();
    assert_eq!(calls[0].output.as_deref(), Some("x"));
    assert_eq!(calls[4].failed, Some(true));
    assert_eq!(th[0].turns[2].text, "x", "tool turns show their output");
}

#[test]
fn anthropic_tool_use_and_errors() {
    let req = json!({"system": [{"type": "text", "text": "sys"}], "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "1", "name": "Read", "input": {"file_path": "/r/a.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1", "content": [{"type": "text", "text": "A"}]}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "2", "name": "Edit", "input": {"file_path": "/r/a.py"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "2", "content": "ok"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "3", "name": "Bash", "input": {"command": "make"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "3", "content": "err", "is_error": true}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "4", "name": "Bash", "input": {"command": "make test"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "4", "content": "Exit code: 2"}]}
    ]});
    let th = vec![Thread {
        thread: 0,
        api: "anthropic".into(),
        turns: turns_of("anthropic", &req),
    }];
    assert_eq!(th[0].turns[0].role, "system");
    assert_eq!(th[0].turns[0].text, "sys");
    assert!(th[0].turns[3].only_results, "a user message of tool results only");
    assert!(!th[0].turns[1].only_results);
    let b = behaviour(&th);
    assert_eq!(b.files_viewed_before_edit, Some(1));
    assert_eq!(b.reread_after_edit, Some(false));
    assert_eq!(
        (b.failed_runs_followed, b.recovered),
        (1, 0),
        "the run after the failure failed too"
    );
    let calls: Vec<&Call> = th[0].turns.iter().flat_map(|t| &t.calls).collect();
    assert_eq!(calls[0].output.as_deref(), Some("A"));
    assert!(calls[2].is_error);
}

#[test]
fn text_bash_blocks_count_as_shell_calls() {
    let th = openai(vec![
        json!({"role": "user", "content": "task"}),
        json!({"role": "assistant", "content": "Run it.\n```bash\npython t.py\n```"}),
        json!({"role": "user", "content": "<returncode>1</returncode>\n<output>boom</output>"}),
        json!({"role": "assistant", "content": "```bash\npython t.py --fix\n```"}),
        json!({"role": "user", "content": "<returncode>0</returncode>"}),
    ]);
    let b = behaviour(&th);
    assert_eq!(b.runs, 2);
    assert_eq!((b.failed_runs_followed, b.recovered), (1, 1));
    assert_eq!(b.reread_after_edit, None, "no edit, no re-read statistic");
}

#[test]
fn shell_classification() {
    assert_eq!(classify_shell("cat a.py"), Action::View { path: "a.py".into() });
    assert_eq!(
        classify_shell("cat a.py | grep x"),
        Action::Run {
            command: "cat a.py | grep x".into()
        }
    );
    assert_eq!(
        classify_shell("cat <<'EOF' > b.py"),
        Action::Edit {
            paths: vec!["b.py".into()]
        }
    );
    assert_eq!(
        classify_shell("pytest 2>&1 > /dev/null"),
        Action::Run {
            command: "pytest 2>&1 > /dev/null".into()
        }
    );
    assert_eq!(exit_code("[Command finished with exit code 0]"), Some(0));
    assert_eq!(exit_code("{\"metadata\": {\"exit_code\": 3}}"), Some(3));
    assert_eq!(exit_code("hello"), None);
    assert!(same_file("/testbed/pkg/a.py", "pkg/a.py"));
    assert!(!same_file("/testbed/pkg/a.py", "b/a.py2"));
    let patch = json!({"input": "*** Begin Patch\n*** Update File: src/x.rs\n@@\n-a\n+b\n*** End Patch"});
    assert_eq!(
        classify("apply_patch", &patch),
        Action::Edit {
            paths: vec!["src/x.rs".into()]
        }
    );
}
