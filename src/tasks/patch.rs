//! Unified-diff statistics for the rules stage: files touched, changed lines, and whether each
//! file is a test file. Parsing follows hunk headers (`@@ -a,b +c,d @@`), so a removed line that
//! itself starts with `--` is counted as a change, not mistaken for a file header.

use serde::Serialize;

/// What a patch touches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PatchStats {
    /// Bytes of the decoded patch text.
    pub bytes: usize,
    pub files: u32,
    /// Added plus removed lines.
    pub changed_lines: u32,
    pub test_files: u32,
    pub non_test_files: u32,
    /// The first test file (for a gold patch) or non-test file (for a test patch), as evidence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_test_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_non_test_file: Option<String>,
    /// Language guessed from the extensions of the non-test files, when one dominates.
    #[serde(skip)]
    pub language: Option<&'static str>,
}

/// Computes the statistics of a unified diff (git or plain).
pub fn stats(patch: &str) -> PatchStats {
    let mut st = PatchStats {
        bytes: patch.len(),
        ..PatchStats::default()
    };
    let mut langs: [u32; LANGS.len()] = [0; LANGS.len()];
    let (mut old_left, mut new_left) = (0u32, 0u32);
    let mut pending_git_file = false;
    let mut start = 0;
    let ends = memchr::memchr_iter(b'\n', patch.as_bytes()).chain(std::iter::once(patch.len()));
    for end in ends {
        // Cutting at b'\n' keeps char boundaries: the newline byte is never inside a UTF-8 sequence.
        let line = &patch[start..end];
        start = (end + 1).min(patch.len());
        if old_left > 0 || new_left > 0 {
            match line.as_bytes().first() {
                Some(b'+') => {
                    new_left = new_left.saturating_sub(1);
                    st.changed_lines += 1;
                }
                Some(b'-') => {
                    old_left = old_left.saturating_sub(1);
                    st.changed_lines += 1;
                }
                Some(b'\\') => {} // "\ No newline at end of file"
                _ => {
                    old_left = old_left.saturating_sub(1);
                    new_left = new_left.saturating_sub(1);
                }
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("diff --git ") {
            if let Some(path) = git_header_path(rest) {
                add_file(&mut st, &mut langs, path);
                pending_git_file = true;
            }
        } else if let Some(rest) = line.strip_prefix("+++ ") {
            // Plain unified diffs (no `diff --git` line) name files only here.
            if !pending_git_file {
                let path = rest.split('\t').next().unwrap_or(rest).trim_end();
                let path = path.strip_prefix("b/").unwrap_or(path);
                if path != "/dev/null" {
                    add_file(&mut st, &mut langs, path);
                }
            }
            pending_git_file = false;
        } else if let Some(rest) = line.strip_prefix("@@ -") {
            pending_git_file = false;
            if let Some((old, new)) = hunk_counts(rest) {
                old_left = old;
                new_left = new;
            }
        }
    }
    let total: u32 = langs.iter().sum();
    if let Some((i, &n)) = langs.iter().enumerate().max_by_key(|(_, n)| **n) {
        if n > 0 && n * 2 > total {
            st.language = Some(LANGS[i].0);
        }
    }
    st
}

fn add_file(st: &mut PatchStats, langs: &mut [u32], path: &str) {
    st.files += 1;
    if is_test_path(path) {
        st.test_files += 1;
        if st.first_test_file.is_none() {
            st.first_test_file = Some(path.to_string());
        }
    } else {
        st.non_test_files += 1;
        if st.first_non_test_file.is_none() {
            st.first_non_test_file = Some(path.to_string());
        }
        if let Some(ext) = path.rsplit_once('.').map(|(_, e)| e) {
            if let Some(i) = LANGS.iter().position(|(_, exts)| exts.contains(&ext)) {
                langs[i] += 1;
            }
        }
    }
}

/// The b-side path of `a/X b/X` (the a-side when that is all there is).
fn git_header_path(rest: &str) -> Option<&str> {
    if let Some(i) = rest.find(" b/") {
        return Some(&rest[i + 3..]);
    }
    rest.strip_prefix("a/").map(|r| r.split(' ').next().unwrap_or(r))
}

/// `a,b +c,d @@ ...` → (b, d); a missing count means 1.
fn hunk_counts(rest: &str) -> Option<(u32, u32)> {
    let (old, rest) = rest.split_once(" +")?;
    let new = rest.split(' ').next()?;
    let count = |r: &str| -> Option<u32> {
        match r.split_once(',') {
            Some((_, n)) => n.parse().ok(),
            None => r.parse::<u32>().ok().map(|_| 1),
        }
    };
    Some((count(old)?, count(new)?))
}

const LANGS: [(&str, &[&str]); 10] = [
    ("python", &["py", "pyi", "pyx"]),
    ("javascript", &["js", "jsx", "mjs", "cjs"]),
    ("typescript", &["ts", "tsx"]),
    ("java", &["java"]),
    ("go", &["go"]),
    ("rust", &["rs"]),
    ("c", &["c", "h"]),
    ("cpp", &["cc", "cpp", "cxx", "hpp", "hh"]),
    ("ruby", &["rb"]),
    ("php", &["php"]),
];

/// Whether a repository path is a test file: a directory named test/tests/testing/e2e/
/// `__tests__`/spec, or a file named like a test (`test_x.py`, `x_test.go`, `x.test.ts`,
/// `x_spec.rb`, `FooTest.java`, `tests.py`, `conftest.py`). Broader than SWE-bench's own
/// heuristic on purpose: a false "test" here only makes the rules stricter.
pub fn is_test_path(path: &str) -> bool {
    let mut parts = path.rsplit('/');
    let file = parts.next().unwrap_or(path);
    const TEST_DIRS: [&str; 8] = [
        "test",
        "tests",
        "testing",
        "e2e",
        "__tests__",
        "spec",
        "specs",
        "unittests",
    ];
    if parts.any(|dir| TEST_DIRS.iter().any(|t| dir.eq_ignore_ascii_case(t))) {
        return true;
    }
    let stem = file.split('.').next().unwrap_or(file);
    let starts =
        |p: &str| stem.len() >= p.len() && stem.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes());
    let ends = |p: &str| {
        stem.len() >= p.len() && stem.as_bytes()[stem.len() - p.len()..].eq_ignore_ascii_case(p.as_bytes())
    };
    starts("test_")
        || ["test", "tests", "conftest"]
            .iter()
            .any(|n| stem.eq_ignore_ascii_case(n))
        || ends("_test")
        || ends("_tests")
        || ends("_spec")
        || stem.ends_with("Test")
        || stem.ends_with("Tests")
        || file.contains(".test.")
        || file.contains(".spec.")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIT: &str = "diff --git a/pkg/mod.py b/pkg/mod.py\nindex 1..2 100644\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,3 +1,3 @@\n ctx\n--- removed sql comment\n+++ added line that looks like a header\n ctx\ndiff --git a/pkg/tests/test_mod.py b/pkg/tests/test_mod.py\n--- a/pkg/tests/test_mod.py\n+++ b/pkg/tests/test_mod.py\n@@ -10 +10,2 @@\n-x\n+y\n+z\n";

    #[test]
    fn counts_files_and_changed_lines_by_hunk() {
        let st = stats(GIT);
        assert_eq!(st.files, 2);
        assert_eq!(st.changed_lines, 5);
        assert_eq!(st.test_files, 1);
        assert_eq!(st.non_test_files, 1);
        assert_eq!(st.first_test_file.as_deref(), Some("pkg/tests/test_mod.py"));
        assert_eq!(st.first_non_test_file.as_deref(), Some("pkg/mod.py"));
        assert_eq!(st.language, Some("python"));
    }

    #[test]
    fn plain_unified_diffs_name_files_by_plus_header() {
        let st = stats("--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1 +1 @@\n-a\n+b\n--- /dev/null\n+++ b/new_test.go\n@@ -0,0 +1 @@\n+x\n");
        assert_eq!((st.files, st.changed_lines, st.test_files), (2, 3, 1));
    }

    #[test]
    fn test_paths() {
        for p in [
            "tests/admin_widgets/tests.py",
            "sympy/matrices/tests/test_sparse.py",
            "testing/test_assertrewrite.py",
            "test/core/rules/docstring_test.py",
            "src/foo.test.ts",
            "src/main/java/FooTest.java",
            "conftest.py",
        ] {
            assert!(is_test_path(p), "{p}");
        }
        for p in [
            "django/contrib/admin/widgets.py",
            "src/testify.py",
            "docs/testing.rst",
            "attest/x.py",
        ] {
            assert!(!is_test_path(p), "{p}");
        }
    }
}
