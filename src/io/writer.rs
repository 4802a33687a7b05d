//! Atomic and append-mode record writers.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use tempfile::NamedTempFile;

use super::frames;
use super::{is_stdio, IoError};
use crate::records::Record;

/// zstd level: 3 is zstd's default and keeps writing well above JSON serialization speed.
const LEVEL: i32 = 3;

/// Output encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Zstd,
    Plain,
}

impl Compression {
    /// zstd unless the file name ends in `.jsonl` or `.json` (plain text, for hand inspection);
    /// stdout is plain when it is a terminal and zstd otherwise, so pipes carry the same format
    /// as files and a terminal shows text.
    pub fn for_path(path: &Path) -> Self {
        if is_stdio(path) {
            return if io::stdout().is_terminal() {
                Compression::Plain
            } else {
                Compression::Zstd
            };
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") | Some("json") => Compression::Plain,
            _ => Compression::Zstd,
        }
    }
}

enum Sink {
    Zstd(zstd::Encoder<'static, BufWriter<Box<dyn Write + Send>>>),
    Plain(BufWriter<Box<dyn Write + Send>>),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Zstd(w) => w.write(buf),
            Sink::Plain(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Zstd(w) => w.flush(),
            Sink::Plain(w) => w.flush(),
        }
    }
}

/// Writes a whole file atomically: records go to `.<name>.<random>.tmp` in the target's
/// directory, and [`AtomicWriter::finish`] fsyncs and renames it. Dropping the writer without
/// `finish` (an error, a panic) removes the temp file and leaves any previous file untouched.
pub struct AtomicWriter {
    path: PathBuf,
    temp: Option<NamedTempFile>,
    sink: Option<Sink>,
    records: u64,
}

impl AtomicWriter {
    /// Creates a writer for `path` (`-` = stdout, written directly), compression by file name.
    pub fn create(path: &Path) -> Result<Self, IoError> {
        Self::with_compression(path, Compression::for_path(path))
    }

    /// Creates a writer with an explicit compression.
    pub fn with_compression(path: &Path, compression: Compression) -> Result<Self, IoError> {
        let werr = |source| IoError::Write {
            path: path.to_path_buf(),
            source,
        };
        let (temp, out): (Option<NamedTempFile>, Box<dyn Write + Send>) = if is_stdio(path) {
            (None, Box::new(io::stdout()))
        } else {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            std::fs::create_dir_all(&dir).map_err(werr)?;
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("out");
            let temp = tempfile::Builder::new()
                .prefix(&format!(".{name}."))
                .suffix(".tmp")
                .tempfile_in(&dir)
                .map_err(werr)?;
            let file = temp.reopen().map_err(werr)?;
            (Some(temp), Box::new(file))
        };
        let buffered = BufWriter::with_capacity(1 << 20, out);
        let sink = match compression {
            Compression::Plain => Sink::Plain(buffered),
            Compression::Zstd => {
                let mut enc = zstd::Encoder::new(buffered, LEVEL).map_err(werr)?;
                let threads = rayon::current_num_threads().min(4) as u32;
                if threads > 1 {
                    // Multi-threaded compression pays on large outputs; measured in scripts/bench/io.sh.
                    enc.multithread(threads).map_err(werr)?;
                }
                Sink::Zstd(enc)
            }
        };
        Ok(AtomicWriter {
            path: path.to_path_buf(),
            temp,
            sink: Some(sink),
            records: 0,
        })
    }

    fn sink(&mut self) -> &mut Sink {
        self.sink.as_mut().expect("invariant: sink present until finish")
    }

    /// Writes one record.
    pub fn write<R: Record>(&mut self, record: &R) -> Result<(), IoError> {
        let mut line = serde_json::to_vec(record).map_err(|source| IoError::Serialize {
            path: self.path.clone(),
            source,
        })?;
        line.push(b'\n');
        self.write_raw(&line)?;
        self.records += 1;
        Ok(())
    }

    /// Writes many records, serializing them in parallel.
    pub fn write_all<R: Record + Sync>(&mut self, records: &[R]) -> Result<(), IoError> {
        let lines: Vec<Vec<u8>> = records
            .par_iter()
            .map(|r| {
                let mut v = serde_json::to_vec(r)?;
                v.push(b'\n');
                Ok(v)
            })
            .collect::<Result<_, serde_json::Error>>()
            .map_err(|source| IoError::Serialize {
                path: self.path.clone(),
                source,
            })?;
        for line in &lines {
            self.write_raw(line)?;
        }
        self.records += records.len() as u64;
        Ok(())
    }

    /// Writes pre-serialized JSON lines (each ending in a newline).
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<(), IoError> {
        let path = self.path.clone();
        self.sink()
            .write_all(bytes)
            .map_err(|source| IoError::Write { path, source })
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Completes the stream, fsyncs and renames the temp file onto the target.
    pub fn finish(mut self) -> Result<u64, IoError> {
        let werr = |source| IoError::Write {
            path: self.path.clone(),
            source,
        };
        let mut buffered = match self.sink.take().expect("invariant: finish called once") {
            Sink::Zstd(enc) => enc.finish().map_err(werr)?,
            Sink::Plain(w) => w,
        };
        buffered.flush().map_err(werr)?;
        drop(buffered);
        if let Some(temp) = self.temp.take() {
            temp.as_file().sync_all().map_err(werr)?;
            temp.persist(&self.path).map_err(|e| werr(e.error))?;
            sync_parent(&self.path);
        }
        Ok(self.records)
    }
}

fn sync_parent(path: &Path) {
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
}

/// Appends records to a zstd JSONL file, one complete frame per [`AppendWriter::commit`].
pub struct AppendWriter {
    path: PathBuf,
    file: File,
    pending: Vec<u8>,
    pending_records: u64,
    /// fsync after each commit (default true; off for benchmarks of throughput alone).
    pub sync: bool,
}

impl AppendWriter {
    /// Opens (or creates) `path` for appending. A torn final frame left by a crash is cut off
    /// with a warning; returns the writer and the number of bytes cut.
    pub fn open(path: &Path) -> Result<(Self, u64), IoError> {
        let werr = |source| IoError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(werr)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(werr)?;
        let scan = frames::scan(&file, 0).map_err(werr)?;
        let mut cut = 0;
        if scan.torn() {
            cut = scan.file_len - scan.complete_len;
            tracing::warn!(
                "{}: cutting a torn final zstd frame ({cut} bytes after byte {}) left by an interrupted writer",
                path.display(),
                scan.complete_len
            );
            file.set_len(scan.complete_len).map_err(werr)?;
            file.sync_all().map_err(werr)?;
        }
        Ok((
            AppendWriter {
                path: path.to_path_buf(),
                file,
                pending: Vec::new(),
                pending_records: 0,
                sync: true,
            },
            cut,
        ))
    }

    /// Buffers one record for the next commit.
    pub fn push<R: Record>(&mut self, record: &R) -> Result<(), IoError> {
        serde_json::to_writer(&mut self.pending, record).map_err(|source| IoError::Serialize {
            path: self.path.clone(),
            source,
        })?;
        self.pending.push(b'\n');
        self.pending_records += 1;
        Ok(())
    }

    /// Writes the buffered records as one zstd frame (a single `write` at the end of the file)
    /// and fsyncs it. Returns the number of records committed.
    pub fn commit(&mut self) -> Result<u64, IoError> {
        if self.pending.is_empty() {
            return Ok(0);
        }
        let werr = |source| IoError::Write {
            path: self.path.clone(),
            source,
        };
        let frame = zstd::bulk::compress(&self.pending, LEVEL).map_err(werr)?;
        use std::io::Seek;
        self.file.seek(io::SeekFrom::End(0)).map_err(werr)?;
        self.file.write_all(&frame).map_err(werr)?;
        if self.sync {
            self.file.sync_data().map_err(werr)?;
        }
        self.pending.clear();
        let n = self.pending_records;
        self.pending_records = 0;
        Ok(n)
    }
}
