#!/usr/bin/env python3
"""Helper of scripts/gpu/check.sh. Needs only torch (the GPU machine has a bare CUDA torch 2.11: no
transformers, no numpy, no safetensors package, no network), so safetensors are read and written
here by hand (an 8-byte header length, a JSON header, raw little-endian bytes).

cast SRC DST DTYPE          copy a checkpoint folder with its float tensors cast (bf16 for the check)
make-model CONFIG DST LAYERS DTYPE SEED DEVICE
                            a Qwen3-MoE checkpoint of CONFIG's shapes with LAYERS layers and random
                            weights (normal 0.02, norms 1), made on DEVICE
measure OUT.json -- CMD...  run CMD; write its exit code, seconds and peak memory (GPU: the device's
                            used memory polled from nvidia-smi over the idle baseline; CPU: maxrss)
metrics FILE KEY...         print the last record's KEYs of a plain JSONL metrics file as JSON
reference CKPT DEVICE SEQS LEN PROMPT MICRO_TOKENS OUT.json
                            a plain-torch GSPO step (π_old without gradients, forward + backward,
                            grad clip, AdamW) of the same model on the same batch shape; tokens/s
report OUT_DIR              gpu-figures.json + gpu-figures.md from the steps' JSON files
"""
import ctypes
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import threading
import time

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64,
          "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}
# H200 SXM dense bf16 tensor-core peak (NVIDIA's datasheet: 1979 TFLOP/s with sparsity).
H200_BF16_PEAK = 989.4e12


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = bytearray(f.read())
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        t = torch.frombuffer(data, dtype=DTYPES[meta["dtype"]], count=(e - b) // DTYPES[meta["dtype"]].itemsize,
                             offset=b) if e > b else torch.empty(0, dtype=DTYPES[meta["dtype"]])
        out[name] = t.reshape(meta["shape"])
    return out


def write_safetensors(path, tensors):
    header, offset = {}, 0
    items = sorted(tensors.items())
    for name, t in items:
        size = t.numel() * t.element_size()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, t in items:
            t = t.detach().contiguous().cpu()
            f.write(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))


def cast(src, dst, dtype):
    kind = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if name.endswith(".safetensors"):
            ts = read_safetensors(s)
            write_safetensors(d, {k: v.to(kind) if v.is_floating_point() else v for k, v in ts.items()})
        elif name == "config.json":
            cfg = json.load(open(s))
            cfg["torch_dtype"] = {"bf16": "bfloat16", "fp32": "float32"}[dtype]
            json.dump(cfg, open(d, "w"), indent=2)
        elif os.path.isfile(s) and not name.endswith(".json") or name.startswith("tokenizer"):
            shutil.copyfile(s, d)


def make_model(config, dst, layers, dtype, seed, device):
    cfg = json.load(open(config))
    cfg["num_hidden_layers"] = int(layers)
    cfg["max_window_layers"] = int(layers)
    kind = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    cfg["torch_dtype"] = {"bf16": "bfloat16", "fp32": "float32"}[dtype]
    g = torch.Generator(device=device).manual_seed(int(seed))
    h, v, d = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    e = cfg.get("num_experts") or cfg.get("num_local_experts")
    nh, nkv, im = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["moe_intermediate_size"]

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(kind)

    def ones(n):
        return torch.ones(n, dtype=kind)

    t = {"model.embed_tokens.weight": rnd(v, h), "model.norm.weight": ones(h)}
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = rnd(v, h)
    for i in range(int(layers)):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ones(h)
        t[p + "post_attention_layernorm.weight"] = ones(h)
        t[p + "self_attn.q_proj.weight"] = rnd(nh * d, h)
        t[p + "self_attn.k_proj.weight"] = rnd(nkv * d, h)
        t[p + "self_attn.v_proj.weight"] = rnd(nkv * d, h)
        t[p + "self_attn.o_proj.weight"] = rnd(h, nh * d)
        t[p + "self_attn.q_norm.weight"] = ones(d)
        t[p + "self_attn.k_norm.weight"] = ones(d)
        t[p + "mlp.gate.weight"] = rnd(e, h)
        for j in range(e):
            q = f"{p}mlp.experts.{j}."
            t[q + "gate_proj.weight"] = rnd(im, h)
            t[q + "up_proj.weight"] = rnd(im, h)
            t[q + "down_proj.weight"] = rnd(h, im)
    os.makedirs(dst, exist_ok=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), t)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)


def gpu_used_mib():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5).stdout
        return sum(float(x) for x in out.split())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def measure(out, cmd):
    base = gpu_used_mib()
    peak = [base]
    done = threading.Event()

    def poll():
        while not done.wait(0.2):
            u = gpu_used_mib()
            if u is not None and (peak[0] is None or u > peak[0]):
                peak[0] = u

    if base is not None:
        threading.Thread(target=poll, daemon=True).start()
    start = time.monotonic()
    p = subprocess.Popen(cmd)
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.monotonic() - start
    done.set()
    rc = os.waitstatus_to_exitcode(status)
    rec = {"rc": rc, "seconds": round(seconds, 3), "peak_rss_bytes": usage.ru_maxrss * 1024}
    if base is not None:
        rec["peak_gpu_bytes"] = int((peak[0] - base) * 2**20)
    json.dump(rec, open(out, "w"))
    return rc


def metrics(path, keys):
    last = [json.loads(line) for line in open(path) if line.strip()][-1]
    print(json.dumps({k: last.get(k) for k in keys}))


class Reference(torch.nn.Module):
    """Qwen3-MoE in plain torch (transformers' modeling_qwen3_moe, eager MoE loop over experts)."""

    def __init__(self, cfg, tensors, device):
        super().__init__()
        self.cfg = cfg
        self.p = torch.nn.ParameterDict(
            {k.replace(".", "/"): torch.nn.Parameter(v.to(device)) for k, v in tensors.items()})
        d = cfg["head_dim"]
        theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        self.inv_freq = inv

    def w(self, name):
        return self.p[name.replace(".", "/")]

    def rms(self, x, w):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"])
        return w * xf.to(x.dtype)

    def rope(self, x, pos):
        f = torch.outer(pos.float(), self.inv_freq)
        emb = torch.cat([f, f], -1)
        cos, sin = emb.cos().to(x.dtype)[None, :, None], emb.sin().to(x.dtype)[None, :, None]
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(self, ids):
        c = self.cfg
        b, t = ids.shape
        nh, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        pos = torch.arange(t, device=ids.device)
        x = self.w("model.embed_tokens.weight")[ids]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self.rms(x, self.w(p + "input_layernorm.weight"))
            q = (h @ self.w(p + "self_attn.q_proj.weight").T).view(b, t, nh, d)
            k = (h @ self.w(p + "self_attn.k_proj.weight").T).view(b, t, nkv, d)
            v = (h @ self.w(p + "self_attn.v_proj.weight").T).view(b, t, nkv, d)
            q = self.rope(self.rms(q, self.w(p + "self_attn.q_norm.weight")), pos).transpose(1, 2)
            k = self.rope(self.rms(k, self.w(p + "self_attn.k_norm.weight")), pos).transpose(1, 2)
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True,
                                                                 enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, t, nh * d) @ self.w(p + "self_attn.o_proj.weight").T
            h = self.rms(x, self.w(p + "post_attention_layernorm.weight")).view(b * t, -1)
            if (p + "mlp.gate.weight").replace(".", "/") not in self.p:  # a dense layer (mlp_only_layers)
                g = torch.nn.functional.silu(h @ self.w(p + "mlp.gate_proj.weight").T) * (h @ self.w(p + "mlp.up_proj.weight").T)
                x = x + (g @ self.w(p + "mlp.down_proj.weight").T).view(b, t, -1)
                continue
            probs = torch.softmax((h @ self.w(p + "mlp.gate.weight").T).float(), -1)
            top, idx = probs.topk(c["num_experts_per_tok"], -1)
            if c.get("norm_topk_prob", True):
                top = top / top.sum(-1, keepdim=True)
            y = torch.zeros_like(h)
            for e in idx.unique().tolist():
                tok, slot = (idx == e).nonzero(as_tuple=True)
                he = h[tok]
                q_ = f"{p}mlp.experts.{e}."
                g = torch.nn.functional.silu(he @ self.w(q_ + "gate_proj.weight").T) * (he @ self.w(q_ + "up_proj.weight").T)
                out = (g @ self.w(q_ + "down_proj.weight").T) * top[tok, slot, None].to(h.dtype)
                y = y.index_add(0, tok, out)
            x = x + y.view(b, t, -1)
        x = self.rms(x, self.w("model.norm.weight"))
        head = self.w("model.embed_tokens.weight") if c.get("tie_word_embeddings") else self.w("lm_head.weight")
        return x @ head.T


def reference(ckpt, device, seqs, length, prompt, micro_tokens, out):
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    tensors = {}
    for name in sorted(os.listdir(ckpt)):
        if name.endswith(".safetensors"):
            tensors.update(read_safetensors(os.path.join(ckpt, name)))
    model = Reference(cfg, tensors, device)
    del tensors
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (seqs, length), generator=g).to(device)
    adv = torch.tensor([1.0, -1.0] * (seqs // 2) + [0.0] * (seqs % 2), device=device)
    per = max(1, micro_tokens // length)

    def seq_logp(i0, i1):
        logits = model(ids[i0:i1])[:, prompt - 1:-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[i0:i1, prompt:, None])[..., 0]
        return lp.mean(-1)

    def step():
        with torch.no_grad():
            old = torch.cat([seq_logp(i, min(i + per, seqs)) for i in range(0, seqs, per)])
        opt.zero_grad(set_to_none=True)
        for i in range(0, seqs, per):
            j = min(i + per, seqs)
            ratio = torch.exp(seq_logp(i, j) - old[i:j])
            a = adv[i:j]
            loss = -torch.minimum(ratio * a, ratio.clamp(1 - 3e-4, 1 + 4e-4) * a).sum() / seqs
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    step()  # warm-up: allocator, kernels, optimizer state
    sync()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t = time.monotonic()
    step()
    sync()
    seconds = time.monotonic() - t
    rec = {"tokens_per_second": seqs * length / seconds, "seconds": seconds, "threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        rec["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    json.dump(rec, open(out, "w"))


def flops_per_token(cfg, seq_len):
    """6 × active parameters (attention, the routed experts a token uses, router, LM head; not the
    embedding lookup) plus causal attention's 6 × layers × seq × heads × head_dim (forward 2, backward 4,
    half the positions)."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv, layers = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    attn = h * nh * d * 2 + h * nkv * d * 2
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    moe = cfg["num_experts_per_tok"] * 3 * h * cfg["moe_intermediate_size"] + h * experts
    dense_layers = len(cfg.get("mlp_only_layers") or [])  # dense MLPs in place of MoE
    dense = 3 * h * cfg.get("intermediate_size", 0)
    active = layers * attn + (layers - dense_layers) * moe + dense_layers * dense + h * cfg["vocab_size"]
    return 6 * active + 6 * layers * seq_len * nh * d


FIGURES = [
    # (key, step, label, unit)
    ("torch_version", "env", "torch", ""),
    ("cuda_available", "env", "CUDA usable", ""),
    ("nccl_usable", "env", "NCCL usable", ""),
    ("devices", "env", "devices", ""),
    ("agreement_replay_on_pearson", "agreement", "log-prob Pearson, replay on", ""),
    ("agreement_replay_on_max_abs_diff", "agreement", "log-prob max |Δ|, replay on", ""),
    ("agreement_replay_on_expert_overlap", "agreement", "expert overlap, replay on", ""),
    ("agreement_replay_off_pearson", "agreement", "log-prob Pearson, replay off", ""),
    ("agreement_replay_off_max_abs_diff", "agreement", "log-prob max |Δ|, replay off", ""),
    ("agreement_replay_off_expert_overlap", "agreement", "expert overlap, replay off", ""),
    ("train_tokens_per_second", "train", "train-step tokens/s (bf16, fp32 masters)", "tok/s"),
    ("train_mfu", "train", "train-step MFU vs H200 bf16 peak", ""),
    ("train_peak_memory_bytes", "train", "train-step peak memory", "B"),
    ("train_plan_total_bytes", "train", "--plan prediction", "B"),
    ("train_peak_over_plan", "train", "peak / plan", ""),
    ("reference_tokens_per_second", "reference", "plain-torch step tokens/s", "tok/s"),
    ("train_over_reference", "reference", "lego-rl / plain torch", "x"),
    ("decode_tokens_per_second_1", "decode", "engine decode, 1 stream", "tok/s"),
    ("decode_tokens_per_second_batched", "decode", "engine decode, batched", "tok/s"),
    ("decode_batched_streams", "decode", "batched streams", ""),
    ("long_tokens", "long", "long-context step: tokens in one sequence", ""),
    ("long_tokens_per_second", "long", "long-context step tokens/s", "tok/s"),
    ("long_peak_memory_bytes", "long", "long-context step peak memory", "B"),
    ("long_plan_total_bytes", "long", "long-context --plan prediction", "B"),
    ("long_peak_over_plan", "long", "long-context peak / plan", ""),
    ("gloo_2_ranks_ok", "collectives", "2 Gloo ranks, tensors on the device", ""),
    ("gloo_2_ranks_tokens_per_second", "collectives", "2 Gloo ranks tokens/s", "tok/s"),
    ("nccl_1_rank_ok", "collectives", "NCCL at world size 1", ""),
]


def long_sample(out, ckpt, tokens):
    """One sample of TOKENS tokens (the second half scored) for the long-context step: random ids
    below the vocabulary, rollout log-probs a constant (the step trains it with `--loss sft`,
    whose passes and saved tensors are GSPO's; one sequence alone has no group advantage)."""
    import base64, random, struct
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    vocab = cfg.get("text_config", cfg)["vocab_size"]
    n = int(tokens)
    rng = random.Random(0)
    scored = n - n // 2
    lp = struct.pack(f"<{scored}f", *([-10.0] * scored))
    rec = {"schema": "lego-rl/sample/v1", "id": "long#0.0", "trajectory_id": "long", "task_id": "long",
           "group_id": 0, "sample_index": 0, "token_ids": [rng.randrange(min(vocab, 151643)) for _ in range(n)],
           "loss_mask": [n // 2, scored],
           "rollout_logprobs": {"dtype": "f32", "shape": [scored], "data": base64.b64encode(lp).decode()},
           "reward": 1.0, "weight": 1.0, "policy_version": 0}
    with open(out, "w") as f:
        f.write(json.dumps(rec) + "\n")


def load(path, default=None):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return default


def report(out):
    fig_dir = os.path.join(out, "figures")
    steps = [json.loads(line) for line in open(os.path.join(out, "steps.jsonl")) if line.strip()]
    figures = {}
    for name in sorted(os.listdir(fig_dir)) if os.path.isdir(fig_dir) else []:
        figures.update(load(os.path.join(fig_dir, name), {}))
    derived = load(os.path.join(out, "model.json"), {})
    if figures.get("train_tokens_per_second") and derived.get("config"):
        cfg = derived["config"]
        peak = float(os.environ.get("LEGO_RL_PEAK_FLOPS", H200_BF16_PEAK))
        figures["train_mfu"] = figures["train_tokens_per_second"] * flops_per_token(cfg, derived["seq_len"]) / peak
    if figures.get("train_peak_memory_bytes") and figures.get("train_plan_total_bytes"):
        figures["train_peak_over_plan"] = figures["train_peak_memory_bytes"] / figures["train_plan_total_bytes"]
    if figures.get("long_peak_memory_bytes") and figures.get("long_plan_total_bytes"):
        figures["long_peak_over_plan"] = figures["long_peak_memory_bytes"] / figures["long_plan_total_bytes"]
    if figures.get("train_tokens_per_second") and figures.get("reference_tokens_per_second"):
        figures["train_over_reference"] = figures["train_tokens_per_second"] / figures["reference_tokens_per_second"]
    status = {s["step"]: s for s in steps}
    rows = []
    for key, step, label, unit in FIGURES:
        v = figures.get(key)
        s = status.get(step, {})
        if v is None:
            why = s.get("error") or ("step not run" if not s else f"step {s.get('status')}")
            figures.setdefault(key, None)
            rows.append((step, label, f"— ({why})"))
        else:
            rows.append((step, label, fmt(v, unit)))
    doc = {"schema": "lego-rl/gpu-figures/v1", "mode": derived.get("mode"), "model": derived.get("model"),
           "steps": steps, "figures": figures}
    json.dump(doc, open(os.path.join(out, "gpu-figures.json"), "w"), indent=2)
    md = [f"GPU check ({derived.get('mode')}, model: {derived.get('model')})", "",
          "| step | figure | value |", "| --- | --- | --- |"]
    md += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    md += ["", "| step | status | seconds |", "| --- | --- | --- |"]
    md += [f"| {s['step']} | {s['status']} | {s['seconds']:.1f} |" for s in steps]
    text = "\n".join(md) + "\n"
    open(os.path.join(out, "gpu-figures.md"), "w").write(text)
    print(text)


def fmt(v, unit):
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if isinstance(v, list):
        return "; ".join(str(x) for x in v) or "none"
    if unit == "B":
        return f"{v / 2**30:.2f} GiB"
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:,.0f} {unit}".strip()
        return f"{v:.4g} {unit}".strip()
    return f"{v} {unit}".strip()


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "cast":
        cast(*args)
    elif cmd == "make-model":
        make_model(*args)
    elif cmd == "measure":
        sep = args.index("--")
        return measure(args[0], args[sep + 1:])
    elif cmd == "metrics":
        metrics(args[0], args[1:])
    elif cmd == "reference":
        ckpt, device, seqs, length, prompt, micro, out = args
        reference(ckpt, device, int(seqs), int(length), int(prompt), int(micro), out)
    elif cmd == "long-sample":
        long_sample(*args)
    elif cmd == "report":
        report(args[0])
    else:
        sys.exit(f"check_helper: unknown command {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
