//! Rollout progress: one spinner per running trial plus a totals bar; hidden unless enabled.

use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::records::Trajectory;

/// Progress: one spinner per running trial plus a totals bar; hidden unless enabled.
pub(super) struct Progress {
    pub(super) multi: MultiProgress,
    pub(super) total: ProgressBar,
    enabled: bool,
    done: u64,
    infra: u64,
    reward_sum: f64,
    graded: u64,
}

impl Progress {
    pub(super) fn new(enabled: bool, trials: u64) -> Self {
        let multi = MultiProgress::with_draw_target(if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        let total = multi.add(ProgressBar::new(trials));
        total.set_style(
            ProgressStyle::with_template("{spinner} trials [{bar:30}] {pos}/{len} {msg} (eta {eta})")
                .expect("invariant: valid template")
                .progress_chars("=> "),
        );
        Progress {
            multi,
            total,
            enabled,
            done: 0,
            infra: 0,
            reward_sum: 0.0,
            graded: 0,
        }
    }

    pub(super) fn trial(&self, id: &str) -> ProgressBar {
        if !self.enabled {
            return ProgressBar::hidden();
        }
        let b = self.multi.add(ProgressBar::new_spinner());
        b.set_style(
            ProgressStyle::with_template("  {spinner} {msg} {elapsed}").expect("invariant: valid template"),
        );
        b.set_message(id.to_string());
        b.enable_steady_tick(Duration::from_millis(250));
        b
    }

    pub(super) fn finished(&mut self, t: &Trajectory) {
        self.done += 1;
        if t.infra_failure {
            self.infra += 1;
        }
        if let Some(r) = t.reward {
            self.reward_sum += r;
            self.graded += 1;
        }
        self.total.inc(1);
        let mean = if self.graded > 0 {
            format!("{:.3}", self.reward_sum / self.graded as f64)
        } else {
            "-".into()
        };
        self.total
            .set_message(format!("failed {} reward mean {mean}", self.infra));
    }
}
