//! Engine operations that stop a trial's agent for good and keep what it left: freeze (the cgroup
//! freezer behind `docker pause`), list a frozen container's processes, kill, snapshot a stopped
//! container into an image (its files, none of its processes), and the filesystem changes a
//! container made. Used between the agent stage and extraction (see `trial::stop`).

use std::collections::HashMap;

use bollard::models::ContainerConfig;
use bollard::query_parameters::{
    CommitContainerOptions, KillContainerOptions, ListImagesOptions, RemoveImageOptions, TopOptions,
};

use super::{Engine, SandboxError};

/// One process of a container, as the engine's `top` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    pub pid: String,
    /// Numeric user id (as the host's `ps` sees it).
    pub uid: Option<u32>,
    /// `ps` state letters; `Z…` is a zombie (already dead, waiting to be reaped).
    pub stat: String,
    pub args: String,
}

impl Process {
    pub fn is_zombie(&self) -> bool {
        self.stat.starts_with('Z')
    }
}

/// Parses the engine's `top` answer for `ps -o pid,uid,stat,args` columns.
pub fn parse_top(titles: &[String], rows: &[Vec<String>]) -> Vec<Process> {
    let col = |name: &str| titles.iter().position(|t| t.eq_ignore_ascii_case(name));
    let (pid, uid, stat) = (col("PID"), col("UID"), col("STAT"));
    let args = col("COMMAND").or_else(|| col("ARGS")).or_else(|| col("CMD"));
    let get = |row: &Vec<String>, i: Option<usize>| i.and_then(|i| row.get(i)).cloned().unwrap_or_default();
    rows.iter()
        .map(|row| Process {
            pid: get(row, pid),
            uid: get(row, uid).trim().parse().ok(),
            stat: get(row, stat),
            args: get(row, args),
        })
        .collect()
}

fn op_error(container: &str, op: &'static str, source: bollard::errors::Error) -> SandboxError {
    SandboxError::Stage {
        stage: op,
        message: format!("{container}: {source}"),
    }
}

impl Engine {
    /// Freezes every process of the container (cgroup freezer); nothing of it runs until
    /// [`Engine::unpause`] or a kill.
    pub async fn pause(&self, id: &str) -> Result<(), SandboxError> {
        self.docker
            .pause_container(id)
            .await
            .map_err(|e| op_error(id, "pause", e))
    }

    pub async fn unpause(&self, id: &str) -> Result<(), SandboxError> {
        self.docker
            .unpause_container(id)
            .await
            .map_err(|e| op_error(id, "unpause", e))
    }

    /// The container's processes (works on a frozen container: the engine reads them from the
    /// host side).
    pub async fn processes(&self, id: &str) -> Result<Vec<Process>, SandboxError> {
        let top = self
            .docker
            .top_processes(
                id,
                Some(TopOptions {
                    ps_args: "-o pid,uid,stat,args".into(),
                }),
            )
            .await
            .map_err(|e| op_error(id, "top", e))?;
        Ok(parse_top(
            &top.titles.unwrap_or_default(),
            &top.processes.unwrap_or_default(),
        ))
    }

    /// SIGKILL to the container's init: the kernel then kills every process in its PID namespace.
    /// A container that already stopped is not an error.
    pub async fn kill(&self, id: &str) -> Result<(), SandboxError> {
        let opts = KillContainerOptions {
            signal: "KILL".into(),
        };
        match self.docker.kill_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            // 409: not running (already stopped).
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => Ok(()),
            Err(e) => Err(op_error(id, "kill", e)),
        }
    }

    /// Snapshots a (stopped) container's filesystem into a new untagged image carrying `labels`;
    /// returns the image id. Mounts (the agent runtime, the proxy socket) are not part of it.
    pub async fn commit(&self, id: &str, labels: HashMap<String, String>) -> Result<String, SandboxError> {
        let opts = CommitContainerOptions {
            container: Some(id.to_string()),
            pause: false,
            ..Default::default()
        };
        let config = ContainerConfig {
            labels: Some(labels),
            cmd: Some(vec!["sleep".into(), "infinity".into()]),
            ..Default::default()
        };
        let resp = self
            .docker
            .commit_container(opts, config)
            .await
            .map_err(|e| op_error(id, "commit", e))?;
        Ok(resp.id)
    }

    /// Removes an image; a missing one is not an error.
    pub async fn remove_image(&self, image: &str) -> Result<(), SandboxError> {
        let opts = RemoveImageOptions {
            force: true,
            noprune: false,
        };
        match self.docker.remove_image(image, Some(opts), None).await {
            Ok(_) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
            Err(e) => Err(op_error(image, "remove image", e)),
        }
    }

    /// Ids of images carrying `label=value` (trial snapshots).
    pub async fn images_with_label(
        &self,
        label: &str,
        value: Option<&str>,
    ) -> Result<Vec<String>, SandboxError> {
        let filter = match value {
            Some(v) => format!("{label}={v}"),
            None => label.to_string(),
        };
        let opts = ListImagesOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_string(), vec![filter])])),
            ..Default::default()
        };
        let list = self
            .docker
            .list_images(Some(opts))
            .await
            .map_err(|source| SandboxError::List { source })?;
        Ok(list.into_iter().map(|i| i.id).collect())
    }

    /// Paths the container added, changed or deleted against its image (`docker diff`).
    pub async fn changes(&self, id: &str) -> Result<Vec<String>, SandboxError> {
        let list = self
            .docker
            .container_changes(id)
            .await
            .map_err(|e| op_error(id, "changes", e))?;
        Ok(list.unwrap_or_default().into_iter().map(|c| c.path).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_top_columns_in_any_order() {
        let titles: Vec<String> = ["UID", "PID", "STAT", "COMMAND"].map(String::from).to_vec();
        let rows = vec![
            ["0", "4242", "Ss", "/sbin/docker-init -- sleep infinity"]
                .map(String::from)
                .to_vec(),
            ["1000", "4300", "T", "bash -c while true; do echo x; done"]
                .map(String::from)
                .to_vec(),
            ["1000", "4301", "Z", "[sh] <defunct>"].map(String::from).to_vec(),
        ];
        let p = parse_top(&titles, &rows);
        assert_eq!(p.len(), 3);
        assert_eq!((p[0].uid, p[0].pid.as_str()), (Some(0), "4242"));
        assert_eq!(p[1].uid, Some(1000));
        assert!(p[1].args.starts_with("bash -c"));
        assert!(!p[1].is_zombie() && p[2].is_zombie());
    }
}
