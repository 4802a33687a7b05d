//! Anthropic messages request wire types and their mapping to [`Conversation`].
//!
//! Mirrors what Claude Code really sends (`testdata/harness-traffic/claude-code/`): `system` as a
//! string or text blocks, `tool_use`/`tool_result` blocks (result content a string or blocks, with
//! `is_error`), `thinking` blocks echoed with their signature, `cache_control` everywhere (ignored).
//! The mapping: thinking → reasoning, `tool_use` → tool calls (input serialized as compact JSON, key
//! order kept), each `tool_result` → one [`Role::Tool`] message, user text → a user message, in block
//! order.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::message::{join_text, Conversation, Message, Role, ToolCall, ToolChoice, ToolSpec};
use super::ChatError;

/// `POST /v1/messages` body (the fields lego-rl reads).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub messages: Vec<AnthropicMessage>,
    #[serde(default)]
    pub system: Option<BlocksOrText>,
    #[serde(default)]
    pub tools: Vec<AnthropicTool>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub thinking: Option<ThinkingConfig>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub stream: bool,
    // The sampling fields are typed here so that a value of the wrong type is a 400; what a
    // request samples with is decided from the raw body by `proxy::harness_sampling::enforce`.
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<u32>,
    #[serde(default)]
    pub stop_sequences: Vec<String>,
    /// Accepted and ignored.
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// `thinking: {type: "enabled", budget_tokens}` or `{type: "disabled"}`.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ThinkingConfig {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub budget_tokens: Option<u32>,
}

/// One entry of `messages`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct AnthropicMessage {
    pub role: String,
    pub content: BlocksOrText,
}

/// Content that is a plain string or a list of blocks.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum BlocksOrText {
    Text(String),
    Blocks(Vec<ContentBlock>),
}

/// A content block. Unknown block types (images, documents, server tools) are kept as `Other`
/// and contribute no text.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        #[serde(default)]
        tool_use_id: String,
        #[serde(default)]
        content: Option<BlocksOrText>,
        #[serde(default)]
        is_error: Option<bool>,
    },
    #[serde(other)]
    Other,
}

/// One entry of `tools`.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct AnthropicTool {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Value,
}

impl BlocksOrText {
    /// The text blocks joined with `\n`.
    pub fn to_text(&self) -> String {
        match self {
            BlocksOrText::Text(s) => s.clone(),
            BlocksOrText::Blocks(blocks) => join_text(blocks.iter().filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })),
        }
    }
}

impl MessagesRequest {
    /// Parse a request body.
    pub fn from_json(body: &str) -> Result<Self, ChatError> {
        serde_json::from_str(body).map_err(|source| ChatError::ParseRequest {
            api: "anthropic",
            source,
        })
    }

    /// The conversation this request describes.
    pub fn to_conversation(&self) -> Result<Conversation, ChatError> {
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            messages.push(Message::text(Role::System, system.to_text()));
        }
        for (index, m) in self.messages.iter().enumerate() {
            match m.role.as_str() {
                "user" => push_user(&mut messages, &m.content),
                "assistant" => messages.push(assistant(&m.content)),
                other => {
                    return Err(ChatError::UnknownRole {
                        index,
                        role: other.to_string(),
                    })
                }
            }
        }
        let tools = self
            .tools
            .iter()
            .map(|t| ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.input_schema.clone(),
            })
            .collect();
        let thinking = self.thinking.as_ref().and_then(|t| match t.kind.as_str() {
            "enabled" | "adaptive" => Some(true),
            "disabled" => Some(false),
            _ => None,
        });
        Ok(Conversation {
            messages,
            tools,
            tool_choice: tool_choice(self.tool_choice.as_ref()),
            thinking,
        })
    }
}

/// User turns: text blocks become user messages, each tool result its own tool message.
fn push_user(out: &mut Vec<Message>, content: &BlocksOrText) {
    let blocks = match content {
        BlocksOrText::Text(s) => return out.push(Message::text(Role::User, s.clone())),
        BlocksOrText::Blocks(b) => b,
    };
    let mut text: Vec<&str> = Vec::new();
    let flush = |text: &mut Vec<&str>, out: &mut Vec<Message>| {
        if !text.is_empty() {
            out.push(Message::text(Role::User, join_text(text.drain(..))));
        }
    };
    for block in blocks {
        match block {
            ContentBlock::Text { text: t } => text.push(t),
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                flush(&mut text, out);
                let body = content.as_ref().map(BlocksOrText::to_text).unwrap_or_default();
                let mut m = Message::tool_result(tool_use_id.clone(), body);
                m.is_error = is_error.unwrap_or(false);
                out.push(m);
            }
            _ => {}
        }
    }
    flush(&mut text, out);
}

fn assistant(content: &BlocksOrText) -> Message {
    let blocks = match content {
        BlocksOrText::Text(s) => return Message::text(Role::Assistant, s.clone()),
        BlocksOrText::Blocks(b) => b,
    };
    let mut text = Vec::new();
    let mut thinking = Vec::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block {
            ContentBlock::Text { text: t } => text.push(t.as_str()),
            ContentBlock::Thinking { thinking: t, .. } => thinking.push(t.as_str()),
            ContentBlock::ToolUse { id, name, input } => tool_calls.push(ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: input.to_string(),
            }),
            _ => {}
        }
    }
    Message {
        reasoning: (!thinking.is_empty()).then(|| join_text(thinking)),
        tool_calls,
        ..Message::text(Role::Assistant, join_text(text))
    }
}

fn tool_choice(v: Option<&Value>) -> ToolChoice {
    let Some(v) = v else { return ToolChoice::Auto };
    match v.get("type").and_then(Value::as_str) {
        Some("any") => ToolChoice::Required,
        Some("none") => ToolChoice::None,
        Some("tool") => v
            .get("name")
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Function(n.to_string()))
            .unwrap_or_default(),
        _ => ToolChoice::Auto,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::openai::ChatCompletionRequest;

    #[test]
    fn maps_like_the_equivalent_openai_request() {
        let anthropic = r#"{"model":"m","max_tokens":5,"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],
          "thinking":{"type":"enabled","budget_tokens":100},
          "tools":[{"name":"bash","description":"run","input_schema":{"type":"object"}}],
          "tool_choice":{"type":"any"},
          "messages":[{"role":"user","content":"fix it"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"text","text":"ok"},
               {"type":"tool_use","id":"toolu_1","name":"bash","input":{"cmd":"ls","n":1}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"is_error":true},
               {"type":"text","text":"go on"}]}]}"#;
        let openai = r#"{"messages":[{"role":"system","content":"sys"},{"role":"user","content":"fix it"},
            {"role":"assistant","content":"ok","reasoning_content":"hmm","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\",\"n\":1}"}}]},
            {"role":"tool","tool_call_id":"toolu_1","content":"a\nb"},{"role":"user","content":"go on"}],
            "tools":[{"type":"function","function":{"name":"bash","description":"run","parameters":{"type":"object"}}}],
            "tool_choice":"required","chat_template_kwargs":{"enable_thinking":true}}"#;
        let a = MessagesRequest::from_json(anthropic)
            .unwrap()
            .to_conversation()
            .unwrap();
        let mut o = ChatCompletionRequest::from_json(openai)
            .unwrap()
            .to_conversation()
            .unwrap();
        o.messages[3].is_error = true; // OpenAI has no is_error
        assert_eq!(a, o);
    }

    #[test]
    fn string_tool_result_and_unknown_blocks() {
        let body = r#"{"messages":[{"role":"user","content":[{"type":"image","source":{}},{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}"#;
        let c = MessagesRequest::from_json(body)
            .unwrap()
            .to_conversation()
            .unwrap();
        assert_eq!(c.messages, vec![Message::tool_result("t", "x")]);
        assert_eq!(c.thinking, None);
    }
}
