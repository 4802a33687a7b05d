//! Optimizer state on disk: one layout for every parallelism, and the readers of the four
//! layouts that came before it.
//!
//! ```text
//! CKPT/trainer_state.json                        the step counter
//! CKPT/optimizer/manifest.json                   which groups, which rank holds which slice
//! CKPT/optimizer/GROUP/slice-SSSSS-of-NNNNN.safetensors
//! CKPT/optimizer/GROUP/group.json                sharded groups: the ZeRO bucket layout
//! ```
//!
//! GROUP is a parameter group's name ([`super::groups::Members::name`]: `all`, or `dense` and
//! `experts-RRRRR-of-EEEEE`). A group with full storage has one slice (`exp_avg.<param>`,
//! `exp_avg_sq.<param>`, `master.<param>`), written by the first rank of its reduction group; a
//! sharded one has a slice per rank of its reduction group (`exp_avg.B`, `exp_avg_sq.B`,
//! `master.B`, fp32 chunks of bucket B). The manifest is written by rank 0, which knows every
//! group of the run from the world size and `--expert-parallel` alone; each slice entry names
//! the world rank that wrote it, so a reader (or a person) can tell who holds what.
//!
//! Loading ([`SavedState::restore`]): a group saved under the same name continues: full state
//! loads as it is or is re-sharded for ZeRO-1; sharded state needs the same layout. One
//! process's full state (group `all`) also seeds the groups of an expert-parallel run (each
//! rank's fused expert tensors cut to its rows). Anything else stops before any compute, naming
//! the file and the flags to resume with.
//!
//! Before this layout (read, never written): `optimizer.safetensors` (full), plus
//! `optimizer-ep-RRRRR-of-EEEEE.safetensors` per expert-parallel rank; or `optimizer/zero.json`
//! with `optimizer/rank-RRRRR.safetensors`, plus `optimizer/experts-RRRRR-of-EEEEE/` holding the
//! same for each rank's experts. They map onto the same groups.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Tensor};

use super::groups::{Comms, Members, ParamGroup, Storage};
use super::optim::Moments;
use super::zero::ZeroLayout;
use super::TrainError;
use crate::model::ExpertShard;

/// Folder of the optimizer state in a checkpoint.
pub const DIR: &str = "optimizer";
const MANIFEST: &str = "manifest.json";
const GROUP_LAYOUT: &str = "group.json";
const SCHEMA: &str = "lego-rl/optimizer-state/v2";

/// `optimizer/manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub schema: String,
    pub world_size: usize,
    pub expert_parallel: usize,
    /// ZeRO-1: every group is sharded over its reduction group.
    pub zero: bool,
    pub groups: Vec<GroupEntry>,
}

/// One group of the manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupEntry {
    pub name: String,
    /// `world`, or `expert-data-parallel` (the ranks holding the same experts).
    pub reduced_over: String,
    /// `full` or `zero1`.
    pub storage: String,
    pub slices: Vec<SliceEntry>,
}

/// One slice file of a group, relative to `optimizer/`, and the world rank that wrote it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SliceEntry {
    pub file: String,
    pub rank: usize,
}

fn bad(path: &Path, msg: impl Into<String>) -> TrainError {
    TrainError::OptimizerState {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

fn slice_name(group: &str, s: usize, n: usize) -> String {
    format!("{group}/slice-{s:05}-of-{n:05}.safetensors")
}

/// The world ranks of the reduction group of `m` (rank order) in a world of `world` with
/// expert parallelism `ep` (as [`crate::c10d::ProcessGroup::expert_groups`] builds them).
fn reducer_ranks(m: Members, world: usize, ep: usize) -> Vec<usize> {
    match m {
        Members::Experts { rank, .. } => (rank..world).step_by(ep).collect(),
        _ => (0..world).collect(),
    }
}

/// The manifest of a run (rank 0 writes it).
pub fn manifest(world: usize, ep: usize, zero: bool) -> Manifest {
    let expert = (ep > 1).then_some(ep);
    let mut members = Members::of_run(expert.map(|e| (0, e)));
    if let Some(e) = expert {
        members.truncate(1);
        members.extend((0..e).map(|rank| Members::Experts { rank, size: e }));
    }
    let groups = members
        .into_iter()
        .map(|m| {
            let ranks = reducer_ranks(m, world, ep);
            let ranks = if zero { ranks } else { ranks[..1].to_vec() };
            let n = ranks.len();
            GroupEntry {
                name: m.name(),
                reduced_over: if m.reduced_over_world() {
                    "world"
                } else {
                    "expert-data-parallel"
                }
                .into(),
                storage: if zero { "zero1" } else { "full" }.into(),
                slices: ranks
                    .into_iter()
                    .enumerate()
                    .map(|(s, rank)| SliceEntry {
                        file: slice_name(&m.name(), s, n),
                        rank,
                    })
                    .collect(),
            }
        })
        .collect();
    Manifest {
        schema: SCHEMA.into(),
        world_size: world,
        expert_parallel: ep,
        zero,
        groups,
    }
}

/// Writes this rank's part of the state of `groups` into checkpoint directory `dir` (rank 0 also
/// the manifest). Every rank of the world calls this.
pub fn save(dir: &Path, groups: &[ParamGroup], comms: &Comms, ep: usize) -> Result<(), TrainError> {
    let root = dir.join(DIR);
    let world = comms.world;
    let zero = groups.iter().any(|g| matches!(g.storage, Storage::Sharded(_)));
    if world.rank() == 0 {
        std::fs::create_dir_all(&root).map_err(|e| bad(&root, e.to_string()))?;
        let path = root.join(MANIFEST);
        let text = serde_json::to_string_pretty(&manifest(world.world_size(), ep, zero))
            .expect("invariant: manifest serializes");
        std::fs::write(&path, text + "\n").map_err(|e| bad(&path, e.to_string()))?;
    }
    for g in groups {
        let pg = comms.reducer(g.members);
        let name = g.members.name();
        let folder = root.join(&name);
        match &g.storage {
            Storage::Full(m) if pg.rank() == 0 => {
                std::fs::create_dir_all(&folder).map_err(|e| bad(&folder, e.to_string()))?;
                m.write(&root.join(slice_name(&name, 0, 1)))?;
            }
            Storage::Full(_) => {}
            Storage::Sharded(z) => {
                std::fs::create_dir_all(&folder).map_err(|e| bad(&folder, e.to_string()))?;
                if pg.rank() == 0 {
                    let path = folder.join(GROUP_LAYOUT);
                    let text =
                        serde_json::to_string_pretty(z.layout()).expect("invariant: layout serializes");
                    std::fs::write(&path, text + "\n").map_err(|e| bad(&path, e.to_string()))?;
                }
                z.write_slice(&root.join(slice_name(&name, pg.rank(), pg.world_size())))?;
            }
        }
    }
    Ok(())
}

/// A group as a checkpoint holds it.
#[derive(Debug, Clone)]
enum SavedStorage {
    Full(PathBuf),
    /// The layout, the file it was read from, and one file per rank of the reduction group.
    Sharded(Box<ZeroLayout>, PathBuf, Vec<PathBuf>),
}

#[derive(Debug, Clone)]
struct SavedGroup {
    name: String,
    storage: SavedStorage,
}

/// The optimizer state a checkpoint holds (files only; tensors are read by
/// [`SavedState::restore`] once the run's groups are laid out).
#[derive(Debug, Clone, Default)]
pub struct SavedState {
    groups: Vec<SavedGroup>,
    /// The file that describes the state (errors name it).
    source: PathBuf,
    /// How it was saved, for errors: (world size, expert parallelism, sharded).
    how: (usize, usize, bool),
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(path, e.to_string()))
}

impl SavedState {
    /// Reads what checkpoint `dir` holds, in this layout or an older one (none: fresh state).
    pub fn read(dir: &Path) -> Result<Self, TrainError> {
        let root = dir.join(DIR);
        let manifest = root.join(MANIFEST);
        if manifest.is_file() {
            return Self::read_manifest(&root, &manifest);
        }
        if root.join("zero.json").is_file() {
            return legacy_zero(&root);
        }
        let full = dir.join("optimizer.safetensors");
        if full.is_file() {
            return Ok(legacy_full(dir, &full));
        }
        Ok(SavedState::default())
    }

    fn read_manifest(root: &Path, path: &Path) -> Result<Self, TrainError> {
        let m: Manifest = read_json(path)?;
        if m.schema != SCHEMA {
            return Err(bad(
                path,
                format!("schema `{}`, this build reads `{SCHEMA}`", m.schema),
            ));
        }
        let mut groups = Vec::new();
        for g in m.groups {
            let files: Vec<PathBuf> = g.slices.iter().map(|s| root.join(&s.file)).collect();
            let storage = match g.storage.as_str() {
                "full" if files.len() == 1 => SavedStorage::Full(files[0].clone()),
                "zero1" => {
                    let layout_path = root.join(&g.name).join(GROUP_LAYOUT);
                    let layout: ZeroLayout = read_json(&layout_path)?;
                    if layout.world_size != files.len() {
                        return Err(bad(
                            path,
                            format!(
                                "group `{}`: {} slices listed, its group.json says {} ranks",
                                g.name,
                                files.len(),
                                layout.world_size
                            ),
                        ));
                    }
                    SavedStorage::Sharded(Box::new(layout), layout_path, files)
                }
                other => {
                    return Err(bad(
                        path,
                        format!(
                            "group `{}`: storage `{other}` with {} slices",
                            g.name,
                            files.len()
                        ),
                    ))
                }
            };
            groups.push(SavedGroup {
                name: g.name,
                storage,
            });
        }
        Ok(SavedState {
            groups,
            source: path.to_path_buf(),
            how: (m.world_size, m.expert_parallel, m.zero),
        })
    }

    /// True when the checkpoint holds any optimizer state.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Fills `g`'s storage from the saved state (`vars`: the model's parameters, frozen ones
    /// included, whose full state is kept; `params`: the group's trained parameters, which ZeRO-1
    /// lays out; `rank`: this rank's index in the group's reduction group), or
    /// refuses state this run cannot continue. `run`: this run's (world size, expert parallelism).
    pub fn restore(
        &self,
        g: &mut ParamGroup,
        vars: &[(String, Tensor)],
        params: &[(String, Tensor)],
        rank: usize,
        run: (usize, usize),
        num_experts: i64,
    ) -> Result<(), TrainError> {
        if self.is_empty() {
            return Ok(());
        }
        let device = vars.first().map_or(Device::Cpu, |(_, t)| t.device());
        let trained: Vec<(String, Tensor)> = g.members.select(vars);
        let name = g.members.name();
        let saved = self.groups.iter().find(|s| s.name == name);
        // One process's full state seeds any group (an expert group takes its rows).
        let seed = match (saved, self.groups.as_slice()) {
            (Some(s), _) => Some(s),
            (None, [only]) if only.name == "all" && matches!(only.storage, SavedStorage::Full(_)) => {
                Some(only)
            }
            _ => None,
        };
        let Some(saved) = seed else {
            return Err(self.mismatch(run));
        };
        match (&saved.storage, &mut g.storage) {
            (SavedStorage::Full(file), storage) => {
                let mut m = Moments::default();
                let shard = match g.members {
                    Members::Experts { rank, size } => Some(ExpertShard { rank, size }),
                    _ => None,
                };
                m.read(file, device, |param, t| {
                    let (_, var) = trained.iter().find(|(n, _)| n == param)?;
                    match shard {
                        Some(s) if t.size() != var.size() && t.size().first() == Some(&num_experts) => {
                            let r = s.range(num_experts);
                            Some(t.narrow(0, r.start, r.end - r.start).copy())
                        }
                        _ => Some(t),
                    }
                })?;
                m.check_shapes(&trained, file)?;
                match storage {
                    Storage::Full(mine) => *mine = m,
                    Storage::Sharded(z) => z.reshard_from(&m, params),
                }
            }
            (SavedStorage::Sharded(layout, layout_path, files), Storage::Sharded(z)) => {
                z.check_saved(layout, layout_path)?;
                let file = files.get(rank).ok_or_else(|| {
                    bad(
                        layout_path,
                        format!("{} slices saved, this rank is {rank}", files.len()),
                    )
                })?;
                z.read_slice(file)?;
            }
            (SavedStorage::Sharded(layout, ..), Storage::Full(_)) => {
                return Err(bad(
                    &self.source,
                    format!(
                        "sharded by --zero 1 over {} ranks; resume with --zero 1 at that world size (this run: \
                         --zero 0, {} ranks)",
                        layout.world_size, run.0
                    ),
                ));
            }
        }
        Ok(())
    }

    fn mismatch(&self, (world, ep): (usize, usize)) -> TrainError {
        let (w, e, z) = self.how;
        let zero = if z {
            format!(" (sharded by --zero 1 over {w} ranks)")
        } else {
            String::new()
        };
        bad(
            &self.source,
            format!(
                "saved at --expert-parallel {e}, this run has {ep} on {world} ranks{zero}: resume at \
                 --expert-parallel {e} (or from a checkpoint with full moments)"
            ),
        )
    }
}

/// `optimizer.safetensors` (one process, or the dense parameters under expert parallelism) and
/// `optimizer-ep-RRRRR-of-EEEEE.safetensors` (each expert-parallel rank's experts).
fn legacy_full(dir: &Path, full: &Path) -> SavedState {
    let mut ep_files: Vec<(usize, usize, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rest = name.strip_prefix("optimizer-ep-")?.strip_suffix(".safetensors")?;
            let (r, n) = rest.split_once("-of-")?;
            Some((
                r.parse::<usize>().ok()?.checked_sub(1)?,
                n.parse().ok()?,
                e.path(),
            ))
        })
        .collect();
    ep_files.sort();
    let ep = ep_files.iter().map(|f| f.1).max().unwrap_or(1);
    let mut groups = vec![SavedGroup {
        name: if ep > 1 { Members::Dense } else { Members::All }.name(),
        storage: SavedStorage::Full(full.to_path_buf()),
    }];
    for (rank, size, path) in ep_files.into_iter().filter(|f| f.1 == ep) {
        groups.push(SavedGroup {
            name: Members::Experts { rank, size }.name(),
            storage: SavedStorage::Full(path),
        });
    }
    SavedState {
        groups,
        source: full.to_path_buf(),
        how: (1, ep, false),
    }
}

/// `optimizer/zero.json` with `optimizer/rank-RRRRR.safetensors`, and per expert-parallel rank
/// `optimizer/experts-RRRRR-of-EEEEE/` with the same inside.
fn legacy_zero(root: &Path) -> Result<SavedState, TrainError> {
    let sharded = |folder: &Path| -> Result<SavedStorage, TrainError> {
        let path = folder.join("zero.json");
        let layout: ZeroLayout = read_json(&path)?;
        let files = (0..layout.world_size)
            .map(|r| folder.join(format!("rank-{r:05}.safetensors")))
            .collect();
        Ok(SavedStorage::Sharded(Box::new(layout), path, files))
    };
    let dense = sharded(root)?;
    let SavedStorage::Sharded(layout, ..) = &dense else {
        unreachable!("invariant: built sharded")
    };
    let (world, ep) = (layout.world_size, layout.expert_parallel);
    let mut groups = vec![SavedGroup {
        name: if ep > 1 { Members::Dense } else { Members::All }.name(),
        storage: dense,
    }];
    for rank in (0..ep).filter(|_| ep > 1) {
        let m = Members::Experts { rank, size: ep };
        groups.push(SavedGroup {
            name: m.name(),
            storage: sharded(&root.join(m.name()))?,
        });
    }
    Ok(SavedState {
        groups,
        source: root.join("zero.json"),
        how: (world, ep, true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Who holds what: the slices of each group and the world rank that writes each, as the
    /// expert-parallel groups are built (`c10d::groups`: experts of rank i are reduced over
    /// ranks i, i+E, …).
    #[test]
    fn the_manifest_names_every_slice_and_its_writer() {
        let holders = |m: &Manifest| -> Vec<(String, String, Vec<usize>)> {
            m.groups
                .iter()
                .map(|g| {
                    let ranks = g.slices.iter().map(|s| s.rank).collect();
                    (g.name.clone(), g.storage.clone(), ranks)
                })
                .collect()
        };
        let s = |n: &str, st: &str, r: &[usize]| (n.to_string(), st.to_string(), r.to_vec());
        assert_eq!(holders(&manifest(1, 1, false)), [s("all", "full", &[0])]);
        assert_eq!(holders(&manifest(2, 1, true)), [s("all", "zero1", &[0, 1])]);
        let ep = manifest(4, 2, true);
        assert_eq!(
            holders(&ep),
            [
                s("dense", "zero1", &[0, 1, 2, 3]),
                s("experts-00001-of-00002", "zero1", &[0, 2]),
                s("experts-00002-of-00002", "zero1", &[1, 3]),
            ]
        );
        assert_eq!(
            ep.groups[2].slices[1].file,
            "experts-00002-of-00002/slice-00001-of-00002.safetensors"
        );
        assert_eq!(
            holders(&manifest(4, 2, false)),
            [
                s("dense", "full", &[0]),
                s("experts-00001-of-00002", "full", &[0]),
                s("experts-00002-of-00002", "full", &[1]),
            ]
        );
    }
}
