//! `lego-rl env`'s report, in the spirit of `torch.utils.collect_env` and `vllm collect-env`: what
//! this binary was built with, which libtorch it loaded, and what it can use (CUDA, NCCL, the GPUs
//! and their memory, the thread count). Collected without touching a GPU beyond torch's device
//! count, so it runs anywhere in well under a second.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{built_with_cuda, built_with_nccl, driver};

/// The schema string of `lego-rl env --json`.
pub const ENV_SCHEMA: &str = "lego-rl/env/v1";

/// Everything `lego-rl env` reports. Unknown values are null, never guessed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EnvReport {
    pub schema: String,
    pub lego_rl_version: String,
    /// torch's version from the loaded libtorch's `version.py` (`2.11.0+cu130`).
    pub torch_version: Option<String>,
    /// The CUDA version that torch was built for (`version.py`'s `cuda`), null for a CPU torch.
    pub torch_cuda_version: Option<String>,
    /// The folder of the libtorch_cpu.so this process loaded (LD_LIBRARY_PATH or the baked RUNPATH).
    pub libtorch: Option<PathBuf>,
    /// build.rs linked libtorch_cuda (the torch wheel had CUDA).
    pub built_with_cuda: bool,
    /// build.rs compiled the c10d shim's NCCL path.
    pub built_with_nccl: bool,
    /// libtorch_cuda.so is mapped into this process.
    pub torch_cuda_loaded: bool,
    /// torch can use a GPU (`torch.cuda.is_available()`).
    pub cuda_available: bool,
    pub cuda_device_count: i64,
    /// The CUDA runtime version torch reports (`13000` style), when a GPU is usable.
    pub cudart_version: Option<i64>,
    pub cudnn_version: Option<i64>,
    /// The CUDA version the NVIDIA driver supports, null without a driver.
    pub driver_cuda_version: Option<String>,
    /// Why the driver could not be asked (no driver on a CPU machine).
    pub driver_error: Option<String>,
    /// NCCL collectives can run: the NCCL path is built and a GPU is usable.
    pub nccl_usable: bool,
    /// The version of the loaded libnccl (`2.27.7`), when libtorch_cuda brought it in.
    pub nccl_version: Option<String>,
    pub devices: Vec<DeviceInfo>,
    /// torch's intra-op thread count.
    pub threads: i64,
    pub cuda_visible_devices: Option<String>,
}

/// One GPU.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub index: usize,
    pub name: String,
    pub memory_bytes: u64,
    pub compute_capability: String,
}

/// Collects the report.
pub fn collect() -> EnvReport {
    let libtorch = loaded_library("libtorch_cpu").and_then(|p| p.parent().map(Path::to_path_buf));
    let version_py = libtorch
        .as_ref()
        .and_then(|lib| std::fs::read_to_string(lib.join("../version.py")).ok())
        .unwrap_or_default();
    let torch_cuda_loaded = loaded_library("libtorch_cuda").is_some();
    let cuda_device_count = if torch_cuda_loaded {
        tch::Cuda::device_count()
    } else {
        0
    };
    let cuda_available = cuda_device_count > 0;
    let (driver_cuda_version, driver_error, devices) = match driver::probe() {
        Ok(d) => (
            Some(d.version),
            None,
            d.devices
                .into_iter()
                .map(|g| DeviceInfo {
                    index: g.index,
                    name: g.name,
                    memory_bytes: g.memory_bytes,
                    compute_capability: g.compute_capability,
                })
                .collect(),
        ),
        Err(e) => (None, Some(e.to_string()), Vec::new()),
    };
    EnvReport {
        schema: ENV_SCHEMA.into(),
        lego_rl_version: env!("CARGO_PKG_VERSION").into(),
        torch_version: py_string(&version_py, "__version__"),
        torch_cuda_version: py_string(&version_py, "cuda"),
        libtorch,
        built_with_cuda: built_with_cuda(),
        built_with_nccl: built_with_nccl(),
        torch_cuda_loaded,
        cuda_available,
        cuda_device_count,
        cudart_version: cuda_available.then(tch::utils::version_cudart),
        cudnn_version: cuda_available.then(tch::utils::version_cudnn),
        driver_cuda_version,
        driver_error,
        nccl_usable: built_with_nccl() && cuda_available,
        nccl_version: nccl_version(),
        devices,
        threads: tch::get_num_threads() as i64,
        cuda_visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
    }
}

impl EnvReport {
    /// `key: value` lines for a terminal.
    pub fn table(&self) -> String {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let mut lines = vec![
            ("lego-rl", self.lego_rl_version.clone()),
            ("torch", opt(&self.torch_version)),
            ("torch CUDA", opt(&self.torch_cuda_version)),
            (
                "libtorch",
                self.libtorch
                    .as_ref()
                    .map_or("-".into(), |p| p.display().to_string()),
            ),
            (
                "built with",
                format!(
                    "CUDA {}, NCCL {}",
                    yes_no(self.built_with_cuda),
                    yes_no(self.built_with_nccl)
                ),
            ),
            ("libtorch_cuda loaded", yes_no(self.torch_cuda_loaded).into()),
            (
                "CUDA usable",
                format!(
                    "{} ({} devices)",
                    yes_no(self.cuda_available),
                    self.cuda_device_count
                ),
            ),
            (
                "NVIDIA driver",
                match (&self.driver_cuda_version, &self.driver_error) {
                    (Some(v), _) => format!("CUDA {v}"),
                    (None, Some(e)) => e.clone(),
                    (None, None) => "-".into(),
                },
            ),
            (
                "NCCL usable",
                format!(
                    "{} (libnccl {})",
                    yes_no(self.nccl_usable),
                    opt(&self.nccl_version)
                ),
            ),
            ("threads", self.threads.to_string()),
        ];
        for d in &self.devices {
            lines.push((
                "device",
                format!(
                    "cuda:{} {} {:.1} GiB, compute capability {}",
                    d.index,
                    d.name,
                    d.memory_bytes as f64 / f64::from(1u32 << 30),
                    d.compute_capability
                ),
            ));
        }
        let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        lines.iter().map(|(k, v)| format!("{k:width$}  {v}\n")).collect()
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The path of a shared library mapped into this process whose file name starts with `stem.so`
/// (read from /proc/self/maps: the library the loader actually chose).
pub fn loaded_library(stem: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let want = format!("{stem}.so");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(&want))
        })
        .map(PathBuf::from)
}

/// `NAME = 'value'` from torch's version.py.
fn py_string(src: &str, name: &str) -> Option<String> {
    src.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        // `cuda: Optional[str] = '13.0'`: the name before an annotation.
        if k.split(':').next().map(str::trim) != Some(name) {
            return None;
        }
        let v = v.trim().trim_matches(|c| c == '\'' || c == '"');
        (!v.is_empty() && v != "None").then(|| v.to_string())
    })
}

/// `ncclGetVersion` of the libnccl already loaded (by libtorch_cuda), if any.
fn nccl_version() -> Option<String> {
    loaded_library("libnccl")?;
    type GetVersion = unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int;
    // SAFETY: a lookup in the already-loaded objects; the symbol is NCCL's documented
    // `ncclResult_t ncclGetVersion(int*)`.
    unsafe {
        let p = libc::dlsym(libc::RTLD_DEFAULT, c"ncclGetVersion".as_ptr());
        if p.is_null() {
            return None;
        }
        let f: GetVersion = std::mem::transmute::<*mut libc::c_void, GetVersion>(p);
        let mut v = 0;
        if f(&mut v) != 0 {
            return None;
        }
        // NCCL >= 2.9: major * 10000 + minor * 100 + patch.
        Some(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_torch_version_py() {
        let src = "__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\nhip = None\n";
        assert_eq!(py_string(src, "__version__").as_deref(), Some("2.11.0+cu130"));
        assert_eq!(py_string(src, "cuda").as_deref(), Some("13.0"));
        assert_eq!(py_string(src, "hip"), None);
    }
}
