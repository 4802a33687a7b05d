//! The prompt the assistant gets about one trajectory, built from its record within a token
//! budget: the instruction, the outcome and termination, the grader's failing tests and log
//! tail, the audit events, the rollout-vs-trainer agreement, and the main thread's turns with
//! their tool calls. Long texts are cut head and tail; when the turns still do not fit, turns
//! are dropped from the middle (the first and the last ones say most about what happened). The
//! prompt ends with a "Left out" list that names everything cut or dropped, so neither the
//! model nor the reader mistakes a condensed record for the whole one.

use std::fmt::Write as _;

use serde::Serialize;

use crate::chat::ChatFormat;
use crate::report::behaviour::{Thread, Turn};
use crate::report::data::TrajDetail;
pub use crate::text::cut_middle;

/// The assistant's system message.
pub const SYSTEM: &str = "You diagnose trajectories of a coding agent trained with reinforcement \
learning: an agent harness drove the policy model through tool calls in a sandboxed repository, \
and the repository's tests graded the result (reward 1 = the hidden tests pass). Answer from the \
record you are given; cite turns as [n]; say when the record does not show something.";

/// The default question of the Ask box.
pub const DEFAULT_QUESTION: &str =
    "Why did this trajectory fail or succeed, and what did the agent do first that mattered?";

/// The question `report --summarize` asks about each failed trial.
pub const CAUSE_QUESTION: &str = "In one line of at most 15 words, without preamble: what caused \
this trajectory to fail?";

/// Counts prompt tokens: exactly with the assistant's tokenizer when one is known, else an
/// estimate of one token per 3 characters (code and English run at 3.5-4.5 characters per token
/// with the Qwen and GPT tokenizers, so the estimate errs on the safe side).
#[derive(Clone)]
pub enum TokenCounter {
    Exact(std::sync::Arc<ChatFormat>),
    Estimate,
}

impl TokenCounter {
    pub fn count(&self, text: &str) -> usize {
        match self {
            TokenCounter::Exact(chat) => chat.encode(text).map_or(text.len().div_ceil(3), |ids| ids.len()),
            TokenCounter::Estimate => text.chars().count().div_ceil(3),
        }
    }

    pub fn is_exact(&self) -> bool {
        matches!(self, TokenCounter::Exact(_))
    }
}

/// A prompt about one trajectory.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AssistPrompt {
    pub system: String,
    /// The record, condensed, followed by the question.
    pub user: String,
    /// What was cut or dropped (also listed at the end of `user`).
    pub left_out: Vec<String>,
    /// Tokens of `system` + `user` as counted (exact or estimated, see `exact`).
    pub tokens: usize,
    pub budget: usize,
    pub exact: bool,
}

/// Character caps of one rendering pass; halved until the turns fit.
#[derive(Debug, Clone, Copy)]
struct Caps {
    text: usize,
    args: usize,
    output: usize,
}

const FIRST_CAPS: Caps = Caps {
    text: 2000,
    args: 1200,
    output: 2400,
};
const MIN_CAPS: Caps = Caps {
    text: 300,
    args: 200,
    output: 300,
};

fn outcome(d: &TrajDetail) -> String {
    let s = &d.summary;
    let verdict = match (s.infra, s.reward) {
        (true, _) => "infrastructure failure (not graded on the agent's merit)".to_string(),
        (false, Some(r)) if r >= 0.5 => format!("reward {r} (passed)"),
        (false, Some(r)) => format!("reward {r} (failed)"),
        (false, None) => "not graded".to_string(),
    };
    format!(
        "{verdict}; termination: {}; harness: {}; step {}; {} turns, {} tool calls, {} response tokens",
        s.termination, s.harness, s.step, s.turns, s.tool_calls, s.response_tokens
    )
}

fn grader(d: &TrajDetail, budget_chars: usize, names: usize, left_out: &mut Vec<String>) -> String {
    let Some(g) = &d.grader else {
        return "no grader result\n".into();
    };
    let mut out = String::new();
    let failing: Vec<&String> = g
        .tests
        .iter()
        .filter(|(_, v)| v.as_str() != "PASSED")
        .map(|(k, _)| k)
        .collect();
    if let Some(code) = g.exit_code {
        let _ = writeln!(out, "exit code {code}");
    }
    if let Some(r) = &g.reason {
        let _ = writeln!(out, "reason: {r}");
    }
    let _ = writeln!(out, "{} of {} tests not passing", failing.len(), g.tests.len());
    for (i, t) in failing.iter().enumerate() {
        if i == names {
            left_out.push(format!("{} more failing test names", failing.len() - names));
            break;
        }
        let _ = writeln!(out, "- {t}: {}", g.tests[*t]);
    }
    if let Some(tail) = &g.log_tail {
        let (t, cut) = cut_middle(tail, budget_chars);
        if cut {
            left_out.push(format!("the grader log tail, cut to {budget_chars} characters"));
        }
        let _ = writeln!(out, "log tail:\n{t}");
    }
    out
}

fn agreement(d: &TrajDetail) -> String {
    if let Some(a) = &d.agreement {
        let f = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.5}"));
        let g = &a.figures;
        return format!(
            "train-step {} on {} policy tokens in {} samples: Pearson {}, mean |Δ log-prob| {}, max {}, KL {} (trainer minus rollout)\n",
            a.step,
            g.policy_tokens,
            g.samples,
            f(g.logprob_pearson),
            f(g.logprob_mean_abs_diff),
            f(g.logprob_max_abs_diff),
            f(g.logprob_kl)
        );
    }
    let diffs: Vec<f32> = d
        .logprob_diffs
        .iter()
        .flat_map(|t| t.diff.iter().copied())
        .collect();
    if diffs.is_empty() {
        return "not recorded (no trained samples with trainer log-probs)\n".into();
    }
    let mean = diffs.iter().map(|x| x.abs() as f64).sum::<f64>() / diffs.len() as f64;
    let max = diffs.iter().fold(0f32, |m, x| m.max(x.abs()));
    format!(
        "{} policy tokens in {} samples: mean |Δ log-prob| {mean:.4}, max {max:.4} (trainer minus rollout)\n",
        diffs.len(),
        d.logprob_diffs.len()
    )
}

/// The instruction: the first user message of the main thread.
fn instruction(th: Option<&Thread>) -> String {
    th.and_then(|t| t.turns.iter().find(|x| x.role == "user" && !x.only_results))
        .map(|t| t.text.clone())
        .unwrap_or_default()
}

fn render_turn(n: usize, t: &Turn, caps: Caps) -> (String, usize) {
    let mut cuts = 0;
    let mut out = format!("[{n}] {}", t.role);
    if !t.text.trim().is_empty() {
        let (x, c) = cut_middle(t.text.trim(), caps.text);
        cuts += c as usize;
        let _ = write!(out, ": {x}");
    }
    out.push('\n');
    for call in &t.calls {
        let (a, c) = cut_middle(&call.args, caps.args);
        cuts += c as usize;
        let _ = writeln!(out, "  → {}({a})", call.name);
        if let Some(o) = &call.output {
            let (o, c) = cut_middle(o, caps.output);
            cuts += c as usize;
            let flag = match call.failed {
                Some(true) => " (failed)",
                _ if call.is_error => " (error)",
                _ => "",
            };
            let _ = writeln!(out, "    output{flag}: {o}");
        }
    }
    (out, cuts)
}

/// Builds the prompt about `d` for `question`, within `budget` tokens as `counter` counts them.
///
/// Every section takes a share of the budget; when the whole does not fit, the shares halve
/// (instruction, grader, audit, question, turns) until it does, and a last resort cuts the
/// record's middle. Whatever was cut or dropped is listed under "Left out".
pub fn build(d: &TrajDetail, question: &str, budget: usize, counter: &TokenCounter) -> AssistPrompt {
    let mut p = build_at(d, question, budget, counter, 1);
    let mut scale = 1;
    while p.tokens > budget && scale < 64 {
        scale *= 2;
        p = build_at(d, question, budget, counter, scale);
    }
    if p.tokens > budget {
        force_fit(&mut p, budget, counter);
    }
    p
}

/// The last resort of [`build`]: the record (everything before "## Left out") cut in its middle
/// until the prompt fits.
fn force_fit(p: &mut AssistPrompt, budget: usize, counter: &TokenCounter) {
    let at = p.user.find("\n## Left out").unwrap_or(p.user.len());
    let (record, rest) = p.user.split_at(at);
    let (record, rest) = (record.to_string(), rest.to_string());
    let note = "the middle of the condensed record (the shares of every section were not small enough)";
    p.left_out.push(note.into());
    let rest = rest.replacen("\n## Left out\n", &format!("\n## Left out\n- {note}\n"), 1);
    let mut chars = record.chars().count();
    loop {
        chars = chars * 3 / 4;
        let (r, _) = cut_middle(&record, chars);
        let user = format!("{r}{rest}");
        let tokens = counter.count(SYSTEM) + counter.count(&user);
        if tokens <= budget || chars < 40 {
            p.user = user;
            p.tokens = tokens;
            return;
        }
    }
}

/// The instruction, outcome, grader, audit and agreement sections at `scale` (1 = full shares;
/// each doubling halves them).
fn head(d: &TrajDetail, budget: usize, scale: usize, left_out: &mut Vec<String>) -> String {
    let main = d.threads.first();
    let (instr, cut) = cut_middle(instruction(main).trim(), (budget * 3 / 4 / scale).max(120));
    if cut {
        left_out.push("the middle of the instruction".into());
    }
    let mut head = String::new();
    let _ = writeln!(
        head,
        "# Trajectory {} of task {}\n",
        d.summary.id, d.summary.task_id
    );
    let _ = writeln!(head, "## Instruction\n{instr}\n");
    let _ = writeln!(head, "## Outcome\n{}\n", outcome(d));
    let names = (20 / scale).max(2);
    let _ = writeln!(
        head,
        "## Grader\n{}",
        grader(d, (budget * 3 / 8 / scale).max(80), names, left_out)
    );
    if !d.audit.is_empty() {
        let (most, detail) = ((20 / scale).max(2), (300 / scale).max(60));
        let _ = writeln!(head, "## Audit events (reward-integrity checks)");
        let mut cut_details = 0;
        for (i, a) in d.audit.iter().enumerate() {
            if i == most {
                left_out.push(format!("{} more audit events", d.audit.len() - most));
                break;
            }
            let (text, cut) = cut_middle(&a.detail, detail);
            cut_details += usize::from(cut);
            let _ = writeln!(head, "- {}: {text}", a.kind);
        }
        if cut_details > 0 {
            left_out.push(format!("the middle of {cut_details} audit details"));
        }
        head.push('\n');
    }
    let _ = writeln!(head, "## Rollout-vs-trainer agreement\n{}", agreement(d));
    head
}

fn build_at(
    d: &TrajDetail,
    question: &str,
    budget: usize,
    counter: &TokenCounter,
    scale: usize,
) -> AssistPrompt {
    let mut left_out = Vec::new();
    let main = d.threads.first();
    let head = head(d, budget, scale, &mut left_out);
    if d.threads.len() > 1 {
        let others: usize = d.threads[1..].iter().map(|t| t.turns.len()).sum();
        left_out.push(format!(
            "{} other threads (sub-agents or side requests, {others} turns)",
            d.threads.len() - 1
        ));
    }
    left_out.push("the harness's system prompt and tool definitions".into());
    let (q, cut) = cut_middle(question, (budget * 3 / 4 / scale).max(200));
    if cut {
        left_out.push("the middle of the question".into());
    }
    let tail = format!("## Question\n{q}\n");

    let turns: Vec<&Turn> = main
        .map(|t| {
            t.turns
                .iter()
                .filter(|x| !(x.only_results && x.calls.is_empty()))
                .collect()
        })
        .unwrap_or_default();
    // The first user turn is the instruction, shown above.
    let skip = turns.iter().position(|t| t.role == "user").map_or(0, |i| i + 1);
    let left_out_room: usize = left_out.iter().map(|l| counter.count(l) + 2).sum::<usize>() + 80;
    let fixed = counter.count(SYSTEM) + counter.count(&head) + counter.count(&tail) + left_out_room;
    let min_caps = Caps {
        text: MIN_CAPS.text / scale,
        args: MIN_CAPS.args / scale,
        output: MIN_CAPS.output / scale,
    };
    let mut caps = FIRST_CAPS;
    let (rendered, cuts) = loop {
        let r: Vec<(String, usize)> = turns
            .iter()
            .enumerate()
            .skip(skip)
            .map(|(i, t)| render_turn(i, t, caps))
            .collect();
        let total: usize = r.iter().map(|(s, _)| counter.count(s)).sum();
        if fixed + total <= budget || caps.output <= min_caps.output {
            let cuts = r.iter().map(|(_, c)| c).sum::<usize>();
            break (r.into_iter().map(|(s, _)| s).collect::<Vec<_>>(), cuts);
        }
        caps = Caps {
            text: (caps.text / 2).max(min_caps.text),
            args: (caps.args / 2).max(min_caps.args),
            output: (caps.output / 2).max(min_caps.output),
        };
    };
    if cuts > 0 {
        left_out.push(format!(
            "the middle of {cuts} long messages, arguments or outputs (kept: {} characters of text, {} of arguments, {} of output, head and tail)",
            caps.text, caps.args, caps.output
        ));
    }
    let sizes: Vec<usize> = rendered.iter().map(|s| counter.count(s)).collect();
    // The pieces are counted apart; the whole can differ by a few tokens where they join, and
    // the "Left out" list comes last, so the room shrinks until the whole fits.
    let mut room = budget.saturating_sub(fixed);
    loop {
        let keep = keep_turns(&sizes, room);
        let mut body = String::from("## Turns of the main thread\n");
        let mut dropped = 0;
        for (i, s) in rendered.iter().enumerate() {
            if keep(i) {
                body.push_str(s);
            } else {
                if dropped == 0 {
                    body.push_str("[… turns dropped here, see Left out …]\n");
                }
                dropped += 1;
            }
        }
        let mut left = left_out.clone();
        if dropped > 0 {
            left.push(format!("{dropped} of {} turns from the middle", rendered.len()));
        }
        let mut user = head.clone();
        user.push_str(&body);
        let _ = writeln!(user, "\n## Left out");
        for l in &left {
            let _ = writeln!(user, "- {l}");
        }
        user.push('\n');
        user.push_str(&tail);
        let tokens = counter.count(SYSTEM) + counter.count(&user);
        if tokens <= budget || room == 0 {
            return AssistPrompt {
                system: SYSTEM.to_string(),
                user,
                left_out: left,
                tokens,
                budget,
                exact: counter.is_exact(),
            };
        }
        room = room.saturating_sub(tokens - budget + 16);
    }
}

/// Which turns fit in `room` tokens: all when they do; otherwise the last one (how the
/// trajectory ended), the first two and as many more of the last as fit, with 10% of the room
/// kept free for where pieces join.
fn keep_turns(sizes: &[usize], room: usize) -> Box<dyn Fn(usize) -> bool> {
    let n = sizes.len();
    let total: usize = sizes.iter().sum();
    if total <= room {
        return Box::new(|_| true);
    }
    let room = room * 9 / 10;
    let mut used = 0;
    let mut last = n;
    if n > 0 && sizes[n - 1] <= room {
        used += sizes[n - 1];
        last = n - 1;
    }
    let mut first = 0;
    while first < n.min(2).min(last) && used + sizes[first] <= room {
        used += sizes[first];
        first += 1;
    }
    while last > first && used + sizes[last - 1] <= room {
        used += sizes[last - 1];
        last -= 1;
    }
    Box::new(move |i| i < first || i >= last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_detail(turns: usize) -> TrajDetail {
        use crate::report::behaviour::{Action, Behaviour, Call};
        use crate::report::data::TrajSummary;
        let mut t = vec![Turn {
            role: "user".into(),
            text: "Fix the parser. ".repeat(50),
            calls: vec![],
            only_results: false,
        }];
        for i in 0..turns {
            t.push(Turn {
                role: "assistant".into(),
                text: format!("Step {i}: looking around."),
                calls: vec![Call {
                    id: format!("c{i}"),
                    name: "Bash".into(),
                    args: format!("{{\"command\": \"cat file{i}.py\"}}"),
                    output: Some(format!("line {i}\n").repeat(400)),
                    is_error: false,
                    action: Action::Other,
                    failed: Some(i % 3 == 0),
                }],
                only_results: false,
            });
        }
        TrajDetail {
            summary: TrajSummary {
                id: "o__r-1/1/0".into(),
                task_id: "o__r-1".into(),
                step: 2,
                harness: "claude-code".into(),
                reward: Some(0.0),
                termination: "max_turns".into(),
                infra: false,
                turns: turns as u64,
                response_tokens: 100,
                tool_calls: turns as u64,
                audit: vec![],
            },
            threads: vec![Thread {
                thread: 0,
                api: "anthropic".into(),
                turns: t,
            }],
            behaviour: Behaviour::default(),
            grader: Some(crate::records::GraderResult {
                tests: [
                    ("t::a".to_string(), "FAILED".to_string()),
                    ("t::b".into(), "PASSED".into()),
                ]
                .into(),
                log_tail: Some("E   AssertionError\n".repeat(300)),
                ..Default::default()
            }),
            stages: Default::default(),
            audit: vec![],
            diff: None,
            logprob_diffs: vec![],
            agreement: None,
        }
    }

    #[test]
    fn a_long_trajectory_fits_its_budget_and_says_what_it_left_out() {
        let d = long_detail(60);
        let p = build(&d, DEFAULT_QUESTION, 3000, &TokenCounter::Estimate);
        assert!(p.tokens <= 3000, "{}", p.tokens);
        assert!(p.user.ends_with(&format!("## Question\n{DEFAULT_QUESTION}\n")));
        assert!(
            p.user.contains("t::a: FAILED") && !p.user.contains("t::b"),
            "failing tests only"
        );
        assert!(
            p.user.contains("[1] assistant: Step 0") && p.user.contains("Step 59"),
            "first and last turns kept"
        );
        assert!(p.user.contains("turns dropped here"));
        assert!(
            p.left_out
                .iter()
                .any(|l| l.ends_with("of 60 turns from the middle")),
            "{:?}",
            p.left_out
        );
        assert!(
            p.left_out.iter().any(|l| l.starts_with("the grader log tail")),
            "{:?}",
            p.left_out
        );
        // With room for everything, nothing is dropped (outputs are still cut at their caps).
        let p = build(
            &long_detail(3),
            DEFAULT_QUESTION,
            100_000,
            &TokenCounter::Estimate,
        );
        assert!(!p.user.contains("turns dropped here"));
        assert!(p.user.contains("Step 2"));
    }

    #[test]
    fn dropped_turns_come_from_the_middle() {
        let keep = keep_turns(&[10; 10], 50);
        let kept: Vec<usize> = (0..10).filter(|i| keep(*i)).collect();
        // 45 tokens of room: turns 0, 1 and the last two.
        assert_eq!(kept, vec![0, 1, 8, 9]);
        let keep = keep_turns(&[10; 4], 40);
        assert!((0..4).all(keep));
    }
}
