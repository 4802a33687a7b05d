//! Which rank am I: the launcher conventions users already have.
//!
//! - torchrun (and `lego-rl train-step --nproc-per-node N`): `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!   `MASTER_ADDR`, `MASTER_PORT`.
//! - Slurm (`srun`, one task per GPU): `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`; the store
//!   lives on the first host of `SLURM_JOB_NODELIST` (or `MASTER_ADDR` when set), port
//!   `MASTER_PORT` or [`DEFAULT_PORT`]. A Slurm job of one task is not a distributed run.
//!
//! torchrun's variables win when both are present (torchrun inside an sbatch allocation).

use super::DistError;

/// Store port when `MASTER_PORT` is not set (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;

/// One rank's view of the world, as the environment gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
}

fn parse<T: std::str::FromStr>(var: &'static str, value: &str) -> Result<T, DistError>
where
    T::Err: std::fmt::Display,
{
    value.trim().parse().map_err(|e: T::Err| DistError::Env {
        var,
        value: value.to_string(),
        msg: e.to_string(),
    })
}

/// Reads the world from variables through `get` (`std::env::var` in practice); `None` when they
/// describe no distributed run.
pub fn world_from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<WorldEnv>, DistError> {
    let port = |get: &dyn Fn(&str) -> Option<String>| -> Result<u16, DistError> {
        get("MASTER_PORT").map_or(Ok(DEFAULT_PORT), |p| parse("MASTER_PORT", &p))
    };
    let w = if let (Some(rank), Some(world)) = (get("RANK"), get("WORLD_SIZE")) {
        let addr = get("MASTER_ADDR").ok_or_else(|| DistError::Env {
            var: "MASTER_ADDR",
            value: String::new(),
            msg: "not set, but RANK and WORLD_SIZE are (torchrun sets all three)".into(),
        })?;
        WorldEnv {
            rank: parse("RANK", &rank)?,
            world_size: parse("WORLD_SIZE", &world)?,
            local_rank: get("LOCAL_RANK").map_or(Ok(0), |v| parse("LOCAL_RANK", &v))?,
            master_addr: addr,
            master_port: port(&get)?,
        }
    } else if let (Some(rank), Some(ntasks)) = (get("SLURM_PROCID"), get("SLURM_NTASKS")) {
        let world_size: usize = parse("SLURM_NTASKS", &ntasks)?;
        if world_size <= 1 {
            return Ok(None);
        }
        let addr = match get("MASTER_ADDR") {
            Some(a) => a,
            None => {
                let list = get("SLURM_JOB_NODELIST")
                    .or_else(|| get("SLURM_NODELIST"))
                    .ok_or_else(|| DistError::Env {
                        var: "SLURM_JOB_NODELIST",
                        value: String::new(),
                        msg: "not set: cannot tell where rank 0 runs (set MASTER_ADDR)".into(),
                    })?;
                first_host(&list).ok_or_else(|| DistError::Env {
                    var: "SLURM_JOB_NODELIST",
                    value: list.clone(),
                    msg: "names no host".into(),
                })?
            }
        };
        WorldEnv {
            rank: parse("SLURM_PROCID", &rank)?,
            world_size,
            local_rank: get("SLURM_LOCALID").map_or(Ok(0), |v| parse("SLURM_LOCALID", &v))?,
            master_addr: addr,
            master_port: port(&get)?,
        }
    } else {
        return Ok(None);
    };
    if w.world_size == 0 || w.rank >= w.world_size {
        return Err(DistError::Env {
            var: "RANK",
            value: w.rank.to_string(),
            msg: format!("must be below the world size {}", w.world_size),
        });
    }
    Ok(Some(w))
}

/// The first host of a Slurm node list: `gpu[003-004,010],cpu1` → `gpu003`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find([',', '[']).unwrap_or(list.len());
    let prefix = &list[..end];
    if list[end..].starts_with('[') {
        let inner = &list[end + 1..list[end..].find(']').map(|i| end + i)?];
        let first = inner.split([',', '-']).next()?;
        return Some(format!("{prefix}{first}"));
    }
    (!prefix.is_empty()).then(|| prefix.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn world(vars: &[(&str, &str)]) -> Result<Option<WorldEnv>, DistError> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        world_from_env(|k| m.get(k).cloned())
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_host("gpu[003-004,010],cpu1").as_deref(), Some("gpu003"));
        assert_eq!(first_host("node7,node8").as_deref(), Some("node7"));
        assert_eq!(first_host("a[10,2]").as_deref(), Some("a10"));
        assert_eq!(first_host("solo").as_deref(), Some("solo"));
        assert_eq!(first_host(""), None);
    }

    #[test]
    fn torchrun_then_slurm_then_none() {
        let w = world(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "h0"),
            ("MASTER_PORT", "1234"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "8"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (w.rank, w.world_size, w.local_rank, w.master_port),
            (1, 4, 1, 1234)
        );
        let w = world(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[01-02]"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            w,
            WorldEnv {
                rank: 3,
                world_size: 8,
                local_rank: 1,
                master_addr: "gpu01".into(),
                master_port: DEFAULT_PORT
            }
        );
        assert_eq!(
            world(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")]).unwrap(),
            None
        );
        assert_eq!(world(&[]).unwrap(), None);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = world(&[("RANK", "x"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err();
        assert!(e.to_string().starts_with("RANK=x: "), "{e}");
        let e = world(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err();
        assert!(e.to_string().contains("below the world size 2"), "{e}");
        let e = world(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert!(e.to_string().starts_with("MASTER_ADDR="), "{e}");
    }
}
