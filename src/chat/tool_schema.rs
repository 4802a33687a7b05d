//! A parsed tool call held to the request's declared tools: the function is one of them, every
//! argument is in its schema's `properties` (unless `additionalProperties` allows more) and every
//! `required` one is present. Shared by both tool-call syntaxes: the XML calls of Qwen3-Coder and
//! Qwen3.5 ([`super::xml_call`], whose values arrive as text and are typed here) and the JSON calls
//! of Qwen3 / Hermes ([`check_json_call`], whose values are already typed and must match).
//! Without declared tools nothing is checked: a client that sent no tools gets what the model wrote.

use serde_json::{Map, Value};

use super::message::ToolSpec;
use super::xml_call::Reject;

/// The schema a call's arguments are held to; `None` inside when the request declared no tools.
#[derive(Debug, Clone, Copy)]
pub(super) struct ArgSchema<'a> {
    schema: Option<&'a Value>,
    properties: Option<&'a Map<String, Value>>,
    /// Parameters outside `properties` are allowed.
    open: bool,
}

impl<'a> ArgSchema<'a> {
    /// The schema of function `name`; [`Reject::UnknownFunction`] when tools were declared and it
    /// is not one of them.
    pub(super) fn of(name: &str, tools: &'a [ToolSpec]) -> Result<Self, Reject> {
        let schema = match tools.iter().find(|t| t.name == name) {
            Some(t) => Some(&t.parameters),
            None if tools.is_empty() => None,
            None => return Err(Reject::UnknownFunction(name.to_string())),
        };
        let properties = schema
            .and_then(|s| s.get("properties"))
            .and_then(Value::as_object);
        let open = schema.is_none_or(|s| {
            properties.is_none()
                || s.get("additionalProperties")
                    .is_some_and(|a| a != &Value::Bool(false))
        });
        Ok(ArgSchema {
            schema,
            properties,
            open,
        })
    }

    /// Whether any tools were declared (values are typed and checked only then).
    pub(super) fn declared(&self) -> bool {
        self.schema.is_some()
    }

    /// The JSON-schema `type` of parameter `name`; [`Reject::UnknownParameter`] when the schema
    /// is closed and has no such property.
    pub(super) fn param_type(&self, name: &str) -> Result<Option<&'a Value>, Reject> {
        let prop = self.properties.and_then(|p| p.get(name));
        if prop.is_none() && !self.open {
            return Err(Reject::UnknownParameter(name.to_string()));
        }
        Ok(prop.and_then(|p| p.get("type")))
    }

    /// [`Reject::MissingParameter`] for the first `required` parameter `args` lacks.
    pub(super) fn check_required(&self, args: &Map<String, Value>) -> Result<(), Reject> {
        let required = self
            .schema
            .and_then(|s| s.get("required"))
            .and_then(Value::as_array);
        match required
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .find(|r| !args.contains_key(*r))
        {
            Some(missing) => Err(Reject::MissingParameter(missing.to_string())),
            None => Ok(()),
        }
    }
}

/// The named type of a JSON-schema `type` (a name or a list of names) and whether it admits null.
pub(super) fn split_type(ty: Option<&Value>) -> (Option<&str>, bool) {
    match ty {
        Some(Value::String(t)) => (Some(t.as_str()), t == "null"),
        Some(Value::Array(ts)) => (
            ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
            ts.iter().any(|t| t == "null"),
        ),
        _ => (None, false),
    }
}

/// A JSON call's `arguments` (compact or as the model wrote them) held to the declared tools:
/// they must be an object whose values have their schema's types.
pub fn check_json_call(name: &str, arguments: &str, tools: &[ToolSpec]) -> Result<(), Reject> {
    let schema = ArgSchema::of(name, tools)?;
    if !schema.declared() {
        return Ok(());
    }
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else {
        return Err(Reject::NotAnObject);
    };
    for (k, v) in &args {
        let ty = schema.param_type(k)?;
        if !json_value_fits(v, ty) {
            return Err(Reject::BadValue {
                name: k.clone(),
                ty: ty.map(Value::to_string).unwrap_or_default(),
            });
        }
    }
    schema.check_required(&args)
}

/// Whether `v` is of the schema type `ty` (untyped and unknown types admit anything).
fn json_value_fits(v: &Value, ty: Option<&Value>) -> bool {
    let (named, nullable) = split_type(ty);
    if v.is_null() {
        return nullable || named.is_none();
    }
    match named {
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("null") => false,
        _ => true,
    }
}
