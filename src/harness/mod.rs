//! Harness adapters: how to run an unmodified coding-agent harness inside a trial container and
//! point it at the trial's proxy URL. Adapters are configuration (one TOML file per harness in
//! `examples/harnesses/`), never forks: adding a harness means adding a file.
//!
//! A config names the API flavour the harness speaks, the runtime to install once into a
//! read-only image (PyPI packages into a venv mounted at `/opt/lego-agent`), the command line,
//! environment and config files of one run, how the instruction is passed, and where the
//! harness writes its own logs. Strings may use placeholders, substituted per trial:
//!
//! | placeholder | value |
//! | --- | --- |
//! | `{instruction}` | the task's problem statement |
//! | `{workdir}` | the repository inside the container (`/testbed`) |
//! | `{home}` | the agent user's home directory |
//! | `{runtime}` | where the runtime is mounted (`/opt/lego-agent`) |
//! | `{proxy_url}` | the trial's proxy root, `http://HOST:PORT/t/<trial token>` (Anthropic base URL) |
//! | `{openai_base_url}` | `{proxy_url}/v1` |
//! | `{model}` | the model name the harness should send (`policy`) |
//! | `{max_turns}` | the turn budget |
//! | `{logs}` | the harness's log directory, created before the run (not kept with the trial; `[exit_status]` may read its status file there) |
//!
//! `[exit_status]` says where the harness records how it ended, in its own words: `file`, `format`
//! (`json`, the default, or `jsonl`: the last record of a JSON Lines file such as a teed
//! `stream-json` stdout, optionally the last one matching `record`), a JSON `pointer` to the
//! status string, and the statuses that mean `finished`, `max_turns` or `agent_crash` (see
//! [`ExitStatusConfig`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The API a harness speaks to the model.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ApiFlavor {
    Openai,
    Anthropic,
}

/// How the task instruction reaches the harness.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum InstructionVia {
    /// As `{instruction}` inside `command` (the default).
    #[default]
    Argument,
    /// On the harness's standard input.
    Stdin,
    /// Written to `instruction_file`, whose path the command refers to.
    File,
}

/// What is installed once into the read-only agent runtime.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Minimum Python version of the runtime venv (e.g. OpenHands SDK needs 3.12).
    #[serde(default)]
    pub python: Option<String>,
    /// PyPI requirements installed into the venv at `{runtime}`.
    #[serde(default)]
    pub pip: Vec<String>,
    /// Executables to link into `{runtime}/bin` after installation, as `name = "path relative
    /// to the venv's site-packages"` (e.g. Claude Code's CLI bundled in the claude-agent-sdk wheel).
    #[serde(default)]
    pub links: BTreeMap<String, String>,
    /// Set when the runtime cannot be installed from the registries reachable here (npm); the
    /// adapter is then only checked against captured traffic.
    #[serde(default)]
    pub unavailable: Option<String>,
}

/// One harness adapter, as written in its TOML file.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HarnessConfig {
    pub name: String,
    pub description: String,
    pub api: ApiFlavor,
    pub runtime: Runtime,
    /// argv of one run; the first element is the program.
    pub command: Vec<String>,
    #[serde(default)]
    pub instruction_via: InstructionVia,
    /// Where the instruction is written when `instruction_via = "file"`.
    #[serde(default)]
    pub instruction_file: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Files written into the container before the run: path → contents (both with placeholders).
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Turn budget passed as `{max_turns}`.
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// The harness's own log directory (`{logs}`), created before the run. Only the
    /// `[exit_status]` file is read back; the rest goes with the container.
    #[serde(default = "default_logs")]
    pub logs: String,
    /// Exit codes that mean "the harness stopped at its turn budget" (→ `max_turns`).
    #[serde(default)]
    pub max_turns_exit_codes: Vec<i64>,
    /// Where the harness records how it ended, read after the agent stage. Without it the turn
    /// budget is inferred: a main thread that used every turn counts as `max_turns`, even when
    /// its last turn submitted.
    #[serde(default)]
    pub exit_status: Option<ExitStatusConfig>,
}

/// A harness's own record of how it ended: a string inside a JSON (or JSON Lines) file it writes.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExitStatusConfig {
    /// The file (placeholders allowed), e.g. `{logs}/trajectory.json`.
    pub file: String,
    /// How the file is laid out: one JSON document (the default) or JSON Lines.
    #[serde(default)]
    pub format: StatusFormat,
    /// With `format = "jsonl"`, which records may carry the status: JSON pointer → the string it
    /// must lead to, e.g. `{ "/type" = "result" }`. The last record matching all of them is read
    /// (none given: the last record).
    #[serde(default)]
    pub record: BTreeMap<String, String>,
    /// JSON pointer (RFC 6901) to the status string in it, e.g. `/info/exit_status`.
    pub pointer: String,
    /// Statuses meaning the agent ended on its own (submitted) → `finished`.
    #[serde(default)]
    pub finished: Vec<String>,
    /// Statuses meaning the turn budget ran out → `max_turns`.
    #[serde(default)]
    pub max_turns: Vec<String>,
    /// Statuses meaning the harness gave up on a run the agent had not finished (its own error,
    /// its loop detection) → `agent_crash`, even when it then exited with 0.
    #[serde(default)]
    pub agent_crash: Vec<String>,
}

/// The layout of an [`ExitStatusConfig`] file.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum StatusFormat {
    /// One JSON document, e.g. mini-swe-agent's trajectory file.
    #[default]
    Json,
    /// JSON Lines, e.g. Claude Code's `stream-json` stdout teed into `{logs}`: the pointer is
    /// applied to the last JSON record that matches [`ExitStatusConfig::record`]. Lines that are
    /// not a JSON object are skipped, as claude-agent-sdk's reader of the CLI's stdout skips
    /// non-JSON lines, and so is a last line cut short when the harness was killed mid-write.
    Jsonl,
}

impl ExitStatusConfig {
    /// The status in `text` (the file's contents), if the pointer leads to a string.
    pub fn status_in(&self, text: &str) -> Option<String> {
        let v: serde_json::Value = match self.format {
            StatusFormat::Json => serde_json::from_str(text).ok()?,
            StatusFormat::Jsonl => text
                .lines()
                .rev()
                .map(str::trim)
                .filter(|l| l.starts_with('{'))
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| {
                    self.record
                        .iter()
                        .all(|(p, want)| v.pointer(p).and_then(|x| x.as_str()) == Some(want.as_str()))
                })?,
        };
        v.pointer(&self.pointer)?.as_str().map(str::to_string)
    }
}

fn default_max_turns() -> u32 {
    50
}

fn default_logs() -> String {
    "/tmp/lego-agent-logs".into()
}

/// Errors loading or rendering an adapter.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{path}: cannot read harness config: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid harness config: {msg}")]
    Parse { path: PathBuf, msg: String },
    #[error("{path}: field `{field}` uses unknown placeholder `{{{name}}}` (known: {known})")]
    UnknownPlaceholder {
        path: PathBuf,
        field: String,
        name: String,
        known: String,
    },
    #[error("{path}: {msg}")]
    Invalid { path: PathBuf, msg: String },
}

/// Placeholder names an adapter may use.
pub const PLACEHOLDERS: &[&str] = &[
    "instruction",
    "workdir",
    "home",
    "runtime",
    "proxy_url",
    "openai_base_url",
    "model",
    "max_turns",
    "logs",
];

/// Values for one trial's placeholders.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialContext {
    pub instruction: String,
    pub workdir: String,
    pub home: String,
    pub runtime: String,
    pub proxy_url: String,
    pub model: String,
}

/// A fully rendered run: what the sandbox executes as the agent user.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub files: BTreeMap<String, String>,
    pub stdin: Option<String>,
    pub logs: String,
    /// The rendered path of [`HarnessConfig::exit_status`]'s file.
    pub exit_status_file: Option<String>,
}

/// A loaded adapter.
#[derive(Debug, Clone)]
pub struct Harness {
    pub path: PathBuf,
    pub config: HarnessConfig,
}

impl Harness {
    /// Loads and checks an adapter file: parse errors and unknown placeholders name the file
    /// and the field.
    pub fn load(path: &Path) -> Result<Self, HarnessError> {
        let text = std::fs::read_to_string(path).map_err(|source| HarnessError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config: HarnessConfig = toml::from_str(&text).map_err(|e| HarnessError::Parse {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        let h = Harness {
            path: path.to_path_buf(),
            config,
        };
        h.check()?;
        Ok(h)
    }

    fn check(&self) -> Result<(), HarnessError> {
        let c = &self.config;
        let invalid = |msg: String| HarnessError::Invalid {
            path: self.path.clone(),
            msg,
        };
        if c.command.is_empty() {
            return Err(invalid("`command` is empty".into()));
        }
        if c.instruction_via == InstructionVia::File && c.instruction_file.is_none() {
            return Err(invalid(
                "`instruction_via = \"file\"` needs `instruction_file`".into(),
            ));
        }
        if c.instruction_via == InstructionVia::Argument
            && !c.command.iter().any(|a| a.contains("{instruction}"))
            && !c.files.values().any(|v| v.contains("{instruction}"))
        {
            return Err(invalid(
                "`instruction_via = \"argument\"` but no `{instruction}` in `command`".into(),
            ));
        }
        let mut fields: Vec<(String, &str)> = c
            .command
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("command[{i}]"), a.as_str()))
            .collect();
        fields.extend(c.env.iter().map(|(k, v)| (format!("env.{k}"), v.as_str())));
        fields.extend(
            c.files
                .iter()
                .map(|(k, v)| (format!("files.\"{k}\""), v.as_str())),
        );
        fields.extend(c.files.keys().map(|k| ("files (path)".to_string(), k.as_str())));
        fields.push(("logs".into(), c.logs.as_str()));
        if let Some(e) = &c.exit_status {
            fields.push(("exit_status.file".into(), e.file.as_str()));
            let pointers = std::iter::once(("pointer".to_string(), &e.pointer))
                .chain(e.record.keys().map(|k| (format!("record.\"{k}\""), k)));
            for (field, p) in pointers {
                if !p.is_empty() && !p.starts_with('/') {
                    return Err(invalid(format!(
                        "`exit_status.{field}` must be a JSON pointer starting with `/`, not `{p}`"
                    )));
                }
            }
            if !e.record.is_empty() && e.format != StatusFormat::Jsonl {
                return Err(invalid(
                    "`exit_status.record` selects records of a JSON Lines file: it needs `format = \"jsonl\"`"
                        .into(),
                ));
            }
        }
        if let Some(f) = &c.instruction_file {
            fields.push(("instruction_file".into(), f.as_str()));
        }
        for (field, text) in fields {
            for name in placeholders(text) {
                if !PLACEHOLDERS.contains(&name) {
                    return Err(HarnessError::UnknownPlaceholder {
                        path: self.path.clone(),
                        field,
                        name: name.to_string(),
                        known: PLACEHOLDERS.join(", "),
                    });
                }
            }
        }
        Ok(())
    }

    /// Renders the run for one trial.
    pub fn render(&self, ctx: &TrialContext) -> Launch {
        let c = &self.config;
        let openai = format!("{}/v1", ctx.proxy_url.trim_end_matches('/'));
        let max_turns = c.max_turns.to_string();
        let values: [(&str, &str); 9] = [
            ("instruction", &ctx.instruction),
            ("workdir", &ctx.workdir),
            ("home", &ctx.home),
            ("runtime", &ctx.runtime),
            ("proxy_url", ctx.proxy_url.trim_end_matches('/')),
            ("openai_base_url", &openai),
            ("model", &ctx.model),
            ("max_turns", &max_turns),
            ("logs", &c.logs),
        ];
        let sub = |s: &str| substitute(s, &values);
        let mut files: BTreeMap<String, String> = c.files.iter().map(|(k, v)| (sub(k), sub(v))).collect();
        if c.instruction_via == InstructionVia::File {
            let f = c.instruction_file.as_deref().expect("invariant: checked at load");
            files.insert(sub(f), ctx.instruction.clone());
        }
        Launch {
            argv: c.command.iter().map(|a| sub(a)).collect(),
            env: c.env.iter().map(|(k, v)| (k.clone(), sub(v))).collect(),
            files,
            stdin: (c.instruction_via == InstructionVia::Stdin).then(|| ctx.instruction.clone()),
            logs: c.logs.clone(),
            exit_status_file: c.exit_status.as_ref().map(|e| sub(&e.file)),
        }
    }
}

/// Placeholder names in `s` (`{name}` with name of `[a-z_]+`; other braces, e.g. JSON, are text).
fn placeholders(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find('{') {
        rest = &rest[i + 1..];
        if let Some(j) = rest.find('}') {
            let name = &rest[..j];
            if !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
                out.push(name);
            }
        }
    }
    out
}

/// Replaces `{name}` with its value in one pass, so an instruction containing `{workdir}` is not
/// expanded again.
fn substitute(s: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match after.find('}').and_then(|j| {
            values
                .iter()
                .find(|(k, _)| *k == &after[..j])
                .map(|(_, v)| (j, v))
        }) {
            Some((j, v)) => {
                out.push_str(v);
                rest = &after[j + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;
