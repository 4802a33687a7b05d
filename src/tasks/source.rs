//! Input enumeration and per-record parsing shared by the pool reader and the loaders of
//! evaluation sets: a path is a Harbor task directory, a directory of them, a JSON Lines file
//! (zstd or plain; SWE-bench records or lego-rl `Task` records, told apart per record by the
//! `schema` field), or a `.json` file holding one array of records.

use std::path::{Path, PathBuf};

use serde_json::value::RawValue;

use super::facts::Facts;
use super::view::{parse_fields, render_swebench, swebench_facts, Fields};
use super::{harbor, swebench_repo, TaskError};
use crate::io::{open_lines, LineSource, TornTail};
use crate::records::{check_schema, Task};

/// One parsed record of any accepted format.
pub enum Parsed<'a> {
    /// A SWE-bench line (its raw fields): converted to a `Task` only when kept.
    Swebench(Facts, Fields<'a>),
    /// A lego-rl task record (from JSONL) or a Harbor directory; the flag says its relative
    /// paths were resolved (so the record must be re-serialised rather than passed through).
    Task(Box<Task>, Facts, bool),
}

impl Parsed<'_> {
    /// The facts the stages decide on.
    pub fn facts(&self) -> &Facts {
        match self {
            Parsed::Swebench(f, _) | Parsed::Task(_, f, _) => f,
        }
    }
}

/// Parses one JSON record (a JSONL line or an array element).
pub fn parse_record<'a>(path: &Path, line: u64, text: &'a str) -> Result<Parsed<'a>, TaskError> {
    let fields = parse_fields(path, line, text)?;
    if fields.get("schema").is_some() {
        let mut task: Task = serde_json::from_str(text).map_err(|e| TaskError::BadTaskRecord {
            path: path.to_path_buf(),
            line,
            msg: e.to_string(),
        })?;
        check_schema::<Task>(&task.schema).map_err(|e| TaskError::BadTaskRecord {
            path: path.to_path_buf(),
            line,
            msg: e.to_string(),
        })?;
        if task.id.trim().is_empty() {
            return Err(TaskError::BadField {
                path: path.to_path_buf(),
                line,
                field: "id".into(),
                msg: "is empty".into(),
            });
        }
        // Relative paths are relative to the file the record came from; make them absolute so
        // the kept record works from wherever it is written (the run directory).
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        let rewritten = task.absolutize_paths(&dir);
        let facts = Facts::of_task(&task);
        return Ok(Parsed::Task(Box::new(task), facts, rewritten));
    }
    let facts = swebench_facts(path, line, &fields)?;
    Ok(Parsed::Swebench(facts, fields))
}

/// The kept record as one JSON line (with newline): SWE-bench converted to a `Task`, lego-rl
/// records passed through as read, Harbor tasks serialised.
pub fn render(path: &Path, line: u64, text: Option<&str>, parsed: &Parsed<'_>) -> Result<Vec<u8>, TaskError> {
    let ser = |t: &Task| {
        serde_json::to_vec(t).map_err(|e| TaskError::Input {
            path: path.to_path_buf(),
            msg: format!("cannot serialise task: {e}"),
        })
    };
    let mut out = match (parsed, text) {
        (Parsed::Swebench(_, fields), _) => {
            let mut v = Vec::with_capacity(text.map_or(4096, |t| t.len() + 512));
            render_swebench(fields, &mut v).map_err(|msg| TaskError::Input {
                path: path.to_path_buf(),
                msg: format!("record {line}: cannot convert to a task: {msg}"),
            })?;
            v
        }
        (Parsed::Task(_, _, false), Some(text)) => text.trim_end().as_bytes().to_vec(),
        (Parsed::Task(task, _, _), _) => ser(task)?,
    };
    out.push(b'\n');
    Ok(out)
}

/// What an input path holds.
#[derive(Debug)]
pub enum InputKind {
    /// JSON Lines, or a `.json` array (detected from the first non-blank character).
    Records(PathBuf),
    /// Task directories (Harbor or swebench 5.x), sorted; read with [`load_dir`].
    TaskDirs(Vec<PathBuf>),
}

/// Classifies an input path. A directory is one task directory (Harbor `task.toml` or swebench
/// `task.yaml`), a swebench task repository (`tasks/<id>/task.yaml`), or a directory whose
/// subdirectories are task directories.
pub fn classify(path: &Path) -> Result<InputKind, TaskError> {
    if !path.is_dir() {
        return Ok(InputKind::Records(path.to_path_buf()));
    }
    if harbor::is_task_dir(path) || swebench_repo::is_task_dir(path) {
        return Ok(InputKind::TaskDirs(vec![path.to_path_buf()]));
    }
    if let Some(dirs) = swebench_repo::repo_task_dirs(path)? {
        return Ok(InputKind::TaskDirs(dirs));
    }
    let dirs = subdirs(path, |p| harbor::is_task_dir(p) || swebench_repo::is_task_dir(p))?;
    if dirs.is_empty() {
        return Err(TaskError::TaskDir {
            path: path.to_path_buf(),
            msg: "not a task directory (no Harbor task.toml, no swebench task.yaml), a swebench task \
                  repository (no tasks/) or a directory of task directories"
                .into(),
        });
    }
    Ok(InputKind::TaskDirs(dirs))
}

/// The immediate subdirectories of `dir` for which `is_task` holds, sorted by name.
pub(crate) fn subdirs(dir: &Path, is_task: impl Fn(&Path) -> bool) -> Result<Vec<PathBuf>, TaskError> {
    let err = |e: std::io::Error| TaskError::TaskDir {
        path: dir.to_path_buf(),
        msg: e.to_string(),
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let p = entry.map_err(err)?.path();
        if p.is_dir() && is_task(&p) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Reads one task directory of either layout.
pub fn load_dir(dir: &Path) -> Result<Task, TaskError> {
    if harbor::is_task_dir(dir) {
        harbor::load(dir)
    } else {
        swebench_repo::load(dir)
    }
}

/// Reads the lines of a record file. A file whose first non-blank line starts with `[` is a
/// JSON array: it is read whole and its elements become the records, numbered from 1.
pub struct RecordLines {
    src: LineSource,
    array: Option<std::vec::IntoIter<(u64, String)>>,
    first: Option<(u64, String)>,
}

impl RecordLines {
    /// Opens a record file (zstd or plain; `-` = stdin).
    pub fn open(path: &Path) -> Result<Self, TaskError> {
        let mut src = open_lines(path, TornTail::Error)?;
        let first = src.next_line()?;
        let mut me = RecordLines {
            src,
            array: None,
            first: None,
        };
        match first {
            Some((n, text)) if text.trim_start().starts_with('[') => {
                let mut whole = text;
                while let Some((_, t)) = me.src.next_line()? {
                    whole.push('\n');
                    whole.push_str(&t);
                }
                let items: Vec<Box<RawValue>> =
                    serde_json::from_str(&whole).map_err(|e| TaskError::NotJson {
                        path: path.to_path_buf(),
                        line: n,
                        msg: format!("file starts with `[` but is not a JSON array: {e}"),
                    })?;
                let recs: Vec<(u64, String)> = items
                    .into_iter()
                    .enumerate()
                    .map(|(i, r)| (i as u64 + 1, r.get().to_string()))
                    .collect();
                me.array = Some(recs.into_iter());
            }
            other => me.first = other,
        }
        Ok(me)
    }

    /// Whether the file is a JSON array (read whole) rather than JSON Lines.
    pub fn is_array(&self) -> bool {
        self.array.is_some()
    }

    /// The next (record number, text).
    pub fn next_record(&mut self) -> Result<Option<(u64, String)>, TaskError> {
        if let Some(arr) = &mut self.array {
            return Ok(arr.next());
        }
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        Ok(self.src.next_line()?)
    }
}
