"""The official `openai` Python SDK as a client of the lego-rl proxy (driven by tests/it/proxy_sdk.rs).

Usage: openai_client.py SCENARIO CONFIG_JSON. Prints one JSON object (what the SDK parsed) on stdout;
any failed assertion exits non-zero with a traceback. The Rust side pushes the scripted outputs and
checks the proxy's captures against what is printed here.
"""

import asyncio
import json
import re
import sys

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageToolCall

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command", "timeout"],
                "additionalProperties": False,
            },
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a coding agent. Use the bash tool."}


def client(url, **kw):
    # The proxy ignores API keys; the SDK insists on one. No retries: errors must surface as they are.
    return openai.OpenAI(base_url=url, api_key="sk-ignored", max_retries=0, **kw)


def summary(resp: ChatCompletion):
    assert isinstance(resp, ChatCompletion), type(resp)
    choice = resp.choices[0]
    msg = choice.message
    calls = []
    for c in msg.tool_calls or []:
        assert isinstance(c, ChatCompletionMessageToolCall), type(c)
        assert c.type == "function"
        calls.append({"id": c.id, "name": c.function.name, "arguments": json.loads(c.function.arguments)})
    extra = msg.model_extra or {}
    return {
        "id": resp.id,
        "content": msg.content,
        "reasoning": extra.get("reasoning_content"),
        "tool_calls": calls,
        "finish_reason": choice.finish_reason,
        "usage": {"prompt": resp.usage.prompt_tokens, "completion": resp.usage.completion_tokens},
    }


def collect_stream(stream):
    """Accumulates raw chunks the way harnesses do: content, reasoning, tool-call deltas by index."""
    out = {"id": None, "content": "", "reasoning": "", "tool_calls": {}, "finish_reason": None, "usage": None}
    for chunk in stream:
        assert isinstance(chunk, ChatCompletionChunk), type(chunk)
        out["id"] = out["id"] or chunk.id
        assert chunk.id == out["id"], "one id per stream"
        if chunk.usage is not None:
            assert chunk.choices == [], "the usage chunk has no choices"
            out["usage"] = {"prompt": chunk.usage.prompt_tokens, "completion": chunk.usage.completion_tokens}
        for choice in chunk.choices:
            d = choice.delta
            out["content"] += d.content or ""
            out["reasoning"] += (d.model_extra or {}).get("reasoning_content") or ""
            for tc in d.tool_calls or []:
                slot = out["tool_calls"].setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            if choice.finish_reason:
                out["finish_reason"] = choice.finish_reason
    out["tool_calls"] = [
        {"id": c["id"], "name": c["name"], "arguments": json.loads(c["arguments"])}
        for _, c in sorted(out["tool_calls"].items())
    ]
    return out


def chat(cfg):
    c = client(cfg["url"])
    results = []
    models = c.models.list()
    assert [m.id for m in models.data] == ["policy"], models

    # 1. Plain text, not streamed, with reasoning.
    r = c.chat.completions.create(
        model="qwen3", messages=[SYSTEM, {"role": "user", "content": "Say hello."}], tools=TOOLS
    )
    s = summary(r)
    assert s["content"] == "Hello from the tiny model!", s
    assert s["reasoning"] == "The user greets me.", s
    assert s["finish_reason"] == "stop" and s["tool_calls"] == [], s
    results.append(s)

    # 2. Two parallel tool calls, not streamed.
    messages = [SYSTEM, {"role": "user", "content": "List and show the files."}]
    r = c.chat.completions.create(model="qwen3", messages=messages, tools=TOOLS, tool_choice="auto")
    s = summary(r)
    assert s["finish_reason"] == "tool_calls", s
    assert [t["arguments"] for t in s["tool_calls"]] == [
        {"command": "ls -la", "timeout": 10},
        {"command": "cat a.py", "timeout": 5},
    ], s
    assert len({t["id"] for t in s["tool_calls"]}) == 2, s
    results.append(s)
    # The harness echoes the assistant message as the SDK parsed it, then the tool results.
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    for t, output in zip(s["tool_calls"], ["a.py\nb.py", "print('hi')"]):
        messages.append({"role": "tool", "tool_call_id": t["id"], "content": output})

    # 3. Streamed tool call with usage, after the tool results.
    stream = c.chat.completions.create(
        model="qwen3",
        messages=messages,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    s = collect_stream(stream)
    assert s["finish_reason"] == "tool_calls", s
    assert s["tool_calls"][0]["name"] == "bash", s
    assert s["tool_calls"][0]["arguments"] == {"command": "cat b.py", "timeout": 5}, s
    assert s["usage"] is not None, s
    results.append(s)
    messages.append(
        {
            "role": "assistant",
            "content": s["content"] or None,
            "tool_calls": [
                {"id": t["id"], "type": "function",
                 "function": {"name": t["name"], "arguments": json.dumps(t["arguments"])}}
                for t in s["tool_calls"]
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": s["tool_calls"][0]["id"], "content": "x = 1"})

    # 4. Streamed text through the SDK's own stream helper (it assembles the final completion).
    with c.chat.completions.stream(
        model="qwen3", messages=messages, tools=TOOLS, stream_options={"include_usage": True}
    ) as st:
        kinds = set()
        for event in st:
            kinds.add(event.type)
        final = st.get_final_completion()
    s = summary(final)
    assert "content.delta" in kinds and "content.done" in kinds, kinds
    assert s["content"] == "All done: a.py and b.py.", s
    assert s["finish_reason"] == "stop", s
    results.append(s)

    # 5. Sampled (not scripted) with the sampling parameters harnesses send.
    r = c.chat.completions.create(
        model="qwen3",
        messages=[{"role": "user", "content": "Write a poem."}],
        max_completion_tokens=5,
        temperature=0.7,
        top_p=0.9,
        seed=3,
    )
    s = summary(r)
    assert s["usage"]["completion"] <= 5, s
    assert s["finish_reason"] in ("stop", "length"), s
    results.append(s)
    return {"results": results}


async def one_stream(c, text):
    stream = await c.chat.completions.create(
        model="qwen3",
        messages=[{"role": "user", "content": text}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=8,
    )
    out = {"sent": text, "id": None, "content": "", "finish_reason": None, "usage": None}
    async for chunk in stream:
        out["id"] = out["id"] or chunk.id
        if chunk.usage is not None:
            out["usage"] = {"prompt": chunk.usage.prompt_tokens, "completion": chunk.usage.completion_tokens}
        for choice in chunk.choices:
            out["content"] += choice.delta.content or ""
            out["finish_reason"] = choice.finish_reason or out["finish_reason"]
    return out


async def concurrent_main(cfg):
    clients = [
        (t["trial"], openai.AsyncOpenAI(base_url=t["url"], api_key="sk-ignored", max_retries=0, timeout=600))
        for t in cfg["trials"]
    ]
    tasks = []
    for trial, c in clients:
        for k in range(cfg["per_trial"]):
            tasks.append(one_stream(c, f"trial {trial} thread {k}: say your number."))
    results = await asyncio.gather(*tasks)
    for _, c in clients:
        await c.close()
    return {"results": results}


def concurrent(cfg):
    return asyncio.run(concurrent_main(cfg))


def disconnect(cfg):
    c = client(cfg["url"])
    stream = c.chat.completions.create(
        model="qwen3",
        messages=[{"role": "user", "content": "Write a very long essay."}],
        stream=True,
    )
    # Read the first tokens as they are generated, then go away mid-stream.
    received = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received += 1
        if received >= 3:
            break
    stream.close()
    # The engine keeps serving others.
    r = c.chat.completions.create(
        model="qwen3", messages=[{"role": "user", "content": "And now briefly."}], max_tokens=3
    )
    return {"received": received, "after": summary(r)}


def retry(cfg):
    """A client timeout shorter than the first generation: the SDK gives up and retries the same
    request (x-stainless-retry-count > 0); the proxy answers the retry from that generation. Then
    the next turn, as a harness sends it."""
    c = openai.OpenAI(base_url=cfg["url"], api_key="sk-ignored", max_retries=cfg["max_retries"], timeout=cfg["timeout"])
    messages = [SYSTEM, {"role": "user", "content": "Describe the repository."}]
    raw = c.chat.completions.with_raw_response.create(model="qwen3", messages=messages, tools=TOOLS)
    retries = int(raw.http_request.headers.get("x-stainless-retry-count", "0"))
    first = raw.parse()
    messages.append({"role": "assistant", "content": first.choices[0].message.content})
    messages.append({"role": "user", "content": "Now fix it."})
    second = client(cfg["url"], timeout=600).chat.completions.create(model="qwen3", messages=messages, tools=TOOLS)
    return {"retries": retries, "first": summary(first), "second": summary(second)}


def stop(cfg):
    """Stop strings: `stop` as a string and as a list, not streamed and streamed (scripted outputs)."""
    c = client(cfg["url"])
    msgs = [{"role": "user", "content": "Count."}]
    r = c.chat.completions.create(model="qwen3", messages=msgs, stop="END")
    one = summary(r)
    assert one["finish_reason"] == "stop", one
    stream = c.chat.completions.create(
        model="qwen3", messages=msgs, stop=["\n\n", "three"], stream=True, stream_options={"include_usage": True}
    )
    two = collect_stream(stream)
    return {"results": [one, two]}


def completions(cfg):
    """The legacy text completions API: raw prompts, no chat template."""
    from openai.types import Completion

    c = client(cfg["url"])
    out = []
    r = c.completions.create(model="qwen3", prompt="def add(a, b):", max_tokens=6, seed=1)
    assert isinstance(r, Completion) and r.object == "text_completion", r
    out.append({"id": r.id, "text": r.choices[0].text, "finish_reason": r.choices[0].finish_reason,
                "usage": {"prompt": r.usage.prompt_tokens, "completion": r.usage.completion_tokens}})
    text, usage, finish, rid = "", None, None, None
    for chunk in c.completions.create(model="qwen3", prompt=cfg["prompt_ids"], max_tokens=5, stream=True,
                                      stream_options={"include_usage": True}):
        assert isinstance(chunk, Completion), chunk
        rid = rid or chunk.id
        if chunk.usage is not None:
            usage = {"prompt": chunk.usage.prompt_tokens, "completion": chunk.usage.completion_tokens}
        for ch in chunk.choices:
            text += ch.text
            finish = ch.finish_reason or finish
    assert usage is not None and usage["prompt"] == len(cfg["prompt_ids"]), usage
    out.append({"id": rid, "text": text, "finish_reason": finish, "usage": usage})
    for o in out:
        assert o["finish_reason"] in ("stop", "length"), o
    return {"results": out}


def expect_error(fn, cls):
    try:
        fn()
    except cls as e:
        return {"class": type(e).__name__, "status": getattr(e, "status_code", None), "body": e.body,
                "message": str(e)}
    raise AssertionError(f"expected {cls.__name__}")


def errors(cfg):
    def create(url, **kw):
        body = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        body.update(kw)
        return lambda: client(url).chat.completions.create(**body)

    def streamed(url):
        def go():
            for _ in client(url).chat.completions.create(
                model="qwen3", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
            ):
                pass
        return go

    out = {}
    out["unknown_trial"] = expect_error(create(cfg["unknown"]), openai.AuthenticationError)
    assert out["unknown_trial"]["status"] == 401
    assert out["unknown_trial"]["body"]["code"] == "invalid_api_key", out
    big = "x" * (cfg["max_body_bytes"] + 1000)
    out["too_large"] = expect_error(
        create(cfg["url"], messages=[{"role": "user", "content": big}]), openai.APIStatusError
    )
    assert out["too_large"]["status"] == 413, out
    long = "hello " * cfg["context_words"]
    out["context"] = expect_error(
        create(cfg["url"], messages=[{"role": "user", "content": long}]), openai.BadRequestError
    )
    out["context_stream"] = expect_error(
        create(cfg["url"], messages=[{"role": "user", "content": long}], stream=True), openai.BadRequestError
    )
    # OpenAI's shape and words: code `context_length_exceeded`, param `messages`.
    for key in ("context", "context_stream"):
        e = out[key]
        assert e["status"] == 400 and e["body"]["code"] == "context_length_exceeded", e
        assert e["body"]["type"] == "invalid_request_error" and e["body"]["param"] == "messages", e
        assert re.fullmatch(
            r"This model's maximum context length is (\d+) tokens\. However, your messages resulted in "
            r"(\d+) tokens\. Please reduce the length of the messages\.",
            e["body"]["message"],
        ), e
    for name in ("backend_500", "backend_down"):
        e = expect_error(create(cfg[name]), openai.InternalServerError)
        assert e["status"] == 502 and e["body"]["type"] == "server_error", e
        out[name] = e
        # Streaming: the headers are out before the backend fails; the SDK raises on the error event.
        out[name + "_stream"] = expect_error(streamed(cfg[name]), openai.APIError)
    return out


if __name__ == "__main__":
    scenario, config = sys.argv[1], json.loads(open(sys.argv[2]).read())
    result = {"chat": chat, "completions": completions, "concurrent": concurrent, "disconnect": disconnect, "errors": errors, "retry": retry, "stop": stop}[scenario](config)
    print(json.dumps(result))
