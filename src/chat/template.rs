//! Hugging Face chat templates rendered exactly as transformers renders them.
//!
//! transformers' `apply_chat_template(..., tokenize=False)` runs the model's Jinja template in an
//! `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with `raise_exception`,
//! `strftime_now` and its own `tojson` (`json.dumps(x, ensure_ascii=False, indent, separators,
//! sort_keys)`), passing `messages`, `tools` (or `None`), `documents=None`,
//! `add_generation_prompt`, the tokenizer's special tokens (`eos_token`, …) and extra kwargs such
//! as `enable_thinking`. [`ChatTemplate`] reproduces that with minijinja + pycompat, replacing
//! minijinja's `tojson` and `string` filters by Python-exact ones ([`super::pyjson`]).
//! `testdata/chat/expected.jsonl` (written by `scripts/chat_reference.py` with transformers) pins
//! the output byte for byte.

use std::path::Path;

use minijinja::value::{Kwargs, Value as JValue};
use minijinja::{AutoEscape, Environment, Error as JError, ErrorKind};
use serde_json::{Map, Value};

use super::message::Conversation;
use super::pyjson::{dumps, py_str, DumpOptions};
use super::ChatError;

const TEMPLATE_NAME: &str = "chat";

/// What to render besides the messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// Append the header of a new assistant turn (`<|im_start|>assistant\n`).
    pub add_generation_prompt: bool,
    /// Passed as `enable_thinking` when set; left undefined otherwise (the template's default).
    pub enable_thinking: Option<bool>,
    /// Further template variables (`chat_template_kwargs`).
    pub extra: Map<String, Value>,
}

impl RenderOptions {
    /// Options for a generation prompt.
    pub fn generation(enable_thinking: Option<bool>) -> Self {
        RenderOptions {
            add_generation_prompt: true,
            enable_thinking,
            extra: Map::new(),
        }
    }
}

/// A compiled chat template plus the special-token variables transformers passes to it.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    special_tokens: Map<String, Value>,
}

impl ChatTemplate {
    /// Compile a template source.
    pub fn new(source: impl Into<String>) -> Result<Self, ChatError> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_filter("string", string);
        env.add_test("iterable", is_iterable);
        env.add_test("sequence", is_sequence);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| ChatError::CompileTemplate {
                message: format!("{e:#}"),
            })?;
        Ok(ChatTemplate {
            env,
            source,
            special_tokens: Map::new(),
        })
    }

    /// The template of a Hugging Face model folder: `chat_template.jinja` if present (as
    /// transformers prefers it), else `chat_template` of `tokenizer_config.json` (a string, or a
    /// list of `{name, template}` of which `default` is used). Special tokens come from the config.
    pub fn from_model_dir(dir: &Path) -> Result<Self, ChatError> {
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?;
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.exists() {
            std::fs::read_to_string(&jinja).map_err(|source| ChatError::Read {
                path: jinja.clone(),
                source,
            })?
        } else {
            template_from_config(&config).ok_or_else(|| ChatError::NoTemplate {
                path: config_path.clone(),
            })?
        };
        Ok(ChatTemplate::new(source)?.with_special_tokens(&config))
    }

    /// Take `bos_token`, `eos_token`, `unk_token`, `pad_token` from a `tokenizer_config.json` value
    /// (strings or `{content: …}` objects), as transformers passes its special tokens map.
    pub fn with_special_tokens(mut self, config: &Value) -> Self {
        for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
            let token = match config.get(key) {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).map(str::to_string),
                _ => None,
            };
            if let Some(t) = token {
                self.special_tokens.insert(key.into(), Value::String(t));
            }
        }
        self
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// A special token's text (`eos_token` → `<|im_end|>`), if the config named it.
    pub fn special_token(&self, key: &str) -> Option<&str> {
        self.special_tokens.get(key).and_then(Value::as_str)
    }

    /// Render a conversation (see [`Conversation::template_messages`] for the data passed).
    pub fn render(&self, conv: &Conversation, opts: &RenderOptions) -> Result<String, ChatError> {
        let tools = conv.template_tools();
        self.render_raw(&conv.template_messages(), tools.as_deref(), opts)
    }

    /// Render transformers-shaped `messages` and `tools` directly.
    pub fn render_raw(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        opts: &RenderOptions,
    ) -> Result<String, ChatError> {
        let mut ctx = self.special_tokens.clone();
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        if let Some(t) = opts.enable_thinking {
            ctx.insert("enable_thinking".into(), Value::Bool(t));
        }
        ctx.insert("messages".into(), Value::Array(messages.to_vec()));
        ctx.insert(
            "tools".into(),
            tools.map_or(Value::Null, |t| Value::Array(t.to_vec())),
        );
        ctx.insert("documents".into(), Value::Null);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::Bool(opts.add_generation_prompt),
        );
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::RenderTemplate {
                message: format!("{e:#}"),
            })?;
        template
            .render(JValue::from_serialize(&ctx))
            .map_err(|e| ChatError::RenderTemplate {
                message: render_error_message(&e),
            })
    }
}

fn render_error_message(e: &JError) -> String {
    // raise_exception messages are the template author's words: show them plainly.
    match e.kind() {
        ErrorKind::InvalidOperation => e.detail().map(str::to_string).unwrap_or_else(|| format!("{e:#}")),
        _ => format!("{e:#}"),
    }
}

pub(crate) fn read_json(path: &Path) -> Result<Value, ChatError> {
    let text = std::fs::read_to_string(path).map_err(|source| ChatError::Read {
        path: path.into(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ChatError::ParseJson {
        path: path.into(),
        source,
    })
}

fn template_from_config(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

fn to_json(v: &JValue) -> Result<Value, JError> {
    serde_json::to_value(v).map_err(|e| JError::new(ErrorKind::InvalidOperation, format!("not JSON: {e}")))
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
fn tojson(value: JValue, indent: Option<JValue>, kwargs: Kwargs) -> Result<JValue, JError> {
    let mut opts = DumpOptions::default();
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<JValue>>("indent")?,
    };
    opts.indent = match indent {
        Some(i) if i.is_none() => None,
        Some(i) => Some(usize::try_from(i)?),
        None => None,
    };
    opts.ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    opts.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        if let [item, key] = seps.as_slice() {
            opts.separators = Some((item.clone(), key.clone()));
        } else {
            return Err(JError::new(
                ErrorKind::InvalidOperation,
                "separators must be a pair",
            ));
        }
    }
    kwargs.assert_all_used()?;
    Ok(JValue::from_safe_string(dumps(&to_json(&value)?, &opts)))
}

/// Python's `str()`, which Jinja2's `string` filter applies (`True`, `None`, `{'a': 1}`).
fn string(value: JValue) -> Result<JValue, JError> {
    if let Some(s) = value.as_str() {
        return Ok(JValue::from(s));
    }
    if value.is_undefined() {
        return Ok(JValue::from(""));
    }
    Ok(JValue::from(py_str(&to_json(&value)?)))
}

/// Python's `iter(x)` succeeds: strings, lists, dicts (and Jinja2's `Undefined`), not `None`.
/// minijinja iterates `none` as empty, which made Qwen3-Coder's `tools is iterable and tools |
/// length > 0` fail on `tools=None`.
fn is_iterable(value: JValue) -> bool {
    use minijinja::value::ValueKind as K;
    matches!(
        value.kind(),
        K::String | K::Seq | K::Map | K::Iterable | K::Undefined
    )
}

/// Jinja2's `sequence` test (`len()` and `__getitem__`): true for strings and dicts too.
fn is_sequence(value: JValue) -> bool {
    use minijinja::value::ValueKind as K;
    matches!(value.kind(), K::String | K::Seq | K::Map | K::Undefined)
}

fn raise_exception(message: String) -> Result<JValue, JError> {
    Err(JError::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> Result<JValue, JError> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        JError::new(
            ErrorKind::InvalidOperation,
            format!("bad strftime format {format:?}"),
        )
    })?;
    Ok(JValue::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::message::{Message, Role};
    use serde_json::json;

    fn qwen3() -> ChatTemplate {
        ChatTemplate::from_model_dir(&crate::chat::testdata("tokenizer/qwen3")).unwrap()
    }

    #[test]
    fn qwen3_generation_prompt_matches_documented_strings() {
        // From shared/models/README.md (checked there with transformers).
        let conv = Conversation {
            messages: vec![Message::text(Role::User, "hi")],
            ..Default::default()
        };
        let t = qwen3();
        assert_eq!(
            t.render(&conv, &RenderOptions::generation(Some(false))).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        assert_eq!(
            t.render(&conv, &RenderOptions::generation(Some(true))).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(t.special_token("eos_token"), Some("<|im_end|>"));
    }

    #[test]
    fn filters_behave_like_python() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=1) }}|{{ b | string }}|{{ n | string }}|{{ f | string }}|{{ raise_exception('boom') if fail }}",
        )
        .unwrap();
        let opts = RenderOptions {
            extra: json!({"x": {"k": "<é>", "l": [1, 2.0]}, "b": true, "n": null, "f": 1.5, "fail": false})
                .as_object()
                .unwrap()
                .clone(),
            ..Default::default()
        };
        assert_eq!(
            t.render_raw(&[], None, &opts).unwrap(),
            "{\"k\": \"<é>\", \"l\": [1, 2.0]}|{\n \"k\": \"<é>\",\n \"l\": [\n  1,\n  2.0\n ]\n}|True|None|1.5|"
        );
        let mut opts = opts;
        opts.extra.insert("fail".into(), json!(true));
        let err = t.render_raw(&[], None, &opts).unwrap_err().to_string();
        assert!(err.contains("boom"), "{err}");
    }
}
