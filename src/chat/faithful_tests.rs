//! Tests of faithful prompt splicing (sibling file of faithful.rs).

use super::*;
use crate::chat::message::{ToolCall, ToolSpec};
use crate::chat::parse::ToolCallIds;
use crate::chat::testdata;
use serde_json::json;

fn qwen3() -> ChatFormat {
    ChatFormat::from_model_dir(&testdata("tokenizer/qwen3")).unwrap()
}

fn coder() -> ChatFormat {
    ChatFormat::from_parts(
        &testdata("tokenizer/qwen3/tokenizer.json"),
        &testdata("tokenizer/qwen3/tokenizer_config.json"),
        Some(&testdata("tokenizer/qwen3-coder/chat_template.jinja")),
    )
    .unwrap()
}

/// The Qwen3 tokenizer with Qwen's Qwen3.5 template (thinking on by default, XML calls, the
/// `<think>` of turns before the last user query dropped).
fn qwen35() -> ChatFormat {
    ChatFormat::from_parts(
        &testdata("tokenizer/qwen3/tokenizer.json"),
        &testdata("tokenizer/qwen3/tokenizer_config.json"),
        Some(&testdata("tokenizer/qwen3.5/chat_template.jinja")),
    )
    .unwrap()
}

fn tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "bash".into(),
        description: Some("Run a command".into()),
        parameters: json!({"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}}}),
    }]
}

fn first_request() -> Conversation {
    Conversation {
        messages: vec![
            Message::text(Role::System, "You fix bugs."),
            Message::text(Role::User, "Fix calc.py"),
        ],
        tools: tools(),
        ..Default::default()
    }
}

/// Generation k: prompt ids, output ids and the parsed assistant message.
struct Gen {
    prompt: Vec<u32>,
    output: Vec<u32>,
    assistant: Message,
}

fn generate(fmt: &ChatFormat, conv: &Conversation, opts: &RenderOptions, output_text: &str) -> Gen {
    let prompt = fmt.prompt_ids(conv, opts).unwrap();
    let output = fmt.encode(output_text).unwrap();
    let start = fmt.prompt_ends_in_reasoning(&prompt).unwrap();
    let p = fmt
        .parse_output(&output, ToolCallIds::new("trial", 0), start, &conv.tools, &[])
        .unwrap();
    let assistant = Message {
        reasoning: p.reasoning,
        tool_calls: p.tool_calls,
        ..Message::text(Role::Assistant, p.content)
    };
    Gen {
        prompt,
        output,
        assistant,
    }
}

fn next_request(first: &Conversation, echoed: Message, result: &str) -> Conversation {
    let id = echoed.tool_calls[0].id.clone();
    let mut c = first.clone();
    c.messages.push(echoed);
    c.messages.push(Message::tool_result(id, result));
    c
}

const QWEN3_OUT: &str = "<think>\nList first.\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\", \"timeout\": 10}}\n</tool_call><|im_end|>";

fn splice(
    fmt: &ChatFormat,
    first: &Conversation,
    opts: &RenderOptions,
    g: &Gen,
    new: &Conversation,
) -> Result<FaithfulPrompt, SpliceBreak> {
    let prev = PreviousGeneration {
        conversation: first,
        options: opts,
        prompt_ids: &g.prompt,
        output_ids: &g.output,
        assistant: &g.assistant,
    };
    fmt.faithful_prompt(&prev, new, opts)
}

#[test]
fn canonical_echo_gives_exactly_the_rendered_prompt() {
    let fmt = qwen3();
    let (first, opts) = (first_request(), RenderOptions::generation(None));
    let g = generate(&fmt, &first, &opts, QWEN3_OUT);
    let new = next_request(&first, g.assistant.clone(), "calc.py\ntest_calc.py");
    let fp = splice(&fmt, &first, &opts, &g, &new).unwrap();
    assert_eq!(fp.suffix_text, "\n<|im_start|>user\n<tool_response>\ncalc.py\ntest_calc.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    assert!(!fp.closed_turn);
    assert_eq!(fp.reused, g.prompt.len() + g.output.len());
    assert_eq!(fp.prompt_ids, fmt.prompt_ids(&new, &opts).unwrap());
}

#[test]
fn reserialized_arguments_and_dropped_reasoning_keep_captured_tokens() {
    let fmt = qwen3();
    let (first, opts) = (first_request(), RenderOptions::generation(None));
    let g = generate(&fmt, &first, &opts, QWEN3_OUT);
    let canonical = splice(
        &fmt,
        &first,
        &opts,
        &g,
        &next_request(&first, g.assistant.clone(), "out"),
    )
    .unwrap();
    // What OpenCode / OpenHands send back: compact, reordered, other whitespace, no reasoning.
    for args in [
        r#"{"timeout":10,"command":"ls -la"}"#,
        "{ \"command\" : \"ls -la\",\n \"timeout\" : 10 }",
    ] {
        let mut echoed = g.assistant.clone();
        echoed.reasoning = None;
        echoed.tool_calls[0].arguments = args.to_string();
        let new = next_request(&first, echoed, "out");
        let fp = splice(&fmt, &first, &opts, &g, &new).unwrap();
        assert_eq!(
            &fp.prompt_ids[..fp.reused],
            [g.prompt.as_slice(), g.output.as_slice()].concat().as_slice()
        );
        assert_eq!(fp, canonical, "independent of the harness's re-serialization");
        let rendered = fmt.prompt_ids(&new, &opts).unwrap();
        assert_ne!(
            fp.prompt_ids, rendered,
            "rendered mode would have changed the context"
        );
    }
}

#[test]
fn qwen3_new_user_turn_is_not_append_only() {
    // Qwen3 drops <think> of assistant turns before the last user query.
    let fmt = qwen3();
    let first = Conversation {
        messages: vec![Message::text(Role::User, "2+2?")],
        ..Default::default()
    };
    let opts = RenderOptions::generation(None);
    let g = generate(&fmt, &first, &opts, "<think>\nadd\n</think>\n\n4<|im_end|>");
    assert_eq!(g.assistant.reasoning.as_deref(), Some("add"));
    let mut new = first.clone();
    new.messages.push(g.assistant.clone());
    new.messages.push(Message::text(Role::User, "and 3+3?"));
    let err = splice(&fmt, &first, &opts, &g, &new).unwrap_err();
    assert!(matches!(err, SpliceBreak::NotAppendOnly { .. }), "{err}");
    // Without reasoning the same conversation is append-only.
    let g = generate(
        &fmt,
        &first,
        &RenderOptions::generation(Some(false)),
        "4<|im_end|>",
    );
    let opts = RenderOptions::generation(Some(false));
    let mut new = first.clone();
    new.messages.push(g.assistant.clone());
    new.messages.push(Message::text(Role::User, "and 3+3?"));
    let err = splice(&fmt, &first, &opts, &g, &new).unwrap_err();
    // enable_thinking=false renders an empty think block for the last assistant only: still a break.
    assert!(matches!(err, SpliceBreak::NotAppendOnly { .. }), "{err}");
}

#[test]
fn changed_history_and_foreign_turns_break() {
    let fmt = qwen3();
    let (first, opts) = (first_request(), RenderOptions::generation(None));
    let g = generate(&fmt, &first, &opts, QWEN3_OUT);
    let mut compacted = next_request(&first, g.assistant.clone(), "out");
    compacted.messages[1].content = "Summary of earlier work".into();
    assert!(matches!(
        splice(&fmt, &first, &opts, &g, &compacted),
        Err(SpliceBreak::HistoryChanged { index: 1 })
    ));
    let mut other = g.assistant.clone();
    other.tool_calls[0] = ToolCall {
        id: "call_other".into(),
        ..other.tool_calls[0].clone()
    };
    let new = next_request(&first, other, "out");
    assert!(matches!(
        splice(&fmt, &first, &opts, &g, &new),
        Err(SpliceBreak::NotThePreviousGeneration { index: 2 })
    ));
    let new = next_request(&first, g.assistant.clone(), "out");
    let thinking_off = RenderOptions::generation(Some(false));
    let prev = PreviousGeneration {
        conversation: &first,
        options: &opts,
        prompt_ids: &g.prompt,
        output_ids: &g.output,
        assistant: &g.assistant,
    };
    assert!(matches!(
        fmt.faithful_prompt(&prev, &new, &thinking_off),
        Err(SpliceBreak::SettingsChanged)
    ));
}

#[test]
fn truncated_output_gets_its_turn_closed() {
    let fmt = qwen3();
    let (first, opts) = (first_request(), RenderOptions::generation(None));
    let mut g = generate(&fmt, &first, &opts, QWEN3_OUT);
    g.output.pop(); // stopped without <|im_end|>
    let fp = splice(
        &fmt,
        &first,
        &opts,
        &g,
        &next_request(&first, g.assistant.clone(), "out"),
    )
    .unwrap();
    assert!(fp.closed_turn);
    assert_eq!(fp.prompt_ids[fp.reused - 1], 151645);
    assert_eq!(fp.reused, g.prompt.len() + g.output.len() + 1);
}

#[test]
fn qwen3_coder_xml_turns_splice() {
    let fmt = coder();
    let (first, opts) = (first_request(), RenderOptions::generation(None));
    // Qwen3-Coder's template puts a blank line between content and the call; so does the model.
    let out = "I'll look.\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n10\n</parameter>\n</function>\n</tool_call><|im_end|>";
    let g = generate(&fmt, &first, &opts, out);
    assert_eq!(
        g.assistant.tool_calls[0].arguments,
        r#"{"command":"ls -la","timeout":10}"#
    );
    let canonical = next_request(&first, g.assistant.clone(), "listing");
    let fp = splice(&fmt, &first, &opts, &g, &canonical).unwrap();
    assert_eq!(
        fp.suffix_text,
        "\n<|im_start|>user\n<tool_response>\nlisting\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(fp.prompt_ids, fmt.prompt_ids(&canonical, &opts).unwrap());
    let mut echoed = g.assistant.clone();
    echoed.tool_calls[0].arguments = r#"{"timeout": 10, "command": "ls -la"}"#.into();
    let fp2 = splice(&fmt, &first, &opts, &g, &next_request(&first, echoed, "listing")).unwrap();
    assert_eq!(fp2, fp);
}

/// Three generations of one thread, each prompt spliced on the previous one's tokens.
fn chain(reserialize: bool) -> (Vec<u32>, Vec<u32>, Conversation) {
    let fmt = qwen3();
    let (first, opts) = (first_request(), RenderOptions::generation(None));
    let g0 = generate(&fmt, &first, &opts, QWEN3_OUT);
    let echo = |m: &Message| {
        let mut m = m.clone();
        if reserialize {
            m.reasoning = None;
            for c in &mut m.tool_calls {
                let v: serde_json::Value = serde_json::from_str(&c.arguments).unwrap();
                c.arguments = format!("{} ", v); // compact + trailing space
            }
        }
        m
    };
    let req1 = next_request(&first, echo(&g0.assistant), "calc.py");
    let p1 = splice(&fmt, &first, &opts, &g0, &req1).unwrap().prompt_ids;
    let out1 = "<think>\nRead it.\n</think>\n\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"cat calc.py\"}}\n</tool_call><|im_end|>";
    let o1 = fmt.encode(out1).unwrap();
    let a1 = fmt
        .parse_output(&o1, ToolCallIds::new("trial", 1), false, &first.tools, &[])
        .unwrap()
        .to_message();
    assert_ne!(a1.tool_calls[0].id, g0.assistant.tool_calls[0].id);
    let req2 = next_request(&req1, echo(&a1), "def add(a, b): return a - b");
    let g1 = Gen {
        prompt: p1.clone(),
        output: o1.clone(),
        assistant: a1,
    };
    let p2 = splice(&fmt, &req1, &opts, &g1, &req2).unwrap().prompt_ids;
    assert!(p2.starts_with(&[p1.as_slice(), o1.as_slice()].concat()));
    assert!(p2.starts_with(&[g0.prompt.as_slice(), g0.output.as_slice()].concat()));
    (p2, fmt.prompt_ids(&req2, &opts).unwrap(), req2)
}

#[test]
fn multi_turn_chain_keeps_every_captured_token() {
    let (canonical, rendered, _) = chain(false);
    assert_eq!(canonical, rendered, "canonical echoes: faithful == rendered");
    let (faithful, rendered, req2) = chain(true);
    assert_eq!(faithful, canonical, "re-serialized echoes change nothing");
    assert_ne!(rendered, canonical);
    assert_eq!(req2.messages.len(), 6);
}

#[test]
fn qwen3_turn_without_reasoning_splices_when_thinking_is_on() {
    // Claude Code sends `thinking: enabled`; a policy turn without a <think> block renders with an
    // empty think block while it is the last message, and without one in history. The history
    // form is what was sampled, so the splice holds (and equals the template's own render).
    let fmt = qwen3();
    let (first, opts) = (first_request(), RenderOptions::generation(None));
    let out = "Listing.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call><|im_end|>";
    let g = generate(&fmt, &first, &opts, out);
    assert!(g.assistant.reasoning.as_deref().unwrap_or("").is_empty());
    let new = next_request(&first, g.assistant.clone(), "calc.py");
    let fp = splice(&fmt, &first, &opts, &g, &new).unwrap();
    assert_eq!(
        &fp.prompt_ids[..fp.reused],
        [g.prompt.as_slice(), g.output.as_slice()].concat().as_slice()
    );
    assert_eq!(
        fp.suffix_text,
        "\n<|im_start|>user\n<tool_response>\ncalc.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(fp.prompt_ids, fmt.prompt_ids(&new, &opts).unwrap());
    // The same turn echoed before a new user query: Qwen3 renders it the same way (no reasoning
    // to drop), so this splices too.
    let mut asked = first.clone();
    asked.messages.push(g.assistant.clone());
    asked.messages.push(Message::tool_result(
        g.assistant.tool_calls[0].id.clone(),
        "calc.py",
    ));
    asked
        .messages
        .push(Message::text(Role::User, "Now run the tests."));
    assert!(splice(&fmt, &first, &opts, &g, &asked).is_ok());
    // A turn whose output itself holds the empty block (the model wrote it) must not splice:
    // history renders that turn without it.
    let g = generate(&fmt, &first, &opts, &format!("<think>\n\n</think>\n\n{out}"));
    let new = next_request(&first, g.assistant.clone(), "calc.py");
    assert!(matches!(
        splice(&fmt, &first, &opts, &g, &new),
        Err(SpliceBreak::NotAppendOnly { .. })
    ));
}

#[test]
fn qwen35_tool_loops_splice_and_dropped_think_blocks_start_a_new_segment() {
    // verl#6854: Qwen3.5 drops the <think> block of every assistant turn before the last user
    // query, so after a new query the prompt is no longer an extension of the tokens sampled.
    let fmt = qwen35();
    let (first, opts) = (first_request(), RenderOptions::generation(None));
    let call = "Let me look.\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n10\n</parameter>\n</function>\n</tool_call><|im_end|>";
    let g = generate(&fmt, &first, &opts, &format!("List first.\n</think>\n\n{call}"));
    assert!(
        fmt.prompt_ends_in_reasoning(&g.prompt).unwrap(),
        "thinking is on by default"
    );
    assert_eq!(g.assistant.reasoning.as_deref(), Some("List first."));
    assert_eq!(
        g.assistant.tool_calls[0].arguments,
        r#"{"command":"ls -la","timeout":10}"#
    );
    // Inside the tool loop the block stays: the splice is the template's own render, whether or
    // not the harness echoes the reasoning (OpenAI clients drop `reasoning_content`).
    let new = next_request(&first, g.assistant.clone(), "calc.py");
    let fp = splice(&fmt, &first, &opts, &g, &new).unwrap();
    assert_eq!(fp.prompt_ids, fmt.prompt_ids(&new, &opts).unwrap());
    assert_eq!(
        fp.suffix_text,
        "\n<|im_start|>user\n<tool_response>\ncalc.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
    );
    let mut bare = g.assistant.clone();
    bare.reasoning = None;
    assert_eq!(
        splice(&fmt, &first, &opts, &g, &next_request(&first, bare, "calc.py")).unwrap(),
        fp
    );
    // A new user query: the earlier turn now renders without its block. A new segment, never a
    // splice — also when the block was empty, and also when the model closed it at once
    // (`<think>\n</think>`, which the "only while last" rule alone would have let through).
    for out in [
        format!("List first.\n</think>\n\n{call}"),
        format!("\n</think>\n\n{call}"),
        format!("</think>\n\n{call}"),
    ] {
        let g = generate(&fmt, &first, &opts, &out);
        let mut asked = next_request(&first, g.assistant.clone(), "calc.py");
        asked
            .messages
            .push(Message::text(Role::User, "Now run the tests."));
        let rendered = fmt.render(&asked, &opts).unwrap();
        assert!(
            !rendered.contains("List first.") && rendered.matches("<think>").count() == 1,
            "{rendered}"
        );
        let err = splice(&fmt, &first, &opts, &g, &asked).unwrap_err();
        assert!(matches!(err, SpliceBreak::NotAppendOnly { .. }), "{out:?}: {err}");
    }
}
