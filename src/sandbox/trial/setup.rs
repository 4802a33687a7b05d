//! The setup stage: the trial's network and container, the repository squashed to its base
//! (SWE-style) or snapshotted (Harbor), the harness's files, and the baseline of the counters the
//! audit compares against (see the parent module).

use std::collections::BTreeSet;
use std::time::Duration;

use super::{interrupted, now, relay, Trial};
use crate::sandbox::{ContainerSpec, SandboxError, AGENT_USER};
use crate::text::{sh_quote, tail_bytes};

impl Trial {
    async fn setup_inner(&mut self) -> Result<(), SandboxError> {
        if self.engine.image_id(&self.image).await?.is_none() {
            return Err(SandboxError::ImageMissing {
                image: self.image.clone(),
            });
        }
        // After SIGINT/SIGTERM the sweep is removing this run's objects: create none it could miss.
        if interrupted() {
            return Err(SandboxError::Stage {
                stage: "setup",
                message: "interrupted".into(),
            });
        }
        // Kept and used by ID: two processes creating the same trial's network at once can both
        // succeed (the engine's name check races; seen here with two loops on one run
        // directory), and removing by name then fails as ambiguous.
        let net = self
            .engine
            .create_network(&self.name("-net"), self.labels())
            .await?;
        self.network = Some(net.clone());
        let mut binds = self.binds.clone();
        let mut cmd = None;
        if let Some(sock) = &self.proxy_socket {
            if !sock.exists() {
                return Err(SandboxError::Stage {
                    stage: "setup",
                    message: format!("proxy socket {} does not exist", sock.display()),
                });
            }
            binds.push(format!("{}:{}", sock.display(), relay::SOCKET));
            cmd = Some(relay::command());
        }
        let spec = ContainerSpec {
            name: self.name(""),
            image: self.image.clone(),
            labels: self.labels(),
            env: self.env.clone(),
            network: net,
            memory_bytes: Some(self.limits.memory_bytes),
            nano_cpus: Some(self.limits.nano_cpus),
            pids_limit: Some(self.limits.pids),
            binds,
            cmd,
        };
        let id = self.engine.create_container(&spec).await?;
        self.container = Some(id.clone());
        self.engine.start_container(&id).await?;
        if self.proxy_socket.is_some() {
            let out = self
                .engine
                .exec(&id, "root", "/", &[], &relay::wait_script(), self.limits.setup)
                .await?;
            if !out.ok() {
                return Err(SandboxError::Stage {
                    stage: "setup",
                    message: format!("proxy relay: {}", tail_bytes(&out.stderr, 2000)),
                });
            }
        }
        let wd = sh_quote(&self.workdir);
        let script = if self.is_swebench() {
            let base = sh_quote(self.task.base_commit.as_deref().unwrap_or("HEAD"));
            format!(
                "set -e; cd {wd}; git reset -q --hard {base}; git clean -qfdx; rm -rf .git; \
                 git init -q -b main; git add -A; \
                 GIT_AUTHOR_DATE=2000-01-01T00:00:00Z GIT_COMMITTER_DATE=2000-01-01T00:00:00Z \
                 git -c user.name=lego-rl -c user.email=lego-rl@localhost commit -q --no-verify --allow-empty -m base; \
                 chown -R {AGENT_USER}:{AGENT_USER} {wd}; {snapshot}",
                snapshot = self.base_snapshot_script(true)
            )
        } else {
            format!(
                "set -e; mkdir -p {wd} /logs/agent; chown -R {AGENT_USER}:{AGENT_USER} {wd} /logs/agent; {}",
                self.base_snapshot_script(false)
            )
        };
        let out = self
            .engine
            .exec(&id, "root", "/", &[], &script, self.limits.setup)
            .await?;
        if !out.ok() {
            return Err(SandboxError::Stage {
                stage: "setup",
                message: format!(
                    "exit {:?}{}: {}",
                    out.exit_code,
                    if out.timed_out { " (timed out)" } else { "" },
                    tail_bytes(&out.stderr, 2000)
                ),
            });
        }
        self.base_hash = Some(out.stdout.trim().to_string()).filter(|h| !h.is_empty());
        if !self.files.is_empty() {
            // Parent directories are made by the agent user (so they are the agent's where it may
            // create them at all); the upload runs as root, then the files are handed over.
            let parents: BTreeSet<String> = self
                .files
                .iter()
                .filter_map(|(p, _)| std::path::Path::new(p).parent())
                .map(|p| sh_quote(&p.to_string_lossy()))
                .collect();
            let mut tar = crate::sandbox::tar::TarBuilder::new();
            for (path, bytes) in &self.files {
                tar.file(path.trim_start_matches('/'), bytes, 0o644);
            }
            let owned: Vec<String> = self.files.iter().map(|(p, _)| sh_quote(p)).collect();
            let mkdir = format!("mkdir -p {}", parents.into_iter().collect::<Vec<_>>().join(" "));
            let chown = format!("chown {AGENT_USER}:{AGENT_USER} {}", owned.join(" "));
            let out = self
                .engine
                .exec(&id, AGENT_USER, "/", &[], &mkdir, self.limits.setup)
                .await?;
            let out = if out.ok() {
                self.engine.upload(&id, "/", tar.finish()).await?;
                self.engine
                    .exec(&id, "root", "/", &[], &chown, self.limits.setup)
                    .await?
            } else {
                out
            };
            if !out.ok() {
                return Err(SandboxError::Stage {
                    stage: "setup",
                    message: format!("writing agent files: {}", tail_bytes(&out.stderr, 2000)),
                });
            }
        }
        // The baseline; probed twice like the after-agent probe. Without one the audit compares
        // against zeros — the counters of a fresh container and network namespace — so setup's own
        // traffic would count as the agent's: say so.
        for attempt in 0..2 {
            self.baseline = self.probe().await;
            if self.baseline.is_some() {
                break;
            }
            if attempt == 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        if self.baseline.is_none() {
            tracing::warn!(
                "trial {}: no baseline probe after setup; its audit counts from container creation",
                self.trial_id
            );
        }
        Ok(())
    }

    /// Creates and prepares the trial container (stage `setup`).
    pub async fn setup(&mut self) -> Result<(), SandboxError> {
        let start = now();
        let r = tokio::time::timeout(self.limits.setup + Duration::from_secs(30), self.setup_inner())
            .await
            .unwrap_or_else(|_| {
                Err(SandboxError::Stage {
                    stage: "setup",
                    message: "timed out".into(),
                })
            });
        self.record("setup", start, if r.is_ok() { "ok" } else { "error" });
        r
    }
}
