//! What grading puts back before the tests run, and the audit event for each file: the plan is a
//! pure function of the diff's files, the task's protected test files and the defences in force,
//! so it is unit-tested here and run as shell by [`super::evaluate`].
//!
//! Order matters: `.gitattributes` and the other hooks go first, so that nothing the agent wrote
//! decides how the protected files are then checked out (the evaluation repository also gets
//! lego-rl's neutral `info/attributes`, which overrides any `.gitattributes`).

use std::collections::BTreeSet;

use super::Defence;
use crate::grade::hooks;
use crate::records::AuditEvent;

/// Files of the diff that grading reverts (restored from the base commit, or removed when the
/// base has none), each list with its audit kind, plus binaries that are only flagged.
#[derive(Debug, Default, PartialEq)]
pub struct Reverts {
    /// `collection_hook`: conftest.py, pytest's ini files, .gitattributes.
    pub hooks: Vec<String>,
    /// `startup_hook`: package metadata, .pth, sitecustomize/usercustomize.
    pub startup: Vec<String>,
    /// `test_helper`: `__init__.py` and helper modules beside the tests.
    pub helpers: Vec<String>,
    /// `test_edit`: the task's own test files.
    pub tests: Vec<String>,
    /// `binary_file`: compiled code that travels in the diff (flagged, kept).
    pub binaries: Vec<String>,
}

impl Reverts {
    /// The plan for a diff touching `touched`, with `protected` the task's test files and
    /// `test_dirs` their directories.
    pub fn plan(
        touched: &BTreeSet<String>,
        protected: &BTreeSet<String>,
        test_dirs: &BTreeSet<String>,
        off: &BTreeSet<Defence>,
    ) -> Self {
        let on = |d: Defence| !off.contains(&d);
        let mut r = Reverts::default();
        for f in touched {
            if protected.contains(f) {
                if on(Defence::ProtectedTests) {
                    r.tests.push(f.clone());
                }
            } else if hooks::is_collection_hook(f) {
                if on(Defence::CollectionHooks) {
                    r.hooks.push(f.clone());
                }
            } else if hooks::is_startup_hook(f) {
                if on(Defence::StartupHooks) {
                    r.startup.push(f.clone());
                }
            } else if hooks::is_test_helper(f, test_dirs) {
                if on(Defence::TestHelpers) {
                    r.helpers.push(f.clone());
                }
            } else if hooks::is_unreviewable_binary(f) {
                r.binaries.push(f.clone());
            }
        }
        r
    }

    /// Everything reverted, in the order it is put back.
    pub fn in_order(&self) -> impl Iterator<Item = &String> {
        self.hooks
            .iter()
            .chain(&self.startup)
            .chain(&self.helpers)
            .chain(&self.tests)
    }

    /// One audit event per file.
    pub fn events(&self) -> Vec<AuditEvent> {
        let lists: [(&str, &Vec<String>, &str); 5] = [
            ("collection_hook", &self.hooks, "reverted before grading"),
            (
                "startup_hook",
                &self.startup,
                "reverted before grading: changes how the test interpreter starts",
            ),
            (
                "test_helper",
                &self.helpers,
                "restored from the base commit before grading: code beside the tests",
            ),
            ("test_edit", &self.tests, "discarded before grading"),
            (
                "binary_file",
                &self.binaries,
                "compiled code in the diff, which no reviewer can read",
            ),
        ];
        lists
            .into_iter()
            .flat_map(|(kind, files, what)| {
                files.iter().map(move |f| AuditEvent {
                    kind: kind.into(),
                    detail: format!("{f} ({what})"),
                    generation: None,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(xs: &[&str]) -> BTreeSet<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_file_gets_one_class_and_hooks_go_first() {
        let touched = set(&[
            "test_x.py",
            "conftest.py",
            ".pytest.ini",
            "x.dist-info/entry_points.txt",
            "sitecustomize/__init__.py",
            "tests/__init__.py",
            "tests/helpers.py",
            "pkg/__init__.py",
            "pkg/_fast.cpython-313-x86_64-linux-gnu.so",
            "pkg/fix.py",
        ]);
        let protected = set(&["test_x.py", "tests/test_y.py"]);
        let dirs = hooks::test_dirs(protected.iter().map(String::as_str));
        let r = Reverts::plan(&touched, &protected, &dirs, &BTreeSet::new());
        assert_eq!(r.hooks, [".pytest.ini", "conftest.py"]);
        assert_eq!(
            r.startup,
            ["sitecustomize/__init__.py", "x.dist-info/entry_points.txt"]
        );
        assert_eq!(r.helpers, ["tests/__init__.py", "tests/helpers.py"]);
        assert_eq!(r.tests, ["test_x.py"]);
        assert_eq!(r.binaries, ["pkg/_fast.cpython-313-x86_64-linux-gnu.so"]);
        assert_eq!(r.in_order().next().map(String::as_str), Some(".pytest.ini"));
        assert_eq!(r.events().len(), 8);
        // A defence switched off leaves its files alone.
        let off = BTreeSet::from([Defence::StartupHooks]);
        assert!(Reverts::plan(&touched, &protected, &dirs, &off)
            .startup
            .is_empty());
    }
}
