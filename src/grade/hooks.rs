//! Which files of a diff change how grading *starts* rather than what it tests, by principle
//! rather than by one file name each:
//!
//! - collection hooks: what pytest reads before it collects (`conftest.py`, every config file it
//!   would consider: `pytest.toml`, `.pytest.toml`, `.pytest.ini`, `pytest.ini`, `tox.ini`,
//!   `setup.cfg`, `pyproject.toml`) and
//!   what git reads while the diff is applied and files restored (`.gitattributes`);
//! - start-up hooks: what the interpreter or pytest's plugin manager reads from any `sys.path`
//!   entry at start-up: package metadata (`*.dist-info/`, `*.egg-info`, entry points with them),
//!   `.pth` files, and `sitecustomize`/`usercustomize` as a module, a package, compiled bytecode
//!   or an extension module;
//! - test helpers: `__init__.py` of a directory that holds the task's test files, and other
//!   Python files beside those tests (pytest imports them with the tests; they are the tests'
//!   code, not the fix's);
//! - unreviewable binaries: extension modules and shared libraries, which travel in the diff but
//!   which no reviewer can read (flagged, not reverted).
//!
//! Pure functions of repository-relative paths; `sandbox::trial` reverts what they name.

use std::collections::BTreeSet;

/// Every file pytest may read its configuration from, in its order of precedence (pytest >= 9
/// reads `pytest.toml` and `.pytest.toml` ahead of all the others).
///
/// The grader reverts every one of them to the base commit rather than running pytest with the
/// base's file given explicitly (`-c FILE --rootdir DIR`): with no config file at the base there is
/// no file to give, and pytest would still find one the diff added; `-c` also changes how the
/// rootdir and conftest files are found for commands that rely on discovery, so the tests would
/// not run as the task's gold check ran them. A name a later pytest adds is caught instead by the
/// grader's plugin, which reports the file pytest used (`config.inipath`): one the diff wrote,
/// where the base commit's run used another, is `config_mismatch` (reward 0).
pub const PYTEST_INI_FILES: &[&str] = &[
    "pytest.toml",
    ".pytest.toml",
    ".pytest.ini",
    "pytest.ini",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
];

/// Start-up hook module names: imported by `site` from any `sys.path` entry at start-up.
const STARTUP_MODULES: &[&str] = &["sitecustomize", "usercustomize"];

fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// True for files that can change what pytest collects, or how git applies and restores files
/// while grading.
pub fn is_collection_hook(path: &str) -> bool {
    let name = name_of(path);
    name == "conftest.py" || name == ".gitattributes" || PYTEST_INI_FILES.contains(&name)
}

/// True for files the interpreter or pytest's plugin autoload reads at start-up from a `sys.path`
/// entry: package metadata (`x.dist-info/…`, `x.egg-info` as a file or directory, `.egg-link`),
/// `.pth` files, and `sitecustomize`/`usercustomize` in any form (`.py`, a package, `.pyc`, an
/// extension module).
pub fn is_startup_hook(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    let last = parts.len().saturating_sub(1);
    parts.iter().enumerate().any(|(i, part)| {
        let is_dir = i < last;
        if part.ends_with(".dist-info") || part.ends_with(".egg-info") {
            return true;
        }
        if !is_dir && (part.ends_with(".pth") || part.ends_with(".egg-link")) {
            return true;
        }
        let stem = part.split('.').next().unwrap_or(part);
        STARTUP_MODULES.contains(&stem) && (is_dir || part.contains('.'))
    })
}

/// True for compiled code no reviewer can read: extension modules and shared libraries.
pub fn is_unreviewable_binary(path: &str) -> bool {
    let name = name_of(path);
    [".so", ".pyd", ".dylib", ".dll"]
        .iter()
        .any(|e| name.ends_with(e))
        || name.contains(".so.")
}

/// The directories that hold the task's test files (`""` is the repository root).
pub fn test_dirs<'a>(test_files: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    test_files
        .into_iter()
        .map(|t| {
            let file = t.split("::").next().unwrap_or(t);
            file.rsplit_once('/')
                .map_or(String::new(), |(d, _)| d.to_string())
        })
        .collect()
}

/// True for a test helper: an `__init__.py` in a directory of test files (the root included:
/// pytest's `prepend` import mode imports the packages above a test file), or any other Python
/// file directly beside test files below the root (the root of many repositories holds the
/// package under test itself).
pub fn is_test_helper(path: &str, test_dirs: &BTreeSet<String>) -> bool {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    if !test_dirs.contains(dir) || !name.ends_with(".py") {
        return false;
    }
    name == "__init__.py" || !dir.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_by_principle() {
        for p in [
            "conftest.py",
            "a/conftest.py",
            ".pytest.ini",
            "pytest.toml",
            "sub/.pytest.toml",
            "sub/tox.ini",
            ".gitattributes",
        ] {
            assert!(is_collection_hook(p), "{p}");
        }
        assert!(!is_collection_hook("src/conftest_helper.py"));
        for p in [
            "x.dist-info/entry_points.txt",
            "src/x-1.0.dist-info/METADATA",
            "x.egg-info/entry_points.txt",
            "x.egg-info",
            "evil.pth",
            "sitecustomize.py",
            "sitecustomize/__init__.py",
            "src/sitecustomize.cpython-313-x86_64-linux-gnu.so",
            "usercustomize.pyc",
        ] {
            assert!(is_startup_hook(p), "{p}");
        }
        for p in [
            "sitecustomize_notes.md",
            "pkg/distinfo.py",
            "pthreads.c",
            "docs/sitecustomize",
        ] {
            assert!(!is_startup_hook(p), "{p}");
        }
        assert!(is_unreviewable_binary(
            "pkg/_speedups.cpython-313-x86_64-linux-gnu.so"
        ));
        assert!(is_unreviewable_binary("lib/libfoo.so.1"));
        assert!(!is_unreviewable_binary("pkg/solver.py"));
    }

    #[test]
    fn helpers_beside_the_tests() {
        let dirs = test_dirs(["test_x.py::t", "tests/test_a.py", "tests_lego/test_r.py"]);
        assert_eq!(dirs.len(), 3);
        assert!(is_test_helper("__init__.py", &dirs));
        assert!(is_test_helper("tests/__init__.py", &dirs));
        assert!(is_test_helper("tests/helpers.py", &dirs));
        // The root's other modules are the code under test; packages of the code are the fix's.
        assert!(!is_test_helper("inflection.py", &dirs));
        assert!(!is_test_helper("inflection/__init__.py", &dirs));
        assert!(!is_test_helper("tests/data/x.py", &dirs));
    }
}
