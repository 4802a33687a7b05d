"""The official `anthropic` Python SDK as a client of the lego-rl proxy (driven by tests/it/proxy_sdk.rs).

Usage: anthropic_client.py SCENARIO CONFIG_JSON. Prints one JSON object (what the SDK parsed) on stdout;
any failed assertion exits non-zero with a traceback.
"""

import json
import re
import sys

import anthropic
from anthropic.types import Message, TextBlock, ThinkingBlock, ToolUseBlock

TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    }
]
SYSTEM = [{"type": "text", "text": "You are Claude Code, a coding agent.", "cache_control": {"type": "ephemeral"}}]
THINKING = {"type": "enabled", "budget_tokens": 1024}


def client(url):
    # base_url is the trial root: the SDK appends /v1/messages. API keys are ignored by the proxy.
    return anthropic.Anthropic(base_url=url, api_key="sk-ant-ignored", max_retries=0)


def summary(m: Message):
    assert isinstance(m, Message), type(m)
    assert m.type == "message" and m.role == "assistant"
    blocks = []
    for b in m.content:
        if isinstance(b, ThinkingBlock):
            assert b.signature, "thinking blocks carry a signature"
            blocks.append({"type": "thinking", "thinking": b.thinking})
        elif isinstance(b, TextBlock):
            blocks.append({"type": "text", "text": b.text})
        elif isinstance(b, ToolUseBlock):
            assert isinstance(b.input, dict), b
            blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
        else:
            raise AssertionError(f"unexpected block {b!r}")
    return {
        "id": m.id,
        "blocks": blocks,
        "stop_reason": m.stop_reason,
        "usage": {"input": m.usage.input_tokens, "output": m.usage.output_tokens},
    }


def messages(cfg):
    c = client(cfg["url"])
    results = []
    common = dict(model="claude-sonnet-4-5", max_tokens=256, system=SYSTEM, tools=TOOLS, thinking=THINKING,
                  metadata={"user_id": "lego-rl-test"})

    # 1. Thinking + text, not streamed.
    first = [{"role": "user", "content": "Say hi."}]
    m = c.messages.create(messages=first, **common)
    s = summary(m)
    assert s["blocks"] == [{"type": "thinking", "thinking": "Greet back."}, {"type": "text", "text": "Hi! I am tiny."}], s
    assert s["stop_reason"] == "end_turn", s
    results.append(s)
    counted = c.messages.count_tokens(
        model="claude-sonnet-4-5", messages=first, system=SYSTEM, tools=TOOLS, thinking=THINKING
    )
    assert counted.input_tokens == s["usage"]["input"], (counted, s)

    # 2. tool_use, not streamed.
    convo = [{"role": "user", "content": [{"type": "text", "text": "List the files, then read one."}]}]
    m = c.messages.create(messages=convo, **common)
    s = summary(m)
    assert s["stop_reason"] == "tool_use", s
    use = s["blocks"][-1]
    assert use["type"] == "tool_use" and use["input"] == {"command": "ls -la", "timeout": 10}, s
    results.append(s)
    # Claude Code echoes the content blocks as parsed (thinking with signature, tool_use) back.
    convo.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
    convo.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "a.py\nb.py"}]})

    # 3. Streamed through the SDK's stream helper: text and a tool_use with input_json_delta.
    with c.messages.stream(messages=convo, **common) as st:
        kinds = [e.type for e in st]
        final = st.get_final_message()
    s = summary(final)
    assert [b["type"] for b in s["blocks"]] == ["thinking", "text", "tool_use"], s
    assert s["blocks"][1]["text"] == "Reading a.py now.", s
    assert s["blocks"][2]["input"] == {"command": "cat a.py"}, s
    assert s["stop_reason"] == "tool_use", s
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "input_json" in kinds and "thinking" in kinds and "signature" in kinds, kinds
    results.append(s)
    convo.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]})
    use = s["blocks"][2]
    convo.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use["id"], "is_error": True,
         "content": [{"type": "text", "text": "cat: a.py: Permission denied"}]}]})

    # 4. Raw event stream: the documented order.
    events = []
    text = ""
    thinking = ""
    msg_id = None
    usage = None
    stop = None
    for e in c.messages.create(messages=convo, stream=True, **common):
        events.append(e.type)
        if e.type == "message_start":
            msg_id = e.message.id
        elif e.type == "content_block_delta" and e.delta.type == "text_delta":
            text += e.delta.text
        elif e.type == "content_block_delta" and e.delta.type == "thinking_delta":
            thinking += e.delta.thinking
        elif e.type == "message_delta":
            usage = e.usage.output_tokens
            stop = e.delta.stop_reason
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"], events
    assert text == "I cannot read it." and thinking == "Denied.", (text, thinking)
    assert stop == "end_turn", stop
    results.append({"id": msg_id, "blocks": [{"type": "thinking", "thinking": thinking},
                                             {"type": "text", "text": text}],
                    "stop_reason": stop, "usage": {"output": usage}, "events": events})
    return {"results": results}


def expect_error(fn, cls):
    try:
        fn()
    except cls as e:
        return {"class": type(e).__name__, "status": getattr(e, "status_code", None), "body": e.body,
                "message": str(e)}
    raise AssertionError(f"expected {cls.__name__}")


def errors(cfg):
    def create(url, text="hi", stream=False):
        def go():
            r = client(url).messages.create(
                model="claude-sonnet-4-5", max_tokens=4, stream=stream,
                messages=[{"role": "user", "content": text}],
            )
            if stream:
                for _ in r:
                    pass
        return go

    out = {}
    e = expect_error(create(cfg["unknown"]), anthropic.AuthenticationError)
    assert e["body"]["type"] == "error" and e["body"]["error"]["type"] == "authentication_error", e
    out["unknown_trial"] = e
    e = expect_error(create(cfg["url"], "x" * (cfg["max_body_bytes"] + 1000)), anthropic.ContentTooLargeError)
    assert e["body"]["error"]["type"] == "request_too_large", e
    out["too_large"] = e
    # Anthropic's own answer to an overlong prompt, the one Claude Code compacts on: it matches
    # /^prompt is too long: \d+ tokens > \d+ maximum$/ on the error message.
    for stream in (False, True):
        e = expect_error(create(cfg["url"], "hello " * cfg["context_words"], stream=stream), anthropic.BadRequestError)
        assert e["status"] == 400 and e["body"]["type"] == "error", e
        assert e["body"]["error"]["type"] == "invalid_request_error", e
        m = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", e["body"]["error"]["message"])
        assert m and int(m.group(1)) > int(m.group(2)) == cfg["context"] - 1, e
        out["context_stream" if stream else "context"] = e
    for name in ("backend_500", "backend_down"):
        e = expect_error(create(cfg[name]), anthropic.OverloadedError)
        assert e["status"] == 529 and e["body"]["error"]["type"] == "overloaded_error", e
        out[name] = e
        # Streaming: the SDK raises on the `error` event.
        e = expect_error(create(cfg[name], stream=True), anthropic.APIStatusError)
        assert e["body"]["error"]["type"] == "overloaded_error", e
        out[name + "_stream"] = e
    return out


def retry(cfg):
    """A client timeout shorter than the first generation: the SDK gives up and retries the same
    request (x-stainless-retry-count > 0); the proxy answers the retry from that generation. Then
    the next turn, as a harness sends it."""
    c = anthropic.Anthropic(base_url=cfg["url"], api_key="sk-ant-ignored", max_retries=cfg["max_retries"], timeout=cfg["timeout"])
    messages = [{"role": "user", "content": "Describe the repository."}]
    raw = c.messages.with_raw_response.create(model="qwen3", max_tokens=1024, system="You are a coding agent.", messages=messages)
    retries = int(raw.http_request.headers.get("x-stainless-retry-count", "0"))
    first = raw.parse()
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})
    messages.append({"role": "user", "content": "Now fix it."})
    second = client(cfg["url"]).messages.create(model="qwen3", max_tokens=1024, system="You are a coding agent.", messages=messages)
    return {"retries": retries, "first": summary(first), "second": summary(second)}


if __name__ == "__main__":
    scenario, config = sys.argv[1], json.loads(open(sys.argv[2]).read())
    print(json.dumps({"messages": messages, "errors": errors, "retry": retry}[scenario](config)))
