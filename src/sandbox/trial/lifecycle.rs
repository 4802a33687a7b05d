//! The whole lifecycle of one trial ([`Trial::run`]): setup → agent → extract → evaluate →
//! cleanup, each stage's outcome classified into exactly one [`TrialResult`].

use super::{observe, take_outlived, AgentOutcome, Trial, TrialResult};
use crate::records::{GraderResult, Termination};
use crate::sandbox::SandboxError;
use crate::text::tail_bytes;

impl Trial {
    /// Runs the whole lifecycle with `agent_script` as the agent; always returns one result and
    /// always cleans up.
    pub async fn run(mut self, agent_script: &str) -> TrialResult {
        let mut result = TrialResult::new(Termination::Finished);
        let infra = |stage: &str, e: SandboxError, r: &mut TrialResult| {
            r.termination = Termination::Infra(stage.to_string());
            r.infra_failure = true;
            let cause = format!("{stage}: {e}");
            r.agent_log
                .get_or_insert_with(String::new)
                .push_str(&format!("\n{cause}"));
            r.infra_cause = Some(cause);
        };
        let in_band: Option<u64>;
        'stages: {
            if let Err(e) = self.setup().await {
                infra("setup", e, &mut result);
                break 'stages;
            }
            match self.run_agent(agent_script).await {
                Err(e) => {
                    infra("agent", e, &mut result);
                    break 'stages;
                }
                Ok((outcome, out)) => {
                    let (stderr, count) = take_outlived(&out.stderr);
                    in_band = count;
                    if let AgentOutcome::Crash(code) = &outcome {
                        result.agent_exit_code = *code;
                    }
                    result.agent_log = Some(tail_bytes(&format!("{}{stderr}", out.stdout), 8000));
                    match self.observe_agent().await {
                        observe::Aftermath::Alive => {}
                        // The agent's memory use took the container down (the OOM killer reached
                        // the relay): its own doing, so an agent crash, graded 0 (nothing is left
                        // to extract a diff from).
                        observe::Aftermath::Dead { oom: true, detail } => {
                            result.termination = Termination::AgentCrash;
                            result.reward = Some(0.0);
                            result
                                .agent_log
                                .get_or_insert_with(String::new)
                                .push_str(&format!("\nagent: {detail}"));
                            break 'stages;
                        }
                        // Killed or removed by someone else (the engine, an operator): ours.
                        observe::Aftermath::Dead { oom: false, detail } => {
                            infra(
                                "agent",
                                SandboxError::Stage {
                                    stage: "agent",
                                    message: detail,
                                },
                                &mut result,
                            );
                            break 'stages;
                        }
                    }
                    result.termination = match outcome {
                        AgentOutcome::Finished => Termination::Finished,
                        AgentOutcome::Timeout => Termination::AgentTimeout,
                        AgentOutcome::Crash(_) => Termination::AgentCrash,
                    };
                    result.outputs = self.read_outputs().await;
                }
            }
            let diff = match self.extract(in_band).await {
                Ok(d) => d,
                Err(e) => {
                    infra("extract", e, &mut result);
                    break 'stages;
                }
            };
            result.diff = Some(diff.clone()).filter(|d| !d.is_empty());
            if self.too_large.is_some() {
                // Not read, not graded: the agent's doing, so reward 0 (the event says why).
                result.reward = Some(0.0);
                result.grader = Some(GraderResult {
                    reason: Some("diff_too_large".into()),
                    ..Default::default()
                });
                break 'stages;
            }
            match self.evaluate(&diff).await {
                Ok((reward, details)) => {
                    result.reward = Some(reward);
                    result.grader = Some(details);
                }
                Err(e) => infra("evaluate", e, &mut result),
            }
        }
        if let Err(e) = self.cleanup().await {
            tracing::warn!("trial {}: cleanup: {e}", self.trial_id);
        }
        result.stages = std::mem::take(&mut self.stages);
        result.audit = std::mem::take(&mut self.audit);
        result
    }
}
