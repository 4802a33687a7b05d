//! Small text helpers shared by the sandbox, rollout, task filtering and the report: shell
//! quoting and cutting long output down to what a log or a prompt can hold.

/// POSIX single-quoting: the text as one shell word.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The last `n` bytes of `s` or fewer, starting at a character boundary.
pub fn tail_bytes(s: &str, n: usize) -> String {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    s[i..].to_string()
}

/// The last `n` lines of `s`.
pub fn tail_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `s` cut to at most `max` characters, keeping its head (two thirds) and tail, with a marker
/// saying how many were cut; the flag says whether it was.
pub fn cut_middle(s: &str, max: usize) -> (String, bool) {
    let n = s.chars().count();
    if n <= max {
        return (s.to_string(), false);
    }
    let head = max * 2 / 3;
    let tail = max - head;
    let h: String = s.chars().take(head).collect();
    let t: String = s.chars().skip(n - tail).collect();
    (
        format!("{h}\n[… {} characters cut …]\n{t}", n - head - tail),
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_tails() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(tail_bytes("héllo", 4), "llo");
        assert_eq!(tail_bytes("ab", 10), "ab");
        assert_eq!(tail_lines("a\nb\nc", 2), "b\nc");
    }

    #[test]
    fn cut_middle_keeps_head_and_tail() {
        let s: String = (0..100).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let (c, cut) = cut_middle(&s, 30);
        assert!(cut);
        assert!(c.starts_with(&s[..20]) && c.ends_with(&s[90..]), "{c}");
        assert!(c.contains("70 characters cut"));
        assert_eq!(cut_middle("short", 30), ("short".into(), false));
    }
}
