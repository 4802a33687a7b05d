//! The NVIDIA driver's view of the GPUs (CUDA driver API, `libcuda.so.1`, opened at run time):
//! names, memory and compute capability for `lego-rl env`, and the reason torch sees no GPU. It
//! is opened with dlopen because a machine without a GPU has no libcuda, and the binary must
//! still start there; libtorch_cuda itself also opens it only on first use.

use std::ffi::{c_char, c_int, c_void, CStr};

/// What the driver reports.
#[derive(Debug, Clone)]
pub struct Driver {
    /// The CUDA version the driver supports, `13.0`.
    pub version: String,
    pub devices: Vec<Gpu>,
}

/// One GPU as the driver shows it to this process (`CUDA_VISIBLE_DEVICES` applied).
#[derive(Debug, Clone)]
pub struct Gpu {
    pub index: usize,
    pub name: String,
    pub memory_bytes: u64,
    pub compute_capability: String,
}

/// Why the driver could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("no NVIDIA driver (libcuda.so.1 cannot be opened)")]
    NotFound,
    #[error("libcuda.so.1 lacks {0}")]
    Symbol(&'static str),
    #[error("the NVIDIA driver failed in {call} (CUresult {code})")]
    Call { call: &'static str, code: c_int },
}

type CuInit = unsafe extern "C" fn(u32) -> c_int;
type CuIntOut = unsafe extern "C" fn(*mut c_int) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> c_int;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;

const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;

fn sym<T: Copy>(lib: *mut c_void, name: &'static str) -> Result<T, DriverError> {
    let cname = std::ffi::CString::new(name).map_err(|_| DriverError::Symbol(name))?;
    // SAFETY: `lib` is a live dlopen handle (never closed), `cname` a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, cname.as_ptr()) };
    if p.is_null() {
        return Err(DriverError::Symbol(name));
    }
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the function-pointer type of the documented CUDA driver API entry `name`.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn check(call: &'static str, code: c_int) -> Result<(), DriverError> {
    if code == 0 {
        Ok(())
    } else {
        Err(DriverError::Call { call, code })
    }
}

/// Asks the driver for its version and the GPUs it shows this process.
pub fn probe() -> Result<Driver, DriverError> {
    // SAFETY: plain dlopen of a system library; the handle is kept for the process's life.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Err(DriverError::NotFound);
    }
    let init: CuInit = sym(lib, "cuInit")?;
    let driver_version: CuIntOut = sym(lib, "cuDriverGetVersion")?;
    let count: CuIntOut = sym(lib, "cuDeviceGetCount")?;
    let get: CuDeviceGet = sym(lib, "cuDeviceGet")?;
    let name: CuDeviceGetName = sym(lib, "cuDeviceGetName")?;
    let total_mem: CuDeviceTotalMem = sym(lib, "cuDeviceTotalMem_v2")?;
    let attr: CuDeviceGetAttribute = sym(lib, "cuDeviceGetAttribute")?;
    // SAFETY: each call follows the CUDA driver API's signature with valid out-pointers.
    unsafe {
        let mut v: c_int = 0;
        check("cuDriverGetVersion", driver_version(&mut v))?;
        let version = format!("{}.{}", v / 1000, (v % 1000) / 10);
        check("cuInit", init(0))?;
        let mut n: c_int = 0;
        check("cuDeviceGetCount", count(&mut n))?;
        let mut devices = Vec::new();
        for i in 0..n {
            let mut dev: c_int = 0;
            check("cuDeviceGet", get(&mut dev, i))?;
            let mut buf: [c_char; 256] = [0; 256];
            check("cuDeviceGetName", name(buf.as_mut_ptr(), buf.len() as c_int, dev))?;
            let mut bytes: usize = 0;
            check("cuDeviceTotalMem", total_mem(&mut bytes, dev))?;
            let (mut major, mut minor): (c_int, c_int) = (0, 0);
            check("cuDeviceGetAttribute", attr(&mut major, ATTR_CC_MAJOR, dev))?;
            check("cuDeviceGetAttribute", attr(&mut minor, ATTR_CC_MINOR, dev))?;
            devices.push(Gpu {
                index: i as usize,
                name: CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(),
                memory_bytes: bytes as u64,
                compute_capability: format!("{major}.{minor}"),
            });
        }
        Ok(Driver { version, devices })
    }
}
