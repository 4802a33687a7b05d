#!/usr/bin/env python3
"""Can the benchmark's model learn to copy the word at all? A fast check outside the pipeline.

The pipeline's runs (run.sh) cost about an hour each on 2 CPU cores, almost all of it harness
start-up. This script answers the design question first, in minutes, with transformers alone: the
same random model (make_model.config, the seed), the same prompts (the real tokenizer and chat
template, mini-swe-agent's system prompt and bash tool, make_tasks.py's phrasings) and the same
correct outputs. It runs

1. SFT on the demonstration tasks (make_tasks.py's choice; one AdamW update on all of them per step,
   as run.sh does), then
2. group-relative RL on the word alone: per step one training task of each word, GROUP samples of
   the word at temperature 1 at its position in the correct output, reward 1 when it is the task's
   word, advantages (r − mean)/std within the group, one AdamW update — what GSPO does when the
   rest of the call is already right,

and prints p(correct word) (teacher-forced, at the word's position) on training and held-out tasks.
It is an idealisation: the pipeline samples the whole call, and a malformed call earns 0. It was
used to choose the family (REPEAT) and the learning rates (README "Choosing the family").

Usage: simulate.py [--repeat N] [--sft-steps N] [--sft-lr X] [--rl-steps N] [--rl-lr X] [--group N] [--seed N]
"""
import argparse
import os
import random
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_model  # noqa: E402
import make_tasks  # noqa: E402

SYSTEM = "You are a helpful assistant that can interact with a computer."
# mini-swe-agent 2.4.6's bash tool, as it sends it (testdata/harness-traffic/mini-swe-agent).
TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Execute a bash command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
                   "required": ["command"]}}}]


def tasks(tok, repeat):
    """Every task: token ids of prompt + correct output, the word's position and id, split."""
    out = []
    for i, w in enumerate(make_tasks.WORDS):
        (wid,) = tok(" " + w, add_special_tokens=False)["input_ids"]
        for j, t in enumerate(make_tasks.phrasings(repeat)):
            msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t.format(w=w)}]
            prompt = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, tokenize=False)
            pid = tok(prompt, add_special_tokens=False)["input_ids"]
            oid = tok(make_tasks.output(w) + "<|im_end|>", add_special_tokens=False)["input_ids"]
            wpos = len(pid) + max(k for k, x in enumerate(oid) if x == wid)
            out.append(dict(id=make_tasks.task_id(w, j), word=i, wid=wid, ids=pid + oid, plen=len(pid), wpos=wpos,
                            held=make_tasks.heldout(j)))
    return out


class Sim:
    def __init__(self, model):
        self.m = model

    def hidden(self, batch):
        n = max(len(t["ids"]) for t in batch)
        ids = torch.full((len(batch), n), 151643)
        att = torch.zeros(len(batch), n, dtype=torch.long)
        for k, t in enumerate(batch):
            ids[k, : len(t["ids"])] = torch.tensor(t["ids"])
            att[k, : len(t["ids"])] = 1
        return self.m.model(input_ids=ids, attention_mask=att).last_hidden_state, ids

    def sft_loss(self, batch):
        """Mean NLL per output token (train-step --loss sft)."""
        h, ids = self.hidden(batch)
        total, n = 0.0, 0
        for k, t in enumerate(batch):
            pos = torch.arange(t["plen"] - 1, len(t["ids"]) - 1)
            lp = self.m.lm_head(h[k, pos]).log_softmax(-1)
            total = total - lp.gather(1, ids[k, pos + 1].unsqueeze(1)).sum()
            n += len(pos)
        return total / n

    def word_logprobs(self, batch):
        h, _ = self.hidden(batch)
        return [self.m.lm_head(h[k, t["wpos"] - 1]).log_softmax(-1) for k, t in enumerate(batch)]

    @torch.no_grad()
    def p_correct(self, batch):
        return sum(lp[t["wid"]].exp().item() for lp, t in zip(self.word_logprobs(batch), batch)) / len(batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=make_tasks.REPEAT, help="extra mentions of the word")
    ap.add_argument("--sft-steps", type=int, default=30)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--rl-steps", type=int, default=40)
    ap.add_argument("--rl-lr", type=float, default=1e-3)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--every", type=int, default=10, help="print every N steps")
    a = ap.parse_args()
    torch.set_num_threads(1)
    tok = transformers.AutoTokenizer.from_pretrained(make_model.TOKENIZER)
    all_tasks = tasks(tok, a.repeat)
    train = [t for t in all_tasks if not t["held"]]
    held = [t for t in all_tasks if t["held"]]
    probe = train[:: len(train) // 24]
    demos = [t for t in train if t["id"] in make_tasks.demo_ids()]
    torch.manual_seed(a.seed)
    sim = Sim(transformers.Qwen3ForCausalLM(make_model.config()))
    rng = random.Random(a.seed)
    print(f"{len(train)} train / {len(held)} held-out tasks, {len(demos)} demonstrations, "
          f"prompt {held[0]['plen']} tokens, repeat {a.repeat}")
    print(f"{'phase':>5} {'step':>4} {'loss/reward':>11} {'p(word) train':>13} {'held-out':>8}")
    show = lambda phase, s, x: print(f"{phase:>5} {s:>4} {x:>11.4f} {sim.p_correct(probe):>13.3f} {sim.p_correct(held):>8.3f}", flush=True)
    show("init", 0, float("nan"))
    opt = torch.optim.AdamW(sim.m.parameters(), lr=a.sft_lr, weight_decay=0.01)
    for s in range(1, a.sft_steps + 1):
        opt.zero_grad()
        loss = sim.sft_loss(demos)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(sim.m.parameters(), 1.0)
        opt.step()
        if s % a.every == 0 or s == a.sft_steps:
            show("sft", s, loss.item())
    # A fresh optimizer for RL, as run.sh starts GSPO without SFT's optimizer state.
    opt = torch.optim.AdamW(sim.m.parameters(), lr=a.rl_lr, weight_decay=0.01)
    by_word = [[t for t in train if t["word"] == i] for i in range(len(make_tasks.WORDS))]
    for s in range(1, a.rl_steps + 1):
        batch = [rng.choice(ts) for ts in by_word]
        loss, rewards = 0.0, []
        for lp, t in zip(sim.word_logprobs(batch), batch):
            sample = torch.multinomial(lp.exp().detach(), a.group, replacement=True)
            r = (sample == t["wid"]).float()
            rewards.append(r.mean().item())
            if r.std() > 0:
                adv = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
                loss = loss - (adv * lp[sample]).mean() / len(batch)
        if torch.is_tensor(loss):
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(sim.m.parameters(), 1.0)
            opt.step()
        if s % a.every == 0 or s == a.rl_steps:
            show("rl", s, sum(rewards) / len(rewards))


if __name__ == "__main__":
    main()
