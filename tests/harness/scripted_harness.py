#!/usr/bin/env python3
"""A scripted coding-agent harness for align's tests (ours; not a real product).

It drives a model through the official `openai` or `anthropic` SDK the way real harnesses do, with
the behaviours alignment must survive:
- earlier tool calls are echoed with re-serialized arguments (keys reversed, compact JSON), and
  the model's reasoning is dropped from the echo;
- after its second turn it calls a side model (a title generator: another system prompt);
- after its third turn it compacts: the earliest turns are dropped, keeping the system prompt, the
  task and the latest call with its result.
Tools are not executed: each command gets a fixed fake output, so the run is deterministic.
It stops at the first answer without tool calls (or after --max-turns) and prints a JSON summary.

usage: scripted_harness.py --api openai|anthropic --base-url URL [--max-turns N]
  openai: URL is the OpenAI base (…/v1); anthropic: the Anthropic base (the SDK adds /v1/messages).
"""

import argparse
import json
import sys

SYSTEM = "You are a scripted coding agent. Use the bash tool to inspect, edit and test the repository."
TASK = "Fix the bug in calc.py so the tests pass."
TITLE_SYSTEM = "You generate a short title for a coding session. Answer with the title only."
SCHEMA = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
    "required": ["command"],
}


def fake_tool(args):
    return "$ %s\n(output of %s)\n" % (args.get("command", ""), args.get("command", "").split(" ")[0])


def reserialize(args):
    """Same JSON, other key order and spacing (what e.g. OpenCode does to tool arguments)."""
    return dict(reversed(list(args.items())))


def compact(messages, keep_head):
    """Drop the earliest turns: keep the first `keep_head` messages and the last call + result."""
    return messages[:keep_head] + messages[-2:]


def run_openai(base_url, max_turns):
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="trial-token-in-url", max_retries=0, timeout=300)
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": SCHEMA}}]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    summary = {"requests": 0, "side_requests": 0, "compactions": 0}
    for turn in range(1, max_turns + 1):
        resp = client.chat.completions.create(model="policy", messages=messages, tools=tools, max_tokens=256)
        summary["requests"] += 1
        msg = resp.choices[0].message
        if not msg.tool_calls:
            summary["final"] = msg.content
            break
        calls = []
        results = []
        for call in msg.tool_calls:
            args = json.loads(call.function.arguments)
            calls.append({"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": json.dumps(reserialize(args), separators=(",", ":"))}})
            results.append({"role": "tool", "tool_call_id": call.id, "content": fake_tool(args)})
        messages.append({"role": "assistant", "content": msg.content or None, "tool_calls": calls})
        messages.extend(results)
        if turn == 2:
            title = client.chat.completions.create(model="policy", max_tokens=32, messages=[
                {"role": "system", "content": TITLE_SYSTEM}, {"role": "user", "content": "Session: " + TASK}])
            summary["side_requests"] += 1
            summary["title"] = title.choices[0].message.content
        if turn == 3:
            messages = compact(messages, 2)
            summary["compactions"] += 1
    return summary


def run_anthropic(base_url, max_turns):
    from anthropic import Anthropic

    client = Anthropic(base_url=base_url, api_key="trial-token-in-url", max_retries=0, timeout=300)
    tools = [{"name": "bash", "description": "Run a shell command.", "input_schema": SCHEMA}]
    messages = [{"role": "user", "content": TASK}]
    summary = {"requests": 0, "side_requests": 0, "compactions": 0}
    for turn in range(1, max_turns + 1):
        resp = client.messages.create(model="policy", system=SYSTEM, messages=messages, tools=tools, max_tokens=256)
        summary["requests"] += 1
        uses = [b for b in resp.content if b.type == "tool_use"]
        if not uses:
            summary["final"] = "".join(b.text for b in resp.content if b.type == "text")
            break
        # The echo keeps only the tool_use blocks (thinking dropped), inputs re-ordered.
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": b.id, "name": b.name, "input": reserialize(dict(b.input))} for b in uses]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id, "content": fake_tool(dict(b.input))} for b in uses]})
        if turn == 2:
            title = client.messages.create(model="policy", max_tokens=32, system=TITLE_SYSTEM,
                                           messages=[{"role": "user", "content": "Session: " + TASK}])
            summary["side_requests"] += 1
            summary["title"] = "".join(b.text for b in title.content if b.type == "text")
        if turn == 3:
            messages = compact(messages, 1)
            summary["compactions"] += 1
    return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--api", choices=["openai", "anthropic"], required=True)
    p.add_argument("--base-url", required=True)
    p.add_argument("--max-turns", type=int, default=10)
    a = p.parse_args()
    run = run_openai if a.api == "openai" else run_anthropic
    json.dump(run(a.base_url, a.max_turns), sys.stdout)
    print()


if __name__ == "__main__":
    main()
