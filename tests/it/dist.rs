//! c10d through `lego_rl::c10d`: every collective on 2 real Gloo ranks, and the ways a world
//! fails (no store, a lone rank, a peer that dies or hangs) ending in an error, never a hang.
//!
//! The ranks are this test binary itself, started again on [`worker`] with `RANK`/`WORLD_SIZE`
//! set by hand and `LEGO_RL_TEST_DIST` naming what to do.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use lego_rl::c10d::{Backend, ProcessGroup, ReduceOp, WorldEnv};
use tch::{Kind, Tensor};

const MODE: &str = "LEGO_RL_TEST_DIST";

/// A port nobody listens on (bound, then released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Starts `world` ranks of [`worker`] in `mode`; returns them once all have ended.
fn ranks(world: usize, mode: &str) -> Vec<Output> {
    start_ranks("dist::worker", MODE, world, mode)
}

/// Starts `world` copies of this test binary on the ignored test `worker` (its full name) with
/// `mode_var=mode`, one thread each and `RANK`/`WORLD_SIZE`/`MASTER_*` set for a fresh local
/// store; returns them once all have ended.
pub fn start_ranks(worker: &str, mode_var: &str, world: usize, mode: &str) -> Vec<Output> {
    let port = free_port().to_string();
    let children: Vec<_> = (0..world)
        .map(|r| {
            crate::common::watched(&mut Command::new(std::env::current_exe().unwrap()))
                .args(["--exact", worker, "--ignored", "--nocapture", "--test-threads=1"])
                .env(mode_var, mode)
                .env("OMP_NUM_THREADS", "1")
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

pub fn f32s(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.reshape([-1])).unwrap()
}

/// One rank's work; does nothing unless started by [`ranks`].
#[test]
#[ignore = "a rank started by the other tests of this module"]
fn worker() {
    let Ok(mode) = std::env::var(MODE) else { return };
    let timeout = Duration::from_secs(if mode == "collectives" { 60 } else { 4 });
    let pg = ProcessGroup::from_env(Backend::Gloo, timeout).unwrap();
    let (r, w) = (pg.rank(), pg.world_size());
    assert_eq!(w, 2);
    let rf = r as f32;
    match mode.as_str() {
        "collectives" => {
            for (op, want) in [
                (ReduceOp::Sum, [3.0, 30.0]),
                (ReduceOp::Max, [2.0, 20.0]),
                (ReduceOp::Min, [1.0, 10.0]),
                (ReduceOp::Product, [2.0, 200.0]),
            ] {
                let t = Tensor::from_slice(&[rf + 1.0, 10.0 * (rf + 1.0)]);
                pg.all_reduce(&t, op, "pair").unwrap();
                assert_eq!(f32s(&t), want, "{op:?}");
            }
            let d = Tensor::from_slice(&[0.1f64 * (r as f64 + 1.0)]);
            pg.all_reduce(&d, ReduceOp::Sum, "f64").unwrap();
            assert_eq!(d.double_value(&[0]), 0.1 + 0.2);
            let i = Tensor::from_slice(&[1i64 << 40, r as i64]);
            pg.all_reduce(&i, ReduceOp::Sum, "i64").unwrap();
            assert_eq!(Vec::<i64>::try_from(&i).unwrap(), [1i64 << 41, 1]);

            let b = Tensor::from_slice(&[rf; 3]);
            pg.broadcast(&b, 1, "from rank 1").unwrap();
            assert_eq!(f32s(&b), [1.0; 3]);

            let input = Tensor::from_slice(&[rf * 10.0, rf * 10.0 + 1.0]);
            let out = Tensor::zeros([2, 2], (Kind::Float, tch::Device::Cpu));
            pg.all_gather(&out, &input, "pairs").unwrap();
            assert_eq!(f32s(&out), [0.0, 1.0, 10.0, 11.0]);

            let input = Tensor::arange(4, (Kind::Float, tch::Device::Cpu)) + (r as f64 + 1.0);
            let out = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
            pg.reduce_scatter(&out, &input, ReduceOp::Sum, "blocks").unwrap();
            assert_eq!(f32s(&out), if r == 0 { [3.0, 5.0] } else { [7.0, 9.0] });

            let input = Tensor::from_slice(&[rf * 10.0, rf * 10.0 + 1.0, rf * 10.0 + 2.0, rf * 10.0 + 3.0])
                .view([2, 2]);
            let out = input.zeros_like();
            pg.all_to_all(&out, &input, "rows").unwrap();
            let want = if r == 0 {
                [0.0, 1.0, 10.0, 11.0]
            } else {
                [2.0, 3.0, 12.0, 13.0]
            };
            assert_eq!(f32s(&out), want);

            let e = pg
                .all_reduce(
                    &Tensor::zeros([2, 2], (Kind::Float, tch::Device::Cpu)).tr(),
                    ReduceOp::Sum,
                    "t",
                )
                .unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("rank {r}: all_reduce (t): tensor is not contiguous")
            );
            pg.barrier("end").unwrap();
            println!("collectives ok on rank {r}");
        }
        // Rank 1 leaves (dies) or stops answering (hangs) after the rendezvous; rank 0's next
        // collective must fail within the timeout and say so.
        "die" | "hang" => {
            pg.barrier("after init").unwrap();
            if r == 1 {
                if mode == "die" {
                    std::process::exit(3);
                }
                std::thread::sleep(Duration::from_secs(10));
                return;
            }
            let e = pg
                .all_reduce(
                    &Tensor::ones([4], (Kind::Float, tch::Device::Cpu)),
                    ReduceOp::Sum,
                    "test tensor",
                )
                .unwrap_err();
            println!("ERR: {e}");
        }
        // bf16 gradients summed over ranks: rank 0 holds 1, rank 1 holds 2⁻⁹. In fp32 the sum is
        // 1 + 2⁻⁹; a bf16 sum rounds it back to 1 (8 significant bits), as the trainer once did.
        "fp32-grads" => {
            use lego_rl::train::shard::all_reduce_grads;
            use lego_rl::train::zero::ZeroAdamW;
            let g = if r == 0 { 1.0 } else { 1.0 / 512.0 };
            let p = Tensor::zeros([6], (Kind::BFloat16, tch::Device::Cpu)).set_requires_grad(true);
            (&p * g).sum(Kind::Float).backward();
            assert_eq!(p.grad().kind(), Kind::BFloat16);
            let params = vec![("w".to_string(), p.shallow_clone())];
            let want = 1.0 + 1.0 / 512.0;
            let sums = all_reduce_grads(&pg, &params, &[true], 1 << 20).unwrap();
            let sum = sums[0].as_ref().unwrap();
            assert_eq!(sum.kind(), Kind::Float, "all-reduced gradient dtype");
            assert_eq!(f32s(sum), [want; 6], "all-reduced bf16 gradients");
            let zero = ZeroAdamW::new(&params, &Default::default(), &pg, 1 << 20);
            let chunks = zero.reduce_scatter(&params, &[true], &pg).unwrap();
            assert_eq!(chunks[0].kind(), Kind::Float, "reduce-scattered gradient dtype");
            assert_eq!(f32s(&chunks[0]), [want; 3], "reduce-scattered bf16 gradients");
            println!("fp32 gradient sums ok on rank {r}");
        }
        other => panic!("unknown {MODE} {other}"),
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn every_collective_on_two_gloo_ranks() {
    let out = ranks(2, "collectives");
    for (r, o) in out.iter().enumerate() {
        assert!(
            o.status.success() && stdout(o).contains(&format!("collectives ok on rank {r}")),
            "rank {r}: {}\n{}",
            stdout(o),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn bf16_gradients_are_summed_over_ranks_in_fp32() {
    let out = ranks(2, "fp32-grads");
    for (r, o) in out.iter().enumerate() {
        assert!(
            o.status.success() && stdout(o).contains(&format!("fp32 gradient sums ok on rank {r}")),
            "rank {r}: {}\n{}",
            stdout(o),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn a_world_of_one_is_the_identity() {
    let pg = ProcessGroup::single();
    assert_eq!((pg.rank(), pg.world_size()), (0, 1));
    let t = Tensor::from_slice(&[1.5f32, -2.0]);
    pg.all_reduce(&t, ReduceOp::Sum, "t").unwrap();
    assert_eq!(f32s(&t), [1.5, -2.0]);
    let out = t.zeros_like();
    pg.all_gather(&out, &t, "t").unwrap();
    assert_eq!(f32s(&out), [1.5, -2.0]);
    let out = t.zeros_like();
    pg.reduce_scatter(&out, &t, ReduceOp::Sum, "t").unwrap();
    assert_eq!(f32s(&out), [1.5, -2.0]);
    let e = pg
        .all_gather(&Tensor::zeros([3], (Kind::Float, tch::Device::Cpu)), &t, "odd")
        .unwrap_err();
    assert!(e.to_string().contains("all_gather (odd)"), "{e}");
}

#[test]
fn a_peer_that_dies_or_hangs_is_an_error_not_a_hang() {
    for mode in ["die", "hang"] {
        let out = ranks(2, mode);
        let r0 = stdout(&out[0]);
        eprintln!("{mode}: {}", r0.trim());
        assert!(
            r0.contains("ERR: rank 0 of 2: all_reduce (test tensor) failed: "),
            "{mode}: rank 0 said:\n{r0}\n{}",
            String::from_utf8_lossy(&out[0].stderr)
        );
        assert!(
            out[0].status.success(),
            "{mode}: rank 0 ended with {:?}",
            out[0].status
        );
        if mode == "die" {
            assert_eq!(out[1].status.code(), Some(3));
        }
    }
}

fn init(rank: usize, port: u16) -> Result<ProcessGroup, lego_rl::c10d::DistError> {
    let w = WorldEnv {
        rank,
        world_size: 2,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
    };
    ProcessGroup::init(&w, Backend::Gloo, Duration::from_secs(3))
}

#[test]
fn no_store_or_no_peer_fails_the_rendezvous() {
    let port = free_port();
    // Rank 1 with nobody serving the store (a wrong MASTER_PORT).
    let e = init(1, port).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "rank 1 of 2: rendezvous at 127.0.0.1:{port} (gloo) failed within 3s: "
        )),
        "{e}"
    );
    eprintln!("no store: {e}");
    // Rank 0 serving the store, with its peer never coming.
    let e = init(0, port).unwrap_err().to_string();
    eprintln!("lone rank 0: {e}");
    assert!(e.starts_with("rank 0 of 2: rendezvous at "), "{e}");
}
