#!/usr/bin/env python3
"""Render testdata/chat/conversations.jsonl with transformers' apply_chat_template (tokenize=False).

The output is lego-rl's byte-exact reference for src/chat/template.rs: one JSON line per
(conversation, template, add_generation_prompt, enable_thinking) with the rendered `text`, or the
`error` transformers raised. The Rust tests compare against the committed
testdata/chat/expected.jsonl and, when the venv exists, re-run this script and compare again.

Conversations are OpenAI chat-completions requests. They are turned into transformers' message
shape the way lego-rl's proxy does it (src/chat/message.rs): text parts joined with "\n",
tool-call `arguments` strings that parse as a JSON object passed as that (ordered) object.

Every OpenAI request captured from real harnesses (testdata/harness-traffic/**/requests.jsonl) is
rendered too (add_generation_prompt=True); those rows carry the `sha256` and `bytes` of the text
instead of the text, to keep the file small. Their tools are passed the way the proxy passes them:
`{"type": "function", "function": {name, description?, parameters}}`.

Usage: chat_reference.py [--out PATH]   (default: testdata/chat/expected.jsonl)
"""

import argparse
import glob
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = {
    "qwen3": os.path.join(ROOT, "testdata/tokenizer/qwen3/chat_template.jinja"),
    "qwen3-coder": os.path.join(ROOT, "testdata/tokenizer/qwen3-coder/chat_template.jinja"),
}
# (add_generation_prompt, enable_thinking or None for "not passed")
OPTIONS = {
    "qwen3": [(True, None), (True, False), (True, True), (False, None)],
    "qwen3-coder": [(True, None), (False, None)],
}


def to_hf_message(m):
    out = dict(m)
    content = m.get("content")
    if isinstance(content, list):
        out["content"] = "\n".join(p["text"] for p in content if p.get("type") == "text" and "text" in p)
    calls = []
    for c in m.get("tool_calls") or []:
        c = json.loads(json.dumps(c))
        args = c["function"].get("arguments")
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                c["function"]["arguments"] = parsed
        calls.append(c)
    if calls:
        out["tool_calls"] = calls
    return out


def canonical_tool(t):
    f = t.get("function", {})
    out = {"name": f.get("name", "")}
    if f.get("description") is not None:
        out["description"] = f["description"]
    out["parameters"] = f.get("parameters")
    return {"type": "function", "function": out}


def harness_requests():
    base = os.path.join(ROOT, "testdata/harness-traffic")
    for path in sorted(glob.glob(os.path.join(base, "**/requests.jsonl"), recursive=True)):
        rel = os.path.relpath(path, base)
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                rec = json.loads(line)
                if rec.get("path", "").startswith("/v1/chat/completions"):
                    yield f"harness:{rel}:{line_no}", json.loads(rec["body_raw"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "testdata/chat/expected.jsonl"))
    args = ap.parse_args()

    from transformers import AutoTokenizer
    import transformers

    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "testdata/tokenizer/qwen3"))
    with open(os.path.join(ROOT, "testdata/chat/conversations.jsonl"), encoding="utf-8") as f:
        convs = [json.loads(line) for line in f if line.strip()]
    rows = []
    for name, path in TEMPLATES.items():
        with open(path, encoding="utf-8") as f:
            template = f.read()
        for conv in convs:
            for add_gen, thinking in OPTIONS[name]:
                kwargs = {}
                if thinking is not None:
                    kwargs["enable_thinking"] = thinking
                row = {
                    "conversation": conv["id"],
                    "template": name,
                    "add_generation_prompt": add_gen,
                    "enable_thinking": thinking,
                }
                try:
                    row["text"] = tok.apply_chat_template(
                        [to_hf_message(m) for m in conv["messages"]],
                        tools=conv.get("tools"),
                        chat_template=template,
                        add_generation_prompt=add_gen,
                        tokenize=False,
                        **kwargs,
                    )
                except Exception as e:  # the template's raise_exception or a type error
                    row["error"] = f"{type(e).__name__}: {e}"
                rows.append(row)
    for name in TEMPLATES:
        with open(TEMPLATES[name], encoding="utf-8") as f:
            template = f.read()
        for conv_id, body in harness_requests():
            tools = [canonical_tool(t) for t in body.get("tools") or []] or None
            text = tok.apply_chat_template(
                [to_hf_message(m) for m in body["messages"]],
                tools=tools,
                chat_template=template,
                add_generation_prompt=True,
                tokenize=False,
            )
            rows.append({
                "conversation": conv_id,
                "template": name,
                "add_generation_prompt": True,
                "enable_thinking": None,
                "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                "bytes": len(text.encode("utf-8")),
            })
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, args.out)
    print(f"chat_reference: {len(rows)} renders with transformers {transformers.__version__} -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
