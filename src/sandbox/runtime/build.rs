//! One cache-miss build of a runtime volume inside a build container: probing the base image's
//! interpreter, uploading the wheels, the offline install and the marker written last.

use std::path::Path;
use std::time::Duration;

use super::volume::helper;
use super::wheels::download_wheels;
use super::{parse_version, Marker, INSTALL_TIMEOUT, MARKER, RECIPE, RUNTIME_DIR, WHEELS_IN_CONTAINER};
use crate::harness::{Harness, Runtime};
use crate::sandbox::tar::TarBuilder;
use crate::sandbox::{Engine, SandboxError};
use crate::text::sh_quote;

/// What the base image's interpreter is.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Interpreter {
    /// `3.13`
    pub(super) version: String,
    /// glibc `2.41`
    pub(super) glibc: String,
    /// `x86_64`
    pub(super) machine: String,
}

/// One cache-miss build.
pub(super) struct Build<'a> {
    pub(super) engine: &'a Engine,
    pub(super) harness: &'a Harness,
    pub(super) base_image: &'a str,
    pub(super) base_id: &'a str,
    pub(super) hash: &'a str,
    pub(super) volume: &'a str,
    pub(super) cache_dir: &'a Path,
}

impl Build<'_> {
    fn fail(&self, message: String) -> SandboxError {
        SandboxError::Runtime {
            harness: self.harness.path.clone(),
            message,
        }
    }

    pub(super) async fn run(&self, log: &mut std::fs::File) -> Result<Marker, SandboxError> {
        let id = helper(
            self.engine,
            self.base_image,
            self.hash,
            "build",
            vec![format!("{}:{RUNTIME_DIR}", self.volume)],
        )
        .await?;
        let r = self.in_container(&id, log).await;
        let removed = self.engine.remove_container(&id).await;
        let m = r?;
        removed?;
        Ok(m)
    }

    async fn exec(
        &self,
        id: &str,
        script: &str,
        timeout: Duration,
        log: &mut std::fs::File,
    ) -> Result<String, SandboxError> {
        use std::io::Write as _;
        let out = self.engine.exec(id, "root", "/", &[], script, timeout).await?;
        let _ = writeln!(log, "$ {script}\n{}{}", out.stdout, out.stderr);
        if !out.ok() {
            let tail: String = {
                let s = format!("{}{}", out.stdout, out.stderr);
                let lines: Vec<&str> = s.lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n")
            };
            let what = if out.timed_out {
                format!("timed out after {:.0}s", out.seconds)
            } else {
                format!("exit {:?}", out.exit_code)
            };
            return Err(self.fail(format!(
                "`{}` in the build container: {what}\n{tail}",
                first_line(script)
            )));
        }
        Ok(out.stdout)
    }

    async fn in_container(&self, id: &str, log: &mut std::fs::File) -> Result<Marker, SandboxError> {
        let rt = &self.harness.config.runtime;
        let probe = self
            .exec(
                id,
                "command -v python3 >/dev/null || { echo 'the base image has no python3' >&2; exit 3; }\n\
                 python3 -c 'import sys, platform; print(\"%d.%d\" % sys.version_info[:2]); \
                 print(platform.libc_ver()[0], platform.libc_ver()[1]); print(platform.machine())'",
                Duration::from_secs(120),
                log,
            )
            .await?;
        let interp = parse_probe(&probe).ok_or_else(|| {
            self.fail(format!(
                "base image {}: cannot read its Python version/glibc from {probe:?} (agent runtimes need a \
                 glibc-based image with python3)",
                self.base_image
            ))
        })?;
        if let Some(min) = &rt.python {
            let need = parse_version(min).expect("invariant: checked by check_spec");
            let have = parse_version(&interp.version).expect("invariant: parsed by parse_probe");
            if have < need {
                return Err(self.fail(format!(
                    "runtime needs Python >= {min}, base image {} has {}",
                    self.base_image, interp.version
                )));
            }
        }
        let wheels = download_wheels(rt, &interp, self.cache_dir, log)
            .await
            .map_err(|m| self.fail(m))?;
        let mut tar = TarBuilder::new();
        let prefix = WHEELS_IN_CONTAINER.trim_start_matches("/tmp/");
        tar.dir(prefix);
        tar.dir_tree(&wheels, prefix)
            .map_err(|source| SandboxError::ReadFile {
                path: wheels.clone(),
                source,
            })?;
        self.engine.upload(id, "/tmp", tar.finish()).await?;
        self.exec(id, &install_script(rt), INSTALL_TIMEOUT, log).await?;
        let freeze = self
            .exec(
                id,
                &format!("{RUNTIME_DIR}/bin/python -m pip freeze --all --disable-pip-version-check"),
                Duration::from_secs(120),
                log,
            )
            .await?;
        let marker = Marker {
            schema: RECIPE.to_string(),
            harness: self.harness.config.name.clone(),
            hash: self.hash.to_string(),
            base_image_id: self.base_id.to_string(),
            python: interp.version.clone(),
            packages: freeze
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
        };
        let json = serde_json::to_vec_pretty(&marker).map_err(|e| self.fail(format!("marker: {e}")))?;
        let mut tar = TarBuilder::new();
        tar.file(MARKER, &json, 0o644);
        self.engine.upload(id, RUNTIME_DIR, tar.finish()).await?;
        // The marker goes last; make sure it and everything before it reached the volume.
        self.exec(id, "sync", Duration::from_secs(120), log).await?;
        Ok(marker)
    }
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s).trim()
}

pub(super) fn parse_probe(s: &str) -> Option<Interpreter> {
    let mut lines = s.lines();
    let version = lines.next()?.trim().to_string();
    parse_version(&version)?;
    let mut libc = lines.next()?.split_whitespace();
    if libc.next()? != "glibc" {
        return None;
    }
    let glibc = libc.next()?.to_string();
    parse_version(&glibc)?;
    let machine = lines.next()?.trim().to_string();
    (!machine.is_empty()).then_some(Interpreter {
        version,
        glibc,
        machine,
    })
}

/// The offline install, run as root in the build container.
fn install_script(rt: &Runtime) -> String {
    let reqs: Vec<String> = rt.pip.iter().map(|r| sh_quote(r)).collect();
    let mut s = format!(
        "set -eu\nW={WHEELS_IN_CONTAINER}\nR={RUNTIME_DIR}\n\
         python3 -m venv --without-pip \"$R\"\n\
         pipwhl=$(ls \"$W\"/pip-*.whl | head -n 1)\n\
         \"$R/bin/python\" \"$pipwhl/pip\" install --no-index --find-links \"$W\" --no-cache-dir \
         --disable-pip-version-check --root-user-action=ignore --no-warn-script-location pip {}\n\
         sp=$(\"$R/bin/python\" -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')\n",
        reqs.join(" ")
    );
    for (name, target) in &rt.links {
        let t = sh_quote(target);
        let n = sh_quote(name);
        s.push_str(&format!(
            "[ -f \"$sp\"/{t} ] || {{ echo \"link target $sp/\"{t}\" is not in the installed packages\" >&2; exit 3; }}\n\
             chmod a+rx \"$sp\"/{t}\nln -sfn \"$sp\"/{t} \"$R/bin/\"{n}\n"
        ));
    }
    s.push_str("rm -rf \"$W\"\nchmod -R a+rX \"$R\"\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::runtime::tests::rt;

    #[test]
    fn install_script_quotes_and_links() {
        let mut r = rt(&["claude-agent-sdk==0.2.189", "a'b"]);
        r.links
            .insert("claude".into(), "claude_agent_sdk/_bundled/claude".into());
        let s = install_script(&r);
        assert!(s.contains("'claude-agent-sdk==0.2.189' 'a'\\''b'"), "{s}");
        assert!(
            s.contains("ln -sfn \"$sp\"/'claude_agent_sdk/_bundled/claude' \"$R/bin/\"'claude'"),
            "{s}"
        );
    }
}
