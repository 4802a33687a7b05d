//! Every record type that passes between subcommands, as serde types.
//!
//! Each file lego-rl reads or writes is JSON Lines (zstd-compressed by default) where every line is
//! one record carrying a `schema` field `"lego-rl/<kind>/v<N>"`. The schema string is checked on
//! input so a misplaced file (samples given where trajectories are expected) fails with a clear
//! error instead of a confusing missing-field message. Unknown fields are tolerated on input, so
//! a v1 reader accepts records written by a newer minor revision that only added fields; a change
//! that alters the meaning of a field bumps the version. The user-facing description of every
//! record lives in `man/lego-rl-formats.md`.

mod packed;
mod sample;
mod task;
mod trajectory;
mod validation;

pub use packed::{DType, Packed, PackedError};
pub use sample::{AlignStats, LossMask, Sample, SamplingRule, SamplingRun, VersionRun};
pub use task::{Environment, Grader, PassRate, RepoSource, Task, TaskDecision, TaskSource, Timeouts};
pub use trajectory::{
    AuditEvent, CapturedCall, CapturedResponse, DynamicSampling, Generation, GraderResult, ImageRecord,
    PromptMode, Sampling, StageTiming, Termination, Trajectory, CHAT_MODEL, CONTEXT_LIMIT, CONTEXT_REFUSALS,
    GRADER_TAMPERING, HARNESS_SAMPLING, MALFORMED_TOOL_CALLS, REPLAYS, ROUTING_MISSING, SAMPLING_OVERRIDES,
    SUSPECTED_HACK, TAMPERING_KINDS,
};
pub use validation::{GateResult, HarnessStepMetrics, StepMetrics, TrajectoryAgreement, ValidationReport};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Prefix of every schema string.
pub const SCHEMA_PREFIX: &str = "lego-rl/";

/// A record type with a versioned schema string.
pub trait Record: Serialize + DeserializeOwned + Send + 'static {
    /// The kind, e.g. `"trajectory"`.
    const KIND: &'static str;
    /// The full schema string written into every record, e.g. `"lego-rl/trajectory/v1"`.
    const SCHEMA: &'static str;
    /// The schema string this value carries.
    fn schema(&self) -> &str;
}

macro_rules! record {
    ($ty:ty, $kind:literal) => {
        impl Record for $ty {
            const KIND: &'static str = $kind;
            const SCHEMA: &'static str = concat!("lego-rl/", $kind, "/v1");
            fn schema(&self) -> &str {
                &self.schema
            }
        }
    };
}

record!(Task, "task");
record!(TaskDecision, "task-decision");
record!(ImageRecord, "image");
record!(Trajectory, "trajectory");
record!(Sample, "sample");
record!(AlignStats, "align-stats");
record!(StepMetrics, "step-metrics");
record!(ValidationReport, "validation-report");

/// Every schema this build understands, as (kind, schema string).
pub const KNOWN_SCHEMAS: &[(&str, &str)] = &[
    (Task::KIND, Task::SCHEMA),
    (TaskDecision::KIND, TaskDecision::SCHEMA),
    (ImageRecord::KIND, ImageRecord::SCHEMA),
    (Trajectory::KIND, Trajectory::SCHEMA),
    (Sample::KIND, Sample::SCHEMA),
    (AlignStats::KIND, AlignStats::SCHEMA),
    (StepMetrics::KIND, StepMetrics::SCHEMA),
    (ValidationReport::KIND, ValidationReport::SCHEMA),
];

/// Why a record's `schema` field was not accepted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SchemaError {
    #[error("record has no string field `schema`")]
    Missing,
    #[error("unknown schema `{0}` (known: {known})", known = KNOWN_SCHEMAS.iter().map(|k| k.1).collect::<Vec<_>>().join(", "))]
    Unknown(String),
    #[error("schema `{found}` is a newer version than this lego-rl understands (`{want}`); upgrade lego-rl")]
    Newer { found: String, want: &'static str },
    #[error("expected a `{want}` record, found `{found}`")]
    WrongKind { found: String, want: &'static str },
}

/// Splits `"lego-rl/<kind>/v<N>"` into (kind, N).
pub fn parse_schema(s: &str) -> Option<(&str, u32)> {
    let rest = s.strip_prefix(SCHEMA_PREFIX)?;
    let (kind, version) = rest.rsplit_once('/')?;
    let n = version.strip_prefix('v')?.parse().ok()?;
    Some((kind, n))
}

/// Checks that `found` is the schema of `R` (same kind, same version).
pub fn check_schema<R: Record>(found: &str) -> Result<(), SchemaError> {
    if found == R::SCHEMA {
        return Ok(());
    }
    match parse_schema(found) {
        Some((kind, _)) if kind == R::KIND => Err(SchemaError::Newer {
            found: found.to_string(),
            want: R::SCHEMA,
        }),
        Some((kind, _)) if KNOWN_SCHEMAS.iter().any(|k| k.0 == kind) => Err(SchemaError::WrongKind {
            found: found.to_string(),
            want: R::SCHEMA,
        }),
        _ => Err(SchemaError::Unknown(found.to_string())),
    }
}

/// Checks that a raw JSON value carries a known schema; returns its kind.
pub fn known_kind(value: &serde_json::Value) -> Result<&'static str, SchemaError> {
    let found = value
        .get("schema")
        .and_then(|s| s.as_str())
        .ok_or(SchemaError::Missing)?;
    if let Some((kind, _)) = KNOWN_SCHEMAS.iter().find(|k| k.1 == found) {
        return Ok(kind);
    }
    match parse_schema(found) {
        Some((kind, _)) if KNOWN_SCHEMAS.iter().any(|k| k.0 == kind) => Err(SchemaError::Newer {
            found: found.to_string(),
            want: KNOWN_SCHEMAS
                .iter()
                .find(|k| k.0 == kind)
                .map(|k| k.1)
                .unwrap_or(""),
        }),
        _ => Err(SchemaError::Unknown(found.to_string())),
    }
}

/// Parses a JSON value as any known record kind, so `validate` can check every field.
pub fn parse_any(value: serde_json::Value) -> Result<&'static str, String> {
    let kind = known_kind(&value).map_err(|e| e.to_string())?;
    fn typed<R: Record>(v: serde_json::Value) -> Result<(), String> {
        serde_json::from_value::<R>(v)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    match kind {
        "task" => typed::<Task>(value),
        "task-decision" => typed::<TaskDecision>(value),
        "image" => typed::<ImageRecord>(value),
        "trajectory" => typed::<Trajectory>(value),
        "sample" => typed::<Sample>(value),
        "align-stats" => typed::<AlignStats>(value),
        "step-metrics" => typed::<StepMetrics>(value),
        "validation-report" => typed::<ValidationReport>(value),
        other => Err(format!("no parser for kind {other}")),
    }?;
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_strings_parse() {
        assert_eq!(parse_schema("lego-rl/trajectory/v1"), Some(("trajectory", 1)));
        assert_eq!(
            parse_schema("lego-rl/task-decision/v12"),
            Some(("task-decision", 12))
        );
        assert_eq!(parse_schema("other/thing/v1"), None);
    }

    #[test]
    fn schema_mismatches_are_classified() {
        assert_eq!(check_schema::<Task>("lego-rl/task/v1"), Ok(()));
        assert!(matches!(
            check_schema::<Task>("lego-rl/task/v2"),
            Err(SchemaError::Newer { .. })
        ));
        assert!(matches!(
            check_schema::<Task>("lego-rl/sample/v1"),
            Err(SchemaError::WrongKind { .. })
        ));
        assert!(matches!(
            check_schema::<Task>("foo"),
            Err(SchemaError::Unknown(_))
        ));
    }
}

#[cfg(test)]
mod snapshots;
