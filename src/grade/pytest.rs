//! Per-test statuses from pytest output: JUnit XML (`--junitxml`) or the `-rA` short summary.
//!
//! Test ids are pytest node ids (`tests/test_x.py::Class::test_y[param]`), the form SWE-bench's
//! FAIL_TO_PASS/PASS_TO_PASS lists use. JUnit's `classname` is the node id's path with `/` turned into
//! `.`, so it is mapped back using the test files that were run.

use std::collections::BTreeMap;

/// Statuses as SWE-bench names them.
pub const PASSED: &str = "PASSED";
pub const FAILED: &str = "FAILED";
pub const SKIPPED: &str = "SKIPPED";
pub const ERROR: &str = "ERROR";
pub const XFAIL: &str = "XFAIL";

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let Some(end) = tail.find(';') else {
            out.push_str(tail);
            return out;
        };
        let ent = &tail[1..end];
        let ch = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => ent
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match ch {
            Some(c) => out.push(c),
            None => out.push_str(&tail[..=end]),
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    out
}

fn attr(tag: &str, name: &str) -> Option<String> {
    let pat = format!(" {name}=\"");
    let start = tag.find(&pat)? + pat.len();
    let end = tag[start..].find('"')? + start;
    Some(unescape(&tag[start..end]))
}

/// Maps a JUnit (classname, name) to a node id using the files that were run.
fn node_id(classname: &str, name: &str, files: &[String]) -> String {
    for f in files {
        let module = f.trim_end_matches(".py").replace('/', ".");
        if classname == module || classname.starts_with(&format!("{module}.")) {
            let rest = classname[module.len()..].trim_start_matches('.');
            let mut parts = vec![f.clone()];
            parts.extend(rest.split('.').filter(|p| !p.is_empty()).map(str::to_string));
            parts.push(name.to_string());
            return parts.join("::");
        }
    }
    format!("{}::{name}", classname.replace('.', "/"))
}

/// Parses pytest's JUnit XML into node id → status. Returns `None` when the text has no
/// `<testsuite` element (not a JUnit report).
pub fn parse_junit(xml: &str, files: &[String]) -> Option<BTreeMap<String, String>> {
    if !xml.contains("<testsuite") {
        return None;
    }
    let mut out = BTreeMap::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<testcase") {
        let after = &rest[i..];
        let open_end = after.find('>').unwrap_or(after.len());
        let open = &after[..open_end];
        let self_closing = open.ends_with('/');
        let (body, consumed) = if self_closing {
            ("", (open_end + 1).min(after.len()))
        } else {
            let close = after.find("</testcase>").unwrap_or(after.len());
            (
                &after[open_end..close],
                (close + "</testcase>".len()).min(after.len()),
            )
        };
        let classname = attr(open, "classname").unwrap_or_default();
        let name = attr(open, "name").unwrap_or_default();
        let status = if body.contains("<failure") {
            FAILED
        } else if body.contains("<error") {
            ERROR
        } else if body.contains("<skipped") {
            if body.contains("type=\"pytest.xfail\"") {
                XFAIL
            } else {
                SKIPPED
            }
        } else {
            PASSED
        };
        // A test can appear twice (a failing test whose teardown errors): keep the worst status.
        let id = node_id(&classname, &name, files);
        let entry = out.entry(id).or_insert_with(|| status.to_string());
        if *entry == PASSED {
            *entry = status.to_string();
        }
        rest = &after[consumed.max(1)..];
    }
    Some(out)
}

/// Parses the `-rA` short test summary (`PASSED tests/x.py::t`, `FAILED tests/x.py::t - msg`).
pub fn parse_log(log: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let line = line.trim_start();
        for status in [PASSED, FAILED, SKIPPED, ERROR, XFAIL, "XPASS"] {
            if let Some(rest) = line.strip_prefix(status).and_then(|r| r.strip_prefix(' ')) {
                let mut id = rest.split(" - ").next().unwrap_or(rest).trim();
                if status == SKIPPED {
                    // `SKIPPED [1] tests/x.py:12: reason` names a location, not a node id.
                    continue;
                }
                if id.is_empty() {
                    continue;
                }
                if let Some(stripped) = id.strip_suffix(" ") {
                    id = stripped;
                }
                let s = if status == "XPASS" { PASSED } else { status };
                out.insert(id.to_string(), s.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const JUNIT: &str = r#"<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4">
<testcase classname="tests.test_lru.LRUCacheTest" name="test_lru" time="0.001" />
<testcase classname="tests.test_lru.LRUCacheTest" name="test_x[a&amp;b]" time="0.001"><failure message="assert 1 == 2">boom</failure></testcase>
<testcase classname="test_inflection" name="test_skip" time="0"><skipped type="pytest.skip" message="no">x</skipped></testcase>
<testcase classname="test_inflection" name="test_xf" time="0"><skipped type="pytest.xfail" message="no" /></testcase>
</testsuite></testsuites>"#;

    #[test]
    fn junit_maps_back_to_node_ids() {
        let files = vec!["tests/test_lru.py".to_string(), "test_inflection.py".to_string()];
        let got = parse_junit(JUNIT, &files).expect("junit");
        assert_eq!(got["tests/test_lru.py::LRUCacheTest::test_lru"], PASSED);
        assert_eq!(got["tests/test_lru.py::LRUCacheTest::test_x[a&b]"], FAILED);
        assert_eq!(got["test_inflection.py::test_skip"], SKIPPED);
        assert_eq!(got["test_inflection.py::test_xf"], XFAIL);
        assert_eq!(got.len(), 4);
        assert!(parse_junit("garbage", &files).is_none());
    }

    #[test]
    fn ra_summary_is_parsed() {
        let log = "collected 3 items\n\n=== short test summary info ===\n\
                   PASSED tests/a.py::test_one\nFAILED tests/a.py::test_two - assert 0\n\
                   ERROR tests/b.py::test_three - fixture\nSKIPPED [1] tests/a.py:9: nope\n\
                   ==== 1 failed, 1 passed, 1 error in 0.10s ====\n";
        let got = parse_log(log);
        assert_eq!(got["tests/a.py::test_one"], PASSED);
        assert_eq!(got["tests/a.py::test_two"], FAILED);
        assert_eq!(got["tests/b.py::test_three"], ERROR);
        assert_eq!(got.len(), 3);
    }
}
