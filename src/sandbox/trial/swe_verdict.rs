//! The SWE grader's verdict once the tests ran ([`super::swe_grader`]): statuses from the grader's
//! result stream ([`channel`]: its keyed lines only, which junit.xml must agree with) or, without
//! the channel, junit.xml or the log; graded by [`grade::swebench::resolve`]. Every file is read
//! bounded ([`super::bounded`]).

use std::collections::BTreeSet;
use std::time::Duration;

use super::bounded::{self, Read, JUNIT_CAP};
use super::evaluate::tampered;
use super::results::RESULTS;
use super::{Defence, Trial};
use crate::grade;
use crate::grade::channel::{self, Stream, RESULT_TAMPERING};
use crate::records::{AuditEvent, GraderResult};
use crate::sandbox::SandboxError;
use crate::text::tail_bytes;

/// The most of the result stream read (a line per test phase: far more than any suite writes).
const STREAM_CAP: u64 = 16_000_000;

/// The audit event of a config file pytest read that the diff wrote (see [`config_event`]).
pub const CONFIG_MISMATCH: &str = "config_mismatch";

/// What the verdict is made from.
pub(super) struct VerdictContext<'a> {
    pub test_files: &'a [String],
    /// The result stream, when the channel is on.
    pub stream: Option<Stream>,
    /// The config file pytest used at the base commit (the probe's report).
    pub base_config: Option<String>,
    /// Files the diff touched.
    pub touched: &'a BTreeSet<String>,
    pub apply: Option<String>,
    /// The shell's exit code for the test command.
    pub exit_code: Option<i64>,
}

/// The [`CONFIG_MISMATCH`] event: pytest read its configuration from a file the diff wrote, where
/// the base commit's run read another. Every config file name pytest knows is reverted before the
/// tests run ([`grade::hooks::PYTEST_INI_FILES`]), so this catches a name a later pytest adds
/// (pytest 9 added `pytest.toml` and `.pytest.toml` ahead of all others); a config file that
/// differs from the probe's for another reason (the test files passed move pytest's rootdir) is
/// the base's or the test patch's, not the diff's, and is no event.
pub fn config_event(
    base: Option<&str>,
    used: Option<&str>,
    touched: &BTreeSet<String>,
) -> Option<AuditEvent> {
    let (base, used) = (base?, used?);
    if base == used || used.is_empty() || !touched.contains(used) {
        return None;
    }
    Some(AuditEvent {
        kind: CONFIG_MISMATCH.into(),
        detail: format!(
            "pytest read its configuration from {used}, which the diff wrote (at the base commit: {}) \
             (reward 0, grader_tampering)",
            if base.is_empty() { "none" } else { base }
        ),
        generation: None,
    })
}

impl Trial {
    /// Reads root's copy of the result stream (bounded) and, when `keyed`, the grading's key.
    pub(super) async fn read_stream(&self, id: &str, keyed: bool) -> Result<Stream, SandboxError> {
        let short = Duration::from_secs(60);
        let text = self
            .engine
            .exec(
                id,
                "root",
                "/",
                &[],
                &format!("head -c {STREAM_CAP} {RESULTS}/stream"),
                short,
            )
            .await?
            .stdout;
        let key = if keyed {
            let k = self
                .engine
                .exec(id, "root", "/", &[], &format!("head -c 256 {RESULTS}/key"), short)
                .await?
                .stdout;
            // No key (root could not draw one) accepts nothing: the stream counts as empty.
            Some(k.trim().to_string())
        } else {
            None
        };
        Ok(channel::parse(&text, key.as_deref()))
    }

    /// The verdict once the tests ran.
    pub(super) async fn swebench_verdict(
        &mut self,
        id: &str,
        ctx: VerdictContext<'_>,
    ) -> Result<(f64, GraderResult), SandboxError> {
        let VerdictContext {
            test_files,
            stream,
            base_config,
            touched,
            apply,
            exit_code,
        } = ctx;
        let short = Duration::from_secs(60);
        let refuse = |this: &mut Self, event: AuditEvent| -> Result<(f64, GraderResult), SandboxError> {
            this.audit.push(event.clone());
            let (reward, mut result) = tampered(&[event]);
            result.apply = apply.clone();
            result.exit_code = exit_code;
            Ok((reward, result))
        };
        let junit_path = "/tmp/lego/out/junit.xml";
        let junit = if self.defended(Defence::BoundedReads) {
            match self.read_bounded(id, junit_path, JUNIT_CAP).await? {
                Read::Absent => String::new(),
                Read::Text(t) => t,
                Read::Refused(why) => {
                    return refuse(self, bounded::refused_event(RESULT_TAMPERING, junit_path, &why));
                }
            }
        } else {
            let cat = format!("cat {junit_path} 2>/dev/null");
            self.engine.exec(id, "root", "/", &[], &cat, short).await?.stdout
        };
        let log = self
            .engine
            .exec(
                id,
                "root",
                "/",
                &[],
                "f=/tmp/lego/out/test.log; [ -f $f ] && [ ! -L $f ] && tail -c 200000 $f",
                short,
            )
            .await?
            .stdout;
        let junit = grade::pytest::parse_junit(&junit, test_files);
        // With the result channel, the stream decides and junit.xml must agree with it; the exit
        // code is pytest's own as the plugin saw it in its keyed `finish` (the shell's, which
        // code under test can force with `os._exit`, only with that defence off).
        let (statuses, resolve_exit) = if let Some(stream) = stream {
            let graded: Vec<String> = self
                .task
                .fail_to_pass
                .iter()
                .chain(&self.task.pass_to_pass)
                .cloned()
                .collect();
            if let Some(event) = channel::tampering(&stream, junit.as_ref(), &graded) {
                return refuse(self, event);
            }
            let config = config_event(base_config.as_deref(), stream.config.as_deref(), touched);
            if let Some(event) = config.filter(|_| self.defended(Defence::ConfigCheck)) {
                return refuse(self, event);
            }
            let exit = if self.defended(Defence::PluginFinish) {
                stream.exit_status
            } else {
                stream.exit_status.or(exit_code)
            };
            (stream.statuses, exit)
        } else {
            (junit.unwrap_or_else(|| grade::pytest::parse_log(&log)), exit_code)
        };
        let verdict = grade::swebench::resolve(
            &statuses,
            &self.task.fail_to_pass,
            &self.task.pass_to_pass,
            resolve_exit,
        );
        let mut log_tail = tail_bytes(&log, 4000);
        if let Some(note) = &verdict.note {
            log_tail = format!("{note}\n{log_tail}");
        }
        let reward = if apply.as_deref() == Some("failed") {
            0.0
        } else {
            verdict.reward
        };
        Ok((
            reward,
            GraderResult {
                tests: statuses,
                exit_code,
                apply,
                log_path: None,
                log_tail: Some(log_tail),
                reason: None,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_the_diff_wrote_is_an_event_only_when_pytest_read_it() {
        let touched = BTreeSet::from(["pytest.toml".to_string(), "pkg/x.py".to_string()]);
        let ev = config_event(Some(""), Some("pytest.toml"), &touched).expect("event");
        assert_eq!(ev.kind, CONFIG_MISMATCH);
        assert!(ev.detail.contains("at the base commit: none"), "{}", ev.detail);
        assert!(config_event(Some("setup.cfg"), Some("setup.cfg"), &touched).is_none());
        // Not the diff's (the test patch's, or another rootdir): no event.
        assert!(config_event(Some(""), Some("tests/setup.cfg"), &touched).is_none());
        // No probe, or no report from the plugin: nothing to compare.
        assert!(config_event(None, Some("pytest.toml"), &touched).is_none());
        assert!(config_event(Some(""), None, &touched).is_none());
    }
}
