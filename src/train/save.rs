//! A trainer's checkpoint on disk: loading it, and writing the next one atomically — from one
//! process or from every rank of a world (rank 0 writes the model, `lego-rl.json` and the step
//! counter; under ZeRO each rank adds its `optimizer/rank-RRRRR.safetensors`, and under expert
//! parallelism its experts' shard in `optimizer/experts-RRRRR-of-EEEEE/`).

use std::path::{Path, PathBuf};

use tch::{Device, Kind};

use super::optim::AdamW;
use super::trainer::{CheckpointInfo, Trainer, INFO_FILE};
use super::{zero, TrainError};
use crate::c10d::ProcessGroup;
use crate::model::Model;

impl Trainer {
    /// Loads a checkpoint and, when present, its optimizer state and `lego-rl.json`.
    pub fn load(dir: &Path, device: Device, kind: Option<Kind>) -> Result<Self, TrainError> {
        let mut t = Self::load_model(Model::load(dir, device, kind)?, dir, device)?;
        // Expert moments saved under expert parallelism only resume at that size.
        super::expert::load_expert_moments(&mut t.opt, dir, device, 0, 1)?;
        Ok(t)
    }

    /// A trainer around `model` (loaded from `dir`) with the optimizer state and `lego-rl.json`
    /// found there.
    pub(super) fn load_model(model: Model, dir: &Path, device: Device) -> Result<Self, TrainError> {
        let opt = AdamW::load(dir, device)?;
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
        Ok(Trainer {
            zero_saved: zero::saved_layout(dir)?,
            source: Some(dir.to_path_buf()),
            ..Trainer {
                info,
                opt,
                ..Trainer::new(model)
            }
        })
    }

    /// Writes the checkpoint, optimizer state and `lego-rl.json` into existing directory `dir`
    /// (under ZeRO: the step counter only; see [`Trainer::save_atomic_on`]).
    pub fn save(&self, dir: &Path) -> Result<(), TrainError> {
        if self.model.needs_sharded_save(self.expert_layout) {
            self.model.save_sharded(
                dir,
                &ProcessGroup::single().with_device(self.model.device()),
                self.expert_layout,
            )?;
        } else {
            self.model.save(dir)?;
        }
        if self.zero.is_some() {
            self.opt.save_counter(dir)?;
        } else {
            self.opt.save(dir)?;
        }
        self.save_info(dir)
    }

    fn save_info(&self, dir: &Path) -> Result<(), TrainError> {
        let path = dir.join(INFO_FILE);
        let text = serde_json::to_string_pretty(&self.info).expect("invariant: info serializes");
        std::fs::write(&path, text + "\n").map_err(|e| TrainError::Output {
            path,
            msg: e.to_string(),
        })
    }

    /// [`Trainer::save_atomic_on`] for one process.
    pub fn save_atomic(&self, out: &Path) -> Result<(), TrainError> {
        self.save_atomic_on(out, &ProcessGroup::single())
    }

    /// Every rank calls this. The checkpoint is written into a staging directory beside `out`
    /// (rank 0: model, counter, `lego-rl.json`; every rank: its ZeRO shard; under expert
    /// parallelism, each rank of the first group its model shard and expert moments), then rank 0 renames
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
            if let Some(z) = &self.zero {
                z.save(&tmp, pg.rank())?;
            }
            self.save_expert_zero(&tmp)?;
            match &self.expert {
                // Expert parallelism: the ranks of the first expert-parallel group write the
                // model's shards and their experts' moments (the other groups hold copies).
                Some(ep) if ep.expert_dp.rank() == 0 => {
                    self.model
                        .save_sharded(&tmp, &ep.comm.group, self.expert_layout)?;
                    self.save_expert_optimizer(&tmp, lead)?;
                    if lead {
                        self.save_info(&tmp)?;
                    }
                }
                Some(_) => {}
                None if lead => self.save(&tmp)?,
                None => {}
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
