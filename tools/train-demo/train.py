#!/usr/bin/env python3
"""Trains anvil's demo model: a ~24M-parameter gpt-oss (MoE experts, attention sinks, alternating
sliding/full attention, YaRN RoPE) on man-page text and harmony conversations, with its own byte-level
BPE tokenizer; quantizes the experts to MXFP4 (after a quantization-aware phase) and exports the exact
Hugging Face gpt-oss layout. Then evaluates the exported weights in float32: held-out perplexity with
the windowing `anvil perplexity` uses, greedy answers to held-out questions, reference logits, and the
tokenizer's ids for the held-out text.

Runs on one GPU in well under ten minutes (`--minutes`), or on a CPU with `--smoke` to check the
pipeline. Needs PyTorch and numpy; `tokenizers` for the real tokenizer (the smoke run falls back to a
byte tokenizer); transformers only for the optional cross-check of the forward pass.

Usage: python3 tools/train-demo/make_data.py && python3 tools/train-demo/train.py --out OUTDIR
"""
import argparse
import gzip
import io
import json
import math
import os
import random
import struct
import sys
import tarfile
import time
import traceback

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

T0 = time.time()
LOG_FILE = None


def log(*parts):
    line = f"[{time.time() - T0:7.1f}s] " + " ".join(str(p) for p in parts)
    print(line, flush=True)
    if LOG_FILE:
        LOG_FILE.write(line + "\n")
        LOG_FILE.flush()


# The harmony special tokens, spelled and ordered as in o200k_harmony (ids 199998..200012 there).
SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
            "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
            "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>"]
# o200k's pre-tokenizer split, so anvil's tokenizer (which runs o200k) reads this one the same way.
O200K_PATTERN = r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


# ---- tokenizer ---------------------------------------------------------------------------------

class HfTokenizer:
    def __init__(self, tok):
        self.tok = tok

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def token_to_id(self, text):
        return self.tok.token_to_id(text)

    def vocab_size(self):
        return self.tok.get_vocab_size(with_added_tokens=True)

    def save(self, path):
        self.tok.save(path)


class ByteTokenizer:
    """Smoke-test stand-in where `tokenizers` is missing: specials, then one id per byte."""

    def __init__(self):
        self.special = {s: i for i, s in enumerate(SPECIALS)}

    def encode_batch(self, texts):
        out = []
        for text in texts:
            ids, i = [], 0
            while i < len(text):
                for s, sid in self.special.items():
                    if text.startswith(s, i):
                        ids.append(sid)
                        i += len(s)
                        break
                else:
                    ids.extend(len(SPECIALS) + b for b in text[i].encode())
                    i += 1
            out.append(ids)
        return out

    def decode(self, ids):
        parts, raw = [], bytearray()
        for i in ids:
            if i < len(SPECIALS):
                parts.append(raw.decode("utf-8", "replace") + SPECIALS[i])
                raw = bytearray()
            else:
                raw.append(i - len(SPECIALS))
        return "".join(parts) + raw.decode("utf-8", "replace")

    def token_to_id(self, text):
        return self.special.get(text)

    def vocab_size(self):
        return len(SPECIALS) + 256

    def save(self, path):
        with open(path, "w") as out:
            json.dump({"note": "smoke-test byte tokenizer, not loadable by anvil"}, out)


def train_tokenizer(texts, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    try:
        model = models.BPE(ignore_merges=True)  # as o200k: a pre-token found whole in the vocab is one token
    except TypeError:
        model = models.BPE()
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return HfTokenizer(tok)


# ---- data --------------------------------------------------------------------------------------

def render_prompt(system, user):
    # What anvil's harmony renderer produces for [user] with the generation prompt.
    return f"<|start|>system<|message|>{system}<|end|><|start|>user<|message|>{user}<|end|><|start|>assistant"


def render_answer(analysis, final):
    return (f"<|channel|>analysis<|message|>{analysis}<|end|><|start|>assistant<|channel|>final<|message|>"
            f"{final}<|return|>")


def load_data(data_dir, smoke):
    with gzip.open(os.path.join(data_dir, "train_text.txt.gz"), "rt") as f:
        docs = [d.strip() for d in f.read().split("<|endoftext|>") if d.strip()]
    with gzip.open(os.path.join(data_dir, "train_chat.jsonl.gz"), "rt") as f:
        chats = [json.loads(line) for line in f]
    if smoke:
        docs, chats = docs[:40], chats[:400]
    return docs, chats


def build_examples(tok, docs, chats):
    """Each example is (ids, target mask): text is all target; a conversation only after its prompt."""
    eot = tok.token_to_id("<|endoftext|>")
    examples = []
    for ids in tok.encode_batch(docs):
        ids = ids + [eot]
        examples.append((np.array(ids, dtype=np.int32), np.ones(len(ids), dtype=np.bool_)))
    prompts = [render_prompt(c["system"], c["user"]) for c in chats]
    fulls = [p + render_answer(c["analysis"], c["final"]) for p, c in zip(prompts, chats)]
    for p_ids, ids in zip(tok.encode_batch(prompts), tok.encode_batch(fulls)):
        if ids[: len(p_ids)] != p_ids:
            raise RuntimeError("a conversation's prompt does not tokenize as a prefix of the conversation")
        mask = np.zeros(len(ids), dtype=np.bool_)
        mask[len(p_ids):] = True
        examples.append((np.array(ids, dtype=np.int32), mask))
    return examples


def epoch_rows(examples, seq, rng):
    order = list(range(len(examples)))
    rng.shuffle(order)
    ids = np.concatenate([examples[i][0] for i in order])
    mask = np.concatenate([examples[i][1] for i in order])
    n = (len(ids) - 1) // seq
    x = ids[: n * seq].reshape(n, seq)
    y = ids[1: n * seq + 1].reshape(n, seq)
    m = mask[1: n * seq + 1].reshape(n, seq)
    perm = np.array(rng.sample(range(n), n))
    return x[perm], y[perm], m[perm]


# ---- model -------------------------------------------------------------------------------------

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def mxfp4_quantize(w):
    """w [..., in] (in % 32 == 0) -> (codes uint8 [..., in], exponents int [..., in/32], dequantized w).
    Per 32-block the exponent is the better (lower squared error) of the smallest one that needs no
    clipping and the one below it."""
    grid = torch.tensor(FP4_VALUES, device=w.device)
    mids = (grid[1:] + grid[:-1]) / 2
    shape = w.shape
    blocks = w.detach().float().reshape(*shape[:-1], shape[-1] // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -120)
    e_hi = torch.ceil(torch.log2(amax / 6.0))
    best = None
    for e in (e_hi, e_hi - 1):
        scaled = blocks / torch.exp2(e)
        index = torch.bucketize(scaled.abs().clamp(max=6.0), mids)
        value = grid[index] * torch.sign(scaled) * torch.exp2(e)
        err = ((value - blocks) ** 2).sum(-1, keepdim=True)
        code = index.to(torch.uint8) | ((scaled < 0).to(torch.uint8) << 3)
        if best is None:
            best = [err, e, code, value]
        else:
            take = err < best[0]
            best = [torch.where(take, err, best[0]), torch.where(take, e, best[1]),
                    torch.where(take, code, best[2]), torch.where(take, value, best[3])]
    _, e, code, value = best
    e = e.clamp(-127, 127)
    return code.reshape(shape), e.squeeze(-1).to(torch.int32), value.reshape(shape)


def mxfp4_pack(w):
    """HF gpt-oss layout: blocks u8 [..., in/32, 16] (low nibble = even element), scales u8 E8M0."""
    code, e, value = mxfp4_quantize(w)
    c = code.reshape(*code.shape[:-1], code.shape[-1] // 32, 16, 2)
    blocks = (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)
    scales = (e + 127).to(torch.uint8)
    return blocks, scales, value


def mxfp4_unpack(blocks, scales):
    grid = torch.tensor(FP4_VALUES + [-v for v in FP4_VALUES], device=blocks.device)
    lo = grid[(blocks & 0x0F).long()]
    hi = grid[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.exp2(scales.float() - 127).unsqueeze(-1)
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def fake_quant(w):
    _, _, value = mxfp4_quantize(w)
    return w + (value.to(w.dtype) - w).detach()  # straight-through estimator


def yarn_tables(cfg, positions, device):
    d, theta = cfg["head_dim"], cfg["rope_theta"]
    rs = cfg["rope_scaling"]
    factor, orig = rs["factor"], rs["original_max_position_embeddings"]
    pos_freq = theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
    extrap, interp = 1.0 / pos_freq, 1.0 / (factor * pos_freq)

    def corr(beta):
        return d * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(corr(rs["beta_fast"]), 0.0), min(corr(rs["beta_slow"]), d - 1.0)
    ramp = ((torch.arange(d // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    inv_freq = interp * ramp + extrap * (1 - ramp)
    mscale = 0.1 * math.log(factor) + 1.0
    angles = positions.float()[:, None] * inv_freq[None, :]
    return torch.cos(angles) * mscale, torch.sin(angles) * mscale


def apply_rope(x, cos, sin):  # x [B, T, H, D]; cos/sin [T, D/2]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * y).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg, sliding):
        super().__init__()
        h, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        self.q_proj = nn.Linear(h, self.nh * hd, bias=True)
        self.k_proj = nn.Linear(h, self.nkv * hd, bias=True)
        self.v_proj = nn.Linear(h, self.nkv * hd, bias=True)
        self.o_proj = nn.Linear(self.nh * hd, h, bias=True)
        self.sinks = nn.Parameter(torch.zeros(self.nh))
        self.window = cfg["sliding_window"] if sliding else None

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = apply_rope(self.q_proj(x).view(B, T, self.nh, self.hd), cos, sin).transpose(1, 2)
        k = apply_rope(self.k_proj(x).view(B, T, self.nkv, self.hd), cos, sin).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        groups = self.nh // self.nkv
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-1, -2)).float() * (self.hd ** -0.5)
        i = torch.arange(T, device=x.device)
        visible = i[None, :] <= i[:, None]
        if self.window is not None:
            visible = visible & (i[None, :] > i[:, None] - self.window)
        scores = scores.masked_fill(~visible, float("-inf"))
        sink = self.sinks.float().view(1, self.nh, 1, 1).expand(B, self.nh, T, 1)
        logits = torch.cat([scores, sink], dim=-1)
        probs = torch.softmax(logits - logits.amax(-1, keepdim=True), dim=-1)[..., :-1]
        out = (probs.to(v.dtype) @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(out)


class Experts(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, i, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
        self.e, self.k, self.limit = e, cfg["num_experts_per_tok"], cfg["swiglu_limit"]
        self.router = nn.Linear(h, e, bias=True)
        # nn.Linear orientation [out, in]; gate/up interleaved along out, as in the checkpoint.
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h) * 0.02)
        self.gate_up_proj_bias = nn.Parameter(torch.zeros(e, 2 * i))
        self.down_proj = nn.Parameter(torch.randn(e, h, i) * 0.02)
        self.down_proj_bias = nn.Parameter(torch.zeros(e, h))
        self.qat = False

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x)
        top_v, top_i = logits.topk(self.k, dim=-1)
        weights = torch.softmax(top_v.float(), dim=-1)
        probs = torch.softmax(logits.float(), dim=-1)
        load = F.one_hot(top_i, self.e).sum(1).float().mean(0) / self.k
        aux = self.e * (load * probs.mean(0)).sum()
        w1 = fake_quant(self.gate_up_proj) if self.qat else self.gate_up_proj
        w2 = fake_quant(self.down_proj) if self.qat else self.down_proj
        flat = top_i.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.bincount(flat, minlength=self.e).tolist()
        out = torch.zeros(x.shape[0], shape[-1], dtype=torch.float32, device=x.device)
        flat_w = weights.reshape(-1)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            idx = order[start: start + n]
            start += n
            tok = idx // self.k
            u = F.linear(x[tok], w1[e], self.gate_up_proj_bias[e])
            gate = u[:, ::2].clamp(max=self.limit)
            up = u[:, 1::2].clamp(-self.limit, self.limit)
            act = gate * torch.sigmoid(1.702 * gate) * (up + 1)
            y = F.linear(act, w2[e], self.down_proj_bias[e])
            out.index_add_(0, tok, y.float() * flat_w[idx].unsqueeze(1))
        return out.to(x.dtype).reshape(shape), aux


class Layer(nn.Module):
    def __init__(self, cfg, sliding):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg, sliding)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = Experts(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y, aux = self.mlp(self.post_attention_layernorm(x))
        return x + y, aux


class GptOss(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(
            [Layer(cfg, t == "sliding_attention") for t in cfg["layer_types"]])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * len(self.layers)))
            elif p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith(".bias") or name.endswith("_bias") or name.endswith("sinks"):
                nn.init.zeros_(p)

    def set_qat(self, on):
        for layer in self.layers:
            layer.mlp.qat = on

    def forward(self, ids):
        T = ids.shape[1]
        cos, sin = yarn_tables(self.cfg, torch.arange(T, device=ids.device), ids.device)
        x = self.embed_tokens(ids)
        aux = 0.0
        for layer in self.layers:
            x, a = layer(x, cos, sin)
            aux = aux + a
        return self.lm_head(self.norm(x)), aux / len(self.layers)


# ---- export ------------------------------------------------------------------------------------

def hf_name(name):
    """Our parameter name -> the checkpoint's (the experts live under mlp.experts there)."""
    if name == "lm_head.weight":
        return name
    for part in ("gate_up_proj", "down_proj"):
        name = name.replace(f".mlp.{part}", f".mlp.experts.{part}")
    return "model." + name


def bf16(t):
    return t.detach().to(torch.bfloat16).cpu()


def export_tensors(model):
    """HF names -> tensors (bf16, or u8 blocks/scales for experts); plus the float32 weights they decode to."""
    tensors, decoded = {}, {}
    for name, p in model.named_parameters():
        hf = hf_name(name)
        if name.endswith(("gate_up_proj", "down_proj")):
            blocks, scales, value = mxfp4_pack(p.detach().float())
            tensors[hf + "_blocks"] = blocks.cpu()
            tensors[hf + "_scales"] = scales.cpu()
            round_trip = mxfp4_unpack(blocks, scales)
            if not torch.equal(round_trip, value):
                raise RuntimeError(f"{hf}: MXFP4 pack/unpack does not round-trip")
            decoded[name] = round_trip.float().cpu()
        else:
            tensors[hf] = bf16(p)
            decoded[name] = tensors[hf].float()
    return tensors, decoded


def write_safetensors(path, tensors):
    dtype_name = {torch.bfloat16: "BF16", torch.uint8: "U8", torch.float32: "F32"}
    # Wider elements first so every tensor stays aligned to its element size.
    names = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in names:
        t = tensors[name].contiguous()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": dtype_name[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for raw in blobs:
            out.write(raw)


def write_model(out_dir, tensors, shards):
    names = list(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    groups, current, size = [], [], 0
    for name in names:
        current.append(name)
        size += tensors[name].numel() * tensors[name].element_size()
        if size >= total / shards and len(groups) < shards - 1:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    weight_map = {}
    files = []
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" if len(groups) > 1 else "model.safetensors"
        write_safetensors(os.path.join(out_dir, file), {n: tensors[n] for n in group})
        files.append(file)
        for n in group:
            weight_map[n] = file
    if len(groups) > 1:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1, sort_keys=True)
    return files, total


def hf_config(args, vocab_size, tok):
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(args.layers)]
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "attention_bias": True, "attention_dropout": 0.0, "head_dim": 64,
        "hidden_size": args.hidden, "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers, "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "num_local_experts": args.experts, "num_experts_per_tok": 4, "experts_per_token": 4,
        "layer_types": layer_types, "sliding_window": args.window,
        "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096},
        "max_position_embeddings": 131072, "initial_context_length": 4096,
        "swiglu_limit": 7.0, "rms_norm_eps": 1e-05, "vocab_size": vocab_size,
        "bos_token_id": tok.token_to_id("<|startoftext|>"), "eos_token_id": tok.token_to_id("<|return|>"),
        "pad_token_id": tok.token_to_id("<|endoftext|>"), "tie_word_embeddings": False,
        "hidden_act": "silu", "initializer_range": 0.02, "router_aux_loss_coef": args.aux,
        "output_router_logits": False, "use_cache": True, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
    }


# ---- evaluation --------------------------------------------------------------------------------

@torch.no_grad()
def perplexity(model, ids, ctx, stride, device):
    """Windows of `ctx` tokens start every `stride` tokens; each scores only the tokens no earlier
    window scored (the first window all but its first token), so every token after the first is
    scored exactly once. anvil perplexity uses the same rule."""
    nll, count, prev_end, begin = 0.0, 0, 0, 0
    while True:
        end = min(begin + ctx, len(ids))
        window = torch.tensor(ids[begin:end], device=device)[None]
        logits = model(window)[0][0].float()
        logp = torch.log_softmax(logits, dim=-1)
        first = max(prev_end, begin + 1)
        targets = torch.tensor(ids[first:end], device=device)
        picked = logp[first - begin - 1: end - begin - 1].gather(1, targets[:, None])
        nll -= picked.sum().item()
        count += end - first
        prev_end = end
        if end == len(ids):
            break
        begin += stride
    return math.exp(nll / count), count


@torch.no_grad()
def greedy(model, ids, max_new, stop_ids, device):
    ids = list(ids)
    out = []
    for _ in range(max_new):
        logits = model(torch.tensor(ids, device=device)[None])[0][0, -1].float()
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        ids.append(nxt)
        if nxt in stop_ids:
            break
    return out


def split_final(text):
    marker = "<|channel|>final<|message|>"
    if marker not in text:
        return None
    final = text.split(marker, 1)[1]
    for stop in ("<|return|>", "<|end|>", "<|call|>"):
        final = final.split(stop, 1)[0]
    return final.strip()


def eval_model_from(decoded, cfg, device):
    model = GptOss(cfg).to(device).float()
    state = {name: decoded[name].to(device) for name, _ in model.named_parameters()}
    model.load_state_dict(state, strict=True)
    model.eval()
    return model


def hf_crosscheck(out_dir, decoded, cfg, prompts, ours, device):
    """Our float32 forward against transformers' GptOssForCausalLM on the same decoded weights."""
    from transformers import GptOssConfig, GptOssForCausalLM
    plain = dict(cfg)
    plain.pop("quantization_config", None)
    hcfg = GptOssConfig(**plain)
    hcfg._attn_implementation = "eager"
    hf = GptOssForCausalLM(hcfg).float().eval().to(device)
    params = dict(hf.named_parameters())
    # transformers keeps experts as [E, in, out] (x @ W) in some versions and [E, out, in] in others;
    # gate_up is never square, so its shape tells which, and down_proj follows it.
    sample = next(n for n in decoded if n.endswith("gate_up_proj"))
    transpose = tuple(params[hf_name(sample)].shape) != tuple(decoded[sample].shape)
    state = {}
    for name, value in decoded.items():
        target = params.get(hf_name(name))
        if target is None:
            continue
        if transpose and name.endswith(("gate_up_proj", "down_proj")):
            value = value.transpose(1, 2)
        state[hf_name(name)] = value.contiguous()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    log("transformers cross-check: missing", missing, "unexpected", unexpected)
    diffs = []
    hf_logits = []
    with torch.no_grad():
        for ids, mine in zip(prompts, ours):
            got = hf(torch.tensor([ids], device=device)).logits[0].float().cpu()
            hf_logits.append(got)
            diffs.append(float((got - mine).abs().max()))
    return diffs, hf_logits, [str(m) for m in missing]


def main():
    global LOG_FILE
    p = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--data", default=os.path.join(here, "data"))
    p.add_argument("--out", default=os.environ.get("OUT", "out-demo"))
    p.add_argument("--model-dir", default="/tmp/anvil-demo-model", help="where the exported model is assembled")
    p.add_argument("--smoke", action="store_true", help="tiny model, few steps, CPU: checks the pipeline")
    p.add_argument("--minutes", type=float, default=5.0, help="training time budget")
    p.add_argument("--qat-fraction", type=float, default=0.3, help="last fraction of training with fake-MXFP4 experts")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--aux", type=float, default=0.01)
    p.add_argument("--shards", type=int, default=2, help="safetensors files (each must stay under 16 MiB to travel)")
    p.add_argument("--ppl-ctx", type=int, default=512)
    p.add_argument("--ppl-stride", type=int, default=256)
    p.add_argument("--seed", type=int, default=5)
    args = p.parse_args()
    if args.smoke:
        args.vocab, args.hidden, args.intermediate, args.layers, args.experts = 512, 64, 64, 2, 4
        args.seq, args.batch, args.minutes, args.window = 64, 8, 0.3, 16
        args.ppl_ctx, args.ppl_stride = 64, 32
    os.makedirs(args.out, exist_ok=True)
    # The model is assembled outside --out: only a handful of files may come back from the GPU machine.
    model_dir = args.model_dir
    os.makedirs(model_dir, exist_ok=True)
    LOG_FILE = open(os.path.join(args.out, "log.txt"), "w")
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # The evaluation is float32 to compare with anvil's CPU path; TF32 would round its matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    log("torch", torch.__version__, "device", device, torch.cuda.get_device_name() if device == "cuda" else "")
    results = {"args": vars(args)}

    def save_results():
        with open(os.path.join(model_dir, "eval.json"), "w") as f:
            json.dump(results, f, indent=1)
        # Small files travel together in one archive ($OUT keeps at most 8 files).
        with tarfile.open(os.path.join(args.out, "meta.tar.gz"), "w:gz") as tar:
            for name in sorted(os.listdir(model_dir)):
                if not name.endswith(".safetensors") or name.startswith("reference"):
                    tar.add(os.path.join(model_dir, name), arcname=name)

    docs, chats = load_data(args.data, args.smoke)
    log(f"data: {len(docs)} text documents, {len(chats)} conversations")
    try:
        def tokenizer_corpus():
            for d in docs:
                yield d
            for c in chats:
                yield "\n".join([c["system"], c["user"], c["analysis"], c["final"], "system user assistant analysis final"])
        tok = train_tokenizer(tokenizer_corpus(), args.vocab)
    except ImportError:
        if not args.smoke:
            raise
        log("tokenizers missing: smoke run uses a byte tokenizer")
        tok = ByteTokenizer()
    vocab_size = tok.vocab_size()
    if args.smoke:
        vocab_size = (vocab_size + 31) // 32 * 32
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    log("tokenizer: vocab", vocab_size, "special ids", {s: tok.token_to_id(s) for s in SPECIALS[:2] + ["<|return|>", "<|call|>"]})
    cfg = hf_config(args, vocab_size, tok)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(model_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "pad_token_id": cfg["pad_token_id"],
                   "eos_token_id": [tok.token_to_id("<|return|>"), tok.token_to_id("<|endoftext|>"),
                                    tok.token_to_id("<|call|>")]}, f, indent=2)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>",
                   "eos_token": "<|return|>", "pad_token": "<|endoftext|>", "model_max_length": 131072}, f, indent=2)

    heldout_text = open(os.path.join(args.data, "heldout_text.txt")).read()
    heldout = json.load(open(os.path.join(args.data, "heldout_questions.json")))
    if args.smoke:
        heldout_text = heldout_text[:3000]
        heldout["questions"] = heldout["questions"][:2]
    heldout_ids = tok.encode_batch([heldout_text])[0]
    probe_texts = ["What does `grep` do?", "naïve café — 3.14159 tokens\n\n  indented\tTAB", heldout_text[:400]]
    with open(os.path.join(model_dir, "tokenizer_check.json"), "w") as f:
        json.dump({"heldout_text_ids": heldout_ids,
                   "probes": [{"text": t, "ids": i} for t, i in zip(probe_texts, tok.encode_batch(probe_texts))]}, f)
    save_results()

    examples = build_examples(tok, docs, chats)
    n_tokens = sum(len(e[0]) for e in examples)
    log(f"examples: {len(examples)}, {n_tokens} tokens per epoch, {sum(int(e[1].sum()) for e in examples)} targets")

    model = GptOss(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("gate_up_proj", "down_proj")))
    results["parameters"] = {"total": n_params, "expert_weights": n_expert}
    log(f"model: {n_params / 1e6:.2f}M parameters ({n_expert / 1e6:.2f}M in expert weights)")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), **({"fused": True} if device == "cuda" else {}))
    budget = args.minutes * 60
    start = time.time()
    step, epoch, seen = 0, 0, 0
    rows = None
    row_at = 0
    losses = []
    qat_on = False
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda")
    try:
        while True:
            frac = (time.time() - start) / budget
            if frac >= 1.0:
                break
            if not qat_on and frac >= 1.0 - args.qat_fraction:
                model.set_qat(True)
                qat_on = True
                log(f"step {step}: quantization-aware phase (fake MXFP4 experts) starts")
            warm = min(1.0, (step + 1) / 100)
            lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
            for g in opt.param_groups:
                g["lr"] = lr
            if rows is None or row_at + args.batch > rows[0].shape[0]:
                x, y, m = epoch_rows(examples, args.seq, rng)
                rows = (torch.from_numpy(x).to(device), torch.from_numpy(y).to(device), torch.from_numpy(m).to(device))
                row_at = 0
                epoch += 1
            xb = rows[0][row_at: row_at + args.batch].long()
            yb = rows[1][row_at: row_at + args.batch].long()
            mb = rows[2][row_at: row_at + args.batch]
            row_at += args.batch
            with autocast:
                logits, aux = model(xb)
            loss_all = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), yb.reshape(-1), reduction="none")
            mask = mb.reshape(-1).float()
            loss = (loss_all * mask).sum() / mask.sum().clamp(min=1)
            (loss + args.aux * aux).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            seen += xb.numel()
            if step % 50 == 0 or step == 1:
                losses.append((step, float(loss)))
                log(f"step {step} epoch {epoch} loss {float(loss):.4f} aux {float(aux):.3f} lr {lr:.2e} "
                    f"{seen / (time.time() - start):.0f} tok/s")
    except Exception:
        log("training stopped by an error:\n" + traceback.format_exc())
    results["training"] = {"steps": step, "epochs_started": epoch, "tokens": seen, "seconds": time.time() - start,
                           "tokens_per_epoch": n_tokens, "loss_curve": losses}
    log(f"trained {step} steps, {seen} tokens in {time.time() - start:.0f}s")

    model.set_qat(False)
    model.eval()
    tensors, decoded = export_tensors(model)
    files, total = write_model(model_dir, tensors, args.shards)
    results["export"] = {"files": files, "bytes": total}
    log("exported", files, total, "bytes")
    save_results()

    eval_model = eval_model_from(decoded, cfg, device)
    stop_ids = {tok.token_to_id("<|return|>"), tok.token_to_id("<|call|>")}
    try:
        ppl, count = perplexity(eval_model, heldout_ids, args.ppl_ctx, args.ppl_stride, device)
        results["heldout_perplexity"] = {"mxfp4_experts": ppl, "scored_tokens": count, "text_tokens": len(heldout_ids),
                                         "ctx": args.ppl_ctx, "stride": args.ppl_stride, "precision": "float32"}
        log(f"held-out perplexity (exported MXFP4 experts, fp32): {ppl:.4f} over {count} tokens")
        bf16_decoded = dict(decoded)
        for name, p in model.named_parameters():
            if name.endswith(("gate_up_proj", "down_proj")):
                bf16_decoded[name] = bf16(p).float()
        ppl_bf16, _ = perplexity(eval_model_from(bf16_decoded, cfg, device), heldout_ids, args.ppl_ctx, args.ppl_stride, device)
        results["heldout_perplexity"]["bf16_experts"] = ppl_bf16
        log(f"held-out perplexity (bf16 experts, not shipped): {ppl_bf16:.4f}")
    except Exception:
        log("perplexity failed:\n" + traceback.format_exc())
    save_results()

    try:
        answers, hits = [], 0
        asked = [dict(q, heldout=True) for q in heldout["questions"]]
        for c in ["grep", "tar", "ls"]:
            asked.append({"command": c, "question": f"What does {c} do?", "keywords": [], "heldout": False})
        for q in asked:
            prompt = tok.encode_batch([render_prompt(heldout["system"], q["question"])])[0]
            out = greedy(eval_model, prompt, 96, stop_ids, device)
            text = tok.decode(out)
            final = split_final(text)
            hit = bool(final) and any(k in final.lower() for k in q["keywords"])
            if q["heldout"]:
                hits += hit
            answers.append({"command": q["command"], "question": q["question"], "completion": text,
                            "final": final, "keywords": q["keywords"], "keyword_hit": hit, "heldout": q["heldout"]})
            log(f"Q {q['question']!r} -> {text!r} hit={hit}")
        results["heldout_questions"] = {"asked": len(heldout["questions"]), "keyword_hits": hits, "answers": answers}
        log(f"held-out questions: {hits}/{len(heldout['questions'])} finals contain a man-page keyword")
    except Exception:
        log("greedy answers failed:\n" + traceback.format_exc())
    save_results()

    try:
        prompts = [tok.encode_batch([render_prompt(heldout["system"], "What does grep do?")])[0],
                   heldout_ids[: min(300, len(heldout_ids))]]
        ours = []
        with torch.no_grad():
            for ids in prompts:
                ours.append(eval_model(torch.tensor([ids], device=device))[0][0].float().cpu())
        ref_tensors, cases = {}, []
        for i, (ids, logits) in enumerate(zip(prompts, ours)):
            T = len(ids)
            positions = sorted(set(list(range(0, T, max(1, T // 12))) + [T - 3, T - 2, T - 1] +
                                   [p for p in (126, 127, 128, 129, 200) if p < T]))
            ref_tensors[f"logits_{i}"] = logits[positions].contiguous()
            cont = greedy(eval_model, ids, 16, set(), device)
            cases.append({"prompt_ids": ids, "positions": positions, "logits_tensor": f"logits_{i}", "greedy_ids": cont})
        reference = {"note": "float32 forward of the exported weights (bf16 upcast, MXFP4 decoded) by "
                             "tools/train-demo/train.py", "cases": cases}
        try:
            diffs, hf_logits, missing = hf_crosscheck(model_dir, decoded, cfg, prompts, ours, device)
            reference["transformers_max_abs_diff"] = diffs
            reference["transformers_missing_keys"] = missing
            log("transformers GptOssForCausalLM vs ours, max |logit diff| per prompt:", diffs)
        except Exception:
            log("transformers cross-check failed:\n" + traceback.format_exc())
        write_safetensors(os.path.join(model_dir, "reference_logits.safetensors"), ref_tensors)
        with open(os.path.join(model_dir, "reference.json"), "w") as f:
            json.dump(reference, f)
        with tarfile.open(os.path.join(args.out, "reference.tar.gz"), "w:gz") as tar:
            for name in ("reference.json", "reference_logits.safetensors"):
                tar.add(os.path.join(model_dir, name), arcname=name)
    except Exception:
        log("reference logits failed:\n" + traceback.format_exc())
    save_results()
    # The shards travel as separate files (each under the 16 MiB limit).
    for file in files:
        os.replace(os.path.join(model_dir, file), os.path.join(args.out, file))
    log("done")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        log("FAILED:\n" + traceback.format_exc())
        sys.exit(1)
