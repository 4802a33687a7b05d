//! OpenAI chat-completions request wire types and their mapping to [`Conversation`].
//!
//! The types mirror the JSON clients really send (see `testdata/harness-traffic/`): content as a
//! string, `null` or a list of parts; `tool_calls` with string arguments; the `tool` role; the
//! non-standard `reasoning_content` that vLLM-style servers return and many clients echo back.
//! Every field is `#[serde(default)]` and unknown fields are ignored, so a harness that adds fields
//! is still served.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::message::{join_text, Conversation, Message, Role, ToolCall, ToolChoice, ToolSpec};
use super::ChatError;

/// `POST /v1/chat/completions` body (the fields lego-rl reads).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ChatCompletionRequest {
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub tools: Vec<ChatTool>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<Value>,
    #[serde(default, alias = "max_completion_tokens")]
    pub max_tokens: Option<u32>,
    // The sampling fields are typed here so that a value of the wrong type is a 400; what a
    // request samples with is decided from the raw body by `proxy::harness_sampling::enforce`.
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub stop: Option<StringOrList>,
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// vLLM/SGLang extension: extra template variables (`enable_thinking`).
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// A string or a list of strings (`stop`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum StringOrList {
    One(String),
    Many(Vec<String>),
}

impl StringOrList {
    /// As a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StringOrList::One(s) => vec![s],
            StringOrList::Many(v) => v,
        }
    }
}

/// One entry of `messages`.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ChatMessage {
    #[serde(default)]
    pub role: String,
    #[serde(default)]
    pub content: Option<ChatContent>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// Some clients use `reasoning` for the same thing.
    #[serde(default)]
    pub reasoning: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ChatToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// `content`: a string or a list of typed parts.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum ChatContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part; only `text` parts carry text a text model can read.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ContentPart {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl ChatContent {
    /// The text, with text parts joined by `\n`; non-text parts (images) are skipped.
    pub fn to_text(&self) -> String {
        match self {
            ChatContent::Text(s) => s.clone(),
            ChatContent::Parts(parts) => join_text(parts.iter().filter_map(|p| p.text.as_deref())),
        }
    }
}

/// An assistant tool call as sent back by the client.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ChatToolCall {
    #[serde(default)]
    pub id: String,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub function: ChatFunctionCall,
}

/// `function` of a tool call; `arguments` is normally a JSON string, an object is tolerated.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ChatFunctionCall {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

/// One entry of `tools`.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ChatTool {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub function: ChatFunctionSpec,
}

/// A function tool's declaration.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ChatFunctionSpec {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Value,
}

impl ChatCompletionRequest {
    /// Parse a request body.
    pub fn from_json(body: &str) -> Result<Self, ChatError> {
        serde_json::from_str(body).map_err(|source| ChatError::ParseRequest {
            api: "openai",
            source,
        })
    }

    /// The conversation this request describes.
    pub fn to_conversation(&self) -> Result<Conversation, ChatError> {
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| convert_message(i, m))
            .collect::<Result<Vec<_>, _>>()?;
        let tools = self
            .tools
            .iter()
            .map(|t| ToolSpec {
                name: t.function.name.clone(),
                description: t.function.description.clone(),
                parameters: t.function.parameters.clone(),
            })
            .collect();
        let thinking = self
            .chat_template_kwargs
            .as_ref()
            .and_then(|k| k.get("enable_thinking"))
            .and_then(Value::as_bool);
        Ok(Conversation {
            messages,
            tools,
            tool_choice: tool_choice(self.tool_choice.as_ref()),
            thinking,
        })
    }
}

fn convert_message(index: usize, m: &ChatMessage) -> Result<Message, ChatError> {
    let role = match m.role.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" | "function" => Role::Tool,
        other => {
            return Err(ChatError::UnknownRole {
                index,
                role: other.to_string(),
            })
        }
    };
    let content = m.content.as_ref().map(ChatContent::to_text).unwrap_or_default();
    let tool_calls = m
        .tool_calls
        .iter()
        .flatten()
        .map(|c| ToolCall {
            id: c.id.clone(),
            name: c.function.name.clone(),
            arguments: match &c.function.arguments {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            },
        })
        .collect();
    Ok(Message {
        role,
        content,
        reasoning: m.reasoning_content.clone().or_else(|| m.reasoning.clone()),
        tool_calls,
        tool_call_id: m.tool_call_id.clone(),
        is_error: false,
        name: m.name.clone(),
    })
}

fn tool_choice(v: Option<&Value>) -> ToolChoice {
    match v {
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => ToolChoice::Auto,
        },
        Some(Value::Object(o)) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Function(n.to_string()))
            .unwrap_or_default(),
        _ => ToolChoice::Auto,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_parts_tool_calls_and_tool_role() {
        let body = r#"{"model":"m","max_completion_tokens":7,"messages":[
            {"role":"developer","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{}},{"type":"text","text":"b"}]},
            {"role":"user","content":"hi"},
            {"role":"assistant","content":null,"reasoning_content":"think","tool_calls":[
                {"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"ls\"}"}},
                {"id":"call_2","type":"function","function":{"name":"read","arguments":{"path":"x"}}}]},
            {"role":"tool","tool_call_id":"call_1","name":"bash","content":"out"}],
            "tools":[{"type":"function","function":{"name":"bash","description":"run","parameters":{"type":"object"}}}],
            "tool_choice":{"type":"function","function":{"name":"bash"}},
            "chat_template_kwargs":{"enable_thinking":false}}"#;
        let req = ChatCompletionRequest::from_json(body).unwrap();
        assert_eq!(req.max_tokens, Some(7));
        let c = req.to_conversation().unwrap();
        assert_eq!(c.messages[0].role, Role::System);
        assert_eq!(c.messages[0].content, "a\nb");
        let a = &c.messages[2];
        assert_eq!(a.content, "");
        assert_eq!(a.reasoning.as_deref(), Some("think"));
        assert_eq!(a.tool_calls[0].arguments, r#"{"cmd": "ls"}"#);
        assert_eq!(a.tool_calls[1].arguments, r#"{"path":"x"}"#);
        assert_eq!(c.messages[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(c.tools[0].description.as_deref(), Some("run"));
        assert_eq!(c.tool_choice, ToolChoice::Function("bash".into()));
        assert_eq!(c.thinking, Some(false));
    }

    #[test]
    fn unknown_role_names_the_message() {
        let req =
            ChatCompletionRequest::from_json(r#"{"messages":[{"role":"user"},{"role":"robot"}]}"#).unwrap();
        let err = req.to_conversation().unwrap_err().to_string();
        assert!(err.contains("messages[1]") && err.contains("robot"), "{err}");
    }
}
