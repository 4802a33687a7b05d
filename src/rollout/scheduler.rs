//! The rollout's scheduler: which group starts next, the trials in flight, and what happens when
//! one ends (its group written as one frame, or run again when it came out stale).
//!
//! [`super::run`] loads the inputs, plans the groups, starts the services and then drives one
//! [`Scheduler`]: while a group may start it starts it (each of its trials waits for a free slot,
//! handling the trials that end meanwhile), else it waits for the next trial to end. All state a
//! run changes as trials come and go lives here, in one place, so each step is a method with a
//! name rather than a branch of one long loop.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use indicatif::ProgressBar;
use tokio::task::{JoinError, JoinSet};

use super::dynamic::Oversampler;
use super::plan::GroupPlan;
use super::progress::Progress;
use super::{follow, trial, Assignment, RolloutConfig, RolloutError, Services, Summary};
use crate::engine::ReloadReport;
use crate::io::AppendWriter;
use crate::records::Trajectory;

/// A group's key: (task id, group id).
type GroupKey = (String, u64);

/// What a trial's task hands back: its group's key and its trajectory.
type TrialDone = (String, u64, Trajectory);

/// What the scheduler works through: the groups still to run and where each trial goes.
pub(super) struct Work {
    /// The planned groups not yet in the output, in order (a stale group goes back to the front).
    pub(super) pending: VecDeque<GroupPlan>,
    /// Dynamic sampling's extra groups, drawn once `pending` is empty.
    pub(super) oversampler: Option<Oversampler>,
    /// Task id → its image.
    pub(super) image_of: HashMap<String, String>,
    /// Which harness runs each trial.
    pub(super) assignment: Assignment,
}

/// The policy new trials run on.
struct Policy {
    version: u64,
    /// The checkpoint directory loaded (None: whatever an HTTP backend was serving at the start).
    loaded_dir: Option<PathBuf>,
    /// The last reload's report, recorded in the trajectories that start after it.
    last_reload: Option<Arc<ReloadReport>>,
}

/// A group in flight: its trajectories so far, until its last trial ends.
struct GroupState {
    plan: GroupPlan,
    policy_version: u64,
    remaining: usize,
    trajectories: Vec<Trajectory>,
    started: Instant,
}

/// The groups and trials of one run, from the first trial started to the summary.
///
/// Fields drop in declaration order: on an error the trials in flight (`running`) are aborted
/// before the services they use (proxy, sockets) go away.
pub(super) struct Scheduler<'a> {
    cfg: &'a RolloutConfig,
    running: JoinSet<TrialDone>,
    services: Services,
    work: Work,
    writer: AppendWriter,
    policy: Policy,
    progress: Progress,
    groups: HashMap<GroupKey, GroupState>,
    /// Trajectory id → its trial's spinner.
    bars: HashMap<String, ProgressBar>,
    in_flight_trials: u64,
    reward_sum: f64,
    graded: u64,
    summary: Summary,
}

impl<'a> Scheduler<'a> {
    /// A scheduler over `work` that appends to `writer` and adds to `summary` (which already holds
    /// what the output had before).
    pub(super) fn new(
        cfg: &'a RolloutConfig,
        services: Services,
        work: Work,
        writer: AppendWriter,
        summary: Summary,
    ) -> Self {
        let policy = Policy {
            version: services.policy_version,
            loaded_dir: super::served_dir(cfg).cloned(),
            last_reload: None,
        };
        services.proxy.set_policy_version(policy.version);
        let total_trials: u64 = work.pending.iter().map(|g| g.samples.len() as u64).sum();
        Scheduler {
            cfg,
            progress: Progress::new(cfg.progress, total_trials),
            services,
            work,
            writer,
            policy,
            groups: HashMap::new(),
            running: JoinSet::new(),
            bars: HashMap::new(),
            in_flight_trials: 0,
            reward_sum: 0.0,
            graded: 0,
            summary,
        }
    }

    /// The next group to start: the planned groups first; then, with dynamic sampling, extra
    /// groups while more informative ones are needed (the groups in flight counted as if they will
    /// be). None once `max_trajectories` are written or running, or when nothing is left to start.
    pub(super) fn next_group(&mut self) -> Option<GroupPlan> {
        let s = &self.summary;
        let written_or_running = s.existing + s.written + self.in_flight_trials;
        if self.cfg.max_trajectories.is_some_and(|m| written_or_running >= m) {
            return None;
        }
        let in_flight = self.groups.len();
        self.work.pending.pop_front().or_else(|| {
            self.work
                .oversampler
                .as_mut()
                .and_then(|o| o.next_group(in_flight))
        })
    }

    /// Starts `group` on the newest policy (`--follow`), each trial as a slot frees up; the trials
    /// that end while it waits are handled as usual.
    pub(super) async fn start_group(&mut self, group: GroupPlan) -> Result<(), RolloutError> {
        if group.group_id >= self.cfg.first_group + self.cfg.epochs {
            self.progress.total.inc_length(group.samples.len() as u64);
        }
        self.follow_newest().await?;
        let image = self.work.image_of[&group.task.id].clone();
        self.groups.insert(
            (group.task.id.clone(), group.group_id),
            GroupState {
                plan: group.clone(),
                policy_version: self.policy.version,
                remaining: group.samples.len(),
                trajectories: Vec::new(),
                started: Instant::now(),
            },
        );
        let concurrency = self.cfg.concurrency.max(1);
        for &sample in &group.samples {
            while self.running.len() >= concurrency {
                self.join_one().await?;
            }
            self.start_trial(&group, &image, sample);
        }
        Ok(())
    }

    /// Spawns one trial of `group` on the harness the assignment names for it.
    fn start_trial(&mut self, group: &GroupPlan, image: &str, sample: u32) {
        let id = Trajectory::make_id(&group.task.id, group.group_id, sample);
        self.bars.insert(id.clone(), self.progress.trial(&id));
        self.in_flight_trials += 1;
        let assignment = &self.work.assignment;
        let harness = assignment.harness(&group.task.id, group.group_id, sample);
        let script = assignment.script_rank(&group.task.id, group.group_id, sample);
        let spec = trial::TrialSpec {
            task: group.task.clone(),
            image: image.to_string(),
            group_id: group.group_id,
            sample,
            script,
            policy_version: self.policy.version,
            reload: self.policy.last_reload.clone(),
        };
        let shared = self.services.shared[harness].clone();
        let (tid, gid) = (group.task.id.clone(), group.group_id);
        self.running
            .spawn(async move { (tid, gid, trial::run_trial(shared, spec).await) });
    }

    /// Waits for one trial to end and handles it; false when none is running.
    pub(super) async fn join_one(&mut self) -> Result<bool, RolloutError> {
        match self.running.join_next().await {
            Some(joined) => {
                self.on_trial_done(joined).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Waits for every trial in flight to end, handling each.
    async fn drain(&mut self) -> Result<(), RolloutError> {
        while self.join_one().await? {}
        Ok(())
    }

    /// Handles one finished trial; finishes its group when it was the last.
    async fn on_trial_done(&mut self, joined: Result<TrialDone, JoinError>) -> Result<(), RolloutError> {
        let (task_id, group_id, traj) =
            joined.map_err(|e| RolloutError::Invalid(format!("trial task failed: {e}")))?;
        self.in_flight_trials -= 1;
        if let Some(b) = self.bars.remove(&traj.id) {
            b.finish_and_clear();
        }
        self.progress.finished(&traj);
        let key = (task_id, group_id);
        let g = self
            .groups
            .get_mut(&key)
            .expect("invariant: group registered before its trials");
        g.trajectories.push(traj);
        g.remaining -= 1;
        if g.remaining == 0 {
            let g = self.groups.remove(&key).expect("invariant: present");
            self.finish_group(&key, g).await?;
        }
        Ok(())
    }

    /// A group whose last trial ended: written, or (more than `max_staleness` versions behind the
    /// newest checkpoint under `--follow`'s root) put back in front of the queue to run again.
    async fn finish_group(&mut self, key: &GroupKey, g: GroupState) -> Result<(), RolloutError> {
        let newest = match &self.cfg.follow {
            Some(root) => follow::newest(root)?.map(|c| c.policy_version),
            None => None,
        };
        let max_staleness = self.cfg.max_staleness;
        if newest.is_some_and(|n| n.saturating_sub(g.policy_version) > max_staleness) {
            tracing::warn!(
                "group {}/{} ran on policy {} and is more than {} versions behind {}; running it again",
                key.0,
                key.1,
                g.policy_version,
                max_staleness,
                newest.unwrap_or(0)
            );
            self.summary.stale_groups += 1;
            self.work.pending.push_front(g.plan);
            return Ok(());
        }
        // Ctrl-C/SIGTERM: this group's failures are the interruption's, not the trials'; a rerun
        // runs the group again.
        crate::sandbox::trial::park_if_interrupted().await;
        self.write_group(key, g)
    }

    /// Appends a finished group's trajectories as one frame (marked by dynamic sampling when it is
    /// on), counts them in the summary and logs one line for the group.
    fn write_group(&mut self, key: &GroupKey, mut g: GroupState) -> Result<(), RolloutError> {
        g.trajectories.sort_by_key(|t| t.sample_index);
        if let Some(o) = self.work.oversampler.as_mut() {
            o.mark(&mut g.trajectories);
        }
        for t in &g.trajectories {
            self.writer.push(t)?;
        }
        let summary = &mut self.summary;
        summary.written += self.writer.commit()?;
        summary.groups += 1;
        let infra = g.trajectories.iter().filter(|t| t.infra_failure).count() as u64;
        summary.infra_failures += infra;
        summary.sampling_overrides += g
            .trajectories
            .iter()
            .flat_map(|t| &t.generations)
            .filter(|g| g.sampling_overridden())
            .count() as u64;
        for t in g.trajectories.iter().filter(|t| t.infra_failure) {
            let cause = trial::infra_cause(t).unwrap_or("no cause recorded");
            let line = format!("{}: {}: {cause}", t.id, t.termination);
            self.progress.multi.suspend(|| tracing::warn!("{line}"));
            summary.first_infra_cause.get_or_insert(line);
        }
        let rewards: Vec<f64> = g.trajectories.iter().filter_map(|t| t.reward).collect();
        self.reward_sum += rewards.iter().sum::<f64>();
        self.graded += rewards.len() as u64;
        let mean = if rewards.is_empty() {
            "-".to_string()
        } else {
            format!("{:.3}", rewards.iter().sum::<f64>() / rewards.len() as f64)
        };
        let line = format!(
            "group {}/{}: {} trials, reward mean {mean}, {infra} infra failures, policy {}, {:.1}s",
            key.0,
            key.1,
            g.trajectories.len(),
            g.policy_version,
            g.started.elapsed().as_secs_f64()
        );
        self.progress.multi.suspend(|| tracing::info!("{line}"));
        Ok(())
    }

    /// Between groups, with `--follow`: switches to the newest complete checkpoint under the root
    /// when it is newer than the one loaded, once the trials in flight are done (or, with
    /// `--reload-in-flight`, between their generations).
    async fn follow_newest(&mut self) -> Result<(), RolloutError> {
        let cfg = self.cfg;
        let Some(root) = &cfg.follow else {
            return Ok(());
        };
        let Some(ck) = follow::newest(root)? else {
            return Ok(());
        };
        let newer = ck.policy_version > self.policy.version
            || (ck.policy_version == self.policy.version && self.policy.loaded_dir.is_none());
        if !newer || self.policy.loaded_dir.as_ref() == Some(&ck.dir) {
            return Ok(());
        }
        if !cfg.reload_in_flight {
            self.drain().await?;
        }
        tracing::info!(
            "policy {} → {} ({})",
            self.policy.version,
            ck.policy_version,
            ck.dir.display()
        );
        let backend = self.services.backend.clone();
        let dir = ck.dir.clone();
        let load = async move {
            backend.reload(&dir).await.map_err(|e| RolloutError::Reload {
                dir: dir.clone(),
                msg: e.to_string(),
            })
        };
        let report = self.services.proxy.swap_weights(ck.policy_version, load).await?;
        self.log_reload(&report);
        self.policy = Policy {
            version: ck.policy_version,
            loaded_dir: Some(ck.dir),
            last_reload: Some(Arc::new(report)),
        };
        Ok(())
    }

    /// Logs a reload's duration (and verification and restarts) and counts it in the summary.
    fn log_reload(&mut self, report: &ReloadReport) {
        let verified = match &report.verification {
            Some(v) => format!(
                ", verified: max |Δ log-prob| {:.2e} ≤ {:.2e} over {} probe tokens{}",
                v.max_abs_delta,
                v.tolerance,
                v.tokens,
                v.served_change
                    .map(|c| format!(", the served probe moved by {c:.2e}"))
                    .unwrap_or_default()
            ),
            None => String::new(),
        };
        let restarts = if report.restarts > 0 {
            format!(", {} server restart(s)", report.restarts)
        } else {
            String::new()
        };
        let line = format!("reload took {:.1} s{verified}{restarts}", report.seconds);
        self.progress.multi.suspend(|| tracing::info!("{line}"));
        self.summary.reload_seconds += report.seconds;
        self.summary.reload_restarts += u64::from(report.restarts);
        self.summary.reloads += 1;
    }

    /// Ends the run (every trial has ended): stops the proxy and completes the summary.
    pub(super) fn finish(self) -> Summary {
        self.progress.total.finish_and_clear();
        self.services.server.abort();
        let mut summary = self.summary;
        summary.reward_mean = (self.graded > 0).then(|| self.reward_sum / self.graded as f64);
        summary.prefix_cache = self.services.backend.prefix_cache_stats();
        summary.dynamic = self.work.oversampler.as_ref().map(Oversampler::summary);
        summary
    }
}
