//! Devices: what `--device` names, checked before any work starts (a `--device cuda` on a machine
//! without a GPU fails at once, saying so), and what this process can use (`lego-rl env`).
//!
//! The release binary links libtorch_cuda whenever its torch wheel has CUDA (build.rs), so the
//! same binary runs on CPU and on GPU: "no CUDA device" and "built without CUDA" are different
//! errors, and the message says which one it is.

pub mod driver;
pub mod probe;
pub mod report;

use tch::Device;

/// Why a `--device` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("--device {given}: expected cpu, cuda or cuda:N")]
    Parse { given: String },
    #[error("--device {given}: no CUDA device: {why}")]
    NoCuda { given: String, why: String },
    #[error("--device {given}: this lego-rl was built without CUDA ({why})")]
    NotBuilt { given: String, why: String },
    #[error("--device {given}: only {count} CUDA device(s) visible (cuda:0 to cuda:{last})", last = count - 1)]
    OutOfRange { given: String, count: i64 },
}

/// True when build.rs linked libtorch_cuda (the torch wheel had CUDA).
pub fn built_with_cuda() -> bool {
    env!("LEGO_RL_BUILT_CUDA") == "1"
}

/// True when build.rs compiled the c10d shim's NCCL path (CUDA headers were found).
pub fn built_with_nccl() -> bool {
    env!("LEGO_RL_BUILT_NCCL") == "1"
}

/// Parses `--device` (`cpu`, `cuda`, `cuda:N`) and, for CUDA, checks that the device is there.
pub fn resolve(given: &str) -> Result<Device, DeviceError> {
    let device =
        crate::model::parse_device(given).ok_or_else(|| DeviceError::Parse { given: given.into() })?;
    let Device::Cuda(index) = device else {
        return Ok(device);
    };
    let given = given.to_string();
    if !built_with_cuda() || report::loaded_library("libtorch_cuda").is_none() {
        let why = if built_with_cuda() {
            "libtorch_cuda is not loaded".to_string()
        } else {
            "its torch had no libtorch_cuda; rebuild against a CUDA torch wheel (scripts/setup.sh)"
                .to_string()
        };
        return Err(DeviceError::NotBuilt { given, why });
    }
    let count = tch::Cuda::device_count();
    if count == 0 {
        return Err(DeviceError::NoCuda {
            given,
            why: no_gpu_reason(),
        });
    }
    if index as i64 >= count {
        return Err(DeviceError::OutOfRange { given, count });
    }
    Ok(device)
}

/// Why torch sees no GPU, in the driver's words.
fn no_gpu_reason() -> String {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let driver = match driver::probe() {
        Err(e) => e.to_string(),
        Ok(d) if d.devices.is_empty() => format!("the NVIDIA driver ({}) reports no GPU", d.version),
        Ok(d) => format!(
            "the NVIDIA driver ({}) reports {} GPU(s) but torch sees none",
            d.version,
            d.devices.len()
        ),
    };
    match visible {
        Some(v) => format!("torch sees 0 GPUs; {driver}; CUDA_VISIBLE_DEVICES={v}"),
        None => format!("torch sees 0 GPUs; {driver}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_bad_names() {
        assert_eq!(resolve("cpu").unwrap(), Device::Cpu);
        let err = resolve("gpu").unwrap_err().to_string();
        assert_eq!(err, "--device gpu: expected cpu, cuda or cuda:N");
    }
}
