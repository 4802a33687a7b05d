//! `report --summarize`: one line of cause per failed or infra-failed trial, asked of the
//! assistant about the trial's condensed record, grouped into `diagnosis.md` (causes with counts
//! and example links into the report page, and each cause's share of every step's failed
//! trials) and `diagnosis.csv` (one row per trial, for scripts).
//!
//! Causes are grouped by their text after normalisation (case, surrounding punctuation and
//! quotes, repeated spaces), not by meaning: a second model call to cluster them would hide
//! what each trial's answer was. A request that still fails after its retries is recorded as
//! `unknown (…)` with the error, never dropped, so the counts add up to the failed trials.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::prompt::{self, CAUSE_QUESTION};
use super::Assistant;
use crate::io::ReadOptions;
use crate::report::data;
use crate::report::ReportError;
use crate::validate::run::{for_each_trajectory, RunFiles};

/// Settings of `--summarize`.
#[derive(Debug, Clone)]
pub struct SummarizeSettings {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Most prompt tokens per trial (the endpoint's own budget caps it too).
    pub max_prompt_tokens: usize,
    /// Retries of a failed request before its cause is `unknown`.
    pub retries: u32,
    pub progress: bool,
}

/// One trial's cause.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Cause {
    pub id: String,
    pub task_id: String,
    pub step: u64,
    pub termination: String,
    pub reward: Option<f64>,
    pub infra: bool,
    /// The answer's first line, normalised (or `unknown (error)`).
    pub cause: String,
    /// Whether the assistant answered.
    pub answered: bool,
}

/// What `summarize` wrote.
#[derive(Debug, Clone)]
pub struct Diagnosis {
    pub causes: Vec<Cause>,
    pub files: Vec<PathBuf>,
    /// Trial ids the report page should embed so that the examples' links open.
    pub examples: Vec<String>,
}

struct Item {
    summary: data::TrajSummary,
    prompt: prompt::AssistPrompt,
}

/// The first line of an answer as a cause: list markers, quotes and a trailing period dropped,
/// spaces collapsed, at most 160 characters.
pub fn normalise(answer: &str) -> String {
    let line = answer
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let line = line
        .trim_start_matches(['-', '*', '•', '#', ' '])
        .trim_start_matches("Cause:")
        .trim_start_matches("cause:")
        .trim()
        .trim_matches(['"', '\'', '`', '*'])
        .trim_end_matches('.')
        .trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    let s = words.join(" ");
    let s: String = s.chars().take(160).collect();
    if s.is_empty() {
        "unknown (empty answer)".into()
    } else {
        s
    }
}

/// Reads the run's failed trials, asks for each one's cause, and writes `diagnosis.md` and
/// `diagnosis.csv` into `out`.
pub async fn summarize(
    files: &RunFiles,
    opts: ReadOptions,
    assistant: Arc<Assistant>,
    s: &SummarizeSettings,
    out: &Path,
) -> Result<Diagnosis, ReportError> {
    let budget = assistant
        .prompt_budget(&[])
        .map_err(|e| ReportError::Assist(e.to_string()))?
        .min(s.max_prompt_tokens);
    let mut items = Vec::new();
    let mut total = 0u64;
    let counter = assistant.counter.clone();
    // Prompts are built while streaming (each is capped), so memory holds no whole record.
    for_each_trajectory(files, opts, |step, _, t| {
        total += 1;
        let failed = t.is_infra_failure() || t.reward.is_none_or(|r| r < 0.5);
        if failed {
            let d = data::detail(step, t);
            let p = prompt::build(&d, CAUSE_QUESTION, budget, &counter);
            items.push(Item {
                summary: d.summary,
                prompt: p,
            });
        }
    })?;
    let bar = crate::ui::bar(s.progress, items.len() as u64, "summarize");
    let retries = s.retries;
    let causes: Vec<Cause> = futures::stream::iter(items)
        .map(|item| {
            let a = assistant.clone();
            let bar = bar.clone();
            async move {
                let messages = Assistant::messages(&item.prompt, &[]);
                let mut last = String::new();
                let mut answer = None;
                for attempt in 0..=retries {
                    if attempt > 0 {
                        tokio::time::sleep(Duration::from_millis(500 << (attempt - 1).min(4))).await;
                    }
                    match a.complete(messages.clone()).await {
                        Ok(t) => {
                            answer = Some(t);
                            break;
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                bar.inc(1);
                let sm = item.summary;
                Cause {
                    cause: match &answer {
                        Some(t) => normalise(t),
                        None => format!(
                            "unknown ({})",
                            prompt::cut_middle(&last, 120).0.replace('\n', " ")
                        ),
                    },
                    answered: answer.is_some(),
                    id: sm.id,
                    task_id: sm.task_id,
                    step: sm.step,
                    termination: sm.termination,
                    reward: sm.reward,
                    infra: sm.infra,
                }
            }
        })
        .buffered(s.concurrency.max(1))
        .collect()
        .await;
    bar.finish_and_clear();
    let groups = group(&causes);
    let examples: Vec<String> = groups
        .iter()
        .flat_map(|g| g.ids.iter().take(3).cloned())
        .collect();
    std::fs::create_dir_all(out).map_err(|source| ReportError::CreateDir {
        path: out.to_path_buf(),
        source,
    })?;
    let md = markdown(&files.root, assistant.label(), total, budget, &causes, &groups);
    let p_md = out.join("diagnosis.md");
    super::super::write_plain(&p_md, md.as_bytes())?;
    let p_csv = out.join("diagnosis.csv");
    super::super::write_plain(&p_csv, &csv_bytes(&causes)?)?;
    Ok(Diagnosis {
        causes,
        files: vec![p_md, p_csv],
        examples,
    })
}

/// Trials sharing a cause (case aside), most frequent first.
struct Group {
    cause: String,
    ids: Vec<String>,
    per_step: BTreeMap<u64, u64>,
}

fn group(causes: &[Cause]) -> Vec<Group> {
    let mut by: HashMap<String, usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for c in causes {
        let key = if c.answered {
            c.cause.to_lowercase()
        } else {
            "unknown".into()
        };
        let i = *by.entry(key).or_insert_with(|| {
            groups.push(Group {
                cause: if c.answered {
                    c.cause.clone()
                } else {
                    "unknown".into()
                },
                ids: Vec::new(),
                per_step: BTreeMap::new(),
            });
            groups.len() - 1
        });
        groups[i].ids.push(c.id.clone());
        *groups[i].per_step.entry(c.step).or_default() += 1;
    }
    groups.sort_by(|a, b| b.ids.len().cmp(&a.ids.len()).then_with(|| a.cause.cmp(&b.cause)));
    groups
}

/// Markdown table cell text: no pipes or line breaks.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// The page link of a trial (the page's `#traj=` takes the id URI-encoded).
pub fn link(id: &str) -> String {
    let enc: String = id
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("index.html#traj={enc}")
}

fn markdown(
    root: &Option<PathBuf>,
    label: &str,
    total: u64,
    budget: usize,
    causes: &[Cause],
    groups: &[Group],
) -> String {
    let run = root
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let unanswered = causes.iter().filter(|c| !c.answered).count();
    let mut m = format!("# Failure diagnosis of {run}\n\n");
    let _ = writeln!(
        m,
        "{} of {total} trials failed or were infra failures. The assistant ({}) was asked about each one's \
condensed record (at most {budget} prompt tokens): \"{CAUSE_QUESTION}\" Causes are grouped by their text \
(case, quotes and punctuation aside), not by meaning. {unanswered} requests failed after their retries and \
count as \"unknown\"; per-trial causes are in diagnosis.csv.\n",
        causes.len(),
        cell(label),
    );
    let _ = writeln!(
        m,
        "## Causes\n\n| cause | trials | share | examples |\n|---|---:|---:|---|"
    );
    let n = causes.len().max(1) as f64;
    for g in groups {
        let ex: Vec<String> = g
            .ids
            .iter()
            .take(3)
            .map(|id| format!("[{}]({})", cell(id), link(id)))
            .collect();
        let _ = writeln!(
            m,
            "| {} | {} | {:.1}% | {} |",
            cell(&g.cause),
            g.ids.len(),
            100.0 * g.ids.len() as f64 / n,
            ex.join(", ")
        );
    }
    let mut per_step: BTreeMap<u64, u64> = BTreeMap::new();
    for c in causes {
        *per_step.entry(c.step).or_default() += 1;
    }
    let _ = writeln!(m, "\n## Share of each step's failed trials per cause\n");
    let _ = writeln!(
        m,
        "| cause | {} |\n|---|{}",
        per_step
            .keys()
            .map(|s| format!("step {s}"))
            .collect::<Vec<_>>()
            .join(" | "),
        "---:|".repeat(per_step.len())
    );
    for g in groups {
        let shares: Vec<String> = per_step
            .iter()
            .map(|(step, n)| {
                let k = g.per_step.get(step).copied().unwrap_or(0);
                format!("{:.1}%", 100.0 * k as f64 / *n as f64)
            })
            .collect();
        let _ = writeln!(m, "| {} | {} |", cell(&g.cause), shares.join(" | "));
    }
    let _ = writeln!(
        m,
        "| (failed trials) | {} |",
        per_step
            .values()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" | ")
    );
    m
}

fn csv_bytes(causes: &[Cause]) -> Result<Vec<u8>, ReportError> {
    let csv_err = |e: csv::Error| ReportError::Csv {
        table: "diagnosis.csv".into(),
        msg: e.to_string(),
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "id",
        "task_id",
        "step",
        "termination",
        "reward",
        "infra",
        "answered",
        "cause",
    ])
    .map_err(csv_err)?;
    for c in causes {
        w.write_record([
            c.id.as_str(),
            &c.task_id,
            &c.step.to_string(),
            &c.termination,
            &c.reward.map(|r| r.to_string()).unwrap_or_default(),
            &c.infra.to_string(),
            &c.answered.to_string(),
            &c.cause,
        ])
        .map_err(csv_err)?;
    }
    w.into_inner().map_err(|e| ReportError::Csv {
        table: "diagnosis.csv".into(),
        msg: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cause(id: &str, step: u64, text: &str, answered: bool) -> Cause {
        Cause {
            id: id.into(),
            task_id: "t".into(),
            step,
            termination: "submitted".into(),
            reward: Some(0.0),
            infra: false,
            cause: text.into(),
            answered,
        }
    }

    #[test]
    fn answers_become_causes() {
        assert_eq!(
            normalise("\n- Cause: \"Edited the wrong file.\"\nmore"),
            "Edited the wrong file"
        );
        assert_eq!(normalise("  "), "unknown (empty answer)");
        assert_eq!(normalise("a   b\tc"), "a b c");
    }

    #[test]
    fn causes_group_by_text_with_shares_per_step() {
        let c = vec![
            cause("a/1/0", 0, "Wrong file", true),
            cause("a/1/1", 0, "wrong file", true),
            cause("b/2/0", 1, "Timed out", true),
            cause("b/2/1", 1, "unknown (HTTP 500)", false),
        ];
        let g = group(&c);
        assert_eq!(g[0].cause, "Wrong file");
        assert_eq!(g[0].ids.len(), 2);
        let md = markdown(&None, "m", 10, 100, &c, &g);
        assert!(md.contains("| Wrong file | 2 | 50.0% | [a/1/0](index.html#traj=a%2F1%2F0), [a/1/1](index.html#traj=a%2F1%2F1) |"), "{md}");
        assert!(md.contains("| unknown | 1 | 25.0% |"), "{md}");
        assert!(md.contains("| Wrong file | 100.0% | 0.0% |"), "{md}");
        assert!(md.contains("| (failed trials) | 2 | 2 |"), "{md}");
        let csv = String::from_utf8(csv_bytes(&c).unwrap()).unwrap();
        assert_eq!(csv.lines().count(), 5);
    }
}
