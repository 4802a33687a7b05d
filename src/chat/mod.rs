//! Chat formats: API messages ↔ prompt text ↔ tokens ↔ parsed model output.
//!
//! The proxy speaks OpenAI and Anthropic to harnesses but the model only sees tokens; `align`
//! needs to know which tokens the policy produced. This module is the one place that knows how a
//! conversation becomes a prompt and how generated tokens become reasoning, text and tool calls.
//!
//! # API
//! - Requests → [`Conversation`]: [`openai::ChatCompletionRequest::to_conversation`],
//!   [`anthropic::MessagesRequest::to_conversation`] (wire types mirror the real JSON), or
//!   [`Conversation::from_api_request`]`("openai" | "anthropic", &body)` for captured requests.
//! - [`ChatFormat::from_model_dir`] loads `tokenizer.json`, `tokenizer_config.json` and the chat
//!   template (`chat_template.jinja` preferred) of a Hugging Face model folder;
//!   [`ChatFormat::from_parts`] takes the files separately (a template override, e.g. Qwen3-Coder).
//! - [`ChatFormat::render`]`(&conv, &RenderOptions) -> String` equals transformers'
//!   `apply_chat_template(..., tokenize=False)` byte for byte; [`ChatFormat::prompt_ids`] tokenizes it.
//! - [`ChatFormat::encode`] / [`ChatFormat::decode`], [`ChatFormat::special`] (ids of
//!   `<|im_end|>`, `<think>`, `<tool_call>`, …), [`IncrementalDecoder`] for streaming token → text.
//! - [`ChatFormat::parse_output`]`(&output_ids, ToolCallIds, .., stops) -> ParsedOutput` splits
//!   generated tokens, cut at the request's stop strings ([`stop`]), into reasoning, text and
//!   tool calls (Qwen3 JSON or Qwen3-Coder XML, chosen from the template); tool-call ids are
//!   `call_<hash(trial, generation, call)>`. [`StreamParser`] does the same incrementally and
//!   emits [`StreamEvent`]s; feeding all text at once gives the same result.
//!   [`ChatFormat::output_stream`] wraps decoder + stop strings + parser for token-by-token
//!   streaming.
//! - [`ChatFormat::faithful_prompt`] builds request k+1's prompt from generation k's captured
//!   prompt + output ids and a suffix derived from the template, or says why a new segment must
//!   start ([`SpliceBreak`]).

pub mod anthropic;
pub mod faithful;
pub mod message;
pub mod openai;
pub mod parse;
pub mod pyjson;
pub mod stop;
pub mod template;
pub mod tokenizer;
pub mod tool_schema;
pub mod xml_call;

use std::path::{Path, PathBuf};

pub use faithful::{FaithfulPrompt, PreviousGeneration, SpliceBreak};
pub use message::{Conversation, Message, Role, ToolCall, ToolChoice, ToolSpec};
pub use parse::{ParsedOutput, StreamEvent, StreamParser, ToolCallFormat, ToolCallIds};
pub use stop::StopStrings;
pub use template::{ChatTemplate, RenderOptions};
pub use tokenizer::{ChatTokenizer, IncrementalDecoder, SpecialTokens};

/// Errors of the chat layer.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("reading {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("parsing {path} as JSON")]
    ParseJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} has no chat_template and there is no chat_template.jinja beside it")]
    NoTemplate { path: PathBuf },
    #[error("compiling the chat template: {message}")]
    CompileTemplate { message: String },
    #[error("rendering the chat template: {message}")]
    RenderTemplate { message: String },
    #[error("loading tokenizer {path}: {message}")]
    LoadTokenizer { path: PathBuf, message: String },
    #[error("tokenizing: {message}")]
    Tokenize { message: String },
    #[error("malformed {api} request body")]
    ParseRequest {
        api: &'static str,
        source: serde_json::Error,
    },
    #[error("unknown API `{api}` (expected openai or anthropic)")]
    UnknownApi { api: String },
    #[error("messages[{index}]: unknown role `{role}`")]
    UnknownRole { index: usize, role: String },
}

/// A model's complete chat format: template, tokenizer and output syntax.
#[derive(Debug)]
pub struct ChatFormat {
    template: ChatTemplate,
    tokenizer: ChatTokenizer,
    tool_format: ToolCallFormat,
}

impl ChatFormat {
    /// Load from a Hugging Face model folder (`tokenizer.json`, `tokenizer_config.json`,
    /// optional `chat_template.jinja`).
    pub fn from_model_dir(dir: &Path) -> Result<Self, ChatError> {
        let template = ChatTemplate::from_model_dir(dir)?;
        let tokenizer = ChatTokenizer::from_file(&dir.join("tokenizer.json"))?;
        Ok(Self::new(template, tokenizer))
    }

    /// Load from separate files; `template` overrides the config's `chat_template`.
    pub fn from_parts(
        tokenizer_json: &Path,
        tokenizer_config: &Path,
        template: Option<&Path>,
    ) -> Result<Self, ChatError> {
        let config = template::read_json(tokenizer_config)?;
        let chat_template = match template {
            Some(p) => {
                let src = std::fs::read_to_string(p).map_err(|source| ChatError::Read {
                    path: p.into(),
                    source,
                })?;
                ChatTemplate::new(src)?
            }
            None => ChatTemplate::from_model_dir(tokenizer_config.parent().unwrap_or(Path::new(".")))?,
        };
        let tokenizer = ChatTokenizer::from_file(tokenizer_json)?;
        Ok(Self::new(chat_template.with_special_tokens(&config), tokenizer))
    }

    /// Combine a template and a tokenizer; the tool-call syntax is detected from the template.
    pub fn new(template: ChatTemplate, tokenizer: ChatTokenizer) -> Self {
        let tool_format = ToolCallFormat::detect(template.source());
        ChatFormat {
            template,
            tokenizer,
            tool_format,
        }
    }

    /// The template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &ChatTokenizer {
        &self.tokenizer
    }

    /// Special-token ids.
    pub fn special(&self) -> SpecialTokens {
        self.tokenizer.special()
    }

    /// Render a conversation to prompt text (transformers-exact).
    pub fn render(&self, conv: &Conversation, opts: &RenderOptions) -> Result<String, ChatError> {
        self.template.render(conv, opts)
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        self.tokenizer.encode(text)
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ChatError> {
        self.tokenizer.decode(ids, skip_special)
    }

    /// `encode(render(conv, opts))`: the prompt in rendered mode.
    pub fn prompt_ids(&self, conv: &Conversation, opts: &RenderOptions) -> Result<Vec<u32>, ChatError> {
        self.encode(&self.render(conv, opts)?)
    }

    /// Whether a generation prompt leaves the model inside a `<think>` block (templates that open
    /// it themselves), so output starts with reasoning. Read from the prompt's last 64 tokens —
    /// the ones the engine was given, faithful or rendered — so nothing is rendered again, and
    /// the proxy (answering) and `align` (re-parsing the capture) apply the same rule.
    pub fn prompt_ends_in_reasoning(&self, prompt_ids: &[u32]) -> Result<bool, ChatError> {
        let tail = &prompt_ids[prompt_ids.len().saturating_sub(64)..];
        Ok(parse::ends_inside_think(&self.decode(tail, false)?))
    }

    /// A streaming parser for this model's output.
    pub fn stream_parser(&self, ids: ToolCallIds, starts_in_reasoning: bool) -> StreamParser {
        StreamParser::new(self.tool_format, ids, starts_in_reasoning)
    }

    /// Generated tokens in, [`StreamEvent`]s out: incremental decoding (special tokens dropped),
    /// stop strings cut (text that may begin one is held back), then `parser` — or plain text
    /// events when `parser` is `None` (raw completions). The events add up to
    /// [`ChatFormat::parse_text`] of the same ids.
    pub fn output_stream(&self, parser: Option<StreamParser>, stops: &[String]) -> OutputStream<'_> {
        OutputStream {
            format: self,
            decoder: IncrementalDecoder::new(true),
            parser,
            stop: StopStrings::new(stops),
        }
    }

    /// Parse generated tokens as the client was answered: decoded (special tokens such as
    /// `<|im_end|>` dropped), cut before the first of `stops` (the request's stop strings: the
    /// engine keeps the token that completed one, the answer does not), then parsed. `tools` lets
    /// Qwen3-Coder's XML parameters be typed by their JSON schema.
    pub fn parse_output(
        &self,
        output_ids: &[u32],
        ids: ToolCallIds,
        starts_in_reasoning: bool,
        tools: &[ToolSpec],
        stops: &[String],
    ) -> Result<ParsedOutput, ChatError> {
        let parser = self.stream_parser(ids, starts_in_reasoning).with_tools(tools);
        self.parse_text(output_ids, Some(parser), stops)
    }

    /// [`ChatFormat::parse_output`] with a prepared parser, or plain text when `parser` is `None`
    /// (raw completions). [`ParsedOutput::stop`] says which stop string cut the text.
    pub fn parse_text(
        &self,
        output_ids: &[u32],
        parser: Option<StreamParser>,
        stops: &[String],
    ) -> Result<ParsedOutput, ChatError> {
        let text = self.decode(output_ids, true)?;
        let (text, stop) = stop::truncate_at_stop(&text, stops);
        let parsed = match parser {
            Some(p) => p.parse_all(&text),
            None => ParsedOutput {
                content: text,
                ..Default::default()
            },
        };
        Ok(ParsedOutput { stop, ..parsed })
    }
}

/// Generated tokens in, [`StreamEvent`]s out (see [`ChatFormat::output_stream`]).
#[derive(Debug)]
pub struct OutputStream<'a> {
    format: &'a ChatFormat,
    decoder: IncrementalDecoder,
    /// None for raw completions (plain text events).
    parser: Option<StreamParser>,
    stop: StopStrings,
}

impl OutputStream<'_> {
    /// Add one generated token.
    pub fn push(&mut self, id: u32) -> Result<Vec<StreamEvent>, ChatError> {
        let text = self.decoder.push(self.format.tokenizer(), id)?;
        let text = self.stop.push(&text);
        Ok(self.emit(&text))
    }

    /// End of generation: the remaining events.
    pub fn finish(&mut self) -> Result<Vec<StreamEvent>, ChatError> {
        let text = self.decoder.finish(self.format.tokenizer())?;
        let mut text = self.stop.push(&text);
        if self.stop.matched().is_none() {
            text.push_str(&self.stop.finish());
        }
        let mut events = self.emit(&text);
        if let Some(p) = &mut self.parser {
            events.extend(p.finish());
        }
        Ok(events)
    }

    fn emit(&mut self, text: &str) -> Vec<StreamEvent> {
        match &mut self.parser {
            _ if text.is_empty() => Vec::new(),
            Some(p) => p.push(text),
            None => vec![StreamEvent::Text(text.to_string())],
        }
    }

    /// The chat parser (malformed-call count, whether reasoning was seen); None for raw text.
    pub fn parser(&self) -> Option<&StreamParser> {
        self.parser.as_ref()
    }
}

/// Path of a file under the crate's `testdata/` (for tests).
#[cfg(test)]
pub(crate) fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_ends_in_reasoning_reads_the_prompt_tail() {
        let fmt = ChatFormat::from_model_dir(&testdata("tokenizer/qwen3")).unwrap();
        let long_user = "word ".repeat(200);
        let ends = |tail: &str| {
            let text = format!("<|im_start|>user\n{long_user}<|im_end|>\n<|im_start|>assistant\n{tail}");
            fmt.prompt_ends_in_reasoning(&fmt.encode(&text).unwrap()).unwrap()
        };
        assert!(ends("<think>\n"), "a template that opens the think block");
        assert!(
            !ends("<think>\n\n</think>\n\n"),
            "thinking off: an empty, closed block"
        );
        assert!(!ends(""));
        // An earlier closed block does not count; only the tail decides.
        assert!(!ends(
            "<think>\nx\n</think>\n\nDone.<|im_end|>\n<|im_start|>assistant\n"
        ));
    }

    #[test]
    fn token_stream_agrees_with_parse_output() {
        let fmt = ChatFormat::from_model_dir(&testdata("tokenizer/qwen3")).unwrap();
        let text = "<think>\nPlan: list, then read. 世界 😀\n</think>\n\nLooking.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la | grep '}'\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"read\", \"arguments\": {}}\n</tool_call><|im_end|>";
        let ids = fmt.encode(text).unwrap();
        let want = fmt
            .parse_output(&ids, ToolCallIds::new("t", 2), false, &[], &[])
            .unwrap();
        assert_eq!(want.tool_calls.len(), 2);
        assert_eq!(
            want.tool_calls[0].arguments,
            r#"{"command": "ls -la | grep '}'"}"#
        );
        let mut stream = fmt.output_stream(Some(fmt.stream_parser(ToolCallIds::new("t", 2), false)), &[]);
        let mut events = Vec::new();
        for &id in &ids {
            events.extend(stream.push(id).unwrap());
        }
        events.extend(stream.finish().unwrap());
        let got = parse::collect(
            events,
            stream.parser().unwrap().saw_reasoning(),
            stream.parser().unwrap().malformed_tool_calls(),
        );
        assert_eq!(got, want);
    }
}
