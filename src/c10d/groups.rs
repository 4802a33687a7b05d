//! Sub-groups of a [`ProcessGroup`]: any set of its ranks, and the two of expert parallelism
//! ([`ProcessGroup::expert_groups`]).

use std::ffi::{c_char, c_int, CString};
use std::ptr::NonNull;

use super::{ffi, take_err, DistError, ProcessGroup};

/// The two sub-groups of expert parallelism of size E over a world of W ranks.
#[derive(Debug)]
pub struct ExpertGroups {
    /// Ranks {g·E, …, g·E+E−1}: they split every MoE layer's experts among them and exchange
    /// tokens with all_to_all.
    pub ep: ProcessGroup,
    /// Ranks {i, i+E, i+2E, …} (i = rank mod E): they hold the same experts, and reduce those
    /// experts' gradients among themselves.
    pub expert_dp: ProcessGroup,
}

impl ProcessGroup {
    /// The sub-group of `ranks` (ascending ranks of this group, this rank among them), built
    /// under `tag` in the store (unique per sub-group). Only its members call this; a sub-group
    /// of one rank needs no c10d (every collective is the identity).
    pub fn subgroup(&self, ranks: &[usize], tag: &str, label: &str) -> Result<Self, DistError> {
        let index = ranks.iter().position(|&r| r == self.rank);
        let fail = |msg: String| DistError::Collective {
            rank: self.global.0,
            world: self.global.1,
            op: "new_group",
            what: label.to_string(),
            timeout: self.timeout,
            msg,
        };
        let Some(index) = index else {
            return Err(fail(format!("rank {} is not one of {ranks:?}", self.rank)));
        };
        let mut group = None;
        if ranks.len() > 1 {
            let Some(parent) = self.group else {
                return Err(fail("a world of one process has no sub-group of many".into()));
            };
            let tag = CString::new(tag).map_err(|e| fail(e.to_string()))?;
            let mut err: *mut c_char = std::ptr::null_mut();
            // SAFETY: `parent` is alive; valid C string; err is an out-parameter.
            let g = unsafe {
                ffi::lr_dist_subgroup(
                    parent.as_ptr(),
                    tag.as_ptr(),
                    index as c_int,
                    ranks.len() as c_int,
                    &mut err,
                )
            };
            group = Some(NonNull::new(g).ok_or_else(|| fail(take_err(err)))?);
        }
        Ok(ProcessGroup {
            group,
            rank: index,
            world_size: ranks.len(),
            local_rank: self.local_rank,
            timeout: self.timeout,
            global: self.global,
            label: Some(label.to_string()),
            device: self.device,
        })
    }

    /// The sub-groups of expert parallelism of size `ep` (which must divide the world size).
    pub fn expert_groups(&self, ep: usize) -> Result<ExpertGroups, DistError> {
        let w = self.world_size;
        if ep == 0 || w % ep != 0 {
            return Err(DistError::Env {
                var: "--expert-parallel",
                value: ep.to_string(),
                msg: format!("must divide the world size {w}"),
            });
        }
        let g = self.rank / ep;
        let i = self.rank % ep;
        let ep_ranks: Vec<usize> = (g * ep..(g + 1) * ep).collect();
        let dp_ranks: Vec<usize> = (i..w).step_by(ep).collect();
        let span = |r: &[usize]| match (r.first(), r.last()) {
            (Some(a), Some(b)) if a != b => format!("ranks {a}-{b}"),
            (Some(a), _) => format!("rank {a}"),
            _ => String::new(),
        };
        Ok(ExpertGroups {
            ep: self.subgroup(
                &ep_ranks,
                &format!("lego-rl/ep/{g}"),
                &format!("expert-parallel group {g}: {}", span(&ep_ranks)),
            )?,
            expert_dp: self.subgroup(
                &dp_ranks,
                &format!("lego-rl/expert-dp/{i}"),
                &format!(
                    "expert data-parallel group {i}: ranks {}",
                    dp_ranks
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            )?,
        })
    }
}
