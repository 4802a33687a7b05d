//! Message-level rules between requests of one thread (the paper's alignment rule).
//!
//! System, user and tool-result messages must match verbatim; an assistant turn is linked to a
//! captured generation by its stable tool-call ids, else by exact content (text and tool calls).
//! [`MatchMode`] decides how tool-call arguments and ids take part in the comparison.

use crate::chat::{Message, Role};

/// How an echoed assistant turn is compared with the generation it claims to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MatchMode {
    /// Tool-call ids link turns; without ids, text and tool arguments must match exactly.
    #[default]
    Strict,
    /// Like strict, but tool arguments are compared as normalized JSON (key order, whitespace).
    LooseToolArgs,
    /// Tool-call ids are ignored; text and tool arguments must match exactly.
    ContentOnly,
}

/// How an echoed assistant turn was linked to its generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// By tool-call ids; `differs` when the harness's copy is not the captured text.
    ById { differs: bool },
    /// By exact content against the decoded capture.
    ByContent,
    /// No decoded capture to compare with: the engine's prompt continued the generation's
    /// tokens (the proxy checked the content when it spliced).
    ByTokens,
}

/// Compares two assistant contents with the mode's argument rule (ids never take part).
fn same_content(a: &Message, b: &Message, mode: MatchMode) -> bool {
    a.content.trim() == b.content.trim()
        && a.tool_calls.len() == b.tool_calls.len()
        && a.tool_calls.iter().zip(&b.tool_calls).all(|(x, y)| {
            x.name == y.name
                && match mode {
                    MatchMode::LooseToolArgs => x.normalized_arguments() == y.normalized_arguments(),
                    MatchMode::Strict | MatchMode::ContentOnly => x.arguments == y.arguments,
                }
        })
}

/// Same tool-call ids, in order (and at least one).
fn same_ids(a: &Message, ids: &[String]) -> bool {
    !ids.is_empty()
        && a.tool_calls.len() == ids.len()
        && a.tool_calls.iter().zip(ids).all(|(c, id)| c.id == *id)
}

/// Whether two messages at the same position of two requests are the same message: non-assistant
/// messages verbatim, assistant copies by ids (unless content-only) or by content.
pub fn same_message(a: &Message, b: &Message, mode: MatchMode) -> bool {
    if a.role != b.role {
        return false;
    }
    match a.role {
        Role::Assistant => {
            let ids: Vec<String> = b.tool_calls.iter().map(|c| c.id.clone()).collect();
            (mode != MatchMode::ContentOnly && same_ids(a, &ids)) || same_content(a, b, mode)
        }
        _ => a.content == b.content && a.tool_call_id == b.tool_call_id && a.is_error == b.is_error,
    }
}

/// Length of the common prefix of two message lists under [`same_message`].
pub fn common_prefix(a: &[Message], b: &[Message], mode: MatchMode) -> usize {
    a.iter()
        .zip(b)
        .take_while(|(x, y)| same_message(x, y, mode))
        .count()
}

/// Links an echoed assistant turn to a generation: `tool_call_ids` are the ids the proxy gave
/// its calls, `captured` its decoded output (when `--model` is given), `tokens_chain` whether the
/// next prompt continued its tokens. `None` when the echo cannot be linked.
pub fn link(
    echo: &Message,
    tool_call_ids: &[String],
    captured: Option<&Message>,
    tokens_chain: bool,
    mode: MatchMode,
) -> Option<Link> {
    if echo.role != Role::Assistant {
        return None;
    }
    let by_id = mode != MatchMode::ContentOnly && same_ids(echo, tool_call_ids);
    match captured {
        Some(cap) => {
            let same = same_content(echo, cap, mode);
            if by_id {
                Some(Link::ById { differs: !same })
            } else if same {
                Some(Link::ByContent)
            } else {
                None
            }
        }
        None if by_id => Some(Link::ById { differs: false }),
        // Without the decoded text only the proxy's splice vouches for content; a turn with tool
        // calls must carry the generation's ids to be linked (content-only mode cannot link it).
        None if tokens_chain && echo.tool_calls.is_empty() && tool_call_ids.is_empty() => {
            Some(Link::ByTokens)
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ToolCall;

    fn call(id: &str, args: &str) -> Message {
        Message {
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: "bash".into(),
                arguments: args.into(),
            }],
            ..Message::text(Role::Assistant, "")
        }
    }

    #[test]
    fn reserialized_arguments_link_by_id_and_count_as_a_difference() {
        let captured = call("call_1", r#"{"command": "ls", "timeout": 10}"#);
        let echo = call("call_1", r#"{"timeout":10,"command":"ls"}"#);
        let ids = vec!["call_1".to_string()];
        assert_eq!(
            link(&echo, &ids, Some(&captured), false, MatchMode::Strict),
            Some(Link::ById { differs: true })
        );
        assert_eq!(
            link(&echo, &ids, Some(&captured), false, MatchMode::LooseToolArgs),
            Some(Link::ById { differs: false })
        );
        // Content-only ignores ids, and the text differs: not linked.
        assert_eq!(
            link(&echo, &ids, Some(&captured), true, MatchMode::ContentOnly),
            None
        );
        // Another id with the same normalized content links by content in loose mode only.
        let other = call("call_9", r#"{"timeout":10,"command":"ls"}"#);
        assert_eq!(
            link(&other, &ids, Some(&captured), false, MatchMode::LooseToolArgs),
            Some(Link::ByContent)
        );
        assert_eq!(
            link(&other, &ids, Some(&captured), false, MatchMode::Strict),
            None
        );
    }

    #[test]
    fn without_a_decoded_capture_text_turns_need_the_token_chain() {
        let echo = Message::text(Role::Assistant, "Done.");
        assert_eq!(
            link(&echo, &[], None, true, MatchMode::Strict),
            Some(Link::ByTokens)
        );
        assert_eq!(link(&echo, &[], None, false, MatchMode::Strict), None);
        let user = Message::text(Role::User, "Done.");
        assert_eq!(link(&user, &[], None, true, MatchMode::Strict), None);
    }

    #[test]
    fn non_assistant_messages_must_match_verbatim() {
        let a = Message::tool_result("call_1", "ok\n");
        let b = Message::tool_result("call_1", "ok");
        assert!(!same_message(&a, &b, MatchMode::LooseToolArgs));
        assert!(same_message(&a, &a.clone(), MatchMode::Strict));
        let msgs = vec![Message::text(Role::System, "s"), a.clone(), b.clone()];
        let other = vec![
            Message::text(Role::System, "s"),
            a,
            Message::text(Role::User, "x"),
        ];
        assert_eq!(common_prefix(&msgs, &other, MatchMode::Strict), 2);
    }
}
