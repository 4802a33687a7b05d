//! Python's `json.dumps` and `str()` for JSON values, byte for byte.
//!
//! Chat templates print tool schemas and arguments with `tojson` and `| string`; transformers runs
//! them in Python, so a tool schema renders as `{"type": "object", "properties": {...}}` (", " and
//! ": " separators, non-ASCII kept, key order kept) and `True|string` as `True`. minijinja's own
//! filters print compact JSON with HTML escaping and `true`, which would change the prompt tokens.

use serde_json::Value;
use std::fmt::Write;

/// Options of Python's `json.dumps` that HF's `tojson` filter exposes.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    pub indent: Option<usize>,
    /// `(item_separator, key_separator)`; Python's default is `(", ", ": ")`, or `(",", ": ")` with
    /// an indent.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// `json.dumps(value, **opts)`.
pub fn dumps(value: &Value, opts: &DumpOptions) -> String {
    let (item, key) = match &opts.separators {
        Some((i, k)) => (i.as_str(), k.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut out = String::new();
    write_value(&mut out, value, opts, item, key, 0);
    out
}

fn newline(out: &mut String, opts: &DumpOptions, level: usize) {
    if let Some(n) = opts.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * level));
    }
}

fn write_value(out: &mut String, v: &Value, opts: &DumpOptions, item: &str, key: &str, level: usize) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&json_number(n)),
        Value::String(s) => write_json_string(out, s, opts.ensure_ascii),
        Value::Array(a) if a.is_empty() => out.push_str("[]"),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                newline(out, opts, level + 1);
                write_value(out, x, opts, item, key, level + 1);
            }
            newline(out, opts, level);
            out.push(']');
        }
        Value::Object(o) if o.is_empty() => out.push_str("{}"),
        Value::Object(o) => {
            let mut entries: Vec<_> = o.iter().collect();
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item);
                }
                newline(out, opts, level + 1);
                write_json_string(out, k, opts.ensure_ascii);
                out.push_str(key);
                write_value(out, x, opts, item, key, level + 1);
            }
            newline(out, opts, level);
            out.push('}');
        }
    }
}

fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn json_number(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() => {
            if f.is_nan() {
                "NaN".into()
            } else if f.is_infinite() {
                if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
            } else {
                float_repr(f)
            }
        }
        _ => n.to_string(),
    }
}

/// Python's `repr(float)`: shortest round-trip digits, fixed notation for exponents in
/// `-4..16`, else `1.5e+16` / `1e-05`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let e = exp as usize;
            let (int, frac) = if digits.len() > e + 1 {
                (digits[..e + 1].to_string(), digits[e + 1..].to_string())
            } else {
                (
                    format!("{digits}{}", "0".repeat(e + 1 - digits.len())),
                    "0".to_string(),
                )
            };
            format!("{sign}{int}.{frac}")
        } else {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{esign}{:02}", exp.abs())
    }
}

/// Python's `str(value)` for a JSON value (`True`, `None`, `{'a': 1}`, `1.0`).
pub fn py_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => py_repr(other),
    }
}

fn py_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => float_repr(f),
            _ => n.to_string(),
        },
        Value::String(s) => py_str_repr(s),
        Value::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, x)| format!("{}: {}", py_str_repr(k), py_repr(x)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::new();
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Expected strings are Python 3 outputs of json.dumps(..., ensure_ascii=False) / repr / str.
    #[test]
    fn dumps_like_python() {
        let v: Value =
            serde_json::from_str(r#"{"b": [1, 2.5, true, null], "a": "é\n\"<>&\u0001", "c": {}, "d": []}"#)
                .unwrap();
        assert_eq!(
            dumps(&v, &DumpOptions::default()),
            r#"{"b": [1, 2.5, true, null], "a": "é\n\"<>&\u0001", "c": {}, "d": []}"#
        );
        let opts = DumpOptions {
            ensure_ascii: true,
            ..Default::default()
        };
        assert_eq!(dumps(&json!("é😀"), &opts), r#""\u00e9\ud83d\ude00""#);
        let opts = DumpOptions {
            indent: Some(2),
            sort_keys: true,
            ..Default::default()
        };
        assert_eq!(
            dumps(&json!({"b": [1], "a": 2}), &opts),
            "{\n  \"a\": 2,\n  \"b\": [\n    1\n  ]\n}"
        );
    }

    #[test]
    fn floats_like_python_repr() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (-2.5e-7, "-2.5e-07"),
            (100.0, "100.0"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn str_like_python() {
        assert_eq!(py_str(&json!(true)), "True");
        assert_eq!(py_str(&json!(null)), "None");
        assert_eq!(py_str(&json!("x")), "x");
        assert_eq!(py_str(&json!(["string", "null"])), "['string', 'null']");
        assert_eq!(py_str(&json!({"it's": 1.0})), "{\"it's\": 1.0}");
    }
}
