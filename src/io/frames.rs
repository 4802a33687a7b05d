//! Walks the frame structure of a zstd file without decompressing it, to find where the last
//! complete frame ends. lego-rl's append mode writes each commit as one complete frame, so the
//! bytes after the last complete frame are a torn write (a crash mid-commit) or a commit still in
//! flight. Only frame and block headers are read (positional reads, constant memory), so this is
//! cheap even on multi-GB files. Format: RFC 8878 §3.1.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// First four bytes of a zstd frame (0xFD2FB528, little-endian).
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Result of walking a file's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameScan {
    /// Offset just past the last complete frame.
    pub complete_len: u64,
    /// Length of the file when it was scanned.
    pub file_len: u64,
    /// Number of complete (data and skippable) frames.
    pub frames: u64,
    /// The largest decompressed size a complete data frame declares in its header, or None when
    /// some frame does not declare one (a streaming encoder's frame). Lets a reader decide
    /// whether frames can be decompressed independently within bounded memory
    /// ([`super::parallel`]).
    pub max_content: Option<u64>,
}

impl FrameScan {
    /// True when bytes after the last complete frame exist.
    pub fn torn(&self) -> bool {
        self.complete_len < self.file_len
    }
}

/// Scans `file` from `start` (a frame boundary) to its end.
pub fn scan(file: &File, start: u64) -> io::Result<FrameScan> {
    let file_len = file.metadata()?.len();
    let mut pos = start;
    let mut frames = 0;
    let mut max_content = Some(0);
    while pos < file_len {
        match frame_at(file, pos, file_len)? {
            Some(f) => {
                pos = f.end;
                frames += 1;
                max_content = max_content.zip(f.content).map(|(a, b)| a.max(b));
            }
            None => break,
        }
    }
    Ok(FrameScan {
        complete_len: pos,
        file_len,
        frames,
        max_content,
    })
}

/// One complete frame: where it ends, and the decompressed size its header declares (0 for a
/// skippable frame; None when a data frame does not declare it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub end: u64,
    pub content: Option<u64>,
}

fn read_at(file: &File, pos: u64, len: u64, buf: &mut [u8]) -> io::Result<bool> {
    if pos + buf.len() as u64 > len {
        return Ok(false);
    }
    file.read_exact_at(buf, pos)?;
    Ok(true)
}

/// The frame starting at `pos` of a file `len` bytes long, or None when it is incomplete or not
/// a frame.
pub fn frame_at(file: &File, pos: u64, len: u64) -> io::Result<Option<Frame>> {
    let mut magic = [0u8; 4];
    if !read_at(file, pos, len, &mut magic)? {
        return Ok(None);
    }
    let m = u32::from_le_bytes(magic);
    if m & 0xFFFF_FFF0 == 0x184D_2A50 {
        // Skippable frame: magic, 4-byte size, payload.
        let mut size = [0u8; 4];
        if !read_at(file, pos + 4, len, &mut size)? {
            return Ok(None);
        }
        let end = pos + 8 + u32::from_le_bytes(size) as u64;
        return Ok((end <= len).then_some(Frame {
            end,
            content: Some(0),
        }));
    }
    if magic != ZSTD_MAGIC {
        return Ok(None);
    }
    let mut fhd = [0u8; 1];
    if !read_at(file, pos + 4, len, &mut fhd)? {
        return Ok(None);
    }
    let fhd = fhd[0];
    if fhd & 0x08 != 0 {
        return Ok(None); // reserved bit set: not a valid frame
    }
    let fcs_flag = fhd >> 6;
    let single_segment = (fhd >> 5) & 1 == 1;
    let has_checksum = (fhd >> 2) & 1 == 1;
    let did_size = [0u64, 1, 2, 4][(fhd & 3) as usize];
    let fcs_size = match fcs_flag {
        0 if single_segment => 1,
        0 => 0,
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let window = if single_segment { 0 } else { 1 };
    let fcs_at = pos + 5 + window + did_size;
    let content = match fcs_size {
        0 => None,
        n => {
            let mut b = [0u8; 8];
            if !read_at(file, fcs_at, len, &mut b[..n as usize])? {
                return Ok(None);
            }
            // RFC 8878 §3.1.1.1.4: the 2-byte form is offset by 256.
            Some(u64::from_le_bytes(b) + if n == 2 { 256 } else { 0 })
        }
    };
    let mut p = fcs_at + fcs_size;
    loop {
        let mut hdr = [0u8; 3];
        if !read_at(file, p, len, &mut hdr)? {
            return Ok(None);
        }
        let h = u32::from(hdr[0]) | u32::from(hdr[1]) << 8 | u32::from(hdr[2]) << 16;
        let last = h & 1 == 1;
        let size = u64::from(h >> 3);
        let content = match (h >> 1) & 3 {
            0 | 2 => size,
            1 => 1,
            _ => return Ok(None), // reserved block type
        };
        p += 3 + content;
        if p > len {
            return Ok(None);
        }
        if last {
            break;
        }
    }
    if has_checksum {
        p += 4;
        if p > len {
            return Ok(None);
        }
    }
    Ok(Some(Frame { end: p, content }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn frame(text: &str) -> Vec<u8> {
        zstd::bulk::compress(text.as_bytes(), 3).unwrap()
    }

    #[test]
    fn finds_the_end_of_the_last_complete_frame() {
        let mut f = tempfile::tempfile().unwrap();
        let a = frame("{\"a\":1}\n");
        let b = frame(&"{\"b\":2}\n".repeat(1000));
        f.write_all(&a).unwrap();
        f.write_all(&b).unwrap();
        let full = scan(&f, 0).unwrap();
        assert_eq!(
            full,
            FrameScan {
                complete_len: (a.len() + b.len()) as u64,
                file_len: (a.len() + b.len()) as u64,
                frames: 2,
                // One-shot compression declares the content size.
                max_content: Some(8000),
            }
        );
        // Tear the second frame at every possible length: the first frame is always complete.
        for cut in 1..b.len() {
            f.set_len((a.len() + cut) as u64).unwrap();
            let s = scan(&f, 0).unwrap();
            assert_eq!(s.complete_len, a.len() as u64, "cut at {cut}");
            assert!(s.torn());
        }
    }

    #[test]
    fn streaming_frames_with_checksums_are_walked() {
        let mut enc = zstd::Encoder::new(Vec::new(), 1).unwrap();
        enc.include_checksum(true).unwrap();
        enc.write_all(&b"x".repeat(300_000)).unwrap();
        let bytes = enc.finish().unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bytes).unwrap();
        let s = scan(&f, 0).unwrap();
        assert_eq!(s.complete_len, bytes.len() as u64);
        assert_eq!(s.frames, 1);
        assert_eq!(
            s.max_content, None,
            "a streaming encoder does not declare the size"
        );
    }

    #[test]
    fn declared_content_sizes_are_read_in_every_header_width() {
        // 1-byte (single segment), 2-byte (+256), 4-byte and 8-byte-free sizes all occur here.
        for n in [0usize, 1, 255, 256, 300, 65_791, 65_792, 1 << 20, (4 << 20) + 7] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            let bytes = zstd::bulk::compress(&data, 3).unwrap();
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&bytes).unwrap();
            let frame = frame_at(&f, 0, bytes.len() as u64).unwrap().unwrap();
            assert_eq!(frame.end, bytes.len() as u64, "size {n}");
            assert_eq!(frame.content, Some(n as u64), "size {n}");
        }
    }
}
