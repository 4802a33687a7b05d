//! Forced scripts (`--forced FILE`): scripted model outputs per task, so tests and the demo drive
//! real harnesses through deterministic multi-turn episodes with a tiny random model.
//!
//! Format (JSON, `lego-rl/forced/v1`):
//!
//! ```json
//! {
//!   "schema": "lego-rl/forced/v1",
//!   "tasks": {
//!     "inflection__ordinal-teens": [
//!       ["<tool_call>\n{\"name\": \"bash\", ...}\n</tool_call>", "..."],
//!       ["..."]
//!     ],
//!     "*": [["..."]]
//!   }
//! }
//! ```
//!
//! Each task maps to a list of scripts; a script is the list of raw model outputs (chat-template
//! text, e.g. Qwen3 `<tool_call>` markup) forced on the trial's generations in request order.
//! The `k`-th sample of a group on a harness gets script `k mod len` of that harness's file (with
//! one harness, sample `s` gets script `s mod len`), so two scripts alternate within a group, on
//! each harness of a mixed group too: a group split across harnesses sample by sample would
//! otherwise give each harness only every other script. `"*"`
//! applies to tasks not listed. Generations after the script's end are sampled normally; the
//! engine computes the true log-probs and routing of forced tokens either way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The schema tag of a forced-scripts file.
pub const SCHEMA: &str = "lego-rl/forced/v1";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    schema: String,
    tasks: BTreeMap<String, Vec<Vec<String>>>,
}

/// Loaded forced scripts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Forced {
    tasks: BTreeMap<String, Vec<Vec<String>>>,
}

/// Errors reading a forced-scripts file; each names the file and, where it applies, the task.
#[derive(Debug, thiserror::Error)]
pub enum ForcedError {
    #[error("{path}: cannot read forced scripts: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid forced scripts: {msg}")]
    Parse { path: PathBuf, msg: String },
}

impl Forced {
    /// Reads and checks a forced-scripts file.
    pub fn load(path: &Path) -> Result<Self, ForcedError> {
        let text = std::fs::read_to_string(path).map_err(|source| ForcedError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|msg| ForcedError::Parse {
            path: path.to_path_buf(),
            msg,
        })
    }

    /// Parses the JSON text of a forced-scripts file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let f: File = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if f.schema != SCHEMA {
            return Err(format!("field `schema` is `{}`, expected `{SCHEMA}`", f.schema));
        }
        for (task, scripts) in &f.tasks {
            if scripts.is_empty() {
                return Err(format!("field `tasks.{task}` has no scripts"));
            }
        }
        Ok(Forced { tasks: f.tasks })
    }

    /// The outputs forced on the `rank`-th sample of a group of `task_id` on this file's harness
    /// (empty when none).
    pub fn script(&self, task_id: &str, rank: u32) -> &[String] {
        match self.tasks.get(task_id).or_else(|| self.tasks.get("*")) {
            Some(scripts) => &scripts[rank as usize % scripts.len()],
            None => &[],
        }
    }

    /// Task ids named in the file (without `*`).
    pub fn task_ids(&self) -> impl Iterator<Item = &str> {
        self.tasks.keys().map(String::as_str).filter(|k| *k != "*")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_alternate_and_fall_back_to_star() {
        let f = Forced::parse(
            r#"{"schema": "lego-rl/forced/v1", "tasks": {"a": [["x1", "x2"], ["y"]], "*": [["z"]]}}"#,
        )
        .unwrap();
        assert_eq!(f.script("a", 0), ["x1", "x2"]);
        assert_eq!(f.script("a", 1), ["y"]);
        assert_eq!(f.script("a", 4), ["x1", "x2"]);
        assert_eq!(f.script("b", 3), ["z"]);
        assert_eq!(f.task_ids().collect::<Vec<_>>(), ["a"]);
        let none = Forced::parse(r#"{"schema": "lego-rl/forced/v1", "tasks": {}}"#).unwrap();
        assert!(none.script("a", 0).is_empty());
    }

    #[test]
    fn bad_files_name_the_field() {
        let e = Forced::parse(r#"{"schema": "x", "tasks": {}}"#).unwrap_err();
        assert!(e.contains("schema"), "{e}");
        let e = Forced::parse(r#"{"schema": "lego-rl/forced/v1", "tasks": {"a": []}}"#).unwrap_err();
        assert!(e.contains("tasks.a"), "{e}");
        let e = Forced::parse(r#"{"schema": "lego-rl/forced/v1", "tasks": {}, "extra": 1}"#).unwrap_err();
        assert!(e.contains("extra"), "{e}");
    }
}
