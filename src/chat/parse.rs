//! Generated text → reasoning, text and tool calls, incrementally.
//!
//! One state machine ([`StreamParser`]) serves streaming and whole-output parsing
//! ([`StreamParser::parse_all`] feeds everything at once), so both give the same result for every
//! way the text is split (tested). Markers are recognized only when complete: a suffix that could
//! still become `<tool_call>` or `</think>` is held back, never emitted as text and never dropped
//! (vLLM's hermes parser is known to drop the final `}` when streaming Qwen3).
//!
//! Rules: a leading `<think>` (or a prompt that already opened one) starts reasoning, ended by
//! `</think>`; reasoning is stripped of surrounding newlines, text of surrounding whitespace (as the
//! Qwen3 template re-renders them). A tool call is emitted whole once `</tool_call>` arrives; a call
//! that does not parse is returned as text and counted in [`ParsedOutput::malformed_tool_calls`]
//! (XML calls are held to the template's exact shape, [`super::xml_call`]; calls of both syntaxes
//! to the request's declared tools and their schemas, [`super::tool_schema`]).
//! Tool-call ids are `call_` + 24 hex digits of sha256(trial, generation, call index): stable, so
//! alignment can link a later request's echoed call to the generation that made it.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::message::{ToolCall, ToolSpec};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// The tool-call syntax a model emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Qwen3 / Hermes: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`.
    Json,
    /// Qwen3-Coder: `<tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>\n</function>\n</tool_call>`.
    Xml,
}

impl ToolCallFormat {
    /// Detect from a chat template's source.
    pub fn detect(template: &str) -> Self {
        if template.contains("<function=") {
            ToolCallFormat::Xml
        } else {
            ToolCallFormat::Json
        }
    }
}

/// Where tool-call ids come from: the trial and the generation's index within it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallIds {
    pub trial: String,
    pub generation: u64,
    /// `call_` (OpenAI style) or `toolu_` (Anthropic style).
    pub prefix: String,
}

impl ToolCallIds {
    /// Ids for generation `generation` of trial `trial`, prefix `call_`.
    pub fn new(trial: impl Into<String>, generation: u64) -> Self {
        ToolCallIds {
            trial: trial.into(),
            generation,
            prefix: "call_".into(),
        }
    }

    /// The same ids with another prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The id of call `index` (0-based) of this generation.
    pub fn id(&self, index: usize) -> String {
        let mut h = Sha256::new();
        h.update(self.trial.as_bytes());
        h.update([0]);
        h.update(self.generation.to_le_bytes());
        h.update((index as u64).to_le_bytes());
        let digest = hex::encode(h.finalize());
        format!("{}{}", self.prefix, &digest[..24])
    }
}

/// A parsed generation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    /// Reasoning, when the output had a think block.
    pub reasoning: Option<String>,
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    /// Tool calls that did not parse (returned inside `content` as text).
    pub malformed_tool_calls: usize,
    /// The stop string that ended the output (cut from the text), if one did.
    pub stop: Option<String>,
}

impl ParsedOutput {
    /// The assistant message this output is (what the proxy returns and later sees echoed).
    pub fn to_message(&self) -> super::message::Message {
        super::message::Message {
            reasoning: self.reasoning.clone(),
            tool_calls: self.tool_calls.clone(),
            ..super::message::Message::text(super::message::Role::Assistant, self.content.clone())
        }
    }
}

/// One piece of streamed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    Reasoning(String),
    Text(String),
    /// A complete tool call (`index` counts calls of this generation from 0).
    ToolCall {
        index: usize,
        call: ToolCall,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Start,
    Reasoning,
    Text,
    ToolCall,
}

/// Holds back trailing characters matching `pred` until something else follows; optionally drops
/// leading ones. Makes the trimming independent of how the text is split.
#[derive(Debug, Clone)]
struct Trimmer {
    pending: String,
    drop_leading: bool,
    pred: fn(char) -> bool,
}

impl Trimmer {
    fn push(&mut self, s: &str) -> String {
        let mut full = std::mem::take(&mut self.pending) + s;
        if self.drop_leading {
            full = full.trim_start_matches(self.pred).to_string();
        }
        let body = full.trim_end_matches(self.pred);
        if body.is_empty() {
            self.pending = full;
            return String::new();
        }
        self.drop_leading = false;
        self.pending = full[body.len()..].to_string();
        body.to_string()
    }

    /// Forget pending characters and drop leading ones from now on.
    fn cut(&mut self) {
        self.pending.clear();
        self.drop_leading = true;
    }
}

/// Incremental parser of one generation's text.
#[derive(Debug, Clone)]
pub struct StreamParser {
    format: ToolCallFormat,
    ids: ToolCallIds,
    tools: Vec<ToolSpec>,
    state: State,
    buf: String,
    text: Trimmer,
    reasoning: Trimmer,
    saw_reasoning: bool,
    calls: usize,
    malformed: usize,
}

fn is_newline(c: char) -> bool {
    c == '\n'
}

impl StreamParser {
    /// A parser; `starts_in_reasoning` when the prompt already opened `<think>`.
    pub fn new(format: ToolCallFormat, ids: ToolCallIds, starts_in_reasoning: bool) -> Self {
        StreamParser {
            format,
            ids,
            tools: Vec::new(),
            state: if starts_in_reasoning {
                State::Reasoning
            } else {
                State::Start
            },
            buf: String::new(),
            text: Trimmer {
                pending: String::new(),
                drop_leading: true,
                pred: char::is_whitespace,
            },
            reasoning: Trimmer {
                pending: String::new(),
                drop_leading: true,
                pred: is_newline,
            },
            saw_reasoning: starts_in_reasoning,
            calls: 0,
            malformed: 0,
        }
    }

    /// The request's tools: calls are checked against them (see [`super::tool_schema`] for what
    /// is rejected), and the parameters of XML calls (Qwen3-Coder, Qwen3.5) typed by their schemas.
    pub fn with_tools(mut self, tools: &[ToolSpec]) -> Self {
        self.tools = tools.to_vec();
        self
    }

    /// Tool calls that failed to parse so far.
    pub fn malformed_tool_calls(&self) -> usize {
        self.malformed
    }

    /// Feed the next piece of text; returns the events it completes.
    pub fn push(&mut self, chunk: &str) -> Vec<StreamEvent> {
        self.buf.push_str(chunk);
        let mut out = Vec::new();
        self.drain(false, &mut out);
        out
    }

    /// End of output: flush what was held back.
    pub fn finish(&mut self) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        self.drain(true, &mut out);
        out
    }

    /// Parse a whole output.
    pub fn parse_all(mut self, text: &str) -> ParsedOutput {
        let mut events = self.push(text);
        events.extend(self.finish());
        collect(events, self.saw_reasoning, self.malformed)
    }

    /// Whether a think block was seen (reasoning is then `Some`, possibly empty).
    pub fn saw_reasoning(&self) -> bool {
        self.saw_reasoning
    }

    fn emit_text(&mut self, s: &str, out: &mut Vec<StreamEvent>) {
        let t = self.text.push(s);
        if !t.is_empty() {
            out.push(StreamEvent::Text(t));
        }
    }

    fn emit_reasoning(&mut self, s: &str, out: &mut Vec<StreamEvent>) {
        let t = self.reasoning.push(s);
        if !t.is_empty() {
            out.push(StreamEvent::Reasoning(t));
        }
    }

    fn drain(&mut self, eof: bool, out: &mut Vec<StreamEvent>) {
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.buf.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(THINK_OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Reasoning;
                        self.saw_reasoning = true;
                    } else if !eof && THINK_OPEN.starts_with(trimmed) {
                        return; // could still become <think>
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Reasoning => match self.buf.find(THINK_CLOSE) {
                    Some(pos) => {
                        let part = self.buf[..pos].to_string();
                        self.buf.drain(..pos + THINK_CLOSE.len());
                        self.emit_reasoning(&part, out);
                        self.state = State::Text;
                    }
                    None => {
                        let keep = if eof {
                            0
                        } else {
                            partial_suffix(&self.buf, THINK_CLOSE)
                        };
                        let part: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.emit_reasoning(&part, out);
                        return;
                    }
                },
                State::Text => match self.buf.find(CALL_OPEN) {
                    Some(pos) => {
                        let part = self.buf[..pos].to_string();
                        self.buf.drain(..pos + CALL_OPEN.len());
                        self.emit_text(&part, out);
                        self.state = State::ToolCall;
                    }
                    None => {
                        let keep = if eof {
                            0
                        } else {
                            partial_suffix(&self.buf, CALL_OPEN)
                        };
                        let part: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.emit_text(&part, out);
                        return;
                    }
                },
                State::ToolCall => {
                    let (body, closed) = match self.buf.find(CALL_CLOSE) {
                        Some(pos) => {
                            let body = self.buf[..pos].to_string();
                            self.buf.drain(..pos + CALL_CLOSE.len());
                            (body, true)
                        }
                        None if eof => (std::mem::take(&mut self.buf), false),
                        None => return,
                    };
                    match self.parse_call(&body) {
                        Some((name, arguments)) => {
                            let call = ToolCall {
                                id: self.ids.id(self.calls),
                                name,
                                arguments,
                            };
                            out.push(StreamEvent::ToolCall {
                                index: self.calls,
                                call,
                            });
                            self.calls += 1;
                            self.text.cut();
                        }
                        None => {
                            self.malformed += 1;
                            let close = if closed { CALL_CLOSE } else { "" };
                            let raw = format!("{CALL_OPEN}{body}{close}");
                            self.emit_text(&raw, out);
                        }
                    }
                    self.state = State::Text;
                }
            }
        }
    }

    fn parse_call(&self, body: &str) -> Option<(String, String)> {
        match self.format {
            ToolCallFormat::Json => {
                let (name, arguments) = parse_json_call(body)?;
                match super::tool_schema::check_json_call(&name, &arguments, &self.tools) {
                    Ok(()) => Some((name, arguments)),
                    Err(reason) => {
                        tracing::debug!("rejected a JSON tool call: {reason}");
                        None
                    }
                }
            }
            ToolCallFormat::Xml => match super::xml_call::parse(body, &self.tools) {
                Ok(call) => Some(call),
                Err(reason) => {
                    tracing::debug!("rejected an XML tool call: {reason}");
                    None
                }
            },
        }
    }
}

/// Gather events into a [`ParsedOutput`].
pub fn collect(events: Vec<StreamEvent>, saw_reasoning: bool, malformed: usize) -> ParsedOutput {
    let mut p = ParsedOutput {
        malformed_tool_calls: malformed,
        ..Default::default()
    };
    if saw_reasoning {
        p.reasoning = Some(String::new());
    }
    for e in events {
        match e {
            StreamEvent::Reasoning(r) => p.reasoning.get_or_insert_with(String::new).push_str(&r),
            StreamEvent::Text(t) => p.content.push_str(&t),
            StreamEvent::ToolCall { call, .. } => p.tool_calls.push(call),
        }
    }
    p
}

/// Length of the longest suffix of `s` that is a proper prefix of `marker`.
fn partial_suffix(s: &str, marker: &str) -> usize {
    (1..marker.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && marker.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// Whether a rendered prompt ends inside an open `<think>` block.
pub fn ends_inside_think(prompt: &str) -> bool {
    match (prompt.rfind(THINK_OPEN), prompt.rfind(THINK_CLOSE)) {
        (Some(o), Some(c)) => o > c,
        (Some(_), None) => true,
        _ => false,
    }
}

/// `{"name": …, "arguments": {…}}` → (name, exact argument text).
fn parse_json_call(body: &str) -> Option<(String, String)> {
    let body = body.trim();
    let obj: Map<String, Value> = serde_json::from_str(body).ok()?;
    let name = obj.get("name")?.as_str()?.to_string();
    let arguments = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(_)) => {
            let key = if obj.contains_key("arguments") {
                "arguments"
            } else {
                "parameters"
            };
            top_level_value_span(body, key)?.to_string()
        }
        Some(_) => return None,
    };
    Some((name, arguments))
}

/// The exact source text of the value of top-level `key` in a JSON object text.
fn top_level_value_span<'a>(obj: &'a str, key: &str) -> Option<&'a str> {
    let skip_ws = |i: &mut usize| {
        while obj[*i..].starts_with([' ', '\n', '\r', '\t']) {
            *i += 1;
        }
    };
    let mut i = 0;
    skip_ws(&mut i);
    obj[i..].starts_with('{').then_some(())?;
    i += 1;
    loop {
        skip_ws(&mut i);
        let mut keys = serde_json::Deserializer::from_str(&obj[i..]).into_iter::<String>();
        let k = keys.next()?.ok()?;
        i += keys.byte_offset();
        skip_ws(&mut i);
        obj[i..].starts_with(':').then_some(())?;
        i += 1;
        skip_ws(&mut i);
        let mut values = serde_json::Deserializer::from_str(&obj[i..]).into_iter::<serde::de::IgnoredAny>();
        values.next()?.ok()?;
        let end = i + values.byte_offset();
        if k == key {
            return Some(&obj[i..end]);
        }
        i = end;
        skip_ws(&mut i);
        if obj[i..].starts_with(',') {
            i += 1;
        } else {
            return None;
        }
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
