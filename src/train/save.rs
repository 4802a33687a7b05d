//! A trainer's checkpoint on disk: loading it, and writing the next one atomically — from one
//! process or from every rank of a world (rank 0 writes the model, `lego-rl.json` and the step
//! counter; under expert parallelism the first expert-parallel group writes the model's shards;
//! every rank writes its part of the optimizer state, [`super::state`]).

use std::path::{Path, PathBuf};

use tch::{Device, Kind};

use super::groups::Comms;
use super::optim::AdamW;
use super::state::SavedState;
use super::trainer::{CheckpointInfo, Trainer, INFO_FILE};
use super::TrainError;
use crate::c10d::ProcessGroup;
use crate::model::{probe, Model};

impl Trainer {
    /// Loads a checkpoint and, when present, its optimizer state and `lego-rl.json`.
    pub fn load(dir: &Path, device: Device, kind: Option<Kind>) -> Result<Self, TrainError> {
        Self::load_model(Model::load(dir, device, kind)?, dir)
    }

    /// A trainer around `model` (loaded from `dir`) with the step counter, `lego-rl.json` and a
    /// description of the optimizer state found there (restored into the parameter groups at
    /// the first step, when the run's layout is known).
    pub(super) fn load_model(model: Model, dir: &Path) -> Result<Self, TrainError> {
        let opt = AdamW::load(dir)?;
        let info_path = dir.join(INFO_FILE);
        let info = if info_path.is_file() {
            let text = std::fs::read_to_string(&info_path).map_err(|e| TrainError::OptimizerState {
                path: info_path.clone(),
                msg: e.to_string(),
            })?;
            serde_json::from_str(&text).map_err(|e| TrainError::OptimizerState {
                path: info_path.clone(),
                msg: e.to_string(),
            })?
        } else {
            CheckpointInfo::default()
        };
        let saved = SavedState::read(dir)?;
        if opt.steps > 0 && saved.is_empty() {
            // The counter without the moments would resume with zero moments and a late step's
            // bias correction: a partly copied checkpoint, refused rather than resumed wrongly.
            return Err(TrainError::OptimizerState {
                path: dir.join(super::state::DIR),
                msg: format!(
                    "trainer_state.json counts {} optimizer steps, but the checkpoint holds no optimizer \
                     state (optimizer/manifest.json, or an older layout's files): was it copied in part?",
                    opt.steps
                ),
            });
        }
        Ok(Trainer {
            saved,
            source: Some(dir.to_path_buf()),
            ..Trainer {
                info,
                opt,
                ..Trainer::new(model)
            }
        })
    }

    /// Writes the checkpoint, optimizer state and `lego-rl.json` of one process into existing
    /// directory `dir` (many ranks: [`Trainer::save_atomic_on`]).
    pub fn save(&self, dir: &Path) -> Result<(), TrainError> {
        let single = ProcessGroup::single().with_device(self.model.device());
        if self.model.needs_sharded_save(self.expert_layout) {
            self.model.save_sharded(dir, &single, self.expert_layout)?;
        } else {
            self.model.save(dir)?;
        }
        self.save_state(dir, &single)?;
        self.opt.save_counter(dir)?;
        self.save_info(dir)
    }

    /// This rank's part of the optimizer state. A trainer that never took a step has no groups
    /// yet: it has nothing of its own to write, and refuses rather than drop the state it loaded.
    fn save_state(&self, dir: &Path, pg: &ProcessGroup) -> Result<(), TrainError> {
        if self.groups.is_empty() {
            if self.saved.is_empty() {
                return Ok(());
            }
            return Err(TrainError::Output {
                path: dir.to_path_buf(),
                msg: "the loaded optimizer state is restored at the first step; take one before saving"
                    .into(),
            });
        }
        let comms = Comms {
            world: pg,
            expert: self.expert.as_ref().map(|e| (&*e.comm.group, &e.expert_dp)),
        };
        let ep = self.expert_rank().map_or(1, |e| e.1);
        super::state::save(dir, &self.groups, &comms, ep)
    }

    /// `lego-rl.json`, and the weight probe's log-probs (`probe.json`, [`crate::model::probe`])
    /// when this process holds the whole model in the dtypes it saves; otherwise a server
    /// following this run scores the checkpoint itself.
    fn save_info(&self, dir: &Path) -> Result<(), TrainError> {
        let path = dir.join(INFO_FILE);
        let text = serde_json::to_string_pretty(&self.info).expect("invariant: info serializes");
        std::fs::write(&path, text + "\n").map_err(|e| TrainError::Output {
            path,
            msg: e.to_string(),
        })?;
        if self.expert.is_none() && probe::fits(&self.model) && probe::computes_as_saved(&self.model) {
            probe::write(dir, &self.model, self.info.policy_version)?;
        }
        Ok(())
    }

    /// [`Trainer::save_atomic_on`] for one process.
    pub fn save_atomic(&self, out: &Path) -> Result<(), TrainError> {
        self.save_atomic_on(out, &ProcessGroup::single())
    }

    /// Every rank calls this. The checkpoint is written into a staging directory beside `out`
    /// (rank 0: model, counter, `lego-rl.json`; every rank: its part of the optimizer state; under
    /// expert parallelism, each rank of the first group its model shard), then rank 0 renames
    /// it to `out` once all ranks have written: a failure anywhere leaves nothing under `out`.
    /// `out` must not exist or be an empty directory; it and the staging directory must be on a
    /// file system every rank sees.
    pub fn save_atomic_on(&self, out: &Path, pg: &ProcessGroup) -> Result<(), TrainError> {
        let fail = |msg: String| TrainError::Output {
            path: out.to_path_buf(),
            msg,
        };
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = out
            .file_name()
            .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
        let tmp = parent.join(format!(".lego-rl-ckpt-{name}.partial"));
        let lead = pg.rank() == 0;
        let result = (|| {
            if lead {
                check_out(out)?;
                std::fs::create_dir_all(&parent).map_err(|e| fail(format!("cannot create parent: {e}")))?;
                if tmp.exists() {
                    // Left by a run that was killed while saving.
                    std::fs::remove_dir_all(&tmp)
                        .map_err(|e| fail(format!("cannot remove stale {}: {e}", tmp.display())))?;
                }
                std::fs::create_dir(&tmp)
                    .map_err(|e| fail(format!("cannot create {}: {e}", tmp.display())))?;
            }
            pg.barrier("creating the checkpoint's staging directory")?;
            self.save_state(&tmp, pg)?;
            match &self.expert {
                // Expert parallelism: the ranks of the first expert-parallel group write the
                // model's shards (the other groups hold copies).
                Some(ep) if ep.expert_dp.rank() == 0 => {
                    self.model
                        .save_sharded(&tmp, &ep.comm.group, self.expert_layout)?;
                }
                Some(_) => {}
                None if lead && self.model.needs_sharded_save(self.expert_layout) => {
                    let single = ProcessGroup::single().with_device(self.model.device());
                    self.model.save_sharded(&tmp, &single, self.expert_layout)?;
                }
                None if lead => self.model.save(&tmp)?,
                None => {}
            }
            if lead {
                self.opt.save_counter(&tmp)?;
                self.save_info(&tmp)?;
            }
            pg.barrier("writing the checkpoint")?;
            if lead {
                if out.is_dir() {
                    std::fs::remove_dir(out).map_err(|e| fail(e.to_string()))?;
                }
                std::fs::rename(&tmp, out).map_err(|e| fail(format!("cannot rename into place: {e}")))?;
            }
            Ok(())
        })();
        if result.is_err() && lead {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result
    }
}

/// Refuses an `--out` that already holds files (nothing is overwritten).
pub fn check_out(out: &Path) -> Result<(), TrainError> {
    if out.exists() {
        let empty = out.is_dir()
            && std::fs::read_dir(out)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
        if !empty {
            return Err(TrainError::Output {
                path: out.to_path_buf(),
                msg: "already exists and is not an empty directory; refusing to overwrite".into(),
            });
        }
    }
    Ok(())
}
