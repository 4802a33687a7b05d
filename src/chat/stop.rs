//! Stop strings (OpenAI `stop`, Anthropic `stop_sequences`) over a stream of decoded text.
//!
//! The embedded engine (`engine::embedded`) feeds it the text of each sampled token to know when to end a generation;
//! the proxy feeds it the same text to cut the answer it returns. Both decode with special tokens
//! skipped (the text the client sees), so a stop string never matches inside `<|im_end|>`.
//!
//! Semantics (OpenAI's and vLLM's): generation ends as soon as the output text contains one of the
//! stop strings; the returned text is everything before the earliest occurrence, without the stop
//! string. While streaming, text that could be the start of a stop string is held back until it
//! is known not to be one, so a stop string never leaks to the client.

/// Incremental stop-string matcher (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text not released yet: the longest suffix that may still begin a stop string.
    held: String,
    matched: Option<usize>,
}

impl StopStrings {
    /// A matcher for `stops` (empty strings are ignored: they would match before any text).
    pub fn new(stops: &[String]) -> Self {
        StopStrings {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Default::default()
        }
    }

    /// Whether there is anything to match.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// The stop string that ended the text, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Adds a piece of output text; returns the text that can be released now (never part of a
    /// stop string). After a match, everything is swallowed.
    pub fn push(&mut self, text: &str) -> String {
        if self.matched.is_some() {
            return String::new();
        }
        self.held.push_str(text);
        // The earliest occurrence wins; at equal positions the longer stop string (it is the one
        // the shorter is a prefix of, and both end the text at the same place).
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                self.held
                    .find(s.as_str())
                    .map(|p| (p, std::cmp::Reverse(s.len()), i))
            })
            .min();
        if let Some((pos, _, i)) = hit {
            self.matched = Some(i);
            let out = self.held[..pos].to_string();
            self.held.clear();
            return out;
        }
        let keep = self.partial_suffix();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// End of the text: what is still held back (it was not a stop string after all).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop string.
    fn partial_suffix(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let h = &self.held;
        (1..longest.min(h.len() + 1))
            .rev()
            .find(|&n| {
                let start = h.len() - n;
                h.is_char_boundary(start)
                    && self
                        .stops
                        .iter()
                        .any(|s| s.len() > n && s.as_bytes().starts_with(&h.as_bytes()[start..]))
            })
            .unwrap_or(0)
    }
}

/// `text` cut before its first stop string, and which one it was.
pub fn truncate_at_stop(text: &str, stops: &[String]) -> (String, Option<String>) {
    let mut m = StopStrings::new(stops);
    let mut out = m.push(text);
    match m.matched() {
        Some(s) => (out, Some(s.to_string())),
        None => {
            out.push_str(&m.finish());
            (out, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    /// Feeds `pieces` one by one; returns the released text and the match.
    fn run(s: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopStrings::new(&stops(s));
        let mut out = String::new();
        for p in pieces {
            out += &m.push(p);
        }
        let matched = m.matched().map(str::to_string);
        if matched.is_none() {
            out += &m.finish();
        }
        (out, matched)
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_found_and_never_released() {
        let (out, m) = run(&["###"], &["Hello #", "#", "# world"]);
        assert_eq!((out.as_str(), m.as_deref()), ("Hello ", Some("###")));
    }

    #[test]
    fn held_back_text_that_is_not_a_stop_string_is_released() {
        let mut m = StopStrings::new(&stops(&["</answer>"]));
        assert_eq!(m.push("a </an"), "a ");
        assert_eq!(m.push("other"), "</another");
        assert_eq!(m.push(" <"), " ");
        assert_eq!(m.finish(), "<");
        assert_eq!(m.matched(), None);
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins_and_later_text_is_swallowed() {
        let (out, m) = run(&["END", "\n\n"], &["one\n\ntwo END three"]);
        assert_eq!((out.as_str(), m.as_deref()), ("one", Some("\n\n")));
        let mut s = StopStrings::new(&stops(&["x"]));
        assert_eq!(s.push("ax"), "a");
        assert_eq!(s.push("more"), "", "nothing after a match");
    }

    #[test]
    fn empty_stop_strings_and_multibyte_text_are_handled() {
        assert_eq!(run(&[""], &["abc"]), ("abc".into(), None));
        assert!(StopStrings::new(&stops(&[""])).is_empty());
        // The held suffix starts on a character boundary.
        assert_eq!(run(&["éé!"], &["ça é", "é?"]), ("ça éé?".into(), None));
        assert_eq!(run(&["éé!"], &["ça é", "é!"]), ("ça ".into(), Some("éé!".into())));
    }

    #[test]
    fn truncate_cuts_at_the_first_stop_string() {
        assert_eq!(
            truncate_at_stop("a.b.c", &stops(&[".c", "."])),
            ("a".into(), Some(".".into()))
        );
        assert_eq!(truncate_at_stop("abc", &stops(&["z"])), ("abc".into(), None));
    }
}
