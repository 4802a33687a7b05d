//! Faithful prompts: request k+1's prompt = generation k's captured tokens + a tokenized suffix.
//!
//! Harnesses echo earlier assistant turns re-serialized (reordered argument keys, other
//! whitespace, dropped reasoning). Re-rendering that copy would give the engine a context that
//! differs from the tokens the policy sampled, so training would see a different sequence than
//! inference. Instead, when request k+1 extends the conversation of generation k, its prompt is
//! `prompt_ids(k) + output_ids(k) + encode(suffix)`.
//!
//! The suffix comes from the template itself, never from hand-written markup. The echoed assistant
//! turn is replaced by the generation as captured (`PreviousGeneration::assistant`, with its
//! reasoning and the model's own arguments), so a harness that re-serializes or drops fields does
//! not matter; earlier messages must match request k's (assistants by tool-call ids). With `G` = render of
//! the messages before the assistant turn plus the generation prompt, `P` = render up to and
//! including the assistant turn, `F` = render of the full new request,
//! - `P` must start with `G` (the assistant turn is appended after the generation prompt),
//! - `F` must start with `P` (later messages do not re-render earlier ones — Qwen3 drops the
//!   `<think>` of assistant turns before the last user query, so a new user turn breaks this);
//!   one exception: text the template adds to a turn only while it is the last message (Qwen3's
//!   empty think block) may vanish from `F` when the captured turn never contained it, since `F`
//!   then renders the turn as it was sampled (see `after_last_turn_artifact`),
//! - the assistant part `P[len G..]` ends with the end-of-turn token (`eos_token`, `<|im_end|>`)
//!   and what follows it in the template (`\n`) starts the suffix: `suffix = tail + F[len P..]`.
//!
//! Anything else is a [`SpliceBreak`]: the caller renders normally and starts a new segment.
//! Tokenizing the suffix separately is exact because it starts right after a special token.

use super::message::{Conversation, Message, Role};
use super::template::RenderOptions;
use super::{ChatError, ChatFormat};

/// What the proxy captured for generation k.
#[derive(Debug, Clone, Copy)]
pub struct PreviousGeneration<'a> {
    /// Request k's conversation (as converted from its body).
    pub conversation: &'a Conversation,
    /// Request k's render options (must equal the new request's).
    pub options: &'a RenderOptions,
    pub prompt_ids: &'a [u32],
    pub output_ids: &'a [u32],
    /// Generation k as returned to the harness (its parsed output: content, tool calls with ids).
    pub assistant: &'a Message,
}

/// A prompt built from captured tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaithfulPrompt {
    pub prompt_ids: Vec<u32>,
    /// How many leading ids are generation k's prompt + output (+ an added end-of-turn id).
    pub reused: usize,
    /// The text tokenized after them.
    pub suffix_text: String,
    /// The output did not end with the end-of-turn token (length stop), so it was appended.
    pub closed_turn: bool,
}

/// Why a faithful prompt cannot be built; the request must be rendered and a new segment started.
#[derive(Debug, thiserror::Error)]
pub enum SpliceBreak {
    #[error("render options or tools differ from the previous request")]
    SettingsChanged,
    #[error("history differs from the previous request at messages[{index}]")]
    HistoryChanged { index: usize },
    #[error("messages[{index}] is not the previous generation (tool-call ids / content differ)")]
    NotThePreviousGeneration { index: usize },
    #[error("the template is not append-only here: {detail}")]
    NotAppendOnly { detail: &'static str },
    #[error(transparent)]
    Chat(#[from] ChatError),
}

/// Same message for prefix purposes: assistants by tool-call ids (else content), others by text.
fn same_message(a: &Message, b: &Message) -> bool {
    if a.role != b.role {
        return false;
    }
    match a.role {
        Role::Assistant => same_assistant(a, b),
        _ => a.content == b.content && a.tool_call_id == b.tool_call_id,
    }
}

fn same_assistant(a: &Message, b: &Message) -> bool {
    if a.tool_calls.is_empty() && b.tool_calls.is_empty() {
        return a.content.trim() == b.content.trim();
    }
    a.tool_calls.len() == b.tool_calls.len()
        && a.tool_calls
            .iter()
            .zip(&b.tool_calls)
            .all(|(x, y)| x.id == y.id && x.name == y.name)
}

impl ChatFormat {
    /// Build the prompt of `new` (rendered with `opts`) on top of generation k's captured tokens.
    pub fn faithful_prompt(
        &self,
        prev: &PreviousGeneration<'_>,
        new: &Conversation,
        opts: &RenderOptions,
    ) -> Result<FaithfulPrompt, SpliceBreak> {
        let same_opts =
            prev.options.enable_thinking == opts.enable_thinking && prev.options.extra == opts.extra;
        if !same_opts || prev.conversation.tools != new.tools {
            return Err(SpliceBreak::SettingsChanged);
        }
        let a = prev.conversation.messages.len();
        if new.messages.len() <= a {
            return Err(SpliceBreak::HistoryChanged {
                index: new.messages.len(),
            });
        }
        if let Some(index) = (0..a).find(|&i| !same_message(&prev.conversation.messages[i], &new.messages[i]))
        {
            return Err(SpliceBreak::HistoryChanged { index });
        }
        let echoed = &new.messages[a];
        if echoed.role != Role::Assistant || !same_assistant(prev.assistant, echoed) {
            return Err(SpliceBreak::NotThePreviousGeneration { index: a });
        }

        // Render with the turn as generated (reasoning, the model's own arguments), not the
        // harness's copy: only the template's behaviour decides whether the splice holds.
        let mut conv = new.clone();
        conv.messages[a] = prev.assistant.clone();
        let upto = |n: usize| Conversation {
            messages: conv.messages[..n].to_vec(),
            ..conv.clone()
        };
        let gen_opts = RenderOptions {
            add_generation_prompt: true,
            ..opts.clone()
        };
        let turn_opts = RenderOptions {
            add_generation_prompt: false,
            ..opts.clone()
        };
        let g = self.render(&upto(a), &gen_opts)?;
        let p = self.render(&upto(a + 1), &turn_opts)?;
        let f = self.render(&conv, opts)?;
        let assistant_part = p.strip_prefix(g.as_str()).ok_or(SpliceBreak::NotAppendOnly {
            detail: "the assistant turn does not extend the generation prompt",
        })?;
        let eos = self.template().special_token("eos_token").unwrap_or("<|im_end|>");
        let eos_id = self.tokenizer().token_id(eos).ok_or(SpliceBreak::NotAppendOnly {
            detail: "the end-of-turn token is not a single token",
        })?;
        let tail = assistant_part
            .rfind(eos)
            .map(|i| &assistant_part[i + eos.len()..])
            .ok_or(SpliceBreak::NotAppendOnly {
                detail: "the assistant turn has no end-of-turn token",
            })?;
        // What follows the turn's end-of-turn token: the template's `tail` (`\n`) + later messages.
        let suffix_text = match f.strip_prefix(p.as_str()) {
            Some(later) => format!("{tail}{later}"),
            None => self
                .after_last_turn_artifact(&upto(a), &turn_opts, &g, &p, &f, prev, eos)?
                .to_string(),
        };

        let mut ids = Vec::with_capacity(prev.prompt_ids.len() + prev.output_ids.len() + 64);
        ids.extend_from_slice(prev.prompt_ids);
        ids.extend_from_slice(prev.output_ids);
        let closed_turn = prev.output_ids.last() != Some(&eos_id);
        if closed_turn {
            ids.push(eos_id);
        }
        let reused = ids.len();
        ids.extend(self.encode(&suffix_text)?);
        Ok(FaithfulPrompt {
            prompt_ids: ids,
            reused,
            suffix_text,
            closed_turn,
        })
    }
}

impl ChatFormat {
    /// `F` does not start with `P`. Still append-only when the only difference in how turn `a`
    /// renders is what the template adds to an assistant turn **only while it is the last
    /// message** (Qwen3: an empty `<think>\n\n</think>\n\n` block when the turn has no reasoning)
    /// and the captured turn never contained that text — then `F` renders the turn exactly as the
    /// policy saw it, e.g. Claude Code with thinking enabled and a turn without reasoning. If the
    /// captured turn does contain it (thinking disabled: the generation prompt holds the empty
    /// block) or the difference is anything else (reasoning dropped before a new user turn), the
    /// splice breaks. Returns `F` after turn `a`'s end-of-turn token (the whole suffix).
    #[allow(clippy::too_many_arguments)]
    fn after_last_turn_artifact<'f>(
        &self,
        before: &Conversation,
        turn_opts: &RenderOptions,
        g: &str,
        p: &str,
        f: &'f str,
        prev: &PreviousGeneration<'_>,
        eos: &str,
    ) -> Result<&'f str, SpliceBreak> {
        let changed = SpliceBreak::NotAppendOnly {
            detail: "later messages change how earlier turns render (e.g. <think> of old turns dropped)",
        };
        let h = self.render(before, turn_opts)?;
        if !(g.starts_with(&h) && p.starts_with(&h) && f.starts_with(&h)) {
            return Err(changed);
        }
        let turn_end = |text: &str| text[h.len()..].find(eos).map(|i| h.len() + i + eos.len());
        let (Some(pe), Some(fe)) = (turn_end(p), turn_end(f)) else {
            return Err(changed);
        };
        let (turn_p, turn_f) = (&p[h.len()..pe], &f[h.len()..fe]);
        let Some(artifact) = self.last_turn_artifact(turn_opts)? else {
            return Err(changed);
        };
        let captured = format!("{}{}", &g[h.len()..], self.decode(prev.output_ids, false)?);
        // Any piece of the artifact in the captured turn means the policy saw (part of) what `F`
        // drops: Qwen3.5's generation prompt always opens `<think>`, so an earlier turn whose
        // (even empty, even `<think>\n</think>`) block the template removes must not splice.
        let seen = artifact.split_whitespace().any(|piece| captured.contains(piece));
        if turn_p.replacen(&artifact, "", 1) != turn_f || seen {
            return Err(changed);
        }
        Ok(&f[fe..])
    }

    /// What the template inserts into an assistant turn only when it is the last message, learned
    /// from the template itself: the turn `y` of `[user x, assistant y]` vs `[user x, assistant y,
    /// user z]`; `None` when both render it the same.
    fn last_turn_artifact(&self, opts: &RenderOptions) -> Result<Option<String>, ChatError> {
        let user = |t: &str| Message::text(Role::User, t);
        let assistant = Message::text(Role::Assistant, "y");
        let conv = |messages: Vec<Message>| Conversation {
            messages,
            ..Default::default()
        };
        let h = self.render(&conv(vec![user("x")]), opts)?;
        let last = self.render(&conv(vec![user("x"), assistant.clone()]), opts)?;
        let mid = self.render(&conv(vec![user("x"), assistant, user("z")]), opts)?;
        let eos = self.template().special_token("eos_token").unwrap_or("<|im_end|>");
        let turn = |text: &str| -> Option<String> {
            let body = text.strip_prefix(h.as_str())?;
            Some(body[..body.find(eos)? + eos.len()].to_string())
        };
        let (Some(last), Some(mid)) = (turn(&last), turn(&mid)) else {
            return Ok(None);
        };
        if last == mid || last.len() <= mid.len() {
            return Ok(None);
        }
        let prefix = last.bytes().zip(mid.bytes()).take_while(|(a, b)| a == b).count();
        let suffix = last[prefix..]
            .bytes()
            .rev()
            .zip(mid[prefix..].bytes().rev())
            .take_while(|(a, b)| a == b)
            .count();
        if prefix + suffix != mid.len() || !last.is_char_boundary(prefix) {
            return Ok(None);
        }
        Ok(Some(last[prefix..last.len() - suffix].to_string()))
    }
}

#[cfg(test)]
#[path = "faithful_tests.rs"]
mod tests;
