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
//! A group has a device ([`ProcessGroup::device`]) and every collective refuses a tensor on
//! another one, naming the operation and both devices: NCCL rejects host tensors ("Tensors must
//! be CUDA and dense") only on a GPU cluster, so a CPU/Gloo run in CI must catch a collective on
//! the wrong device before NCCL would.
//!
//! Expert parallelism adds sub-groups ([`ProcessGroup::expert_groups`]: the ranks that split the
//! experts among them, and the ranks that hold the same experts), all_to_all with uneven splits
//! and a differentiable all_to_all ([`ProcessGroup::all_to_all_autograd`]) for the MoE dispatch.
//!
//! - [`env`]: which rank am I (torchrun or Slurm variables).
//! - `groups`: sub-groups, and the two of expert parallelism.
//! - `collectives`: all_reduce, broadcast, all_gather, reduce_scatter, all_to_all (even, uneven,
//!   differentiable), barrier.
//! - [`launch`]: `--nproc-per-node N`, a local launcher like `torchrun --standalone`.

mod collectives;
pub mod env;
mod ffi;
mod groups;
pub mod launch;

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;

use tch::Device;

pub use env::WorldEnv;
pub use groups::ExpertGroups;

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
    /// The device every collective's tensors must be on: cuda:LOCAL_RANK for NCCL (which
    /// rejects host tensors), the model's device for Gloo (CPU, or CUDA tensors, which Gloo
    /// also takes); set with [`ProcessGroup::with_device`].
    device: Device,
}

// The shim's group is only used through &self. c10d's backends accept calls from any thread
// and the shim's own state (the poisoned flag) is behind a mutex, so sharing a group between
// threads is sound; the trainer issues collectives from one thread, in one order on every rank.
unsafe impl Send for ProcessGroup {}
unsafe impl Sync for ProcessGroup {}

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
            device: Device::Cpu,
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
            device: match backend {
                Backend::Gloo => Device::Cpu,
                Backend::Nccl => Device::Cuda(w.local_rank),
            },
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

    /// The device every collective's tensors must be on (see [`ProcessGroup::with_device`]).
    pub fn device(&self) -> Device {
        self.device
    }

    /// This group with its collectives on `device` (the model's: a Gloo group on a CUDA model,
    /// or an NCCL rank whose GPU is not cuda:LOCAL_RANK, e.g. one GPU per task). Sub-groups made
    /// afterwards inherit it.
    pub fn with_device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }
}

/// A device as PyTorch writes it (`cpu`, `cuda:0`), for errors.
pub(crate) fn device_name(d: Device) -> String {
    match d {
        Device::Cpu => "cpu".into(),
        Device::Cuda(i) => format!("cuda:{i}"),
        Device::Mps => "mps".into(),
        Device::Vulkan => "vulkan".into(),
    }
}
