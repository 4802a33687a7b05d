//! Small JSON helpers for the hot path: decoding a raw JSON string literal into a reused buffer
//! (no allocation per record), and the lenient list fields of SWE-bench records.

use serde_json::value::RawValue;

/// Decodes the JSON string literal `raw` (with its quotes) into `out` (cleared first).
/// Errors when `raw` is not a string literal. Lone surrogates become U+FFFD.
pub fn unescape_into(raw: &str, out: &mut String) -> Result<(), String> {
    out.clear();
    let inner = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .ok_or_else(|| format!("expected a string, found {}", kind_of(raw)))?;
    let mut rest = inner;
    while let Some(i) = memchr::memchr(b'\\', rest.as_bytes()) {
        out.push_str(&rest[..i]);
        let esc = rest.as_bytes().get(i + 1).copied().ok_or("dangling escape")?;
        rest = &rest[i + 2..];
        match esc {
            b'n' => out.push('\n'),
            b't' => out.push('\t'),
            b'r' => out.push('\r'),
            b'"' => out.push('"'),
            b'\\' => out.push('\\'),
            b'/' => out.push('/'),
            b'b' => out.push('\u{8}'),
            b'f' => out.push('\u{c}'),
            b'u' => {
                let hi = hex4(rest)?;
                rest = &rest[4..];
                let c = if (0xD800..0xDC00).contains(&hi) && rest.starts_with("\\u") {
                    let lo = hex4(&rest[2..])?;
                    if (0xDC00..0xE000).contains(&lo) {
                        rest = &rest[6..];
                        char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
                    } else {
                        None
                    }
                } else {
                    char::from_u32(hi)
                };
                out.push(c.unwrap_or('\u{FFFD}'));
            }
            other => return Err(format!("invalid escape `\\{}`", other as char)),
        }
    }
    out.push_str(rest);
    Ok(())
}

/// The number of chars [`unescape_into`] would produce from `raw`, without writing them (the
/// rules stage needs only the problem statement's length); the same errors on the same input.
pub fn unescaped_char_count(raw: &str) -> Result<usize, String> {
    let inner = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .ok_or_else(|| format!("expected a string, found {}", kind_of(raw)))?;
    let mut n = 0;
    let mut rest = inner;
    while let Some(i) = memchr::memchr(b'\\', rest.as_bytes()) {
        n += rest[..i].chars().count();
        let esc = rest.as_bytes().get(i + 1).copied().ok_or("dangling escape")?;
        rest = &rest[i + 2..];
        match esc {
            b'n' | b't' | b'r' | b'"' | b'\\' | b'/' | b'b' | b'f' => n += 1,
            b'u' => {
                let hi = hex4(rest)?;
                rest = &rest[4..];
                // A surrogate pair is one char; anything else one char too (U+FFFD when lone),
                // and a second escape that does not complete the pair is read on its own.
                if (0xD800..0xDC00).contains(&hi) && rest.starts_with("\\u") {
                    let lo = hex4(&rest[2..])?;
                    if (0xDC00..0xE000).contains(&lo) {
                        rest = &rest[6..];
                    }
                }
                n += 1;
            }
            other => return Err(format!("invalid escape `\\{}`", other as char)),
        }
    }
    Ok(n + rest.chars().count())
}

fn hex4(s: &str) -> Result<u32, String> {
    s.get(..4)
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| "invalid \\u escape".to_string())
}

/// A word for the JSON type of a raw value, for error messages.
pub fn kind_of(raw: &str) -> &'static str {
    match raw.trim_start().as_bytes().first() {
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        Some(b't') | Some(b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// Parses a list of strings given either as a JSON array or as a JSON-encoded string holding
/// one (`"[\"tests/a.py::t\"]"`, the HuggingFace form of `FAIL_TO_PASS`). An empty string is an
/// empty list.
pub fn string_list(raw: &RawValue) -> Result<Vec<String>, String> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'[') => serde_json::from_str::<Vec<String>>(text)
            .map_err(|e| format!("expected an array of strings: {e}")),
        Some(b'"') => {
            let inner: String = serde_json::from_str(text).map_err(|e| e.to_string())?;
            if inner.trim().is_empty() {
                return Ok(Vec::new());
            }
            serde_json::from_str::<Vec<String>>(&inner)
                .map_err(|e| format!("string does not hold a JSON array of strings: {e}"))
        }
        _ => Err(format!("expected an array of strings, found {}", kind_of(text))),
    }
}

/// A scalar as text: strings as is, numbers in their JSON spelling (so a `version` written as
/// the number `0.2` becomes `"0.2"`; it cannot recover a lost trailing zero, which is why
/// `version` should be a string in the input).
pub fn scalar_text(raw: &RawValue) -> Result<String, String> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(text).map_err(|e| e.to_string()),
        Some(b'-') | Some(b'0'..=b'9') => Ok(text.to_string()),
        _ => Err(format!("expected a string, found {}", kind_of(text))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_matches_serde_json() {
        let mut buf = String::new();
        for s in [
            "plain",
            "a\nb\tc\"d\\e/",
            "unicode é 😀 \u{1}",
            "diff --git a/x b/x\n+\\n literal\n",
        ] {
            let raw = serde_json::to_string(s).unwrap();
            unescape_into(&raw, &mut buf).unwrap();
            assert_eq!(buf, s);
        }
        unescape_into(r#""\ud83d\ude00\u00e9""#, &mut buf).unwrap();
        assert_eq!(buf, "😀é");
        unescape_into(r#""\ud83d x""#, &mut buf).unwrap();
        assert_eq!(buf, "\u{FFFD} x");
        assert_eq!(
            unescape_into("12", &mut buf).unwrap_err(),
            "expected a string, found a number"
        );
    }

    #[test]
    fn char_count_equals_unescape_then_count() {
        let mut buf = String::new();
        for raw in [
            r#""plain""#,
            r#""a\nb\tc\"d\\e\/ é 😀""#,
            r#""\ud83d\ude00\u00e9""#,
            r#""\ud83d x""#,
            r#""\ud83d\u0041""#,
            r#""\udc00\ud800""#,
            r#""""#,
            r#""ends with escape\n""#,
        ] {
            unescape_into(raw, &mut buf).unwrap();
            assert_eq!(unescaped_char_count(raw).unwrap(), buf.chars().count(), "{raw}");
        }
        for bad in [
            r#""dangling\""#,
            r#""bad \x""#,
            r#""\u12""#,
            "12",
            r#""\ud800\u12""#,
        ] {
            assert_eq!(
                unescaped_char_count(bad).unwrap_err(),
                unescape_into(bad, &mut buf).unwrap_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn string_lists_accept_arrays_and_encoded_strings() {
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        assert_eq!(string_list(&raw(r#"["a","b"]"#)).unwrap(), vec!["a", "b"]);
        assert_eq!(string_list(&raw(r#""[\"a\", \"b\"]""#)).unwrap(), vec!["a", "b"]);
        assert_eq!(string_list(&raw(r#""""#)).unwrap(), Vec::<String>::new());
        assert!(string_list(&raw(r#""not json""#)).is_err());
        assert!(string_list(&raw("3")).is_err());
        assert!(string_list(&raw("[1]")).is_err());
    }

    #[test]
    fn version_stays_text() {
        let raw = |s: &str| RawValue::from_string(s.to_string()).unwrap();
        assert_eq!(scalar_text(&raw(r#""0.20""#)).unwrap(), "0.20");
        assert_eq!(scalar_text(&raw("4.2")).unwrap(), "4.2");
        assert!(scalar_text(&raw("[]")).is_err());
    }
}
