//! No grading process can trace or write into another: the test user's commands run under a
//! seccomp filter that fails `ptrace`, `process_vm_readv`, `process_vm_writev` and `pidfd_getfd`
//! (which copies another process's descriptor, its stdout say) with `EPERM`.
//!
//! Why a filter installed in the container, and not Docker's `seccomp=` security option: Docker
//! has no per-exec security option (only the container's), and a container profile *replaces* the
//! engine's default one, so denying ptrace that way means shipping a copy of Docker's whole
//! default profile (hundreds of rules, which drift from the engine's) or loosening it. A filter
//! installed with `prctl(PR_SET_SECCOMP)` *stacks* on whatever the engine installed: every
//! syscall must pass both, so the engine's defaults stay as they are and only these four are
//! added. It is installed by root's grading shell just before it drops to the test user
//! (`no_new_privs` set first, as the kernel requires; `setpriv` then drops privileges, it never
//! gains any), and is inherited by every process the tests start; nothing can remove a seccomp
//! filter. Not `PR_SET_DUMPABLE`: it is reset to 1 at every `execve` of an ordinary binary, so
//! the shell the tests run under cannot keep it. Not Yama: `ptrace_scope` is a host setting
//! outside the container's reach.
//!
//! The filter also fails every syscall of a foreign ABI (x32, i386 on x86_64), so that a syscall
//! number of another table cannot slip past. Needs `python3` in the image (every SWE task image
//! has it; a Harbor image without it runs its verifier without the filter, see the threat model).
//! A filter that cannot be installed prints [`FAILED`] and the trial is an infra failure.
//!
//! Not covered: a same-user write through `/proc/PID/mem` (the kernel checks it like ptrace, but a
//! filter cannot tell that open from any other); see the threat model.

/// Printed (stdout) when the filter cannot be installed.
pub(super) const FAILED: &str = "LEGO_SECCOMP_FAILED";

/// Installs the filter, then `execvp(argv[1:])`.
const FILTER_PY: &str = r#"import ctypes, os, platform, struct, sys
arch, nrs = {'x86_64': (0xC000003E, (101, 310, 311, 438)), 'aarch64': (0xC00000B7, (117, 270, 271, 438))}.get(platform.machine(), (None, ()))
def ins(code, jt, jf, k):
    return struct.pack('HBBI', code, jt, jf, k)
try:
    if arch is None:
        raise OSError('no seccomp filter for ' + platform.machine())
    deny, allow = 0x00050001, 0x7FFF0000
    n = len(nrs)
    prog = [ins(0x20, 0, 0, 4), ins(0x15, 1, 0, arch), ins(0x06, 0, 0, deny), ins(0x20, 0, 0, 0)]
    prog.append(ins(0x35, n + 1, 0, 0x40000000))
    prog += [ins(0x15, n - i, 0, nr) for i, nr in enumerate(nrs)]
    prog += [ins(0x06, 0, 0, allow), ins(0x06, 0, 0, deny)]
    buf = ctypes.create_string_buffer(b''.join(prog))
    class Prog(ctypes.Structure):
        _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]
    fprog = Prog(len(prog), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'prctl')
except Exception as e:
    print('LEGO_SECCOMP_FAILED', e, flush=True)
    sys.exit(125)
os.execvp(sys.argv[1], sys.argv[1:])
"#;

/// The command prefix that runs what follows it under the filter (`-I`: the pristine
/// interpreter, nothing of the repository or the environment on its path).
pub(super) fn prefix() -> String {
    format!("python3 -I -c {} ", crate::text::sh_quote(FILTER_PY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_denies_tracing_on_this_machine() {
        // Runs the real filter when this machine has python3 on a supported architecture: a
        // traced child (strace-like PTRACE_TRACEME) is refused, an ordinary command runs.
        let Ok(py) = std::process::Command::new("python3").arg("-c").arg("0").status() else {
            return;
        };
        if !py.success() || !matches!(std::env::consts::ARCH, "x86_64" | "aarch64") {
            return;
        }
        let run = |cmd: &str| {
            std::process::Command::new("bash")
                .arg("-c")
                .arg(format!("{}{cmd}", prefix()))
                .output()
                .expect("bash")
        };
        let ok = run("echo fine");
        assert_eq!(String::from_utf8_lossy(&ok.stdout), "fine\n", "{ok:?}");
        let traced = run(
            "python3 -c \"import ctypes; l = ctypes.CDLL(None, use_errno=True); \
             print(l.ptrace(0, 0, None, None), ctypes.get_errno())\"",
        );
        assert_eq!(String::from_utf8_lossy(&traced.stdout), "-1 1\n", "{traced:?}");
    }
}
