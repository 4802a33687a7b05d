//! `Engine`: the one place that talks to the container engine (bollard), one method and one error
//! variant per operation, so every Docker call is labelled, timed out and reported with context.
//!
//! Connects through `DOCKER_HOST` when set (Podman's Docker-compatible socket, a remote engine) and
//! the local socket otherwise. Every object it creates carries the `lego-rl.run-id` label (and
//! `lego-rl.trial` for trial objects) so [`Engine::sweep`] can remove leftovers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{
    BuildImageOptions, CreateContainerOptions, ListContainersOptions, ListNetworksOptions,
    RemoveContainerOptions, UploadToContainerOptions,
};
use bollard::Docker;
use futures::StreamExt;

use super::{SandboxError, LABEL_RUN, LABEL_TRIAL};

/// Output of one command run inside a container.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOutput {
    /// Exit code (`None` when the engine did not report one).
    pub exit_code: Option<i64>,
    pub stdout: String,
    pub stderr: String,
    /// True when the command ran into its time limit (and was killed).
    pub timed_out: bool,
    pub seconds: f64,
}

impl ExecOutput {
    /// True for exit code 0 within the time limit.
    pub fn ok(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }
}

/// A container's state as the engine reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerState {
    pub running: bool,
    /// The engine's `State.OOMKilled`. Docker sets it when the container stops after the kernel's
    /// OOM killer acted in its memory cgroup (any process, not only the main one); while the
    /// container runs it may still read false, so the trial also reads the cgroup's own counter.
    pub oom_killed: bool,
    pub exit_code: Option<i64>,
}

/// What a new container looks like.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub labels: HashMap<String, String>,
    pub env: Vec<String>,
    /// A network name, or `none`.
    pub network: String,
    pub memory_bytes: Option<i64>,
    pub nano_cpus: Option<i64>,
    pub pids_limit: Option<i64>,
    /// Bind mounts `host:container[:ro]` (agent runtimes, the proxy socket).
    pub binds: Vec<String>,
    /// Main process; `None` idles (`sleep infinity`) until commands are exec'd.
    pub cmd: Option<Vec<String>>,
}

/// A connection to the container engine.
#[derive(Clone)]
pub struct Engine {
    pub(super) docker: Docker,
}

impl Engine {
    /// Connects (honours `DOCKER_HOST`) and pings the engine.
    pub async fn connect() -> Result<Self, SandboxError> {
        let docker = Docker::connect_with_defaults().map_err(|source| SandboxError::Connect { source })?;
        docker
            .ping()
            .await
            .map_err(|source| SandboxError::Connect { source })?;
        Ok(Engine { docker })
    }

    /// The image id of `tag`, or `None` when the engine does not have it.
    pub async fn image_id(&self, tag: &str) -> Result<Option<String>, SandboxError> {
        match self.docker.inspect_image(tag).await {
            Ok(img) => Ok(img.id),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(source) => Err(SandboxError::InspectImage {
                image: tag.to_string(),
                source,
            }),
        }
    }

    /// The working directory `tag`'s config sets (its last `WORKDIR`, inherited ones included), or
    /// `None` when the engine does not have the image or it sets none that
    /// [`super::images::usable_workdir`] accepts (`/` is not).
    pub async fn image_workdir(&self, tag: &str) -> Result<Option<String>, SandboxError> {
        match self.docker.inspect_image(tag).await {
            Ok(img) => Ok(img
                .config
                .and_then(|c| c.working_dir)
                .and_then(|d| super::images::usable_workdir(&d))),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(source) => Err(SandboxError::InspectImage {
                image: tag.to_string(),
                source,
            }),
        }
    }

    /// Builds `tag` from an in-memory tar context; every output line goes to `log`. Returns the image id.
    pub async fn build_image(
        &self,
        tag: &str,
        context_tar: Vec<u8>,
        labels: HashMap<String, String>,
        log: &mut (dyn std::io::Write + Send),
    ) -> Result<String, SandboxError> {
        let opts = BuildImageOptions {
            t: Some(tag.to_string()),
            rm: true,
            forcerm: true,
            labels: Some(labels),
            ..Default::default()
        };
        let mut stream = self
            .docker
            .build_image(opts, None, Some(bollard::body_full(context_tar.into())));
        while let Some(item) = stream.next().await {
            let info = item.map_err(|source| SandboxError::BuildImage {
                image: tag.to_string(),
                message: source.to_string(),
            })?;
            if let Some(s) = &info.stream {
                let _ = log.write_all(s.as_bytes());
            }
            if let Some(err) = info.error.or(info.error_detail.and_then(|d| d.message)) {
                let _ = writeln!(log, "ERROR: {err}");
                return Err(SandboxError::BuildImage {
                    image: tag.to_string(),
                    message: err,
                });
            }
        }
        self.image_id(tag).await?.ok_or_else(|| SandboxError::BuildImage {
            image: tag.to_string(),
            message: "image missing after build".into(),
        })
    }

    /// Creates an internal bridge network with no IPv4 address on the host side: containers on it
    /// reach each other and nothing else (no gateway, no host address, no default route).
    pub async fn create_network(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> Result<String, SandboxError> {
        let req = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".into()),
            internal: Some(true),
            labels: Some(labels),
            options: Some(HashMap::from([(
                "com.docker.network.bridge.inhibit_ipv4".to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        };
        let resp = self
            .docker
            .create_network(req)
            .await
            .map_err(|source| SandboxError::CreateNetwork {
                name: name.to_string(),
                source,
            })?;
        Ok(resp.id)
    }

    /// Removes a network (by ID, or by name when the name is unique); a missing one is not an
    /// error. An endpoint can outlive its container
    /// by a moment (the engine detaches it asynchronously), so a failed removal is retried
    /// briefly (5 tries over ~3 s) before it counts.
    pub async fn remove_network(&self, name: &str) -> Result<(), SandboxError> {
        let mut attempt = 0u64;
        loop {
            match self.docker.remove_network(name).await {
                Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                    return Ok(())
                }
                Err(source) if attempt == 4 => {
                    return Err(SandboxError::RemoveNetwork {
                        name: name.to_string(),
                        source,
                    })
                }
                Err(_) => {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
                }
            }
        }
    }

    /// Creates (not starts) a container running `spec.cmd` (default: idle with `sleep infinity`)
    /// as root; commands are exec'd in it.
    pub async fn create_container(&self, spec: &ContainerSpec) -> Result<String, SandboxError> {
        let host = HostConfig {
            network_mode: Some(spec.network.clone()),
            memory: spec.memory_bytes,
            memory_swap: spec.memory_bytes,
            nano_cpus: spec.nano_cpus,
            pids_limit: spec.pids_limit,
            binds: (!spec.binds.is_empty()).then(|| spec.binds.clone()),
            init: Some(true),
            cap_drop: Some(vec![
                "NET_RAW".into(),
                "SYS_ADMIN".into(),
                "MKNOD".into(),
                "SYS_PTRACE".into(),
            ]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(
                spec.cmd
                    .clone()
                    .unwrap_or_else(|| vec!["sleep".into(), "infinity".into()]),
            ),
            user: Some("root".into()),
            labels: Some(spec.labels.clone()),
            env: Some(spec.env.clone()),
            network_disabled: Some(spec.network == "none"),
            host_config: Some(host),
            ..Default::default()
        };
        let opts = CreateContainerOptions {
            name: Some(spec.name.clone()),
            ..Default::default()
        };
        let resp = self
            .docker
            .create_container(Some(opts), body)
            .await
            .map_err(|source| SandboxError::CreateContainer {
                image: spec.image.clone(),
                source,
            })?;
        Ok(resp.id)
    }

    /// Starts a created container.
    pub async fn start_container(&self, id: &str) -> Result<(), SandboxError> {
        self.docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>)
            .await
            .map_err(|source| SandboxError::StartContainer {
                container: id.to_string(),
                source,
            })
    }

    /// Force-removes a container and its anonymous volumes; a missing one is not an error.
    pub async fn remove_container(&self, id: &str) -> Result<(), SandboxError> {
        let opts = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                Ok(())
            }
            // Someone else (a sweep, a signal handler) is removing it: wait until it is gone, so
            // that removing its network right after does not find an endpoint still attached.
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {
                for _ in 0..40 {
                    match self
                        .docker
                        .inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>)
                        .await
                    {
                        Err(bollard::errors::Error::DockerResponseServerError {
                            status_code: 404, ..
                        }) => return Ok(()),
                        _ => tokio::time::sleep(Duration::from_millis(250)).await,
                    }
                }
                Ok(())
            }
            Err(source) => Err(SandboxError::RemoveContainer {
                container: id.to_string(),
                source,
            }),
        }
    }

    /// The container's state, or `None` when it no longer exists.
    pub async fn container_state(&self, id: &str) -> Result<Option<ContainerState>, SandboxError> {
        match self
            .docker
            .inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>)
            .await
        {
            Ok(info) => {
                let st = info.state.unwrap_or_default();
                Ok(Some(ContainerState {
                    running: st.running.unwrap_or(false),
                    oom_killed: st.oom_killed.unwrap_or(false),
                    exit_code: st.exit_code,
                }))
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(source) => Err(SandboxError::InspectContainer {
                container: id.to_string(),
                source,
            }),
        }
    }

    /// Runs `bash -c script` as `user`, killed (with its process group) after `timeout`.
    ///
    /// The limit is enforced twice: `timeout` inside the container kills the command (exit 124/137),
    /// and the client stops waiting a little later in case the container itself hangs.
    pub async fn exec(
        &self,
        id: &str,
        user: &str,
        workdir: &str,
        env: &[String],
        script: &str,
        timeout: Duration,
    ) -> Result<ExecOutput, SandboxError> {
        let secs = timeout.as_secs_f64().max(1.0);
        let cmd = vec![
            "timeout".to_string(),
            "-k".into(),
            "5".into(),
            format!("{secs:.0}"),
            "bash".into(),
            "-c".into(),
            script.to_string(),
        ];
        let short: String = script.chars().take(80).collect();
        let err = |source| SandboxError::Exec {
            container: id.to_string(),
            command: short.clone(),
            source,
        };
        let created = self
            .docker
            .create_exec(
                id,
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    user: Some(user.to_string()),
                    working_dir: Some(workdir.to_string()),
                    env: Some(env.to_vec()),
                    cmd: Some(cmd),
                    ..Default::default()
                },
            )
            .await
            .map_err(err)?;
        let started = Instant::now();
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut client_timed_out = false;
        if let StartExecResults::Attached { mut output, .. } = self
            .docker
            .start_exec(&created.id, None::<StartExecOptions>)
            .await
            .map_err(err)?
        {
            let deadline = tokio::time::Instant::now() + timeout + Duration::from_secs(15);
            loop {
                match tokio::time::timeout_at(deadline, output.next()).await {
                    Err(_) => {
                        client_timed_out = true;
                        break;
                    }
                    Ok(None) => break,
                    Ok(Some(Err(source))) => return Err(err(source)),
                    Ok(Some(Ok(chunk))) => match chunk {
                        bollard::container::LogOutput::StdErr { message } => {
                            stderr.extend_from_slice(&message)
                        }
                        other => stdout.extend_from_slice(&other.into_bytes()),
                    },
                }
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let exit_code = if client_timed_out {
            None
        } else {
            self.docker
                .inspect_exec(&created.id)
                .await
                .map_err(err)?
                .exit_code
        };
        let timed_out =
            client_timed_out || (matches!(exit_code, Some(124) | Some(137)) && seconds + 0.5 >= secs);
        Ok(ExecOutput {
            exit_code,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            timed_out,
            seconds,
        })
    }

    /// Extracts a tar archive into `path` inside the container.
    pub async fn upload(&self, id: &str, path: &str, tar: Vec<u8>) -> Result<(), SandboxError> {
        let opts = UploadToContainerOptions {
            path: path.to_string(),
            ..Default::default()
        };
        self.docker
            .upload_to_container(id, Some(opts), bollard::body_full(tar.into()))
            .await
            .map_err(|source| SandboxError::Upload {
                container: id.to_string(),
                path: path.to_string(),
                source,
            })
    }

    /// Ids of containers (running or not) carrying `label=value`.
    pub async fn containers_with_label(&self, label: &str, value: &str) -> Result<Vec<String>, SandboxError> {
        let filters = HashMap::from([("label".to_string(), vec![format!("{label}={value}")])]);
        let opts = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let list = self
            .docker
            .list_containers(Some(opts))
            .await
            .map_err(|source| SandboxError::List { source })?;
        Ok(list.into_iter().filter_map(|c| c.id).collect())
    }

    /// IDs of networks carrying `label=value` (IDs, not names: concurrent creates can leave two
    /// networks of one name).
    pub async fn networks_with_label(&self, label: &str, value: &str) -> Result<Vec<String>, SandboxError> {
        let filters = HashMap::from([("label".to_string(), vec![format!("{label}={value}")])]);
        let opts = ListNetworksOptions {
            filters: Some(filters),
        };
        let list = self
            .docker
            .list_networks(Some(opts))
            .await
            .map_err(|source| SandboxError::List { source })?;
        Ok(list.into_iter().filter_map(|n| n.id).collect())
    }

    /// Removes every container, network and snapshot image labelled with `run_id` (or every lego-rl trial object
    /// when `run_id` is `None`); returns how many objects were removed.
    pub async fn sweep(&self, run_id: Option<&str>) -> Result<usize, SandboxError> {
        let (label, value) = match run_id {
            Some(r) => (LABEL_RUN, r),
            None => (LABEL_TRIAL, ""),
        };
        let (containers, networks) = if value.is_empty() {
            let filters = HashMap::from([("label".to_string(), vec![label.to_string()])]);
            let c = self
                .docker
                .list_containers(Some(ListContainersOptions {
                    all: true,
                    filters: Some(filters.clone()),
                    ..Default::default()
                }))
                .await
                .map_err(|source| SandboxError::List { source })?
                .into_iter()
                .filter_map(|c| c.id)
                .collect::<Vec<_>>();
            let n = self
                .docker
                .list_networks(Some(ListNetworksOptions {
                    filters: Some(filters),
                }))
                .await
                .map_err(|source| SandboxError::List { source })?
                .into_iter()
                .filter_map(|n| n.id)
                .collect::<Vec<_>>();
            (c, n)
        } else {
            (
                self.containers_with_label(label, value).await?,
                self.networks_with_label(label, value).await?,
            )
        };
        // Snapshots of killed agent containers (see `freeze`), after the containers made from them.
        let images = self
            .images_with_label(label, (!value.is_empty()).then_some(value))
            .await?;
        let n = containers.len() + networks.len() + images.len();
        for c in containers {
            self.remove_container(&c).await?;
        }
        for net in networks {
            self.remove_network(&net).await?;
        }
        for image in images {
            self.remove_image(&image).await?;
        }
        Ok(n)
    }
}
