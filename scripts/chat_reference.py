#!/usr/bin/env python3
"""Render testdata/chat/conversations.jsonl with transformers' apply_chat_template (tokenize=False).

The output is lego-rl's byte-exact reference for src/chat/template.rs: one JSON line per
(conversation, template, add_generation_prompt, enable_thinking) with the rendered `text`, or the
`error` transformers raised. The Rust tests compare against the committed
testdata/chat/expected.jsonl and, when the venv exists, re-run this script and compare again.

Conversations are OpenAI chat-completions requests. They are turned into transformers' message
shape the way lego-rl's proxy does it (src/chat/message.rs): text parts joined with "\n",
tool-call `arguments` strings that parse as a JSON object passed as that (ordered) object.

Usage: chat_reference.py [--out PATH]   (default: testdata/chat/expected.jsonl)
"""

import argparse
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
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, args.out)
    print(f"chat_reference: {len(rows)} renders with transformers {transformers.__version__} -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
