//! Data generator of scripts/bench/align.sh: replicates real captured trajectories (the seed file
//! written by align's integration test) into a large trajectory file, each copy with its own
//! task/group/sample ids, until the uncompressed JSONL reaches SIZE_MB.
//!
//! usage: align_bench SEED.jsonl.zst OUT.jsonl.zst SIZE_MB
//! prints `gen_bytes=N gen_records=N` (shell assignments).

use std::path::Path;

use lego_rl::io::{read_all, AtomicWriter, ReadOptions};
use lego_rl::records::Trajectory;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 4, "usage: align_bench SEED OUT SIZE_MB");
    let seed: Vec<Trajectory> = read_all(Path::new(&args[1]), ReadOptions::default())?;
    anyhow::ensure!(!seed.is_empty(), "{}: no trajectories", args[1]);
    let target = args[3].parse::<u64>()? << 20;
    let mut out = AtomicWriter::create(Path::new(&args[2]))?;
    let (mut bytes, mut records) = (0u64, 0u64);
    let mut k = 0u64;
    while bytes < target {
        for t in &seed {
            let mut t = t.clone();
            t.task_id = format!("{}-{k}", t.task_id);
            t.group_id = k;
            t.id = Trajectory::make_id(&t.task_id, t.group_id, t.sample_index);
            bytes += serde_json::to_vec(&t)?.len() as u64 + 1;
            records += 1;
            out.write(&t)?;
        }
        k += 1;
    }
    out.finish()?;
    println!("gen_bytes={bytes} gen_records={records}");
    Ok(())
}
