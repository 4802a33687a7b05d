//! Many ranks, one step: libtorch's own c10d (TCPStore rendezvous, ProcessGroupGloo on CPU,
//! ProcessGroupNCCL on CUDA) behind one safe type, [`ProcessGroup`].
//!
//! tch has no bindings for c10d, so `shim.cpp` (compiled by build.rs with torch-sys's flags) wraps
//! the few calls we need in a narrow `extern "C"` surface ([`ffi`]); nothing else in the crate
//! touches C++. Tensor data only ever moves through c10d's collectives.
//!
//! A process that was not started as one rank of many is a world of size 1
//! ([`ProcessGroup::single`]): every collective is then the identity, so the trainer runs the same
//! code whatever the world size.
//!
//! Expert parallelism adds sub-groups ([`ProcessGroup::expert_groups`]: the ranks that split the
//! experts among them, and the ranks that hold the same experts), all_to_all with uneven splits
//! and a differentiable all_to_all ([`ProcessGroup::all_to_all_autograd`]) for the MoE dispatch.
//!
//! - [`env`]: which rank am I (torchrun or Slurm variables).
//! - [`launch`]: `--nproc-per-node N`, a local launcher like `torchrun --standalone`.

pub mod env;
mod ffi;
pub mod launch;

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;

use tch::Tensor;

pub use env::WorldEnv;

/// Errors of the process group; each names the rank and what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("{var}={value}: {msg}")]
    Env {
        var: &'static str,
        value: String,
        msg: String,
    },
    #[error("rank {rank} of {world}: rendezvous at {addr} ({backend}) failed within {timeout:?}: {msg}")]
    Init {
        rank: usize,
        world: usize,
        addr: String,
        backend: Backend,
        timeout: Duration,
        msg: String,
    },
    #[error(
        "rank {rank} of {world}: {op} ({what}) failed: {msg} (a peer rank died, hung past \
         --dist-timeout {timeout:?}, or disagreed on the collective)"
    )]
    Collective {
        rank: usize,
        world: usize,
        op: &'static str,
        what: String,
        timeout: Duration,
        msg: String,
    },
    #[error("rank {rank}: {op} ({what}): {msg}")]
    BadTensor {
        rank: usize,
        op: &'static str,
        what: String,
        msg: String,
    },
}

/// The c10d backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// CPU tensors (and the only one tested in CI).
    Gloo,
    /// CUDA tensors, one GPU per rank (needs the `nccl` cargo feature).
    Nccl,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        })
    }
}

/// Reduction of [`ProcessGroup::all_reduce`] and [`ProcessGroup::reduce_scatter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    Product,
}

impl ReduceOp {
    fn code(self) -> c_int {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
            ReduceOp::Product => 3,
        }
    }
}

/// One rank's membership in a group of `world_size` processes (the whole world, or a sub-group
/// of it).
#[derive(Debug)]
pub struct ProcessGroup {
    /// The shim's group; `None` for a group of size 1 without c10d.
    group: Option<NonNull<c_void>>,
    rank: usize,
    world_size: usize,
    local_rank: usize,
    timeout: Duration,
    /// This process's rank in the whole world and its size (errors name these).
    global: (usize, usize),
    /// Which sub-group this is (`None`: the world), for errors.
    label: Option<String>,
}

// The shim's group is only used through &self. c10d's backends accept calls from any thread
// and the shim's own state (the poisoned flag) is behind a mutex, so sharing a group between
// threads is sound; the trainer issues collectives from one thread, in one order on every rank.
unsafe impl Send for ProcessGroup {}
unsafe impl Sync for ProcessGroup {}

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
impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(g) = self.group.take() {
            // SAFETY: created by lr_dist_init and dropped once.
            unsafe { ffi::lr_dist_free(g.as_ptr()) }
        }
    }
}

fn take_err(err: *mut c_char) -> String {
    if err.is_null() {
        return "unknown error (no message)".into();
    }
    // SAFETY: the shim returns a NUL-terminated malloc'ed string that we own.
    let msg = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    unsafe { ffi::lr_dist_free_string(err) };
    msg.trim().to_string()
}

impl ProcessGroup {
    /// A world of one process: no rendezvous, every collective is the identity.
    pub fn single() -> Self {
        ProcessGroup {
            group: None,
            rank: 0,
            world_size: 1,
            local_rank: 0,
            timeout: Duration::from_secs(0),
            global: (0, 1),
            label: None,
        }
    }

    /// Joins the group the environment describes (torchrun or Slurm variables, see [`env`]), or
    /// returns [`ProcessGroup::single`] when it describes none.
    pub fn from_env(backend: Backend, timeout: Duration) -> Result<Self, DistError> {
        match env::world_from_env(|k| std::env::var(k).ok())? {
            None => Ok(ProcessGroup::single()),
            Some(w) => ProcessGroup::init(&w, backend, timeout),
        }
    }

    /// Rendezvous at `w.master_addr:w.master_port` (rank 0 serves the TCPStore) and builds the
    /// backend. Fails, rather than waits forever, when the store or a peer is not there within
    /// `timeout`.
    pub fn init(w: &WorldEnv, backend: Backend, timeout: Duration) -> Result<Self, DistError> {
        let fail = |msg: String| DistError::Init {
            rank: w.rank,
            world: w.world_size,
            addr: format!("{}:{}", w.master_addr, w.master_port),
            backend,
            timeout,
            msg,
        };
        let host = CString::new(w.master_addr.clone()).map_err(|e| fail(e.to_string()))?;
        // Gloo binds to an address of this host that peers can reach: the named interface, the
        // loopback when everything is local, else Gloo's default (the host name's address).
        let iface = CString::new(std::env::var("GLOO_SOCKET_IFNAME").unwrap_or_default())
            .map_err(|e| fail(e.to_string()))?;
        let local =
            matches!(w.master_addr.as_str(), "localhost" | "::1") || w.master_addr.starts_with("127.");
        let gloo_host = CString::new(if local { "127.0.0.1" } else { "" }).expect("no NUL");
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: valid C strings for the call's duration; err is an out-parameter.
        let g = unsafe {
            ffi::lr_dist_init(
                match backend {
                    Backend::Gloo => 0,
                    Backend::Nccl => 1,
                },
                host.as_ptr(),
                c_int::from(w.master_port),
                w.rank as c_int,
                w.world_size as c_int,
                timeout.as_millis() as i64,
                iface.as_ptr(),
                gloo_host.as_ptr(),
                &mut err,
            )
        };
        let group = NonNull::new(g).ok_or_else(|| fail(take_err(err)))?;
        tracing::debug!(rank = w.rank, world = w.world_size, %backend, "process group ready");
        Ok(ProcessGroup {
            group: Some(group),
            rank: w.rank,
            world_size: w.world_size,
            local_rank: w.local_rank,
            timeout,
            global: (w.rank, w.world_size),
            label: None,
        })
    }

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

    /// The first error of a collective of this group, when one failed (later collectives of the
    /// group then fail at once).
    pub fn poisoned(&self) -> Option<String> {
        let g = self.group?;
        // SAFETY: `g` is alive; the shim returns NULL or a malloc'ed string we own.
        let p = unsafe { ffi::lr_dist_poisoned(g.as_ptr()) };
        (!p.is_null()).then(|| take_err(p))
    }

    /// This process's rank, 0-based.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Rank among the processes of this node (the GPU it uses).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Timeout of every collective.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn check(&self, op: &'static str, what: &str, tensors: &[&Tensor]) -> Result<(), DistError> {
        for t in tensors {
            if !t.is_contiguous() {
                return Err(DistError::BadTensor {
                    rank: self.global.0,
                    op,
                    what: what.to_string(),
                    msg: "tensor is not contiguous".into(),
                });
            }
        }
        Ok(())
    }

    fn call(
        &self,
        op: &'static str,
        what: &str,
        f: impl FnOnce(*mut c_void, i64, *mut *mut c_char) -> c_int,
    ) -> Result<(), DistError> {
        let Some(g) = self.group else {
            return Ok(());
        };
        let mut err: *mut c_char = std::ptr::null_mut();
        if f(g.as_ptr(), self.timeout.as_millis() as i64, &mut err) == 0 {
            return Ok(());
        }
        Err(self.collective_error(op, what, take_err(err)))
    }

    fn collective_error(&self, op: &'static str, what: &str, msg: String) -> DistError {
        DistError::Collective {
            rank: self.global.0,
            world: self.global.1,
            op,
            what: match &self.label {
                Some(l) => format!("{what}; {l}"),
                None => what.to_string(),
            },
            timeout: self.timeout,
            msg,
        }
    }

    fn bad_splits(&self, op: &'static str, what: &str, msg: String) -> DistError {
        DistError::BadTensor {
            rank: self.global.0,
            op,
            what: what.to_string(),
            msg,
        }
    }

    /// Checks uneven splits: one entry per rank, summing to the rows of `input` / `out`.
    fn check_splits(
        &self,
        op: &'static str,
        what: &str,
        out_rows: Option<i64>,
        input: &Tensor,
        out_splits: &[i64],
        in_splits: &[i64],
    ) -> Result<(), DistError> {
        let n = self.world_size;
        if out_splits.len() != n || in_splits.len() != n {
            return Err(self.bad_splits(
                op,
                what,
                format!(
                    "{} output and {} input splits for a group of {n}",
                    out_splits.len(),
                    in_splits.len()
                ),
            ));
        }
        if out_splits.iter().chain(in_splits).any(|&s| s < 0) {
            return Err(self.bad_splits(op, what, "negative split".into()));
        }
        let rows = input.size().first().copied().unwrap_or(0);
        if in_splits.iter().sum::<i64>() != rows {
            return Err(self.bad_splits(
                op,
                what,
                format!("input splits {in_splits:?} do not sum to its {rows} rows"),
            ));
        }
        if let Some(o) = out_rows.filter(|&o| o != out_splits.iter().sum::<i64>()) {
            return Err(self.bad_splits(
                op,
                what,
                format!("output splits {out_splits:?} do not sum to its {o} rows"),
            ));
        }
        Ok(())
    }

    /// Uneven splits along dim 0: `in_splits[j]` rows of `input` go to rank j; `out` receives
    /// `out_splits[i]` rows from rank i, in rank order. Every rank must call it, even with
    /// nothing to send or receive.
    pub fn all_to_all_v(
        &self,
        out: &Tensor,
        input: &Tensor,
        out_splits: &[i64],
        in_splits: &[i64],
        what: &str,
    ) -> Result<(), DistError> {
        self.check("all_to_all", what, &[out, input])?;
        let out_rows = out.size().first().copied().unwrap_or(0);
        self.check_splits("all_to_all", what, Some(out_rows), input, out_splits, in_splits)?;
        if self.group.is_none() {
            tch::no_grad(|| out.shallow_clone().copy_(input));
            return Ok(());
        }
        self.call("all_to_all", what, |g, ms, err| unsafe {
            ffi::lr_dist_all_to_all_v(
                g,
                out.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                out_splits.as_ptr(),
                in_splits.as_ptr(),
                out_splits.len() as i64,
                ms,
                err,
            )
        })
    }

    /// [`Self::all_to_all_v`] as a new tensor with a gradient: its backward sends each gradient
    /// row back to the rank its row came from (the reverse exchange, itself a collective every
    /// rank's backward takes part in). A failure in the backward surfaces as the error of
    /// `f_backward`.
    pub fn all_to_all_autograd(
        &self,
        input: &Tensor,
        out_splits: &[i64],
        in_splits: &[i64],
        what: &str,
    ) -> Result<Tensor, DistError> {
        self.check_splits("all_to_all", what, None, input, out_splits, in_splits)?;
        let Some(g) = self.group else {
            return Ok(input.shallow_clone());
        };
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: `input` and the splits outlive the call (which waits for the exchange); the
        // group outlives the graph's backward as long as `self` does (callers keep it alive).
        let p = unsafe {
            ffi::lr_dist_all_to_all_autograd(
                g.as_ptr(),
                input.as_ptr() as *mut c_void,
                out_splits.as_ptr(),
                in_splits.as_ptr(),
                out_splits.len() as i64,
                self.timeout.as_millis() as i64,
                &mut err,
            )
        };
        if p.is_null() {
            return Err(self.collective_error("all_to_all", what, take_err(err)));
        }
        // SAFETY: a `new at::Tensor` that tch now owns (and frees with `delete`).
        Ok(unsafe { Tensor::from_ptr(p as *mut _) })
    }

    /// Reduces `t` in place over all ranks. `what` says what it holds, for errors.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp, what: &str) -> Result<(), DistError> {
        self.check("all_reduce", what, &[t])?;
        // SAFETY: `t` outlives the call, which waits for the work to finish.
        self.call("all_reduce", what, |g, ms, err| unsafe {
            ffi::lr_dist_all_reduce(g, t.as_ptr() as *mut c_void, op.code(), ms, err)
        })
    }

    /// Copies rank `root`'s `t` into every rank's `t`.
    pub fn broadcast(&self, t: &Tensor, root: usize, what: &str) -> Result<(), DistError> {
        self.check("broadcast", what, &[t])?;
        self.call("broadcast", what, |g, ms, err| unsafe {
            ffi::lr_dist_broadcast(g, t.as_ptr() as *mut c_void, root as c_int, ms, err)
        })
    }

    /// Fills `out` (world_size × numel(input) elements) with every rank's `input`, rank order.
    pub fn all_gather(&self, out: &Tensor, input: &Tensor, what: &str) -> Result<(), DistError> {
        self.check("all_gather", what, &[out, input])?;
        self.same_numel("all_gather", what, out, input)?;
        if self.group.is_none() {
            tch::no_grad(|| out.shallow_clone().view_as(input).copy_(input));
            return Ok(());
        }
        // c10d splits the output along dim 0: hand it flat views.
        let (out, input) = (out.view([-1]), input.view([-1]));
        self.call("all_gather", what, |g, ms, err| unsafe {
            ffi::lr_dist_all_gather(
                g,
                out.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                ms,
                err,
            )
        })
    }

    /// Reduces `input` (world_size blocks of numel(out)) over ranks; rank r keeps block r in `out`.
    pub fn reduce_scatter(
        &self,
        out: &Tensor,
        input: &Tensor,
        op: ReduceOp,
        what: &str,
    ) -> Result<(), DistError> {
        self.check("reduce_scatter", what, &[out, input])?;
        self.same_numel("reduce_scatter", what, input, out)?;
        if self.group.is_none() {
            tch::no_grad(|| out.shallow_clone().copy_(&input.view_as(out)));
            return Ok(());
        }
        let (out, input) = (out.view([-1]), input.view([-1]));
        let (out, input) = (out.view([-1]), input.view([-1]));
        self.call("reduce_scatter", what, |g, ms, err| unsafe {
            ffi::lr_dist_reduce_scatter(
                g,
                out.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                op.code(),
                ms,
                err,
            )
        })
    }

    /// Equal splits along dim 0: block j of `input` goes to rank j; block i of `out` comes from
    /// rank i.
    pub fn all_to_all(&self, out: &Tensor, input: &Tensor, what: &str) -> Result<(), DistError> {
        self.check("all_to_all", what, &[out, input])?;
        if out.size() != input.size()
            || input.size().first().copied().unwrap_or(0) % self.world_size as i64 != 0
        {
            return Err(DistError::BadTensor {
                rank: self.global.0,
                op: "all_to_all",
                what: what.to_string(),
                msg: format!(
                    "input {:?} and output {:?} must have one shape whose dim 0 divides by {}",
                    input.size(),
                    out.size(),
                    self.world_size
                ),
            });
        }
        if self.group.is_none() {
            tch::no_grad(|| out.shallow_clone().copy_(input));
            return Ok(());
        }
        self.call("all_to_all", what, |g, ms, err| unsafe {
            ffi::lr_dist_all_to_all(
                g,
                out.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                ms,
                err,
            )
        })
    }

    /// Waits until every rank got here.
    pub fn barrier(&self, what: &str) -> Result<(), DistError> {
        self.call("barrier", what, |g, ms, err| unsafe {
            ffi::lr_dist_barrier(g, ms, err)
        })
    }

    /// `big` must hold world_size × numel(small) elements.
    fn same_numel(
        &self,
        op: &'static str,
        what: &str,
        big: &Tensor,
        small: &Tensor,
    ) -> Result<(), DistError> {
        if big.numel() != small.numel() * self.world_size || big.kind() != small.kind() {
            return Err(DistError::BadTensor {
                rank: self.global.0,
                op,
                what: what.to_string(),
                msg: format!(
                    "{} {:?} elements vs {} {:?} × world size {}",
                    big.numel(),
                    big.kind(),
                    small.numel(),
                    small.kind(),
                    self.world_size
                ),
            });
        }
        Ok(())
    }
}
