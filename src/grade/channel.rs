//! The grader's result channel: test outcomes that code under test can neither rewrite after the
//! fact nor forge.
//!
//! The grader installs [`PLUGIN_PY`] (module [`PLUGIN_MODULE`]) as root in the evaluation
//! container's site-packages (root-owned, read-only to the test user) and loads it with `-p`, so it
//! loads with plugin autoload off too. As each test phase finishes, its `pytest_runtest_logreport`
//! writes one JSON line (`["report", nodeid, when, outcome, xfail]`) to an inherited file
//! descriptor: the write end of a FIFO whose reader is a root process copying it to a root-only
//! file. junit.xml, the log and the exit code, which the test user owns, can be rewritten (an
//! `atexit` hook and `os._exit(0)`), so they no longer decide the reward. Code under test can write
//! to the descriptor too, so every line the plugin writes starts with a per-grading key
//! ([`KEY_FD_ENV`]), which the plugin reads before any code under test is imported:
//!
//! - the statuses come from the keyed lines, the FIRST outcome of each (test, phase), and pytest's
//!   exit status from the keyed `finish` alone;
//! - an unkeyed line, a (test, phase) recorded twice with different outcomes, or a graded test on
//!   which junit.xml and the stream disagree (one says it passed, the other does not), is
//!   tampering: reward 0, event [`RESULT_TAMPERING`], reason `grader_tampering`.
//!
//! Not closed (see the threat model in man/lego-rl-formats.md): code that runs inside pytest before
//! a test reports (the module under test at import) can read the key from the plugin's memory, patch
//! the report objects, or this plugin itself; the stream then records what pytest was told.

use std::collections::{BTreeMap, BTreeSet};

use super::pytest::{ERROR, FAILED, PASSED, SKIPPED, XFAIL};
use crate::records::AuditEvent;

/// The plugin's module name (one of the names a diff may not shadow, see
/// [`super::integrity::RUNNER_MODULES`]).
pub const PLUGIN_MODULE: &str = "_lego_rl_results";

/// The environment variable naming the stream's file descriptor.
pub const FD_ENV: &str = "LEGO_RL_RESULTS_FD";

/// The environment variable naming the descriptor the plugin reads the grading's key from: the
/// read end of a pipe root wrote the key into and closed. The plugin reads it to the end when it is
/// imported (by `-p`, before any conftest, test module or code under test), closes it and drops
/// the variable, so nothing that runs later finds the key in the pipe (it is empty) or the
/// environment.
pub const KEY_FD_ENV: &str = "LEGO_RL_KEY_FD";

/// The environment variable that turns a run of the plugin into the import-path probe: it writes
/// `LEGO_SYSPATH <dir>` lines (each `sys.path` entry under the working directory, relative to it;
/// `""` is the directory itself) to the file it names and exits before collection.
pub const SYSPATH_ENV: &str = "LEGO_RL_SYSPATH";

/// The config file the probe saw pytest use at the base commit (relative to the working
/// directory; `""`: none), when the probe reported one.
pub fn probe_config(out: &str) -> Option<String> {
    out.lines()
        .find_map(|l| l.strip_prefix("LEGO_INI "))
        .map(|c| c.trim().to_string())
        .or_else(|| out.lines().any(|l| l == "LEGO_INI").then(String::new))
}

/// The probe's directories.
pub fn syspath_dirs(out: &str) -> BTreeSet<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("LEGO_SYSPATH "))
        .map(|d| d.trim_end_matches('/').to_string())
        .collect()
}

/// The audit event of a result stream that contradicts itself or junit.xml.
pub const RESULT_TAMPERING: &str = "result_tampering";

/// The plugin. It writes nothing in xdist workers (their reports reach the controller's hook) nor
/// when the descriptor is not a FIFO (a child process that inherited another file as that number).
/// With a key (see [`KEY_FD_ENV`]) every line is `KEY JSON`; without one, plain JSON (the
/// unkeyed stream of the tests that switch the key off).
pub const PLUGIN_PY: &str = r#"import json, os, stat
import pytest

_FD = None
_KEY = ''
if not os.environ.get('PYTEST_XDIST_WORKER'):
    try:
        _fd = int(os.environ.get('LEGO_RL_RESULTS_FD', ''))
        if stat.S_ISFIFO(os.fstat(_fd).st_mode):
            _FD = _fd
    except (ValueError, OSError):
        pass
    try:
        _kfd = int(os.environ.pop('LEGO_RL_KEY_FD', ''))
        if stat.S_ISFIFO(os.fstat(_kfd).st_mode):
            _k = b''
            while len(_k) < 256:
                _c = os.read(_kfd, 256)
                if not _c:
                    break
                _k += _c
            _KEY = _k.decode('ascii', 'replace').strip()
        os.close(_kfd)
    except (ValueError, OSError):
        pass


def _put(*fields):
    if _FD is None:
        return
    line = json.dumps(fields)
    if _KEY:
        line = _KEY + ' ' + line
    try:
        os.write(_FD, (line + '\n').encode('utf-8', 'replace'))
    except OSError:
        pass


def pytest_configure(config):
    # The import-path probe (run at the base commit, before the diff): the real sys.path, ini
    # `pythonpath` included, as directories under the working directory; then out, before any
    # test is collected.
    out = os.environ.get('LEGO_RL_SYSPATH')
    if out:
        import sys
        here = os.path.realpath(os.getcwd())
        rel = [os.path.relpath(os.path.realpath(p or '.'), here) for p in sys.path]
        ini = getattr(config, 'inipath', None)
        with open(out, 'w') as f:
            f.write('LEGO_INI ' + (os.path.relpath(str(ini)) if ini else '') + '\n')
            for r in rel:
                if r == '.' or not (r == '..' or r.startswith('../')):
                    f.write('LEGO_SYSPATH ' + ('' if r == '.' else r) + '\n')
        os._exit(0)


def pytest_sessionstart(session):
    # The config file pytest really used (pytest >= 9 reads pytest.toml and .pytest.toml first):
    # the grader compares it with the base commit's.
    ini = getattr(session.config, 'inipath', None)
    _put('start', os.path.relpath(str(ini)) if ini else '')


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report):
    when = report.when
    if 'SubTest' in type(report).__name__:
        when = 'subtest'
    _put('report', report.nodeid, when, report.outcome, bool(getattr(report, 'wasxfail', None) is not None))


def pytest_sessionfinish(session, exitstatus):
    _put('finish', int(exitstatus))
"#;

/// What the stream says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stream {
    /// The plugin ran (its session started).
    pub started: bool,
    /// pytest's exit status, when the session finished.
    pub exit_status: Option<i64>,
    /// Node id → status, from the first outcome of each phase.
    pub statuses: BTreeMap<String, String>,
    /// Tests with a phase recorded twice with different outcomes.
    pub conflicts: BTreeSet<String>,
    /// Lines without the grading's key (written by something other than the plugin), when the
    /// stream is keyed.
    pub unkeyed: usize,
    /// The config file pytest used, as the plugin saw it at session start (`""`: none).
    pub config: Option<String>,
}

/// Parses the stream. With `key` (the grading's secret), only lines that start with it count;
/// every other non-empty line was written by something else on the descriptor (code under test)
/// and is counted in [`Stream::unkeyed`]. Without a key (the tests' unguarded runs), lines that
/// are not the plugin's JSON are ignored: a conflict with the real line is caught as such.
pub fn parse(text: &str, key: Option<&str>) -> Stream {
    let mut s = Stream::default();
    // (node id, phase) → (outcome, xfail), first one wins.
    let mut phases: BTreeMap<(String, String), (String, bool)> = BTreeMap::new();
    let mut subtest_failed: BTreeSet<String> = BTreeSet::new();
    for line in text.lines() {
        let line = match key {
            Some(k) => match line.strip_prefix(k).and_then(|l| l.strip_prefix(' ')) {
                Some(l) if !k.is_empty() => l,
                _ => {
                    s.unkeyed += usize::from(!line.trim().is_empty());
                    continue;
                }
            },
            None => line,
        };
        let Ok(serde_json::Value::Array(f)) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        match f.first().and_then(|v| v.as_str()) {
            Some("start") => {
                s.started = true;
                if s.config.is_none() {
                    s.config = f.get(1).and_then(|v| v.as_str()).map(str::to_string);
                }
            }
            Some("finish") => {
                s.exit_status = s.exit_status.or(f.get(1).and_then(|v| v.as_i64()));
            }
            Some("report") => {
                let field = |i: usize| f.get(i).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                let (id, when, outcome) = (field(1), field(2), field(3));
                let xfail = f.get(4).and_then(|v| v.as_bool()).unwrap_or(false);
                // pytest-rerunfailures reports a failed try as `rerun`; the last try decides.
                if id.is_empty() || outcome == "rerun" {
                    continue;
                }
                if when == "subtest" {
                    if outcome == "failed" {
                        subtest_failed.insert(id);
                    }
                    continue;
                }
                match phases.get(&(id.clone(), when.clone())) {
                    Some((o, _)) if *o != outcome => {
                        s.conflicts.insert(id);
                    }
                    Some(_) => {}
                    None => {
                        phases.insert((id, when), (outcome, xfail));
                    }
                }
            }
            _ => {}
        }
    }
    let ids: BTreeSet<&String> = phases.keys().map(|(id, _)| id).collect();
    for id in ids {
        let get = |w: &str| phases.get(&(id.clone(), w.to_string()));
        let skipped = |xfail: bool| if xfail { XFAIL } else { SKIPPED };
        let status = match (get("setup"), get("call"), get("teardown")) {
            (Some((o, _)), _, _) if o == "failed" => Some(ERROR),
            (Some((o, x)), _, _) if o == "skipped" => Some(skipped(*x)),
            (_, Some((o, _)), _) if o == "failed" => Some(FAILED),
            (_, Some((o, x)), _) if o == "skipped" => Some(skipped(*x)),
            (_, _, Some((o, _))) if o == "failed" => Some(ERROR),
            (_, Some((o, _)), _) if o == "passed" => Some(PASSED),
            _ => None,
        };
        if let Some(mut status) = status {
            if status == PASSED && subtest_failed.contains(id) {
                status = FAILED;
            }
            s.statuses.insert(id.clone(), status.to_string());
        }
    }
    s
}

/// Passed, skipped (or xfailed), or neither: the classes junit.xml and the stream must agree on.
fn class(status: Option<&String>) -> u8 {
    match status.map(String::as_str) {
        Some(PASSED) => 2,
        Some(SKIPPED) | Some(XFAIL) => 1,
        _ => 0,
    }
}

/// The [`RESULT_TAMPERING`] event, if the stream contradicts itself or, on one of the `graded`
/// tests, junit.xml's statuses (`None`: no junit.xml; a graded test junit.xml does not list is
/// not compared, its node id may be mapped differently).
pub fn tampering(
    stream: &Stream,
    junit: Option<&BTreeMap<String, String>>,
    graded: &[String],
) -> Option<AuditEvent> {
    let mut what: Vec<String> = stream
        .conflicts
        .iter()
        .take(5)
        .map(|id| format!("{id} recorded twice with different outcomes"))
        .collect();
    if stream.unkeyed > 0 {
        what.push(format!(
            "{} line(s) on the result stream without the grading's key",
            stream.unkeyed
        ));
    }
    if let Some(junit) = junit {
        for id in graded {
            let j = junit.get(id);
            if j.is_some() && class(j) != class(stream.statuses.get(id)) {
                what.push(format!(
                    "{id}: junit.xml says {}, the grader's stream {}",
                    j.map_or("nothing", String::as_str),
                    stream.statuses.get(id).map_or("nothing", String::as_str)
                ));
            }
        }
    }
    if what.is_empty() {
        return None;
    }
    let n = what.len();
    what.truncate(5);
    Some(AuditEvent {
        kind: RESULT_TAMPERING.into(),
        detail: format!(
            "test results rewritten after the fact: {}{} (reward 0, grader_tampering)",
            what.join("; "),
            if n > what.len() { "; ..." } else { "" }
        ),
        generation: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_first_outcome_of_each_phase_decides() {
        let text = r#"["start"]
["report", "t.py::a", "setup", "passed", false]
["report", "t.py::a", "call", "passed", false]
["report", "t.py::a", "teardown", "passed", false]
["report", "t.py::b", "setup", "passed", false]
["report", "t.py::b", "call", "failed", false]
["report", "t.py::c", "setup", "skipped", true]
["report", "t.py::d", "setup", "failed", false]
["report", "t.py::e", "call", "rerun", false]
["report", "t.py::e", "call", "passed", false]
["report", "t.py::f", "call", "passed", false]
["report", "t.py::f", "subtest", "failed", false]
not json
["finish", 1]
"#;
        let s = parse(text, None);
        assert!(s.started);
        assert_eq!(s.exit_status, Some(1));
        let want: BTreeMap<String, String> = [
            ("t.py::a", PASSED),
            ("t.py::b", FAILED),
            ("t.py::c", XFAIL),
            ("t.py::d", ERROR),
            ("t.py::e", PASSED),
            ("t.py::f", FAILED),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(s.statuses, want);
        assert!(s.conflicts.is_empty());
        assert!(tampering(&s, Some(&want), &v(&["t.py::a", "t.py::b"])).is_none());
        assert!(!parse("", None).started);
    }

    #[test]
    fn the_probe_names_directories_under_the_workdir() {
        let got = syspath_dirs("pytest11 x\nLEGO_SYSPATH \nLEGO_SYSPATH lib/\nLEGO_SYSPATH src\nos\n");
        assert_eq!(got, BTreeSet::from([String::new(), "lib".into(), "src".into()]));
    }

    #[test]
    fn forged_lines_and_rewritten_junit_are_tampering() {
        // A pass appended before the real failure: the first line wins, the conflict is caught.
        let forged = "[\"start\"]\n[\"report\", \"t.py::b\", \"call\", \"passed\", false]\n\
                      [\"report\", \"t.py::b\", \"call\", \"failed\", false]\n";
        let s = parse(forged, None);
        assert_eq!(s.statuses["t.py::b"], PASSED);
        let ev = tampering(&s, None, &[]).expect("conflict");
        assert_eq!(ev.kind, RESULT_TAMPERING);
        assert!(ev.detail.contains("t.py::b recorded twice"), "{}", ev.detail);
        // junit.xml rewritten to a pass the stream never saw; a test junit.xml does not list is
        // left alone.
        let s = parse(
            "[\"start\"]\n[\"report\", \"t.py::b\", \"call\", \"failed\", false]\n",
            None,
        );
        let junit: BTreeMap<String, String> = [("t.py::b".to_string(), PASSED.to_string())].into();
        let ev = tampering(&s, Some(&junit), &v(&["t.py::b", "t.py::z"])).expect("disagreement");
        assert!(
            ev.detail
                .contains("junit.xml says PASSED, the grader's stream FAILED"),
            "{}",
            ev.detail
        );
        let none = parse("", None);
        assert!(tampering(&none, Some(&junit), &v(&["t.py::b"])).is_some());
        assert!(tampering(&none, Some(&BTreeMap::new()), &v(&["t.py::b"])).is_none());
    }

    #[test]
    fn only_keyed_lines_count_and_the_rest_is_tampering() {
        // Forged passes and a forged finish written to the descriptor before the plugin's own
        // lines: ignored, counted; the plugin's keyed lines decide.
        let text = "[\"start\"]\n[\"report\", \"t.py::b\", \"call\", \"passed\", false]\n[\"finish\", 0]\n\
                    k3y [\"start\", \"pyproject.toml\"]\n\
                    k3y [\"report\", \"t.py::b\", \"call\", \"failed\", false]\n\
                    k3yx [\"finish\", 0]\n";
        let s = parse(text, Some("k3y"));
        assert_eq!(s.unkeyed, 4);
        assert_eq!(s.statuses["t.py::b"], FAILED);
        assert_eq!(s.exit_status, None, "the finish line is not the plugin's");
        assert_eq!(s.config.as_deref(), Some("pyproject.toml"));
        let ev = tampering(&s, None, &[]).expect("unkeyed lines");
        assert!(ev.detail.contains("4 line(s)"), "{}", ev.detail);
        // An empty key accepts nothing.
        assert_eq!(parse(" [\"start\"]\n", Some("")).unkeyed, 1);
        // The probe's config file: a name, none, or no report.
        assert_eq!(probe_config("LEGO_INI tox.ini\n").as_deref(), Some("tox.ini"));
        assert_eq!(probe_config("LEGO_INI \n").as_deref(), Some(""));
        assert_eq!(probe_config("LEGO_SYSPATH \n"), None);
    }
}
