//! The internal message model every API flavour maps into.
//!
//! OpenAI chat-completions and Anthropic messages requests describe the same conversation in
//! different shapes (`tool_calls` + `tool` role vs `tool_use`/`tool_result` blocks, `reasoning_content`
//! vs `thinking` blocks). The proxy renders, captures and aligns one shape only: [`Conversation`].
//! Conversion from the wire JSON lives in [`super::openai`] and [`super::anthropic`]; this module
//! also builds the data a Hugging Face chat template sees ([`Conversation::template_messages`]).

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Who wrote a message.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool result (OpenAI `tool` role, Anthropic `tool_result` block).
    Tool,
}

impl Role {
    /// The role name chat templates expect.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A call of a tool by the assistant.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The id results refer back to (`call_…`, `toolu_…`); alignment links turns by it.
    pub id: String,
    pub name: String,
    /// The arguments as the exact JSON text received or generated (an object, normally).
    pub arguments: String,
}

impl ToolCall {
    /// Arguments parsed as JSON, `None` when they are not valid JSON.
    pub fn arguments_json(&self) -> Option<Value> {
        serde_json::from_str(&self.arguments).ok()
    }

    /// Arguments with key order and whitespace normalized (keys sorted recursively, compact), for
    /// comparing a harness's re-serialized copy with the generated call; the text itself when it
    /// is not JSON.
    pub fn normalized_arguments(&self) -> String {
        fn sort(v: Value) -> Value {
            match v {
                Value::Object(o) => {
                    let mut entries: Vec<_> = o.into_iter().map(|(k, v)| (k, sort(v))).collect();
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                    Value::Object(entries.into_iter().collect())
                }
                Value::Array(a) => Value::Array(a.into_iter().map(sort).collect()),
                other => other,
            }
        }
        match self.arguments_json() {
            Some(v) => sort(v).to_string(),
            None => self.arguments.clone(),
        }
    }
}

/// One message of a conversation. Fields not used by a role stay empty.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    /// Text content; several text parts/blocks are joined with `\n` (as vLLM does).
    #[serde(default)]
    pub content: String,
    /// The assistant's reasoning (`reasoning_content`, Anthropic thinking blocks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The assistant's tool calls, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For [`Role::Tool`]: the id of the call this result answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For [`Role::Tool`]: the tool reported an error (Anthropic `is_error`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// Optional author name (OpenAI `name`; tool name on some clients' tool messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    /// A message with only a role and text.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            is_error: false,
            name: None,
        }
    }

    /// A tool result answering `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            tool_call_id: Some(tool_call_id.into()),
            ..Message::text(Role::Tool, content)
        }
    }
}

/// A tool the model may call.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ToolSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON schema of the arguments (OpenAI `parameters`, Anthropic `input_schema`).
    #[serde(default)]
    pub parameters: Value,
}

/// Which tools the model may or must call.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    /// Some tool must be called (OpenAI `required`, Anthropic `any`).
    Required,
    /// This tool must be called.
    Function(String),
}

/// A request's conversation in API-independent form.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct Conversation {
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// Thinking requested (`true`) or refused (`false`) by the client, when it said so: Anthropic
    /// `thinking.type`, OpenAI `chat_template_kwargs.enable_thinking` (vLLM's convention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<bool>,
}

impl Conversation {
    /// The `messages` a Hugging Face chat template receives, in transformers' shape:
    /// `{thinking?, role, content, reasoning_content?, tool_calls?: [{id, type, function: {name, arguments}}],
    /// tool_call_id?, name?}`. Arguments that parse as a JSON object are passed as that object (key
    /// order kept), as vLLM does, so templates that iterate them (Qwen3-Coder) work; anything else
    /// is passed as the original string.
    pub fn template_messages(&self) -> Vec<Value> {
        self.messages.iter().map(template_message).collect()
    }

    /// The `tools` a chat template receives: `[{type: "function", function: {name, description?,
    /// parameters}}]`, or `None` when there are none (transformers passes `tools=None` then).
    pub fn template_tools(&self) -> Option<Vec<Value>> {
        if self.tools.is_empty() {
            return None;
        }
        let tools = self
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), Value::String(t.name.clone()));
                if let Some(d) = &t.description {
                    f.insert("description".into(), Value::String(d.clone()));
                }
                f.insert("parameters".into(), t.parameters.clone());
                json!({"type": "function", "function": Value::Object(f)})
            })
            .collect();
        Some(tools)
    }
}

fn template_message(m: &Message) -> Value {
    let mut o = Map::new();
    // transformers 5 also passes reasoning as `thinking` (first key) for templates that read that.
    if let Some(r) = &m.reasoning {
        o.insert("thinking".into(), Value::String(r.clone()));
    }
    o.insert("role".into(), Value::String(m.role.as_str().into()));
    o.insert("content".into(), Value::String(m.content.clone()));
    if let Some(r) = &m.reasoning {
        o.insert("reasoning_content".into(), Value::String(r.clone()));
    }
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .map(|c| {
                let args = match serde_json::from_str::<Value>(&c.arguments) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => Value::String(c.arguments.clone()),
                };
                json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}})
            })
            .collect();
        o.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        o.insert("tool_call_id".into(), Value::String(id.clone()));
    }
    if let Some(n) = &m.name {
        o.insert("name".into(), Value::String(n.clone()));
    }
    Value::Object(o)
}

/// Join text pieces the way vLLM flattens content-part lists for string-content templates.
pub(crate) fn join_text<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    parts.into_iter().collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_message_parses_object_arguments_in_order() {
        let m = Message {
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "f".into(),
                arguments: r#"{"b": 1, "a": [2]}"#.into(),
            }],
            ..Message::text(Role::Assistant, "")
        };
        let v = template_message(&m);
        let args = &v["tool_calls"][0]["function"]["arguments"];
        assert_eq!(serde_json::to_string(args).unwrap(), r#"{"b":1,"a":[2]}"#);
        let bad = ToolCall {
            id: "x".into(),
            name: "f".into(),
            arguments: "not json".into(),
        };
        let m2 = Message {
            tool_calls: vec![bad],
            ..Message::text(Role::Assistant, "")
        };
        assert_eq!(
            template_message(&m2)["tool_calls"][0]["function"]["arguments"],
            "not json"
        );
    }

    #[test]
    fn normalized_arguments_ignore_key_order_and_whitespace() {
        let call = |a: &str| ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: a.into(),
        };
        let a = call(r#"{"b": {"y": 1, "x": [2, {"d": 0, "c": 1}]}, "a": "s"}"#);
        let b = call("{\"a\":\"s\",\n \"b\":{\"x\":[2,{\"c\":1,\"d\":0}],\"y\":1}}");
        assert_eq!(a.normalized_arguments(), b.normalized_arguments());
        assert_eq!(
            a.normalized_arguments(),
            r#"{"a":"s","b":{"x":[2,{"c":1,"d":0}],"y":1}}"#
        );
        assert_ne!(
            a.normalized_arguments(),
            call(r#"{"a": "t", "b": {}}"#).normalized_arguments()
        );
        assert_eq!(call("not json").normalized_arguments(), "not json");
    }

    #[test]
    fn empty_tools_render_as_none() {
        assert_eq!(Conversation::default().template_tools(), None);
    }
}
