//! Byte sizes on the command line, with one meaning in every subcommand: `KB`/`MB`/`GB`/`TB`
//! are powers of 1000, `KiB`/`MiB`/`GiB`/`TiB` powers of 1024, and a bare `K`/`M`/`G`/`T` is
//! binary, as in `docker run --memory 2g` and `ulimit` (so `--prefix-cache-bytes 2G` and
//! `--device-memory 2G` are both 2 GiB). Case-insensitive; a plain number is bytes.

/// Parses a byte size (see the module docs): `141GiB`, `80GB`, `512 MiB`, `1.5K`, `4096`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}`: expected a size like 141GiB, 80GB, 512MiB or 0"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        other => {
            return Err(format!(
                "`{s}`: unknown unit `{other}` (use B, KB, MB, GB, TB for powers of 1000; K, M, G, T, KiB, MiB, GiB, TiB for powers of 1024)"
            ))
        }
    };
    Ok((value * scale).round() as u64)
}

/// [`parse_bytes`] as a `usize` (an in-memory budget).
pub fn parse_bytes_usize(s: &str) -> Result<usize, String> {
    let n = parse_bytes(s)?;
    usize::try_from(n).map_err(|_| format!("`{s}`: too large for this machine"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_have_one_meaning() {
        assert_eq!(parse_bytes("141GiB"), Ok(141 << 30));
        assert_eq!(parse_bytes("141GB"), Ok(141_000_000_000));
        assert_eq!(parse_bytes("80g"), Ok(80 << 30));
        assert_eq!(parse_bytes("2G"), parse_bytes("2GiB"));
        assert_eq!(parse_bytes("1.5 MiB"), Ok(3 << 19));
        assert_eq!(parse_bytes("1.5K"), Ok(1536));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(parse_bytes("141 parsecs")
            .unwrap_err()
            .contains("unknown unit `parsecs`"));
        assert!(parse_bytes("GiB").is_err());
        assert!(parse_bytes("lots").is_err());
        assert_eq!(parse_bytes_usize("4GiB"), Ok(4 << 30));
    }
}
