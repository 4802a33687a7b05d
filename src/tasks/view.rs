//! The hot path: one JSONL line viewed as its top-level (key, raw value) pairs — nothing is
//! decoded until a stage needs it — turned into [`Facts`], and for kept records rendered
//! straight into a `Task` JSON line by copying the raw values (no `serde_json::Value` tree).
//! Field types are checked one by one so an error names the field.

use std::cell::RefCell;
use std::fmt;
use std::io::Write as _;
use std::path::Path;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::facts::{normalize_repo, Facts};
use super::json::{kind_of, unescape_into, unescaped_char_count};
use super::patch;
use super::TaskError;
use crate::records::{Task, TaskSource, Timeouts};

/// A key, borrowed from the line unless it contained escapes.
enum Key<'a> {
    Borrowed(&'a str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Owned(s) => s,
        }
    }
}

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v.to_string()))
            }
        }
        d.deserialize_str(V)
    }
}

/// The top-level fields of a JSON object line, in order.
pub struct Fields<'a> {
    pairs: Vec<(Key<'a>, &'a RawValue)>,
}

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut pairs = Vec::with_capacity(16);
                while let Some((k, v)) = map.next_entry::<Key<'de>, &'de RawValue>()? {
                    pairs.push((k, v));
                }
                Ok(Fields { pairs })
            }
        }
        d.deserialize_map(V)
    }
}

impl<'a> Fields<'a> {
    /// The raw value of a field; JSON `null` counts as absent. The last occurrence wins, as
    /// in serde_json's own maps.
    pub fn get(&self, name: &str) -> Option<&'a RawValue> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k.as_str() == name)
            .map(|(_, v)| *v)
            .filter(|v| v.get() != "null")
    }
}

thread_local! {
    static BUF: RefCell<String> = RefCell::new(String::with_capacity(64 << 10));
}

/// Parses a line's top-level fields; the error says why it is not a JSON object.
pub fn parse_fields<'a>(path: &Path, line: u64, text: &'a str) -> Result<Fields<'a>, TaskError> {
    serde_json::from_str::<Fields<'a>>(text).map_err(|e| TaskError::NotJson {
        path: path.to_path_buf(),
        line,
        msg: e.to_string(),
    })
}

/// Counts the strings of a JSON array without allocating them; errors on a non-string element.
struct StrCount(usize);

impl<'de> Deserialize<'de> for StrCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Elem;
        impl<'de> Deserialize<'de> for Elem {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = Elem;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_str<E: de::Error>(self, _: &str) -> Result<Elem, E> {
                        Ok(Elem)
                    }
                }
                d.deserialize_str(V)
            }
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrCount;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StrCount, A::Error> {
                let mut n = 0;
                while seq.next_element::<Elem>()?.is_some() {
                    n += 1;
                }
                Ok(StrCount(n))
            }
        }
        d.deserialize_seq(V)
    }
}

/// A list of strings as a JSON array or a JSON-encoded string holding one (HuggingFace's
/// form of FAIL_TO_PASS); returns the count and, for the encoded form, leaves the decoded
/// array text in `buf` (an empty string is an empty list).
fn list_count(raw: &RawValue, buf: &mut String) -> Result<(usize, bool), String> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'[') => serde_json::from_str::<StrCount>(text)
            .map(|c| (c.0, false))
            .map_err(|e| format!("expected an array of strings: {e}")),
        Some(b'"') => {
            unescape_into(text, buf)?;
            if buf.trim().is_empty() {
                buf.clear();
                buf.push_str("[]");
                return Ok((0, true));
            }
            serde_json::from_str::<StrCount>(buf)
                .map(|c| (c.0, true))
                .map_err(|e| format!("string does not hold a JSON array of strings: {e}"))
        }
        _ => Err(format!("expected an array of strings, found {}", kind_of(text))),
    }
}

fn scalar_string(raw: &RawValue) -> Result<String, String> {
    match raw.get().as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(raw.get()).map_err(|e| e.to_string()),
        _ => Err(format!("expected a string, found {}", kind_of(raw.get()))),
    }
}

fn is_number(raw: &RawValue) -> bool {
    matches!(raw.get().as_bytes().first(), Some(b'-') | Some(b'0'..=b'9'))
}

/// Facts of a SWE-bench-style record from its fields.
pub fn swebench_facts(path: &Path, line: u64, v: &Fields<'_>) -> Result<Facts, TaskError> {
    let bad = |field: &str, msg: String| TaskError::BadField {
        path: path.to_path_buf(),
        line,
        field: field.to_string(),
        msg,
    };
    let id_raw = v.get("instance_id").ok_or_else(|| TaskError::MissingField {
        path: path.to_path_buf(),
        line,
        field: "instance_id",
    })?;
    let id = scalar_string(id_raw).map_err(|m| bad("instance_id", m))?;
    if id.trim().is_empty() {
        return Err(bad("instance_id", "is empty".into()));
    }
    let opt_str = |field: &str| -> Result<Option<String>, TaskError> {
        v.get(field)
            .map(|r| scalar_string(r).map_err(|m| bad(field, m)))
            .transpose()
    };
    let mut f = Facts {
        id,
        source: TaskSource::Swebench,
        repo: opt_str("repo")?.map(|r| normalize_repo(&r)),
        base_commit: opt_str("base_commit")?,
        language: opt_str("language")?.map(|s| s.trim().to_ascii_lowercase()),
        license: match opt_str("license")? {
            Some(l) => Some(l),
            None => opt_str("license_name")?,
        }
        .map(|s| s.trim().to_ascii_lowercase()),
        ..Facts::default()
    };
    if let Some(r) = v.get("version") {
        if !is_number(r) {
            scalar_string(r).map_err(|m| bad("version", m))?;
        }
    }
    BUF.with(|buf| -> Result<(), TaskError> {
        let mut buf = buf.borrow_mut();
        for (field, slot) in [
            ("FAIL_TO_PASS", &mut f.fail_to_pass),
            ("PASS_TO_PASS", &mut f.pass_to_pass),
        ] {
            if let Some(r) = v.get(field) {
                *slot = Some(list_count(r, &mut buf).map_err(|m| bad(field, m))?.0);
            }
        }
        if let Some(r) = v.get("problem_statement") {
            f.instruction_chars = unescaped_char_count(r.get()).map_err(|m| bad("problem_statement", m))?;
        }
        if let Some(r) = v.get("patch") {
            unescape_into(r.get(), &mut buf).map_err(|m| bad("patch", m))?;
            f.set_gold_patch(&buf);
        }
        if let Some(r) = v.get("test_patch") {
            unescape_into(r.get(), &mut buf).map_err(|m| bad("test_patch", m))?;
            f.test_patch = Some(patch::stats(&buf));
        }
        Ok(())
    })?;
    Ok(f)
}

/// Fields mapped onto `Task` fields; all others go to `metadata`.
const MAPPED: [&str; 8] = [
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
];

/// Writes the `Task` JSON line of a SWE-bench record whose facts were computed (so every
/// mapped field is known to be well-typed), copying raw values. Produces the same record as
/// [`super::swebench::to_task`] serialised (checked by a test), field for field.
pub fn render_swebench(v: &Fields<'_>, out: &mut Vec<u8>) -> Result<(), String> {
    let copy = |out: &mut Vec<u8>, key: &str, raw: Option<&RawValue>| {
        if let Some(r) = raw {
            out.extend_from_slice(b",\"");
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"\":");
            out.extend_from_slice(r.get().as_bytes());
        }
    };
    out.extend_from_slice(br#"{"schema":""#);
    out.extend_from_slice(<Task as crate::records::Record>::SCHEMA.as_bytes());
    out.extend_from_slice(br#"","id":"#);
    out.extend_from_slice(v.get("instance_id").ok_or("no instance_id")?.get().as_bytes());
    out.extend_from_slice(br#","source":"swebench""#);
    copy(out, "repo", v.get("repo"));
    copy(out, "base_commit", v.get("base_commit"));
    out.extend_from_slice(br#","instruction":"#);
    out.extend_from_slice(v.get("problem_statement").map_or("\"\"", |r| r.get()).as_bytes());
    copy(out, "gold_patch", v.get("patch"));
    copy(out, "test_patch", v.get("test_patch"));
    BUF.with(|buf| -> Result<(), String> {
        let mut buf = buf.borrow_mut();
        for (field, key) in [("FAIL_TO_PASS", "fail_to_pass"), ("PASS_TO_PASS", "pass_to_pass")] {
            out.extend_from_slice(b",\"");
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"\":");
            match v.get(field) {
                None => out.extend_from_slice(b"[]"),
                Some(r) => match list_count(r, &mut buf)? {
                    (_, true) => out.extend_from_slice(buf.as_bytes()),
                    (_, false) => out.extend_from_slice(r.get().as_bytes()),
                },
            }
        }
        Ok(())
    })?;
    out.extend_from_slice(br#","environment":{"#);
    if let Some(repo) = v.get("repo") {
        let repo = scalar_string(repo)?;
        out.extend_from_slice(br#""repo_source":{"kind":"git","url":"#);
        serde_json::to_writer(&mut *out, &format!("https://github.com/{repo}.git"))
            .map_err(|e| e.to_string())?;
        out.extend_from_slice(b"},");
    }
    out.extend_from_slice(br#""workdir":"/testbed"},"timeouts":"#);
    serde_json::to_writer(&mut *out, &Timeouts::default()).map_err(|e| e.to_string())?;
    let mut first = true;
    for (i, (k, raw)) in v.pairs.iter().enumerate() {
        let key = k.as_str();
        // Mapped fields and earlier duplicates of a later key are not metadata.
        if MAPPED.contains(&key) || v.pairs[i + 1..].iter().any(|(k2, _)| k2.as_str() == key) {
            continue;
        }
        out.extend_from_slice(if first { br#","metadata":{"# } else { b"," });
        first = false;
        serde_json::to_writer(&mut *out, key).map_err(|e| e.to_string())?;
        out.push(b':');
        if key == "version" && is_number(raw) {
            let _ = write!(out, "\"{}\"", raw.get());
        } else {
            out.extend_from_slice(raw.get().as_bytes());
        }
    }
    if !first {
        out.push(b'}');
    }
    out.push(b'}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_from_a_line_name_the_bad_field() {
        let p = Path::new("pool.jsonl");
        let line = r#"{"instance_id":"o__r-1","repo":"O/R","base_commit":"abc","problem_statement":"x\ny","patch":"diff --git a/m.py b/m.py\n@@ -1 +1 @@\n-a\n+b\n","FAIL_TO_PASS":"[\"t\"]","PASS_TO_PASS":[],"hints_text":null,"extra":{"k":[1,2]}}"#;
        let v = parse_fields(p, 3, line).unwrap();
        let f = swebench_facts(p, 3, &v).unwrap();
        assert_eq!(f.id, "o__r-1");
        assert_eq!(f.repo.as_deref(), Some("o/r"));
        assert_eq!(f.instruction_chars, 3);
        assert_eq!(f.fail_to_pass, Some(1));
        assert_eq!(f.pass_to_pass, Some(0));
        assert_eq!(f.patch.as_ref().map(|p| p.changed_lines), Some(2));
        assert_eq!(f.language.as_deref(), Some("python"));
        assert!(f.test_patch.is_none());

        let bad = r#"{"instance_id":"o__r-1","FAIL_TO_PASS":5}"#;
        let err = swebench_facts(p, 7, &parse_fields(p, 7, bad).unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pool.jsonl: record 7: field `FAIL_TO_PASS`: expected an array of strings, found a number"
        );
        let bad = r#"{"instance_id":"o__r-1","PASS_TO_PASS":["a",3]}"#;
        let err = swebench_facts(p, 7, &parse_fields(p, 7, bad).unwrap()).unwrap_err();
        assert!(
            err.to_string()
                .contains("field `PASS_TO_PASS`: expected an array of strings"),
            "{err}"
        );
        let missing = r#"{"repo":"o/r"}"#;
        let err = swebench_facts(p, 2, &parse_fields(p, 2, missing).unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pool.jsonl: record 2: missing required field `instance_id`"
        );
        assert!(parse_fields(p, 1, "not json").is_err());
        assert!(parse_fields(p, 1, "[1,2]").is_err());
    }

    #[test]
    fn fast_render_equals_the_typed_conversion() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/swebench");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
                continue;
            }
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
                // Both list encodings, and a numeric version.
                for variant in 0..2 {
                    if variant == 1 {
                        for k in ["FAIL_TO_PASS", "PASS_TO_PASS"] {
                            value[k] = serde_json::Value::String(value[k].to_string());
                        }
                        value["version"] = serde_json::json!(4.2);
                    }
                    let text = value.to_string();
                    let typed = super::super::swebench::to_task(&path, 1, &text).unwrap();
                    let fields = parse_fields(&path, 1, &text).unwrap();
                    let mut out = Vec::new();
                    render_swebench(&fields, &mut out).unwrap();
                    let fast: Task = serde_json::from_slice(&out).unwrap();
                    assert_eq!(fast, typed);
                    assert_eq!(out, serde_json::to_vec(&typed).unwrap());
                    n += 1;
                }
            }
        }
        assert_eq!(n, 28);
    }
}
