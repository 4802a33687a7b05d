//! The model's tokenizer (`tokenizer.json` via the `tokenizers` crate) and its special tokens.
//!
//! Prompts are rendered to text by the chat template, which already writes every special token,
//! so encoding never adds special tokens (transformers' `apply_chat_template(tokenize=True)` does
//! the same). [`IncrementalDecoder`] turns a token stream into text deltas without ever emitting
//! half a UTF-8 character, for streaming responses.

use std::path::Path;

use super::ChatError;

/// Ids of the special tokens lego-rl's parsers and splicing care about (`None` when the
/// vocabulary lacks one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecialTokens {
    pub endoftext: Option<u32>,
    pub im_start: Option<u32>,
    pub im_end: Option<u32>,
    pub think_start: Option<u32>,
    pub think_end: Option<u32>,
    pub tool_call_start: Option<u32>,
    pub tool_call_end: Option<u32>,
    pub tool_response_start: Option<u32>,
    pub tool_response_end: Option<u32>,
}

/// A loaded tokenizer.
#[derive(Debug, Clone)]
pub struct ChatTokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
}

impl ChatTokenizer {
    /// Load `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Self, ChatError> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| ChatError::LoadTokenizer {
            path: path.into(),
            message: e.to_string(),
        })?;
        let id = |t: &str| inner.token_to_id(t);
        let special = SpecialTokens {
            endoftext: id("<|endoftext|>"),
            im_start: id("<|im_start|>"),
            im_end: id("<|im_end|>"),
            think_start: id("<think>"),
            think_end: id("</think>"),
            tool_call_start: id("<tool_call>"),
            tool_call_end: id("</tool_call>"),
            tool_response_start: id("<tool_response>"),
            tool_response_end: id("</tool_response>"),
        };
        Ok(ChatTokenizer { inner, special })
    }

    /// The special-token ids.
    pub fn special(&self) -> SpecialTokens {
        self.special
    }

    /// The id of a token given as text (`<|im_end|>`), if it is one token.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of `text`, no special tokens added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        let enc = self.inner.encode(text, false).map_err(|e| ChatError::Tokenize {
            message: e.to_string(),
        })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; with `skip_special`, tokens marked special (`<|im_end|>`) are left out but
    /// added non-special tokens (`<think>`, `<tool_call>`) are kept.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ChatError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| ChatError::Tokenize {
                message: e.to_string(),
            })
    }
}

/// Turns token ids arriving one by one into text deltas whose concatenation equals decoding all
/// ids at once (text is held back while it ends in an incomplete UTF-8 sequence).
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special: bool,
}

impl IncrementalDecoder {
    /// A decoder; `skip_special` as in [`ChatTokenizer::decode`].
    pub fn new(skip_special: bool) -> Self {
        IncrementalDecoder {
            skip_special,
            ..Default::default()
        }
    }

    /// Add one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &ChatTokenizer, id: u32) -> Result<String, ChatError> {
        self.ids.push(id);
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            if let Some(delta) = full.strip_prefix(prefix.as_str()) {
                let delta = delta.to_string();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                return Ok(delta);
            }
        }
        Ok(String::new())
    }

    /// Text still held back (an incomplete character at the end of the stream).
    pub fn finish(&mut self, tok: &ChatTokenizer) -> Result<String, ChatError> {
        let prefix = tok.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special)?;
        let full = tok.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(full.strip_prefix(prefix.as_str()).unwrap_or("").to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok() -> ChatTokenizer {
        ChatTokenizer::from_file(&crate::chat::testdata("tokenizer/qwen3/tokenizer.json")).unwrap()
    }

    #[test]
    fn known_ids_from_models_readme() {
        let t = tok();
        assert_eq!(
            t.encode("<|im_start|>user\nhi<|im_end|>").unwrap(),
            vec![151644, 872, 198, 6023, 151645]
        );
        assert_eq!(
            t.encode("<|im_start|>user\n1+1=?<|im_end|>\n<|im_start|>assistant\n")
                .unwrap(),
            vec![151644, 872, 198, 16, 10, 16, 19884, 151645, 198, 151644, 77091, 198]
        );
        let s = t.special();
        assert_eq!(
            (
                s.endoftext,
                s.im_start,
                s.im_end,
                s.tool_call_start,
                s.tool_call_end,
                s.think_start,
                s.think_end
            ),
            (
                Some(151643),
                Some(151644),
                Some(151645),
                Some(151657),
                Some(151658),
                Some(151667),
                Some(151668)
            )
        );
        assert_eq!(t.vocab_size(), 151669);
    }

    #[test]
    fn decode_skips_only_special_tokens() {
        let t = tok();
        let ids = t
            .encode("<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>")
            .unwrap();
        assert_eq!(
            t.decode(&ids, true).unwrap(),
            "<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call>"
        );
        assert!(t.decode(&ids, false).unwrap().ends_with("<|im_end|>"));
    }

    #[test]
    fn incremental_decoding_equals_full_decoding() {
        let t = tok();
        let text = "héllo 世界 😀👩‍👩‍👧 <tool_call>\n{\"a\": 1}\n</tool_call> done";
        let ids = t.encode(text).unwrap();
        let mut d = IncrementalDecoder::new(false);
        let mut out = String::new();
        let mut deltas = 0;
        for &id in &ids {
            let delta = d.push(&t, id).unwrap();
            assert!(!delta.contains('\u{FFFD}'), "half a character emitted: {delta:?}");
            deltas += usize::from(!delta.is_empty());
            out += &delta;
        }
        out += &d.finish(&t).unwrap();
        assert_eq!(out, text);
        assert!(deltas > 5);
    }
}
