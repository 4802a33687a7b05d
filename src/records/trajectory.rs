//! `ImageRecord` (build-images' manifest), `Trajectory` (one trial) and its `Generation`s (the
//! proxy's captures, exactly as sampled).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{Packed, Record};

/// One line of build-images' manifest (`lego-rl/image/v1`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ImageRecord {
    pub schema: String,
    pub task_id: String,
    /// Image tag `lego-rl/task-<id>:<content hash>`; the hash covers Dockerfile, context, base
    /// image id and build args, so an unchanged task is a cache hit.
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Tag of the shared environment layer this task image builds on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_image: Option<String>,
    pub cache_hit: bool,
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<String>,
    /// Set when the build failed; `image` is then not usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a trial ended. Serialized as a string: `finished`, `agent_timeout`, `max_turns`,
/// `context_limit`, `agent_crash`, or `infra:<stage>` (setup, agent, extract, evaluate, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Termination {
    Finished,
    AgentTimeout,
    MaxTurns,
    ContextLimit,
    AgentCrash,
    /// An infrastructure failure in the named stage; the trajectory gets weight 0 in training.
    Infra(String),
}

impl Termination {
    /// True for `infra:*`.
    pub fn is_infra(&self) -> bool {
        matches!(self, Termination::Infra(_))
    }
}

impl fmt::Display for Termination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Termination::Finished => f.write_str("finished"),
            Termination::AgentTimeout => f.write_str("agent_timeout"),
            Termination::MaxTurns => f.write_str("max_turns"),
            Termination::ContextLimit => f.write_str("context_limit"),
            Termination::AgentCrash => f.write_str("agent_crash"),
            Termination::Infra(stage) => write!(f, "infra:{stage}"),
        }
    }
}

impl FromStr for Termination {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "finished" => Termination::Finished,
            "agent_timeout" => Termination::AgentTimeout,
            "max_turns" => Termination::MaxTurns,
            "context_limit" => Termination::ContextLimit,
            "agent_crash" => Termination::AgentCrash,
            other => match other.strip_prefix("infra:") {
                Some(stage) if !stage.is_empty() => Termination::Infra(stage.to_string()),
                _ => return Err(format!("unknown termination `{other}`")),
            },
        })
    }
}

impl Serialize for Termination {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Termination {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Sampling parameters of a generation or a rollout.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Sampling {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Drop the tokens whose probability is below `min_p` × the most likely one's (after the
    /// temperature, before top-k and top-p: vLLM's order, src/model/sampled.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
}

impl Sampling {
    /// Whether a temperature at or below this is greedy decoding (the engines pick the argmax).
    pub const GREEDY_BELOW: f64 = 1e-6;

    /// Whether these values sample from a distribution other than the model's own: a
    /// temperature other than 1 (and above [`Self::GREEDY_BELOW`]: greedy decoding samples
    /// nothing), a top-k, a top-p below 1, or a min-p above 0. Tokens drawn so have the log-prob of that
    /// tempered, truncated and renormalised distribution only when the engine records it
    /// ([`Generation::processed_logprobs`]).
    pub fn is_processed(&self) -> bool {
        let t = self.temperature.unwrap_or(1.0);
        t > Self::GREEDY_BELOW
            && (t != 1.0
                || self.top_k.is_some_and(|k| k > 0)
                || self.top_p.is_some_and(|p| p < 1.0)
                || self.min_p.is_some_and(|p| p > 0.0))
    }

    /// Whether these values decode greedily (temperature at or below [`Self::GREEDY_BELOW`]).
    pub fn is_greedy(&self) -> bool {
        self.temperature.unwrap_or(1.0) <= Self::GREEDY_BELOW
    }
}

/// A generation's answer as the harness received it (text, reasoning, tool calls).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CapturedResponse {
    #[serde(default)]
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<CapturedCall>,
}

/// One tool call of a [`CapturedResponse`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CapturedCall {
    pub id: String,
    pub name: String,
    /// The arguments' JSON text as returned.
    pub arguments: String,
}

/// How the proxy built a generation's prompt.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PromptMode {
    /// Earlier assistant turns were spliced in from their captured output tokens.
    Faithful,
    /// The whole conversation was rendered with the chat template and tokenized.
    #[default]
    Rendered,
}

/// One model call captured by the proxy at generation time (inside a trajectory).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Generation {
    /// Conversation thread within the trial (0 = main agent; side requests get their own).
    #[serde(default)]
    pub thread: u32,
    /// Order of this request within the trial.
    pub index: u32,
    /// `openai` or `anthropic`.
    pub api: String,
    /// The request body exactly as received (parsed JSON).
    #[serde(default)]
    pub request: Value,
    #[serde(default)]
    pub prompt_mode: PromptMode,
    pub prompt_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    /// Log-prob of each output token under the sampling policy, f32 `[len(output_ids)]`.
    pub logprobs: Packed,
    /// Expert ids `[tokens, layers, top_k]` for prompt+output positions when the backend reports
    /// them (u8/u16); `tokens` may be one less than prompt+output (the last token is never forwarded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<Packed>,
    /// `stop`, `length`, `tool_calls`, ... as the backend reported.
    #[serde(default)]
    pub finish_reason: String,
    /// Ids of the tool calls in this generation's response (alignment links turns by them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_call_ids: Vec<String>,
    /// What the proxy answered, as parsed from `output_ids`: the next request of the thread
    /// echoes it back, but a thread's last answer (often its last tool call) is seen nowhere
    /// else, and the report shows it. Absent in captures that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<CapturedResponse>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default)]
    pub policy_version: u64,
    #[serde(default)]
    pub sampling: Sampling,
    /// Whether `logprobs` are those of the distribution the tokens were drawn from under
    /// `sampling` when it is not the model's own ([`Sampling::is_processed`]): tempered, and
    /// renormalised over the top-k / top-p support (vLLM's `processed_logprobs`). The embedded
    /// engine always records them so; vLLM does when its server runs with
    /// `--logprobs-mode processed_logprobs` (rollout starts it so), for sampled tokens only. False
    /// with a processed `sampling`: the log-probs are the model's own, not the behaviour policy's,
    /// and align drops the turn (`logprobs_not_of_sampling`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub processed_logprobs: bool,
    /// The request's own sampling values that were not used (`temperature`, `top_p`, `top_k`,
    /// `min_p`, as sent): rollout pins its sampling in train mode (`--harness-sampling pin`), and
    /// no engine implements `min_p`. Empty when the request was sampled as it asked.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ignored_sampling: BTreeMap<String, Value>,
    /// Seconds: `queue`, `prefill`, `decode`, `total`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub timings: BTreeMap<String, f64>,
    /// `ok`, `client_disconnected`, `infra_error`, `malformed_tool_call`, `context_limit` (the
    /// prompt did not fit the model's context and was refused, [`CONTEXT_LIMIT`]), ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Proxy-specific details (segment starts, counts per prompt mode, ...).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

impl Generation {
    /// Whether the request asked for sampling it was not served with ([`Self::ignored_sampling`]).
    pub fn sampling_overridden(&self) -> bool {
        !self.ignored_sampling.is_empty()
    }

    /// Tool calls of this output the proxy rejected and returned as text
    /// (`extra.malformed_tool_calls`; 1 for a `malformed_tool_call` status without the count).
    pub fn malformed_tool_calls(&self) -> u64 {
        match self.extra.get(MALFORMED_TOOL_CALLS).and_then(Value::as_u64) {
            Some(n) => n,
            None => u64::from(self.status.as_deref() == Some("malformed_tool_call")),
        }
    }
}

/// Result of grading a trial.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct GraderResult {
    /// Per-test status: PASSED, FAILED, SKIPPED, ERROR, XFAIL.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tests: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// How the agent's diff was applied (`git apply`, `--3way`, `patch --fuzz=5`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_path: Option<String>,
    /// Tail of the grader's output, for the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<String>,
    /// Why the reward was decided without (or against) the tests' verdict: `grader_tampering`
    /// when the diff tried to change how grading runs (see the `shadowing` and `bytecode` audit
    /// events), `eval_timeout` when the tests ran out of time on the agent's diff (reward 0: the
    /// gold patch passes within the limit). Absent when the tests decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Start and end (seconds since the Unix epoch) and outcome of one trial stage.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct StageTiming {
    pub start: f64,
    pub end: f64,
    pub outcome: String,
}

/// Something the agent did that validate/report count as a possible reward-hacking attempt.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct AuditEvent {
    /// `git_history`, `blocked_egress`, `test_edit`, `outside_read`, ...
    pub kind: String,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
}

/// One trial: a harness run on one task in one sandbox (`lego-rl/trajectory/v1`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Trajectory {
    pub schema: String,
    /// `<task_id>/<group_id>/<sample_index>`, unique within a run.
    pub id: String,
    pub task_id: String,
    pub group_id: u64,
    pub sample_index: u32,
    pub harness: String,
    pub backend: String,
    pub policy_version: u64,
    #[serde(default)]
    pub sampling: Sampling,
    #[serde(default)]
    pub generations: Vec<Generation>,
    pub termination: Termination,
    /// True when the trial failed for infrastructure reasons; such trajectories get weight 0.
    pub infra_failure: bool,
    /// 0/1 (or a Harbor float reward); null when the trial could not be graded.
    pub reward: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grader: Option<GraderResult>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stages: BTreeMap<String, StageTiming>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit: Vec<AuditEvent>,
    /// The agent's change as a unified diff against the squashed base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
    /// `train` or `eval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// Set by `rollout --min-informative-groups` (dynamic sampling) on every trajectory it
    /// writes: whether its group carries a learning signal, and whether it was an extra group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_sampling: Option<DynamicSampling>,
}

/// How dynamic sampling saw a trajectory's group (`Trajectory::dynamic_sampling`).
///
/// A group whose graded rewards do not vary gives GSPO no gradient; rollout keeps it in the file
/// (it is data: the report counts it and `filter-tasks --drop-saturated` reads its pass rate) but
/// marks it, and align skips it (`AlignStats::skipped_uninformative`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DynamicSampling {
    /// Whether the group's rewards vary: among its graded, non-infra trials (weight > 0) at least
    /// two rewards differ. False: align skips every trajectory of the group.
    pub informative: bool,
    /// 0-based index of the extra group, drawn from the task pool beyond the planned groups
    /// (absent for a planned group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_group: Option<u64>,
    /// Tasks in the pool extra groups are drawn from (after the shard and the image check).
    pub pool: u64,
    /// The run's `--min-informative-groups` and `--max-extra-groups` (absent in records written
    /// before they were recorded): validate warns when the budget ran out short of N.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_informative_groups: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_extra_groups: Option<u64>,
}

impl DynamicSampling {
    /// Whether a group with these trials has reward variance > 0: at least two of its graded,
    /// non-infra trials have different rewards.
    pub fn varies<'a>(group: impl IntoIterator<Item = &'a Trajectory>) -> bool {
        let mut first: Option<f64> = None;
        for t in group {
            if let (false, Some(r)) = (t.is_infra_failure(), t.reward) {
                match first {
                    None => first = Some(r),
                    Some(f) if f != r => return true,
                    Some(_) => {}
                }
            }
        }
        false
    }
}

impl Trajectory {
    /// A `finished`, ungraded trajectory of trial (task, group, sample) with these generations
    /// and every other field empty: the starting point of records built by hand (tests, benches,
    /// converters), which set what they need with struct update syntax.
    pub fn new(
        task_id: &str,
        group_id: u64,
        sample_index: u32,
        harness: &str,
        backend: &str,
        generations: Vec<Generation>,
    ) -> Self {
        Trajectory {
            schema: Trajectory::SCHEMA.into(),
            id: Trajectory::make_id(task_id, group_id, sample_index),
            task_id: task_id.into(),
            group_id,
            sample_index,
            harness: harness.into(),
            backend: backend.into(),
            policy_version: 0,
            sampling: Sampling::default(),
            generations,
            termination: Termination::Finished,
            infra_failure: false,
            reward: None,
            grader: None,
            stages: BTreeMap::new(),
            audit: Vec::new(),
            diff: None,
            mode: None,
            metadata: Map::new(),
            dynamic_sampling: None,
        }
    }

    /// Whether dynamic sampling marked this trajectory's group as giving no learning signal
    /// (align skips it).
    pub fn is_uninformative(&self) -> bool {
        self.dynamic_sampling.is_some_and(|d| !d.informative)
    }

    /// The canonical trajectory id for (task, group, sample).
    pub fn make_id(task_id: &str, group_id: u64, sample_index: u32) -> String {
        format!("{task_id}/{group_id}/{sample_index}")
    }

    /// Whether the infrastructure failed this trial (flagged, or an infra termination): its
    /// reward says nothing about the policy, so it trains with weight 0 and is kept out of
    /// reward statistics and task difficulty.
    pub fn is_infra_failure(&self) -> bool {
        self.infra_failure || self.termination.is_infra()
    }

    /// True when the trial's diff tried to change how it was graded: its grader's reason says
    /// so, or it has an audit event of a [`TAMPERING_KINDS`] kind.
    pub fn is_grader_tampering(&self) -> bool {
        self.grader.as_ref().and_then(|g| g.reason.as_deref()) == Some(GRADER_TAMPERING)
            || self
                .audit
                .iter()
                .any(|a| TAMPERING_KINDS.contains(&a.kind.as_str()))
    }

    /// The kinds of its audit events, plus `grader_tampering` (see
    /// [`Trajectory::is_grader_tampering`]) and `suspected_hack` (see
    /// [`Trajectory::is_suspected_hack`]): what validate's gates and the report count.
    pub fn audit_kinds(&self) -> std::collections::BTreeSet<String> {
        let mut kinds: std::collections::BTreeSet<String> =
            self.audit.iter().map(|a| a.kind.clone()).collect();
        if self.is_grader_tampering() {
            kinds.insert(GRADER_TAMPERING.to_string());
        }
        if self.is_suspected_hack() {
            kinds.insert(SUSPECTED_HACK.to_string());
        }
        kinds
    }

    /// Whether a rewarded trial raised a deterministic hack signal: a `hack_*` audit event
    /// (rollout's checks of the diff, `rollout::hack_signals`) or a read outside the repository.
    pub fn is_suspected_hack(&self) -> bool {
        self.reward.is_some_and(|r| r > 0.0)
            && self
                .audit
                .iter()
                .any(|a| a.kind.starts_with("hack_") || a.kind == "outside_read")
    }
}

/// The audit kind a rewarded trial with a hack signal also counts as
/// ([`Trajectory::is_suspected_hack`]; validate's `suspected_hack_rate` gate, the report's
/// advisory of the same name).
pub const SUSPECTED_HACK: &str = "suspected_hack";

/// A generation's `status` when the proxy refused its prompt for not fitting the model's context.
pub const CONTEXT_LIMIT: &str = "context_limit";

/// `metadata` key: the tokenizer and chat template folder the proxy used (absolute), which
/// align loads when it is not given `--model`.
pub const CHAT_MODEL: &str = "chat_model";

/// `metadata` key: how many of the trial's requests were refused for the context (present when
/// any were; the harness may have compacted and gone on).
pub const CONTEXT_REFUSALS: &str = "context_refusals";

/// `Generation::extra` and `Trajectory::metadata` key: tool calls the proxy could not parse
/// (unknown function or parameter, a value not of its type, unterminated tags, …) and returned to
/// the harness as text; see `chat::xml_call`. Present when there were any.
pub const MALFORMED_TOOL_CALLS: &str = "malformed_tool_calls";

/// `Trajectory::metadata` key: generations whose request asked for sampling it was not served with
/// (`Generation::ignored_sampling` non-empty). Present when there were any.
pub const SAMPLING_OVERRIDES: &str = "sampling_overrides";

/// `Generation::extra` key: client retries of the request answered from this generation instead of
/// generating again (the proxy's retry guard); `Trajectory::metadata` key: their sum over the trial.
pub const REPLAYS: &str = "replays";

/// `Generation::extra` key: `true` when an MoE policy's routing was asked for and the backend
/// returned none (a vLLM without `--enable-return-routed-experts`, a forced continuation scored
/// by vLLM). align counts such samples (`samples_without_routing`) and train-step their tokens
/// (`unreplayed_tokens`); they are never taken as replayed.
pub const ROUTING_MISSING: &str = "routing_missing";

/// `Trajectory::metadata` key: `pin` or `honor`, how the proxy treated requests' own sampling.
pub const HARNESS_SAMPLING: &str = "harness_sampling";

/// `GraderResult::reason` of a trial whose diff tried to change how it is graded (reward 0).
pub const GRADER_TAMPERING: &str = "grader_tampering";

/// Audit event kinds that make a trial `grader_tampering`: a planted module shadowing one the
/// grader imports, planted compiled Python (see `grade::integrity`), test results rewritten after
/// the fact (see `grade::channel`), a pytest config file the diff wrote that pytest read
/// (`config_mismatch`, see `sandbox::trial`).
pub const TAMPERING_KINDS: &[&str] = &["shadowing", "bytecode", "result_tampering", "config_mismatch"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_strings_round_trip() {
        for s in [
            "finished",
            "agent_timeout",
            "max_turns",
            "context_limit",
            "agent_crash",
            "infra:setup",
        ] {
            let t: Termination = s.parse().unwrap();
            assert_eq!(t.to_string(), s);
            assert_eq!(serde_json::to_value(&t).unwrap(), Value::String(s.into()));
        }
        assert!("infra:".parse::<Termination>().is_err());
        assert!("done".parse::<Termination>().is_err());
        assert!(Termination::Infra("evaluate".into()).is_infra());
    }
}
