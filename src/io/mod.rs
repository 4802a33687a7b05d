//! Streams of records as zstd-compressed JSON Lines.
//!
//! - [`RecordReader`]: streaming, constant memory, JSON decoded in parallel batches (rayon);
//!   reads zstd (any number of frames) or plain JSONL (detected by the zstd magic); `-` = stdin.
//!   A file of many frames that declare their sizes (lego-rl's own) is also decompressed in
//!   parallel ([`parallel`]).
//! - [`AtomicWriter`]: writes to a temp file beside the target, fsyncs, renames: a crash never
//!   leaves a half-written file under the final name. zstd output is a frame per ~4 MiB of
//!   records, compressed in parallel.
//! - [`AppendWriter`]: for long-running producers; every commit is one complete zstd frame
//!   written with a single `write` and fsynced, so readers of a growing file see every committed
//!   record, and re-opening after a crash cuts a torn final frame (with a warning) and continues.

pub mod frames;
pub mod parallel;
mod reader;
mod writer;

pub use reader::{open_lines, open_records, read_all, LineSource, ReadOptions, RecordReader, TornTail};
pub use writer::{AppendWriter, AtomicWriter, Compression};

use std::path::PathBuf;

/// Errors of the IO layer; every variant names the file and, where it applies, the record
/// (1-based line number of the decompressed stream).
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{path}: cannot open: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: record {line}: {msg}")]
    BadRecord { path: PathBuf, line: u64, msg: String },
    #[error("{path}: read error after record {line}: {source}")]
    Read {
        path: PathBuf,
        line: u64,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: truncated zstd data after record {line} (byte {offset} of {len}): the last frame is \
         incomplete (a writer crashed or is still running); the {line} records before it are intact"
    )]
    Truncated {
        path: PathBuf,
        line: u64,
        offset: u64,
        len: u64,
    },
    #[error(
        "{path}: compressed stream ends inside a zstd frame after record {line}: the input is truncated"
    )]
    TruncatedStream { path: PathBuf, line: u64 },
    #[error("{path}: cannot write: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot serialize record: {source}")]
    Serialize {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {skipped} bad record(s) skipped (first: {first})")]
    Skipped {
        path: PathBuf,
        skipped: u64,
        first: String,
    },
}

/// Takes an exclusive advisory lock (`flock(2)`) on `file`, released when the file is closed,
/// also when the process dies. `wait`: block until it is free; otherwise a held lock is an error
/// of kind [`std::io::ErrorKind::WouldBlock`]. (`File::lock` / `try_lock` would do, but need Rust
/// 1.89; the crate's MSRV is 1.85.)
pub fn lock_exclusive(file: &std::fs::File, wait: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: flock on a descriptor `file` owns for the duration of the call.
    if unsafe { libc::flock(file.as_raw_fd(), op) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `-` names stdin/stdout.
pub fn is_stdio(path: &std::path::Path) -> bool {
    path.as_os_str() == "-"
}

#[cfg(test)]
mod tests;
