//! The pool reader of the hot path: one thread only decompresses (with helper threads for a
//! file of many sized frames: [`crate::io::parallel`]) and cuts the stream into large chunks of
//! whole lines; splitting into lines, UTF-8 checks and parsing happen in
//! parallel on the workers ([`super::filter`]). This keeps the sequential part of a run to the
//! zstd decode itself, which `scripts/bench/filter.sh` compares against.
//!
//! File handling matches [`crate::io::open_lines`]: zstd or plain detected by the magic bytes,
//! and bytes after the last complete zstd frame (a torn append) reported after the complete
//! records. Stdin and JSON-array files go through [`super::source::RecordLines`] instead.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use crate::io::frames::{self, ZSTD_MAGIC};
use crate::io::parallel;
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
/// The bytes are `buf[..len]`; hand `buf` back through [`Chunks::recycle`] when done.
pub struct Chunk {
    buf: Vec<u8>,
    len: usize,
    pub end: Option<End>,
}

impl Chunk {
    /// The decompressed lines.
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The reader thread's output, and the way back for spent buffers.
///
/// Buffers circulate instead of being allocated per chunk: a fresh 8 MiB buffer costs a page
/// fault per 4 KiB page and, through `read_to_end`, a memset before the decoder writes it —
/// together about a seventh of a whole rules+decontamination run before this (perf, 100k
/// records). A recycled buffer is already mapped and initialised, so the reader thread does
/// little more than the zstd decode that `scripts/bench/filter.sh` compares against.
pub struct Chunks {
    rx: Receiver<Chunk>,
    back: SyncSender<Vec<u8>>,
}

impl Chunks {
    /// The next chunk; None after the last.
    pub fn next_chunk(&self) -> Option<Chunk> {
        self.rx.recv().ok()
    }

    /// Returns a chunk's buffer to the reader thread for reuse.
    pub fn recycle(&self, chunk: Chunk) {
        // The reader may have finished; then the buffer is simply dropped.
        let _ = self.back.try_send(chunk.buf);
    }
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
        // (Reads into a chunk at least as large as the decoder's buffer go past it, uncopied.)
        let dec = parallel::decoder(scan_file, &scan).map_err(err)?;
        Ok((Box::new(dec), torn))
    } else {
        Ok((Box::new(file), None))
    }
}

/// Fills `buf[*filled..]` from `reader`; returns whether the stream ended.
fn fill(reader: &mut dyn Read, buf: &mut [u8], filled: &mut usize) -> io::Result<bool> {
    while *filled < buf.len() {
        match reader.read(&mut buf[*filled..]) {
            Ok(0) => return Ok(true),
            Ok(k) => *filled += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Starts the reader thread; an open error is returned at once.
pub fn spawn(path: PathBuf) -> Result<Chunks, IoError> {
    let (mut reader, torn) = open(&path)?;
    // Two chunks in flight to the workers, one being filled: four buffers suffice.
    let (tx, rx) = sync_channel::<Chunk>(2);
    let (back, spent) = sync_channel::<Vec<u8>>(4);
    std::thread::spawn(move || {
        let mut torn = torn;
        // The partial last line of the previous chunk.
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let mut buf = spent.try_recv().unwrap_or_else(|_| vec![0u8; CHUNK_BYTES]);
            // A line longer than a chunk: grow until it fits (initialised once, then reused).
            // Geometric growth (room for at least as much again as the carry), so a line of n
            // bytes costs O(n) copying in all, not O(n²) through 1 MiB steps.
            let want = carry.len() + carry.len().max(1 << 20);
            if buf.len() < want {
                buf.resize(want, 0);
            }
            buf[..carry.len()].copy_from_slice(&carry);
            let mut filled = carry.len();
            carry.clear();
            let mut end = None;
            let eof = match fill(&mut *reader, &mut buf, &mut filled) {
                Ok(eof) => eof,
                Err(e) => {
                    end = Some(End::Read(e));
                    false
                }
            };
            let done = eof || end.is_some();
            let mut len = filled;
            if !done {
                // Keep the partial last line for the next chunk.
                match memchr::memrchr(b'\n', &buf[..filled]) {
                    Some(p) => {
                        carry.extend_from_slice(&buf[p + 1..filled]);
                        len = p + 1;
                    }
                    None => {
                        // One line fills the whole buffer: carry it into a larger one.
                        carry.extend_from_slice(&buf[..filled]);
                        continue;
                    }
                }
            } else if end.is_none() {
                end = torn.take();
            }
            if tx.send(Chunk { buf, len, end }).is_err() || done {
                break;
            }
        }
    });
    Ok(Chunks { rx, back })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The number of lines in a part (a final line without newline counts).
    fn count_lines(part: &[u8]) -> u64 {
        let nl = memchr::memchr_iter(b'\n', part).count() as u64;
        nl + u64::from(part.last().is_some_and(|b| *b != b'\n'))
    }

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
    fn recycled_buffers_keep_lines_whole_including_one_longer_than_a_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = Vec::new();
        for i in 0..400_000 {
            text.extend_from_slice(format!("{{\"n\":{i},\"pad\":\"{}\"}}\n", "x".repeat(i % 50)).as_bytes());
            if i == 200_000 {
                // A line of 1.5 chunks.
                text.extend_from_slice(&vec![b'y'; CHUNK_BYTES * 3 / 2]);
                text.push(b'\n');
            }
        }
        let path = dir.path().join("x.jsonl");
        std::fs::write(&path, &text).unwrap();
        let chunks = spawn(path).unwrap();
        let mut all = Vec::new();
        let mut n = 0;
        while let Some(c) = chunks.next_chunk() {
            assert!(c.data().last() == Some(&b'\n'), "chunk {n} ends mid-line");
            assert!(c.end.is_none());
            all.extend_from_slice(c.data());
            chunks.recycle(c);
            n += 1;
        }
        assert!(n >= 4, "{n} chunks");
        assert_eq!(all.len(), text.len());
        assert!(all == text);
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
        let reader = spawn(path.clone()).unwrap();
        let chunks: Vec<Chunk> = std::iter::from_fn(|| reader.next_chunk()).collect();
        let all: Vec<u8> = chunks.iter().flat_map(|c| c.data().to_vec()).collect();
        assert_eq!(all, text.as_bytes());
        let last = chunks.into_iter().last().unwrap();
        let err = last.end.unwrap().into_error(&path, 300_000).to_string();
        assert!(err.contains("truncated zstd data after record 300000"), "{err}");
    }

    #[test]
    fn many_sized_frames_decode_in_parallel_into_the_same_chunks_and_torn_tail() {
        // lego-rl's own format (AtomicWriter: a frame per ~4 MiB), more than one chunk of it,
        // frames cut mid-line on purpose, then a torn frame.
        let dir = tempfile::tempdir().unwrap();
        let text: Vec<u8> = (0..1_000_000)
            .flat_map(|i| format!("{{\"line\":{i},\"pad\":\"{}\"}}\n", "z".repeat(i % 20)).into_bytes())
            .collect();
        let mut bytes = Vec::new();
        for piece in text.chunks((3 << 20) + 17) {
            bytes.extend_from_slice(&zstd::bulk::compress(piece, 3).unwrap());
        }
        let torn = zstd::bulk::compress(b"{\"line\":-1}\n", 3).unwrap();
        bytes.extend_from_slice(&torn[..torn.len() - 3]);
        let path = dir.path().join("x.jsonl.zst");
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let scan = frames::scan(&file, 0).unwrap();
        assert!(
            parallel::applies(&scan) && scan.frames > 4 && scan.torn(),
            "{scan:?}"
        );
        let reader = spawn(path.clone()).unwrap();
        let mut all = Vec::new();
        let mut n = 0;
        let mut end = None;
        while let Some(c) = reader.next_chunk() {
            assert!(
                c.end.is_some() || c.data().last() == Some(&b'\n'),
                "chunk {n} ends mid-line"
            );
            all.extend_from_slice(c.data());
            end = end.or(c.end.as_ref().map(|e| format!("{e:?}")));
            reader.recycle(c);
            n += 1;
        }
        assert!(n >= 3, "{n} chunks");
        assert!(all == text);
        let end = end.expect("the torn tail is reported");
        assert!(end.starts_with("Torn"), "{end}");
    }
}
