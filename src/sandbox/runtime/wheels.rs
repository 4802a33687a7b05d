//! Host-side wheel downloads for a runtime: `pip download` for the base image's Python and
//! manylinux platforms, sdist-only dependencies built into pure-Python wheels, and the on-disk
//! wheel cache.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::build::Interpreter;
use super::{parse_version, PIP_TIMEOUT, RECIPE};
use crate::harness::Runtime;
use crate::text::tail_lines;

/// The `--platform` tags a glibc `major.minor` on `machine` accepts (manylinux_2_5 … that glibc,
/// plus the legacy aliases).
fn platforms(interp: &Interpreter) -> Vec<String> {
    let (_, minor) = parse_version(&interp.glibc).unwrap_or((2, 17));
    let m = &interp.machine;
    let mut out: Vec<String> = (5..=minor)
        .rev()
        .map(|i| format!("manylinux_2_{i}_{m}"))
        .collect();
    out.push(format!("manylinux2014_{m}"));
    if m == "x86_64" || m == "i686" {
        out.push(format!("manylinux2010_{m}"));
        out.push(format!("manylinux1_{m}"));
    }
    out
}

/// The host interpreter whose pip downloads wheels: `$LEGO_RL_VENV/bin/python`, else the project
/// venv `<cache_dir>/venv`, else `python3`.
fn host_python(cache_dir: &Path) -> PathBuf {
    if let Some(v) = std::env::var_os(crate::env::VENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(v).join("bin/python");
    }
    let venv = cache_dir.join("venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Runs `python -m pip args…` on the host, logging its output; Err(stderr tail) on failure.
async fn pip(python: &Path, args: &[String], log: &mut std::fs::File) -> Result<(), String> {
    use std::io::Write as _;
    let _ = writeln!(log, "$ {} -m pip {}", python.display(), args.join(" "));
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg("-m")
        .arg("pip")
        .args(args)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .kill_on_drop(true);
    let out = tokio::time::timeout(PIP_TIMEOUT, cmd.output())
        .await
        .map_err(|_| format!("`pip {}` timed out", args[0]))?
        .map_err(|e| format!("running {} -m pip: {e}", python.display()))?;
    let _ = log.write_all(&out.stdout);
    let _ = log.write_all(&out.stderr);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The requirement pip could not satisfy with a wheel, from its error output.
fn missing_requirement(stderr: &str) -> Option<String> {
    let line = stderr
        .lines()
        .find(|l| l.contains("No matching distribution found for "))?;
    let rest = line.split("No matching distribution found for ").nth(1)?;
    // "func-timeout>=4.3.5 (from openhands-tools)" → "func-timeout>=4.3.5"
    let req = rest.split(" (from").next()?.trim();
    (!req.is_empty()).then(|| req.to_string())
}

/// Downloads (or finds cached) every wheel the runtime needs for `interp`; returns the directory.
pub(super) async fn download_wheels(
    rt: &Runtime,
    interp: &Interpreter,
    cache_dir: &Path,
    log: &mut std::fs::File,
) -> Result<PathBuf, String> {
    let plats = platforms(interp);
    let mut h = Sha256::new();
    h.update(RECIPE.as_bytes());
    for part in [&interp.version, &interp.glibc, &interp.machine] {
        h.update([0]);
        h.update(part.as_bytes());
    }
    for r in &rt.pip {
        h.update([1]);
        h.update(r.as_bytes());
    }
    let key = hex::encode(h.finalize())[..16].to_string();
    let root = cache_dir.join("runtime-wheels");
    let done = root.join(&key);
    if done.join(".complete").exists() {
        tracing::info!("wheels cached in {}", done.display());
        return Ok(done);
    }
    let tmp = root.join(format!("{key}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let python = host_python(cache_dir);
    let dest = tmp.display().to_string();
    let mut args: Vec<String> = [
        "download",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        &interp.version,
        "--no-input",
        "--find-links",
        &dest,
        "-d",
        &dest,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for p in &plats {
        args.push("--platform".into());
        args.push(p.clone());
    }
    args.push("pip".into());
    args.extend(rt.pip.iter().cloned());
    tracing::info!(
        "downloading wheels for Python {} into {}",
        interp.version,
        done.display()
    );
    let mut built: Vec<String> = Vec::new();
    loop {
        let Err(stderr) = pip(&python, &args, log).await else {
            break;
        };
        // A dependency published only as an sdist: build it here; accept pure-Python wheels only.
        let Some(req) = missing_requirement(&stderr).filter(|r| !built.contains(r) && built.len() < 16)
        else {
            return Err(format!(
                "pip download for Python {} ({}) failed:\n{}",
                interp.version,
                plats[0],
                tail_lines(&stderr, 15)
            ));
        };
        tracing::info!("{req}: no wheel on the index; building one from its sdist");
        let before: Vec<_> = wheel_names(&tmp);
        let wargs: Vec<String> = ["wheel", "--no-deps", "--no-input", "-w", &dest, &req]
            .iter()
            .map(|s| s.to_string())
            .collect();
        pip(&python, &wargs, log).await.map_err(|e| {
            format!(
                "building a wheel of `{req}` from its sdist failed:\n{}",
                tail_lines(&e, 15)
            )
        })?;
        for w in wheel_names(&tmp).into_iter().filter(|w| !before.contains(w)) {
            if !w.ends_with("-none-any.whl") {
                return Err(format!(
                    "`{req}` has no wheel for Python {} on {} and its sdist builds a platform wheel ({w}); \
                     it cannot be installed offline",
                    interp.version, plats[0]
                ));
            }
        }
        built.push(req);
    }
    std::fs::write(tmp.join(".complete"), format!("{}\n", rt.pip.join("\n")))
        .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    match std::fs::rename(&tmp, &done) {
        Ok(()) => Ok(done),
        // Another process finished the same download first: use its copy.
        Err(_) if done.join(".complete").exists() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(done)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&done);
            std::fs::rename(&tmp, &done)
                .map_err(|e2| format!("moving wheels to {}: {e}; {e2}", done.display()))?;
            Ok(done)
        }
    }
}

fn wheel_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".whl"))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::runtime::build::parse_probe;

    #[test]
    fn probe_and_platforms() {
        let i = parse_probe("3.13\nglibc 2.41\nx86_64\n").expect("probe");
        assert_eq!(i.version, "3.13");
        let p = platforms(&i);
        assert_eq!(p[0], "manylinux_2_41_x86_64");
        assert!(p.contains(&"manylinux_2_17_x86_64".to_string()));
        assert!(p.contains(&"manylinux2014_x86_64".to_string()));
        assert!(
            parse_probe("3.12\n \naarch64\n").is_none(),
            "musl/unknown libc is refused"
        );
    }

    #[test]
    fn missing_requirement_is_parsed() {
        let e = "ERROR: Could not find a version that satisfies the requirement func-timeout>=4.3.5 (from \
                 openhands-tools) (from versions: none)\nERROR: No matching distribution found for \
                 func-timeout>=4.3.5 (from openhands-tools)\n";
        assert_eq!(missing_requirement(e).as_deref(), Some("func-timeout>=4.3.5"));
        assert_eq!(missing_requirement("ERROR: other"), None);
    }
}
