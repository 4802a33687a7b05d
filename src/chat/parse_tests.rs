//! Tests of the output parser (a sibling file to keep parse.rs under the size limit).

use super::*;
use serde_json::json;

fn ids() -> ToolCallIds {
    ToolCallIds::new("trial-1", 3)
}

fn json_parser() -> StreamParser {
    StreamParser::new(ToolCallFormat::Json, ids(), false)
}

const QWEN3_OUT: &str = "<think>\nThe user wants a fix.\nLook first.\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\",  \"opts\": {\"a\": [1, 2]}}}\n</tool_call>\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"/testbed/calc.py\"}}\n</tool_call>";

#[test]
fn qwen3_reasoning_text_and_calls() {
    let p = json_parser().parse_all(QWEN3_OUT);
    assert_eq!(p.reasoning.as_deref(), Some("The user wants a fix.\nLook first."));
    assert_eq!(p.content, "Let me look.");
    assert_eq!(p.malformed_tool_calls, 0);
    assert_eq!(p.tool_calls.len(), 2);
    assert_eq!(p.tool_calls[0].name, "bash");
    // the model's exact argument text, whitespace included
    assert_eq!(
        p.tool_calls[0].arguments,
        r#"{"command": "ls -la",  "opts": {"a": [1, 2]}}"#
    );
    assert_eq!(p.tool_calls[1].arguments, r#"{"path": "/testbed/calc.py"}"#);
    assert_eq!(p.tool_calls[0].id, ids().id(0));
    assert_eq!(p.tool_calls[1].id, ids().id(1));
}

#[test]
fn tool_call_ids_are_stable_and_distinct() {
    let a = ToolCallIds::new("t", 0);
    assert_eq!(a.id(0), ToolCallIds::new("t", 0).id(0));
    assert!(a.id(0).starts_with("call_") && a.id(0).len() == 5 + 24);
    let all = [
        a.id(0),
        a.id(1),
        ToolCallIds::new("t", 1).id(0),
        ToolCallIds::new("u", 0).id(0),
    ];
    for i in 0..all.len() {
        for j in i + 1..all.len() {
            assert_ne!(all[i], all[j]);
        }
    }
    assert!(a.with_prefix("toolu_").id(0).starts_with("toolu_"));
}

#[test]
fn malformed_calls_come_back_as_text_and_are_counted() {
    let out = "Trying.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \n</tool_call>\nok";
    let p = json_parser().parse_all(out);
    assert_eq!(p.malformed_tool_calls, 1);
    assert!(p.tool_calls.is_empty());
    assert_eq!(
        p.content,
        "Trying.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \n</tool_call>\nok"
    );
    // unterminated and truncated: text, counted
    let p = json_parser().parse_all("<tool_call>\n{\"name\": \"ba");
    assert_eq!(
        (p.content.as_str(), p.malformed_tool_calls),
        ("<tool_call>\n{\"name\": \"ba", 1)
    );
    // unterminated but complete (stopped right before </tool_call>): accepted
    let p = json_parser().parse_all("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n");
    assert_eq!((p.tool_calls.len(), p.malformed_tool_calls), (1, 0));
    // not an object, no name
    let p = json_parser().parse_all("<tool_call>[1]</tool_call><tool_call>{\"x\": 1}</tool_call>");
    assert_eq!(p.malformed_tool_calls, 2);
}

#[test]
fn string_arguments_and_no_think() {
    let p = json_parser()
        .parse_all("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>");
    assert_eq!(p.reasoning, None);
    assert_eq!(p.tool_calls[0].arguments, r#"{"a": 1}"#);
    let p = json_parser().parse_all("Just an answer.");
    assert_eq!((p.reasoning, p.content.as_str()), (None, "Just an answer."));
}

#[test]
fn prompt_opened_think() {
    let p = StreamParser::new(ToolCallFormat::Json, ids(), true).parse_all("plan\n</think>\n\nanswer");
    assert_eq!(
        (p.reasoning.as_deref(), p.content.as_str()),
        (Some("plan"), "answer")
    );
    assert!(ends_inside_think("<|im_start|>assistant\n<think>\n"));
    assert!(!ends_inside_think(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ));
    assert!(!ends_inside_think("<|im_start|>assistant\n"));
}

const CODER_OUT: &str = "I'll edit.\n<tool_call>\n<function=str_replace>\n<parameter=path>\n/testbed/calc.py\n</parameter>\n<parameter=count>\n2\n</parameter>\n<parameter=dry>\ntrue\n</parameter>\n<parameter=old>\n  return a - b\n\n</parameter>\n<parameter=extra>\n{\"k\": [1]}\n</parameter>\n</function>\n</tool_call>";

fn coder_tools() -> Vec<ToolSpec> {
    vec![ToolSpec {
        name: "str_replace".into(),
        description: None,
        parameters: json!({"type": "object", "properties": {
            "path": {"type": "string"}, "count": {"type": "integer"}, "dry": {"type": ["boolean", "null"]},
            "old": {"type": "string"}, "extra": {"type": "object"}}}),
    }]
}

#[test]
fn qwen3_coder_xml_calls_typed_by_schema() {
    let p = StreamParser::new(ToolCallFormat::Xml, ids(), false)
        .with_tools(&coder_tools())
        .parse_all(CODER_OUT);
    assert_eq!(p.content, "I'll edit.");
    assert_eq!(p.tool_calls.len(), 1);
    assert_eq!(p.tool_calls[0].name, "str_replace");
    let args: Value = serde_json::from_str(&p.tool_calls[0].arguments).unwrap();
    assert_eq!(
        args,
        json!({"path": "/testbed/calc.py", "count": 2, "dry": true, "old": "  return a - b\n", "extra": {"k": [1]}})
    );
    // without schemas every value is a string
    let p = StreamParser::new(ToolCallFormat::Xml, ids(), false).parse_all(CODER_OUT);
    let args: Value = serde_json::from_str(&p.tool_calls[0].arguments).unwrap();
    assert_eq!(args["count"], "2");
    // missing </function> is malformed
    let p = StreamParser::new(ToolCallFormat::Xml, ids(), false)
        .parse_all("<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>");
    assert_eq!(p.malformed_tool_calls, 1);
}

/// A tiny deterministic generator for chunk boundaries.
fn lcg(seed: &mut u64) -> usize {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as usize
}

fn stream(parser: &StreamParser, chunks: &[&str]) -> ParsedOutput {
    let mut p = parser.clone();
    let mut events = Vec::new();
    for c in chunks {
        events.extend(p.push(c));
    }
    events.extend(p.finish());
    collect(events, p.saw_reasoning(), p.malformed_tool_calls())
}

fn char_splits(s: &str) -> Vec<usize> {
    s.char_indices().map(|(i, _)| i).chain([s.len()]).collect()
}

#[test]
fn streaming_agrees_with_whole_parse_on_every_split() {
    // Regression guard for the vLLM hermes bug class: streamed Qwen3 calls losing their last `}`.
    let outputs = [
        (json_parser(), QWEN3_OUT),
        (
            json_parser(),
            "Trying.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \n</tool_call>\nok",
        ),
        (
            json_parser(),
            "  <think>\n\n</think>\n\nHé 😀 <tool_cal not a call < tool_call>\n\n",
        ),
        (json_parser(), "<think>unterminated reasoning </thi"),
        (
            json_parser(),
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"}</tool_call>\"}}</tool_call>",
        ),
        (
            StreamParser::new(ToolCallFormat::Json, ids(), true),
            "a\n\n</think>\n\nb\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n\nafter",
        ),
        (
            StreamParser::new(ToolCallFormat::Xml, ids(), false).with_tools(&coder_tools()),
            CODER_OUT,
        ),
    ];
    let mut seed = 7;
    for (parser, text) in outputs {
        let whole = parser.clone().parse_all(text);
        let splits = char_splits(text);
        // one split at every position
        for &i in &splits {
            assert_eq!(
                stream(&parser, &[&text[..i], &text[i..]]),
                whole,
                "split at {i} of {text:?}"
            );
        }
        // char by char
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(stream(&parser, &refs), whole, "char by char {text:?}");
        // 200 random chunkings
        for _ in 0..200 {
            let mut cuts: Vec<usize> = (0..lcg(&mut seed) % 8)
                .map(|_| splits[lcg(&mut seed) % splits.len()])
                .collect();
            cuts.extend([0, text.len()]);
            cuts.sort_unstable();
            let chunks: Vec<&str> = cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            assert_eq!(stream(&parser, &chunks), whole, "chunks {chunks:?}");
        }
    }
}

#[test]
fn tool_call_arguments_keep_their_closing_brace_when_streamed() {
    let text = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";
    let mut p = json_parser();
    let mut calls = Vec::new();
    for c in text.chars() {
        for e in p.push(&c.to_string()) {
            if let StreamEvent::ToolCall { call, .. } = e {
                calls.push(call);
            }
        }
    }
    assert!(p.finish().is_empty());
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].arguments, "{\"command\": \"ls\"}");
}

#[test]
fn random_marker_soup_never_panics_and_streams_consistently() {
    // Untrusted model output: any mix of markers and JSON/XML fragments must parse without panic.
    const POOL: [&str; 24] = [
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        "\"name\"",
        ": ",
        "\"f\"",
        "\"arguments\"",
        ", ",
        "<function=f>",
        "<parameter=a>",
        "</parameter>",
        "</function>",
        "\n",
        " ",
        "é",
        "x",
        "<",
        "</",
        "[1]",
        "<tool_",
        "</thi",
    ];
    let mut seed = 11;
    for round in 0..3000 {
        let n = lcg(&mut seed) % 30;
        let text: String = (0..n).map(|_| POOL[lcg(&mut seed) % POOL.len()]).collect();
        let format = if round % 2 == 0 {
            ToolCallFormat::Json
        } else {
            ToolCallFormat::Xml
        };
        let parser = StreamParser::new(format, ids(), round % 3 == 0);
        let whole = parser.clone().parse_all(&text);
        let splits = char_splits(&text);
        let mut cuts: Vec<usize> = (0..lcg(&mut seed) % 6)
            .map(|_| splits[lcg(&mut seed) % splits.len()])
            .collect();
        cuts.extend([0, text.len()]);
        cuts.sort_unstable();
        let chunks: Vec<&str> = cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect();
        assert_eq!(stream(&parser, &chunks), whole, "{chunks:?}");
        // nothing is lost: every call either parsed or came back as text
        let opened = text.matches("<tool_call>").count();
        assert!(
            whole.tool_calls.len() + whole.malformed_tool_calls <= opened,
            "{text:?}"
        );
    }
}

#[test]
fn parsed_output_becomes_the_assistant_message() {
    let m = json_parser().parse_all(QWEN3_OUT).to_message();
    assert_eq!(m.role, crate::chat::Role::Assistant);
    assert_eq!((m.content.as_str(), m.tool_calls.len()), ("Let me look.", 2));
    assert_eq!(m.reasoning.as_deref(), Some("The user wants a fix.\nLook first."));
}

/// mini-swe-agent's tool and an editor tool, as a Qwen3.5 request declares them.
fn qwen35_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "bash".into(),
            description: Some("Run a command".into()),
            parameters: json!({"type": "object", "properties": {"command": {"type": "string"}},
                "required": ["command"]}),
        },
        ToolSpec {
            name: "edit".into(),
            description: None,
            parameters: json!({"type": "object", "additionalProperties": false,
                "properties": {"path": {"type": "string"}, "line": {"type": "integer"},
                    "ratio": {"type": "number"}, "dry": {"type": "boolean"},
                    "tags": {"type": "array"}, "note": {"type": ["string", "null"]}},
                "required": ["path", "line"]}),
        },
    ]
}

/// A Qwen3.5 parser: the generation prompt opened `<think>` (thinking on by default).
fn qwen35() -> StreamParser {
    StreamParser::new(ToolCallFormat::Xml, ids(), true).with_tools(&qwen35_tools())
}

/// A call exactly as the Qwen3.5 template renders one.
fn xml_call(name: &str, params: &[(&str, &str)]) -> String {
    let params: String = params
        .iter()
        .map(|(k, v)| format!("<parameter={k}>\n{v}\n</parameter>\n"))
        .collect();
    format!("<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
}

#[test]
fn qwen35_reasoning_and_xml_calls_in_the_templates_format() {
    let template =
        std::fs::read_to_string(crate::chat::testdata("tokenizer/qwen3.5/chat_template.jinja")).unwrap();
    assert_eq!(ToolCallFormat::detect(&template), ToolCallFormat::Xml);
    let out = format!(
        "The teens check is wrong.\nLook first.\n</think>\n\nLet me look.\n\n{}\n{}",
        xml_call(
            "bash",
            &[("command", "grep -n 'in (11, 12, 13)' x.py\necho <done>")]
        ),
        xml_call(
            "edit",
            &[
                ("path", "x.py"),
                ("line", "12"),
                ("ratio", "0.5"),
                ("dry", "True"),
                ("tags", "[\"a\", 1]"),
                ("note", "None")
            ]
        ),
    );
    let p = qwen35().parse_all(&out);
    assert_eq!(p.malformed_tool_calls, 0, "{p:?}");
    assert_eq!(
        p.reasoning.as_deref(),
        Some("The teens check is wrong.\nLook first.")
    );
    assert_eq!(p.content, "Let me look.");
    assert_eq!(p.tool_calls.len(), 2);
    assert_eq!(
        p.tool_calls[0].arguments,
        r#"{"command":"grep -n 'in (11, 12, 13)' x.py\necho <done>"}"#
    );
    // Typed by the schema, in the model's order; `True` and `None` as the template writes them.
    assert_eq!(
        p.tool_calls[1].arguments,
        r#"{"path":"x.py","line":12,"ratio":0.5,"dry":true,"tags":["a",1],"note":null}"#
    );
}

#[test]
fn qwen35_rejects_what_the_request_did_not_declare_and_counts_it() {
    use super::super::xml_call::{parse, Reject};
    let body = |call: &str| {
        call.strip_prefix("<tool_call>")
            .and_then(|c| c.strip_suffix("</tool_call>"))
            .unwrap()
            .to_string()
    };
    let tools = qwen35_tools();
    let cases: Vec<(String, Reject)> = vec![
        (xml_call("python", &[("code", "1")]), Reject::UnknownFunction("python".into())),
        (xml_call("bash", &[("cmd", "ls")]), Reject::UnknownParameter("cmd".into())),
        (xml_call("edit", &[("path", "x"), ("line", "1"), ("mode", "w")]), Reject::UnknownParameter("mode".into())),
        (xml_call("edit", &[("path", "x")]), Reject::MissingParameter("line".into())),
        (xml_call("bash", &[("command", "ls"), ("command", "pwd")]), Reject::DuplicateParameter("command".into())),
        (
            xml_call("edit", &[("path", "x"), ("line", "twelve")]),
            Reject::BadValue { name: "line".into(), ty: "\"integer\"".into() },
        ),
        (
            xml_call("edit", &[("path", "x"), ("line", "1.5")]),
            Reject::BadValue { name: "line".into(), ty: "\"integer\"".into() },
        ),
        (
            xml_call("edit", &[("path", "x"), ("line", "1"), ("dry", "yes")]),
            Reject::BadValue { name: "dry".into(), ty: "\"boolean\"".into() },
        ),
        (
            xml_call("edit", &[("path", "x"), ("line", "1"), ("tags", "{\"a\": 1}")]),
            Reject::BadValue { name: "tags".into(), ty: "\"array\"".into() },
        ),
        (
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</function>\n</tool_call>".into(),
            Reject::UnterminatedParameter,
        ),
        (
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</tool_call>".into(),
            Reject::UnterminatedFunction,
        ),
        ("<tool_call>\n<function=bash\n</tool_call>".into(), Reject::UnterminatedTag("function")),
        ("<tool_call>\n<function=ba sh>\n</function>\n</tool_call>".into(), Reject::BadName("function")),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>".into(), Reject::BadName("function")),
        (
            "<tool_call>\n<parameter=command>\nls\n</parameter>\n</tool_call>".into(),
            Reject::NoFunction,
        ),
        (
            "<tool_call>\nbash\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>".into(),
            Reject::NoFunction,
        ),
        (
            "<tool_call>\n<function=bash>\nnow:\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>".into(),
            Reject::StrayText,
        ),
        (
            "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\ndone\n</tool_call>".into(),
            Reject::StrayText,
        ),
        // The JSON syntax of Qwen3 is not Qwen3.5's.
        (
            "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>".into(),
            Reject::NoFunction,
        ),
    ];
    for (call, want) in &cases {
        assert_eq!(parse(&body(call), &tools).unwrap_err(), *want, "{call}");
        // Through the parser: returned as text, counted, the good call beside it kept.
        let out = format!(
            "x\n</think>\n\n{call}\n{}",
            xml_call("bash", &[("command", "ls")])
        );
        let p = qwen35().parse_all(&out);
        assert_eq!((p.malformed_tool_calls, p.tool_calls.len()), (1, 1), "{call}");
        assert!(p.content.contains(call.as_str()), "{call}: {:?}", p.content);
    }
    // An unterminated <tool_call> at the end of the output is rejected unless its function closed
    // (the model stopped right before `</tool_call>`).
    let cut = "x\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls";
    let p = qwen35().parse_all(cut);
    assert_eq!(
        (p.malformed_tool_calls, p.content.as_str()),
        (1, &cut[cut.find("<tool_call>").unwrap()..])
    );
    let p = qwen35().parse_all(
        "x\n</think>\n\n<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n",
    );
    assert_eq!((p.malformed_tool_calls, p.tool_calls.len()), (0, 1));
    // Text after a complete call stays content (vLLM drops it; nothing is dropped here).
    let p = qwen35().parse_all(&format!(
        "x\n</think>\n\n{}\nand then more",
        xml_call("bash", &[("command", "ls")])
    ));
    assert_eq!((p.tool_calls.len(), p.content.as_str()), (1, "and then more"));
    // A call inside the reasoning is reasoning (the think block has not ended).
    let p = qwen35().parse_all(&format!("maybe {}", xml_call("bash", &[("command", "ls")])));
    assert_eq!((p.tool_calls.len(), p.malformed_tool_calls), (0, 0));
    // Without declared tools names are not checked and values stay strings.
    let p = StreamParser::new(ToolCallFormat::Xml, ids(), false)
        .parse_all(&xml_call("python", &[("line", "12")]));
    assert_eq!(p.tool_calls[0].arguments, r#"{"line":"12"}"#);
}

#[test]
fn qwen3_json_calls_are_held_to_the_declared_tools() {
    // Before: only XML calls were checked; a Qwen3 JSON call to an undeclared function reached
    // the harness as a call it never offered.
    use super::super::tool_schema::check_json_call;
    use super::super::xml_call::Reject;
    let tools = qwen35_tools();
    let bad = |ty: &str, name: &str| Reject::BadValue {
        name: name.into(),
        ty: ty.into(),
    };
    let cases: Vec<(&str, &str, Reject)> = vec![
        (
            "python",
            r#"{"code": "1"}"#,
            Reject::UnknownFunction("python".into()),
        ),
        ("bash", r#"{"cmd": "ls"}"#, Reject::UnknownParameter("cmd".into())),
        (
            "edit",
            r#"{"path": "x", "line": 1, "mode": "w"}"#,
            Reject::UnknownParameter("mode".into()),
        ),
        (
            "edit",
            r#"{"path": "x"}"#,
            Reject::MissingParameter("line".into()),
        ),
        ("bash", "{}", Reject::MissingParameter("command".into())),
        (
            "edit",
            r#"{"path": "x", "line": "12"}"#,
            bad("\"integer\"", "line"),
        ),
        (
            "edit",
            r#"{"path": "x", "line": 1.5}"#,
            bad("\"integer\"", "line"),
        ),
        ("edit", r#"{"path": 3, "line": 1}"#, bad("\"string\"", "path")),
        (
            "edit",
            r#"{"path": "x", "line": 1, "dry": "yes"}"#,
            bad("\"boolean\"", "dry"),
        ),
        (
            "edit",
            r#"{"path": "x", "line": null}"#,
            bad("\"integer\"", "line"),
        ),
        ("bash", r#"["ls"]"#, Reject::NotAnObject),
        ("bash", r#""ls""#, Reject::NotAnObject),
    ];
    for (name, args, want) in &cases {
        assert_eq!(
            check_json_call(name, args, &tools).unwrap_err(),
            *want,
            "{name} {args}"
        );
        // Through the parser: returned as text, counted, the good call beside it kept.
        let out = format!(
            "<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>\n\
             <tool_call>\n{{\"name\": \"bash\", \"arguments\": {{\"command\": \"ls\"}}}}\n</tool_call>"
        );
        let p = json_parser().with_tools(&tools).parse_all(&out);
        assert_eq!((p.malformed_tool_calls, p.tool_calls.len()), (1, 1), "{out}");
        assert!(
            p.content.contains(&format!("\"name\": \"{name}\"")),
            "{:?}",
            p.content
        );
    }
    // What the schemas allow passes, arguments kept exactly as the model wrote them.
    let ok = r#"{"path": "x.py", "line": 12, "ratio": 1, "dry": false, "tags": [], "note": null}"#;
    check_json_call("edit", ok, &tools).unwrap();
    let p = json_parser().with_tools(&tools).parse_all(&format!(
        "<tool_call>\n{{\"name\": \"edit\", \"arguments\": {ok}}}\n</tool_call>"
    ));
    assert_eq!(
        (p.malformed_tool_calls, p.tool_calls[0].arguments.as_str()),
        (0, ok)
    );
    // Without declared tools nothing is checked.
    check_json_call("python", r#"["anything"]"#, &[]).unwrap();
}
