//! The XML tool-call body of Qwen3-Coder and Qwen3.5, parsed strictly and typed by the tool's
//! JSON schema.
//!
//! The templates render a call as
//! `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>`
//! (string values raw, objects and arrays as JSON, other scalars through Jinja's `string`, so a
//! boolean is `True`). vLLM's and SGLang's `qwen3_coder` parsers accept much more than that: a
//! `<parameter=` without `</parameter>`, a missing `</function>`, a function or parameter the
//! request never declared (kept as a string, with a log line), a value that does not fit its type
//! (kept as a string). Each of those reaches the harness as a call it did not ask for or cannot
//! run, and peers lost whole runs to calls nobody counted. Here the body must be exactly that
//! shape — only whitespace between tags — and when the request declared tools:
//! - the function is one of them,
//! - every parameter is in its schema's `properties` (unless `additionalProperties` allows more),
//!   appears once, and every `required` one is present,
//! - a value typed `integer`, `number`, `boolean`, `object`, `array` or `null` parses as that
//!   type (JSON; `True`/`False` too, as the template writes them; `null`/`None` for a nullable
//!   or non-string parameter).
//!
//! Anything else is a [`Reject`]: the caller returns the call to the client as text and counts it
//! (`malformed_tool_calls`). Without declared tools names are not checked and values stay strings.
//! What is not rejected: a missing `</tool_call>` at the very end of the output once
//! `</function>` closed (the model stopped on a stop string or the length limit right there), and
//! text after a complete call (kept as content, never dropped — vLLM drops it).

use serde_json::{Map, Value};

use super::message::ToolSpec;
use super::tool_schema::{split_type, ArgSchema};

/// Why an XML tool call was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("text before `<function=`")]
    NoFunction,
    #[error("an unterminated `<{0}=` tag")]
    UnterminatedTag(&'static str),
    #[error("an empty or malformed name in `<{0}=…>`")]
    BadName(&'static str),
    #[error("function `{0}` is not among the request's tools")]
    UnknownFunction(String),
    #[error("parameter `{0}` is not in the tool's schema")]
    UnknownParameter(String),
    #[error("parameter `{0}` appears twice")]
    DuplicateParameter(String),
    #[error("required parameter `{0}` is missing")]
    MissingParameter(String),
    #[error("parameter `{name}` is not a valid {ty}")]
    BadValue { name: String, ty: String },
    #[error("`<parameter=` without `</parameter>`")]
    UnterminatedParameter,
    #[error("no `</function>`")]
    UnterminatedFunction,
    #[error("text between or after the tags")]
    StrayText,
    #[error("the arguments are not a JSON object")]
    NotAnObject,
}

/// `<function=NAME><parameter=P>V</parameter>…</function>` → (name, compact JSON arguments in
/// the model's parameter order).
pub fn parse(body: &str, tools: &[ToolSpec]) -> Result<(String, String), Reject> {
    let mut rest = body
        .trim_start()
        .strip_prefix("<function=")
        .ok_or(Reject::NoFunction)?;
    let (name, r) = tag_name(rest, "function")?;
    rest = r;
    let schema = ArgSchema::of(&name, tools)?;
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("</function>") {
            if !after.trim().is_empty() {
                return Err(Reject::StrayText);
            }
            break;
        }
        if rest.is_empty() {
            return Err(Reject::UnterminatedFunction);
        }
        let r = rest.strip_prefix("<parameter=").ok_or(Reject::StrayText)?;
        let (pname, r) = tag_name(r, "parameter")?;
        let close = r.find("</parameter>").ok_or(Reject::UnterminatedParameter)?;
        // The template writes one newline on each side of the value.
        let raw = r[..close].strip_prefix('\n').unwrap_or(&r[..close]);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        rest = &r[close + "</parameter>".len()..];
        let ty = schema.param_type(&pname)?;
        if args.contains_key(&pname) {
            return Err(Reject::DuplicateParameter(pname));
        }
        let value = typed_value(raw, ty).ok_or_else(|| Reject::BadValue {
            ty: ty.map(Value::to_string).unwrap_or_default(),
            name: pname.clone(),
        })?;
        args.insert(pname, value);
    }
    schema.check_required(&args)?;
    Ok((name, Value::Object(args).to_string()))
}

/// The name of `<KIND=NAME>` (after the `=`) and the text after `>`. A name is one line of
/// non-blank text without `<`.
fn tag_name<'a>(s: &'a str, kind: &'static str) -> Result<(String, &'a str), Reject> {
    let end = s.find('>').ok_or(Reject::UnterminatedTag(kind))?;
    let name = s[..end].trim();
    if name.is_empty() || name.contains(['<', '\n', ' ', '\t']) {
        return Err(Reject::BadName(kind));
    }
    Ok((name.to_string(), &s[end + 1..]))
}

/// `raw` as the schema's type; `None` when it is not one. Untyped and string parameters keep the
/// text as it is.
fn typed_value(raw: &str, ty: Option<&Value>) -> Option<Value> {
    let (ty, nullable) = split_type(ty);
    let text = raw.trim();
    if matches!(text, "null" | "None") && (nullable || !matches!(ty, None | Some("string"))) {
        return Some(Value::Null);
    }
    let json = || serde_json::from_str::<Value>(text).ok();
    match ty {
        None | Some("string") => Some(Value::String(raw.to_string())),
        Some("integer") => json().filter(|v| v.is_i64() || v.is_u64()),
        Some("number") => json().filter(Value::is_number),
        Some("boolean") => match text {
            "true" | "True" => Some(Value::Bool(true)),
            "false" | "False" => Some(Value::Bool(false)),
            _ => None,
        },
        Some("object") => json().filter(Value::is_object),
        Some("array") => json().filter(Value::is_array),
        Some("null") => None,
        // A type JSON Schema does not have: keep the text.
        Some(_) => Some(Value::String(raw.to_string())),
    }
}
