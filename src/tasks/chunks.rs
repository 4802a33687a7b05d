//! The pool reader of the hot path: one thread only decompresses and cuts the stream into
//! large chunks of whole lines; splitting into lines, UTF-8 checks and parsing happen in
//! parallel on the workers ([`super::filter`]). This keeps the sequential part of a run to the
//! zstd decode itself, which `scripts/bench/filter.sh` compares against.
//!
//! File handling matches [`crate::io::open_lines`]: zstd or plain detected by the magic bytes,
//! and bytes after the last complete zstd frame (a torn append) reported after the complete
//! records. Stdin and JSON-array files go through [`super::source::RecordLines`] instead.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};

use crate::io::frames::{self, ZSTD_MAGIC};
use crate::io::IoError;

/// Decompressed bytes per chunk (whole lines; a longer line makes a longer chunk).
const CHUNK_BYTES: usize = 8 << 20;

/// How a stream ended, when not cleanly.
#[derive(Debug)]
pub enum End {
    /// Bytes after the last complete zstd frame: (offset, file length).
    Torn { offset: u64, len: u64 },
    /// A read or decode error.
    Read(io::Error),
}

impl End {
    /// The error, placed after record `line`.
    pub fn into_error(self, path: &Path, line: u64) -> IoError {
        match self {
            End::Torn { offset, len } => IoError::Truncated {
                path: path.to_path_buf(),
                line,
                offset,
                len,
            },
            End::Read(source) => {
                let msg = source.to_string().to_ascii_lowercase();
                if source.kind() == io::ErrorKind::UnexpectedEof || msg.contains("incomplete") {
                    IoError::TruncatedStream {
                        path: path.to_path_buf(),
                        line,
                    }
                } else {
                    IoError::Read {
                        path: path.to_path_buf(),
                        line,
                        source,
                    }
                }
            }
        }
    }
}

/// A run of whole lines (the last chunk may lack its final newline), or how the stream ended.
pub struct Chunk {
    pub data: Vec<u8>,
    pub end: Option<End>,
}

/// Opens `path` (not stdin) as decompressed bytes.
fn open(path: &Path) -> Result<(Box<dyn Read + Send>, Option<End>), IoError> {
    let err = |source| IoError::Open {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(err)?;
    let mut magic = [0u8; 4];
    let n = file.read(&mut magic).map_err(err)?;
    let scan_file = File::open(path).map_err(err)?;
    let file = BufReader::with_capacity(1 << 20, io::Cursor::new(magic[..n].to_vec()).chain(file));
    if n == 4 && magic == ZSTD_MAGIC {
        let scan = frames::scan(&scan_file, 0).map_err(err)?;
        let torn = scan.torn().then_some(End::Torn {
            offset: scan.complete_len,
            len: scan.file_len,
        });
        let limited = BufReader::with_capacity(1 << 20, file.take(scan.complete_len));
        let dec = zstd::Decoder::with_buffer(limited).map_err(err)?;
        Ok((Box::new(dec), torn))
    } else {
        Ok((Box::new(file), None))
    }
}

/// Starts the reader thread; an open error is returned at once.
pub fn spawn(path: PathBuf) -> Result<Receiver<Chunk>, IoError> {
    let (mut reader, torn) = open(&path)?;
    let (tx, rx) = sync_channel::<Chunk>(2);
    std::thread::spawn(move || {
        let mut carry: Vec<u8> = Vec::new();
        let mut torn = torn;
        loop {
            let mut buf = std::mem::take(&mut carry);
            buf.reserve(CHUNK_BYTES + (1 << 20));
            let mut end = None;
            let mut eof = false;
            // Read at least 1 MiB more than the carried partial line, so a line longer than a
            // chunk still completes.
            let target = CHUNK_BYTES.max(buf.len() + (1 << 20));
            let want = (target - buf.len()) as u64;
            // read_to_end fills spare capacity without zeroing it first.
            match (&mut reader).take(want).read_to_end(&mut buf) {
                Ok(k) if (k as u64) < want => eof = true,
                Ok(_) => {}
                Err(e) => end = Some(End::Read(e)),
            }
            let done = eof || end.is_some();
            if !done {
                // Keep the partial last line for the next chunk.
                match memchr::memrchr(b'\n', &buf) {
                    Some(p) => carry = buf.split_off(p + 1),
                    None => {
                        carry = buf;
                        continue;
                    }
                }
            } else if end.is_none() {
                end = torn.take();
            }
            if tx.send(Chunk { data: buf, end }).is_err() || done {
                break;
            }
        }
    });
    Ok(rx)
}

/// Splits `data` into about `n` parts at line boundaries (each part but the last ends with a
/// newline).
pub fn parts(data: &[u8], n: usize) -> Vec<&[u8]> {
    let target = (data.len() / n.max(1)).max(1 << 16);
    let mut out = Vec::with_capacity(n + 1);
    let mut start = 0;
    while start < data.len() {
        let mut cut = (start + target).min(data.len());
        if cut < data.len() {
            match memchr::memchr(b'\n', &data[cut..]) {
                Some(p) => cut += p + 1,
                None => cut = data.len(),
            }
        }
        out.push(&data[start..cut]);
        start = cut;
    }
    out
}

/// The number of lines in a part (a final line without newline counts).
pub fn count_lines(part: &[u8]) -> u64 {
    let nl = memchr::memchr_iter(b'\n', part).count() as u64;
    nl + u64::from(part.last().is_some_and(|b| *b != b'\n'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cut_at_newlines_and_cover_everything() {
        let data: Vec<u8> = (0..50_000)
            .flat_map(|i| format!("{{\"n\":{i}}}\n").into_bytes())
            .collect();
        let p = parts(&data, 7);
        assert!(p.len() > 1);
        assert_eq!(p.concat(), data);
        assert!(p.iter().all(|x| x.last() == Some(&b'\n')));
        assert_eq!(p.iter().map(|x| count_lines(x)).sum::<u64>(), 50_000);
        assert_eq!(count_lines(b"a\nb"), 2);
    }

    #[test]
    fn reads_zstd_in_chunks_and_reports_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let text: String = (0..300_000).map(|i| format!("{{\"line\":{i}}}\n")).collect();
        let frame = zstd::bulk::compress(text.as_bytes(), 3).unwrap();
        let path = dir.path().join("x.jsonl.zst");
        let mut bytes = frame.clone();
        bytes.extend_from_slice(&frame[..frame.len() / 2]);
        std::fs::write(&path, &bytes).unwrap();
        let chunks: Vec<Chunk> = spawn(path.clone()).unwrap().into_iter().collect();
        let all: Vec<u8> = chunks.iter().flat_map(|c| c.data.clone()).collect();
        assert_eq!(all, text.as_bytes());
        let last = chunks.into_iter().last().unwrap();
        let err = last.end.unwrap().into_error(&path, 300_000).to_string();
        assert!(err.contains("truncated zstd data after record 300000"), "{err}");
    }
}
