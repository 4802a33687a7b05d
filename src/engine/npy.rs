//! Minimal reader of NumPy `.npy` arrays (format 1.0–3.0), as vLLM returns routed experts:
//! magic `\x93NUMPY`, version, header length, a Python-dict header (`descr`, `fortran_order`,
//! `shape`), then the raw little-endian data.

/// A decoded integer array.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<u32>,
}

/// Parses an `.npy` byte string holding unsigned/signed integers up to 32 bits.
pub fn parse(bytes: &[u8]) -> Result<NpyArray, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not an .npy array (bad magic)".into());
    }
    let major = bytes[6];
    let (header_len, offset) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("truncated .npy header".into());
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = bytes
        .get(offset..offset + header_len)
        .ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|e| format!("header not text: {e}"))?;
    let descr_text = dict_value(header, "descr").ok_or("header has no descr")?;
    let quote = descr_text
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .ok_or("descr is not a string")?;
    let descr = descr_text[1..].split(quote).next().unwrap_or("");
    if dict_value(header, "fortran_order").is_some_and(|v| v.starts_with("True")) {
        return Err("fortran_order arrays are not supported".into());
    }
    let shape_text = dict_value(header, "shape").ok_or("header has no shape")?;
    let inner = shape_text.trim_start_matches('(');
    let inner = &inner[..inner.find(')').ok_or("bad shape")?];
    let shape: Vec<usize> = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|e| format!("bad shape {shape_text}: {e}")))
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let raw = &bytes[offset + header_len..];
    let (size, little) = match descr {
        "|u1" | "<u1" | "u1" | "|i1" | "<i1" => (1, true),
        "<u2" | "<i2" => (2, true),
        "<u4" | "<i4" => (4, true),
        ">u2" | ">i2" => (2, false),
        ">u4" | ">i4" => (4, false),
        other => return Err(format!("unsupported dtype {other}")),
    };
    if raw.len() < n * size {
        return Err(format!(
            "data has {} bytes, shape {shape:?} of {descr} needs {}",
            raw.len(),
            n * size
        ));
    }
    let data = raw[..n * size]
        .chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 4];
            if little {
                b[..size].copy_from_slice(c);
            } else {
                for (i, x) in c.iter().rev().enumerate() {
                    b[i] = *x;
                }
            }
            u32::from_le_bytes(b)
        })
        .collect();
    Ok(NpyArray { shape, data })
}

/// The text of `key`'s value in a Python dict literal (up to the next top-level comma).
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let start = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[start + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    Some(rest)
}

/// Writes an `.npy` (version 1.0) of u8 or u16 values — the inverse of [`parse`], used by tests
/// and by tools that hand routing to vLLM-shaped consumers.
pub fn write_u16(shape: &[usize], data: &[u16], as_u8: bool) -> Vec<u8> {
    let descr = if as_u8 { "|u1" } else { "<u2" };
    let shape_text = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    let pad = 64 - (10 + header.len() + 1) % 64;
    header.push_str(&" ".repeat(pad % 64));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &v in data {
        if as_u8 {
            out.push(v as u8);
        } else {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}
