#!/usr/bin/python3
"""Independent float64 reference for lmtune's decoder families (tests/models/fixtures/).

Run with Debian's PyTorch:  /usr/bin/python3 scripts/reference_models.py [--out tests/models/fixtures]

For each architecture (llama, llama3 with llama3 rope scaling, mistral, qwen2 with q/k/v biases, qwen3,
gemma2, gemma3_text, gemma4_text; llama_yarn, qwen2_longrope and llama_dynamic for the rope scalings; mixtral
and qwen3_moe, mixtures of experts) it writes a tiny random
checkpoint in HuggingFace layout (config.json + model.safetensors, written by the standard-library safetensors
writer below; mistral is sharded with an index) and reference.safetensors
holding the inputs (ids, positions, doc_ids, targets) and the outputs of the PyTorch model written here from the
papers / the transformers modeling files: logits [B, T, V], the mean cross-entropy over non-ignored targets
(-100), and the gradients of that loss w.r.t. a few weights ("grad.<hf name>").

Nothing here imports transformers: the model is re-derived so that a shared misunderstanding cannot hide.
The batch is B=2, T=11: row 0 is one document (positions 0..10), row 1 packs three documents (positions reset
to 0 at each boundary, attention never crosses a boundary). Sliding windows are 4, so they matter.
The rope-scaling fixtures' original context is 8 (the batch goes past it) and they add "short.logits" and
"generate.logits" (see rope_outputs). The mixture-of-experts fixtures add "aux_loss" (transformers'
load_balancing_loss_func over every expert layer's router logits) and its gradient w.r.t. layer 0's router
("grad_aux.<name>"); mixtral is stored in the per-expert layout of transformers 4
(block_sparse_moe.experts.E.w1/w2/w3), qwen3_moe in the stacked layout of transformers 5 (mlp.experts.gate_up_proj /
down_proj).
--only NAME... writes just those fixtures.
"""
import argparse
import json
import math
import os
import shutil
import struct

import torch

torch.set_default_dtype(torch.float64)

# ---------------------------------------------------------------------------------------------------------------
# safetensors writer (format: u64 header length, JSON header, raw little-endian data)
# ---------------------------------------------------------------------------------------------------------------
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32",
              torch.float64: "F64"}


def write_safetensors(path, tensors, metadata=None):
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------------------------------------------
# The reference model (float64)
# ---------------------------------------------------------------------------------------------------------------
def rope_inv_freq(rope, dim, seq_len=0):
    """transformers' _compute_*_rope_parameters, in float64: (inv_freq [dim/2], attention factor).

    seq_len is the forward call's largest position + 1 (dynamic and longrope depend on it)."""
    base = rope["theta"]
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    inv = 1.0 / (base ** exponents)
    kind = rope.get("type", "default")
    if kind == "linear":
        return inv / rope["factor"], 1.0
    if kind == "llama3":
        factor, lo, hi, old = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max"]
        low_wl, high_wl = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wl) & (wavelen <= low_wl)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "dynamic":  # NTK-aware: the base grows once the call is longer than max_position_embeddings
        factor, trained = rope["factor"], rope["max_pos"]
        if seq_len > trained:
            base = base * (factor * seq_len / trained - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** exponents), 1.0
    if kind == "yarn":
        factor, old = rope["factor"], rope["original_max"]

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if rope.get("attention_factor") is not None:
            attention = rope["attention_factor"]
        elif rope.get("mscale") and rope.get("mscale_all_dim"):
            attention = mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"])
        else:
            attention = mscale(factor)

        def correction_dim(rotations):  # the dimension whose wavelength fits `rotations` times in `old`
            return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = correction_dim(rope.get("beta_fast") or 32), correction_dim(rope.get("beta_slow") or 1)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        # ramp 0: the frequency is kept (extrapolated); ramp 1: divided by factor (interpolated)
        return inv * (1 - ramp) + inv / factor * ramp, attention
    if kind == "longrope":
        old = rope["original_max"]
        ext = torch.tensor(rope["long_factor"] if seq_len > old else rope["short_factor"], dtype=torch.float64)
        factor = rope.get("factor") or rope["max_pos"] / old
        attention = rope.get("attention_factor")
        if attention is None:
            attention = math.sqrt(1 + math.log(factor) / math.log(old)) if factor > 1 else 1.0
        return inv / ext, attention
    return inv, 1.0


def apply_rope(x, positions, inv_freq, attention=1.0):
    """x [B, T, H, D], half-split pairs (i, i + R/2) of the first R = 2 * inv_freq size dims as transformers'
    rotate_half; cos and sin times the attention factor. inv_freq: [R/2], or [B, T, R/2] per token."""
    ang = positions.to(torch.float64)[..., None] * inv_freq  # [B, T, R/2]
    cos = (torch.cat([ang.cos(), ang.cos()], -1) * attention)[:, :, None, :].to(x.dtype)
    sin = (torch.cat([ang.sin(), ang.sin()], -1) * attention)[:, :, None, :].to(x.dtype)
    R = cos.shape[-1]
    xr, rest = x[..., :R], x[..., R:]
    rot = torch.cat([-xr[..., R // 2:], xr[..., :R // 2]], -1)
    return torch.cat([xr * cos + rot * sin, rest], -1)


def rope_tables(rope, dim, positions, token_seq_len):
    """Per-layer frequencies for a forward call: one table for the call's length (transformers' seq_len = the
    largest position + 1), or, with token_seq_len [B, T], each token's own (the KV-cache timeline, where a token's
    key keeps the rotation of the call that computed it)."""
    if token_seq_len is None:
        return rope_inv_freq(rope, dim, int(positions.max()) + 1)
    B, T = positions.shape
    table = torch.zeros(B, T, dim // 2)
    attention = 1.0
    for b in range(B):
        for t in range(T):
            table[b, t], attention = rope_inv_freq(rope, dim, int(token_seq_len[b, t]))
    return table, attention


def rms_norm(x, w, eps, one_plus):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (1.0 + w) if one_plus else y * w


def act(name, x):
    if name == "silu":
        return x * torch.sigmoid(x)
    if name == "gelu_pytorch_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))
    raise ValueError(name)


def linear(p, name, x, bias):
    y = x @ p[name + ".weight"].T
    if name + ".lora_A" in p:  # LoRA (bench/torch_cpu_baseline.py): + scale * (x A^T) B^T
        y = y + (x @ p[name + ".lora_A"].T) @ p[name + ".lora_B"].T * p["lora_scale"]
    return y + p[name + ".bias"] if bias else y


def moe_mlp(a, p, pre, h, router_logits):
    """Mixtral / Qwen3-MoE sparse block: softmax router, top-k, optional renormalization, dropless experts."""
    x = h.reshape(-1, h.shape[-1])
    logits = x @ p[pre + "mlp.gate.weight"].T
    router_logits.append(logits)
    top, idx = torch.topk(torch.softmax(logits, -1), a["top_k"], -1)
    if a["norm_topk"]:
        top = top / top.sum(-1, keepdim=True)
    y = routed_experts(a, x, top, idx, p[pre + "mlp.experts.gate_up_proj"], p[pre + "mlp.experts.down_proj"])
    return y.reshape(h.shape)


def routed_experts(a, x, top, idx, gate_up, down):
    """Each row of x [N, C] through its top-k experts (stacked gate_up [E, 2 EI, C], down [E, C, EI]), weighted."""
    EI = down.shape[-1]
    rows = []
    for n in range(x.shape[0]):
        y = torch.zeros_like(x[n])
        for s in range(a["top_k"]):
            gu = gate_up[idx[n, s]] @ x[n]
            y = y + top[n, s] * (down[idx[n, s]] @ (act(a["act"], gu[:EI]) * gu[EI:]))
        rows.append(y)
    return torch.stack(rows)


def load_balancing_loss(router_logits, E, k):
    """transformers' load_balancing_loss_func without an attention mask."""
    probs = torch.softmax(torch.cat(router_logits, 0), -1)
    _, idx = torch.topk(probs, k, -1)
    tokens_per_expert = torch.nn.functional.one_hot(idx, E).to(probs.dtype).mean(0)  # [k, E]
    return (tokens_per_expert * probs.mean(0)[None]).sum() * E


def forward(spec, p, ids, positions, doc_ids, token_seq_len=None, router_logits=None):
    a = spec["arch"]
    if a.get("gemma4"):
        return gemma4_forward(a, p, ids, positions, doc_ids)
    if a.get("qwen3_next"):
        return qwen3_next_forward(a, p, ids, positions, doc_ids, router_logits)
    B, T = ids.shape
    H, KV, D = a["heads"], a["kv_heads"], a["head_dim"]
    gemma, one_plus = a["gemma"], a["gemma"]
    x = p["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * math.sqrt(a["hidden"])
    i = torch.arange(T)
    causal = i[:, None] >= i[None, :]
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]  # [B, T, T]
    for l in range(a["layers"]):
        pre = f"model.layers.{l}."
        window = a["windows"][l]
        mask = causal[None] & same_doc
        if window:
            mask = mask & ((i[:, None] - i[None, :]) < window)[None]
        # attention
        h = rms_norm(x, p[pre + "input_layernorm.weight"], a["eps"], one_plus)
        q = linear(p, pre + "self_attn.q_proj", h, a["qkv_bias"]).view(B, T, H, D)
        k = linear(p, pre + "self_attn.k_proj", h, a["qkv_bias"]).view(B, T, KV, D)
        v = linear(p, pre + "self_attn.v_proj", h, a["qkv_bias"]).view(B, T, KV, D)
        if a["qk_norm"]:
            q = rms_norm(q, p[pre + "self_attn.q_norm.weight"], a["eps"], one_plus)
            k = rms_norm(k, p[pre + "self_attn.k_norm.weight"], a["eps"], one_plus)
        inv, attention = rope_tables(a["ropes"][l], a.get("rotary_dim", D), positions, token_seq_len)
        q, k = apply_rope(q, positions, inv, attention), apply_rope(k, positions, inv, attention)
        rep = H // KV
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) * a["attn_scale"]
        if a["attn_softcap"]:
            s = a["attn_softcap"] * torch.tanh(s / a["attn_softcap"])
        s = s.masked_fill(~mask[:, None], float("-inf"))
        o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v).reshape(B, T, H * D)
        o = linear(p, pre + "self_attn.o_proj", o, False)
        if gemma:
            o = rms_norm(o, p[pre + "post_attention_layernorm.weight"], a["eps"], one_plus)
        x = x + o
        # MLP
        norm = "pre_feedforward_layernorm" if gemma else "post_attention_layernorm"
        h = rms_norm(x, p[pre + norm + ".weight"], a["eps"], one_plus)
        if a.get("moe_layers", [False] * a["layers"])[l]:
            m = moe_mlp(a, p, pre, h, router_logits if router_logits is not None else [])
        else:
            m = act(a["act"], linear(p, pre + "mlp.gate_proj", h, False)) * linear(p, pre + "mlp.up_proj", h, False)
            m = linear(p, pre + "mlp.down_proj", m, False)
        if gemma:
            m = rms_norm(m, p[pre + "post_feedforward_layernorm.weight"], a["eps"], one_plus)
        x = x + m
    x = rms_norm(x, p["model.norm.weight"], a["eps"], one_plus)
    head = p["model.embed_tokens.weight"] if a["tied"] else p["lm_head.weight"]
    logits = x @ head.T
    if a["final_softcap"]:
        logits = a["final_softcap"] * torch.tanh(logits / a["final_softcap"])
    return logits


def deltanet(a, p, pre, h, positions):
    """Qwen3NextGatedDeltaNet in its recurrent form (torch_recurrent_gated_delta_rule, one token at a time), the
    state and the causal convolution's window restarting where a sequence starts (position 0), as
    flash-linear-attention does for packed sequences."""
    B, T, _ = h.shape
    Hk, Hv, Dk, Dv, K = a["lin_k_heads"], a["lin_v_heads"], a["lin_dk"], a["lin_dv"], a["conv"]
    r = Hv // Hk
    if a.get("split"):  # Qwen3.5: one projection each
        mixed = linear(p, pre + "in_proj_qkv", h, False)
        z = linear(p, pre + "in_proj_z", h, False).view(B, T, Hv, Dv)
        b, dt = linear(p, pre + "in_proj_b", h, False), linear(p, pre + "in_proj_a", h, False)
    else:  # Qwen3-Next: grouped per key head
        qkvz = linear(p, pre + "in_proj_qkvz", h, False).view(B, T, Hk, 2 * Dk + 2 * r * Dv)
        q, k, v, z = torch.split(qkvz, [Dk, Dk, r * Dv, r * Dv], dim=3)
        ba = linear(p, pre + "in_proj_ba", h, False).view(B, T, Hk, 2 * r)
        b, dt = torch.split(ba, [r, r], dim=3)
        z, b, dt = z.reshape(B, T, Hv, Dv), b.reshape(B, T, Hv), dt.reshape(B, T, Hv)
        mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], -1)
    w = p[pre + "conv1d.weight"][:, 0, :]  # [channels, K]
    conv = []
    for t in range(T):
        acc = torch.zeros_like(mixed[:, 0])
        for j in range(K):
            if t - j >= 0:
                keep = (positions[:, t] >= j).to(mixed.dtype)[:, None]
                acc = acc + keep * w[:, K - 1 - j] * mixed[:, t - j]
        conv.append(acc)
    conv = act("silu", torch.stack(conv, 1))
    q, k, v = torch.split(conv, [Hk * Dk, Hk * Dk, Hv * Dv], dim=-1)
    l2 = lambda x: x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    q = (l2(q.reshape(B, T, Hk, Dk)) * Dk ** -0.5).repeat_interleave(r, dim=2)
    k = l2(k.reshape(B, T, Hk, Dk)).repeat_interleave(r, dim=2)
    v = v.reshape(B, T, Hv, Dv)
    beta = torch.sigmoid(b)
    g = -p[pre + "A_log"].exp() * torch.nn.functional.softplus(dt + p[pre + "dt_bias"])
    S = torch.zeros(B, Hv, Dk, Dv, dtype=h.dtype)
    out = []
    for t in range(T):
        S = S * (positions[:, t] != 0).to(h.dtype)[:, None, None, None]
        S = S * g[:, t].exp()[..., None, None]
        delta = (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t])) * beta[:, t][..., None]
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], delta)
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    o = torch.stack(out, 1)
    o = rms_norm(o, p[pre + "norm.weight"], a["eps"], False) * act("silu", z)
    return linear(p, pre + "out_proj", o.reshape(B, T, Hv * Dv), False)


def qwen3_next_forward(a, p, ids, positions, doc_ids, router_logits=None):
    """Qwen3NextForCausalLM: (1 + w) norms, Gated DeltaNet layers, gated attention with q/k norms and partial
    rotary embeddings, experts with a gated shared expert."""
    B, T = ids.shape
    Hh, KVh, D, eps = a["heads"], a["kv_heads"], a["head_dim"], a["eps"]
    x = p["model.embed_tokens.weight"][ids]
    i = torch.arange(T)
    mask = (i[:, None] >= i[None, :])[None] & (doc_ids[:, :, None] == doc_ids[:, None, :])
    inv = 1.0 / (a["theta"] ** (torch.arange(0, a["rotary_dim"], 2, dtype=torch.float64) / a["rotary_dim"]))
    inv = inv[None, None].expand(B, T, -1)
    for l in range(a["layers"]):
        pre = f"model.layers.{l}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps, True)
        if a["linear"][l]:
            o = deltanet(a, p, pre + "linear_attn.", h, positions)
        else:
            qg = linear(p, pre + "self_attn.q_proj", h, False).view(B, T, Hh, 2 * D)
            q, gate = qg[..., :D], qg[..., D:].reshape(B, T, Hh * D)
            k = linear(p, pre + "self_attn.k_proj", h, False).view(B, T, KVh, D)
            v = linear(p, pre + "self_attn.v_proj", h, False).view(B, T, KVh, D)
            q = apply_rope(rms_norm(q, p[pre + "self_attn.q_norm.weight"], eps, True), positions, inv)
            k = apply_rope(rms_norm(k, p[pre + "self_attn.k_norm.weight"], eps, True), positions, inv)
            k, v = k.repeat_interleave(Hh // KVh, dim=2), v.repeat_interleave(Hh // KVh, dim=2)
            s = torch.einsum("bthd,bshd->bhts", q, k) * D ** -0.5
            s = s.masked_fill(~mask[:, None], float("-inf"))
            o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v).reshape(B, T, Hh * D)
            o = linear(p, pre + "self_attn.o_proj", o * torch.sigmoid(gate), False)
        x = x + o
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps, True)
        if a["moe_layers"][l]:
            m = moe_mlp(a, p, pre, h, router_logits if router_logits is not None else [])
            sh = act("silu", linear(p, pre + "mlp.shared_expert.gate_proj", h, False)) * \
                linear(p, pre + "mlp.shared_expert.up_proj", h, False)
            sh = linear(p, pre + "mlp.shared_expert.down_proj", sh, False)
            m = m + torch.sigmoid(linear(p, pre + "mlp.shared_expert_gate", h, False)) * sh
        else:
            m = act("silu", linear(p, pre + "mlp.gate_proj", h, False)) * linear(p, pre + "mlp.up_proj", h, False)
            m = linear(p, pre + "mlp.down_proj", m, False)
        x = x + m
    x = rms_norm(x, p["model.norm.weight"], eps, True)
    return x @ p["lm_head.weight"].T


def qwen3_next_fixture(arch):
    """Four layers (Gated DeltaNet, gated attention, Gated DeltaNet, gated attention); the DeltaNet layers with 2
    key heads of 8 serving 4 value heads of 12 and a convolution of 4; attention heads of 16 with a quarter
    rotated; experts (top-2 of 4 of 16, renormalized) with a shared expert of 24 on layers 0, 1 and 3, a dense MLP
    on layer 2."""
    types = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    cfg = base_config("qwen3_next", "Qwen3NextForCausalLM", 4, hidden_act="silu", head_dim=16, layer_types=types,
                      linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12,
                      linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=16, shared_expert_intermediate_size=24, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[2], router_aux_loss_coef=0.001,
                      tie_word_embeddings=False, attention_bias=False, rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
    a = arch(4, head_dim=16, eps=1e-6, qwen3_next=True, linear=[t == "linear_attention" for t in types],
             lin_k_heads=2, lin_v_heads=4, lin_dk=8, lin_dv=12, conv=4, rotary_dim=4, theta=10000.0,
             moe_layers=[True, True, False, True], experts=4, top_k=2, expert_size=16, norm_topk=True, shared=24)
    out = [("qwen3_next", cfg, a, {})]
    # Qwen3.5-MoE's text model: separate q/k/v, z, b and a projections, one value head per key head (12 and 8
    # wide), every layer sparse (top-2 of 4, always renormalized) with the shared expert, mrope's sections (the
    # same positions on every axis for text).
    types = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
    cfg = base_config("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", 4, hidden_act="silu", head_dim=32,
                      layer_types=types, linear_conv_kernel_dim=3, linear_key_head_dim=12,
                      linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=2, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                      router_aux_loss_coef=0.001, tie_word_embeddings=False, attention_bias=False,
                      rms_norm_eps=1e-6,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                       "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    del cfg["intermediate_size"]
    a = arch(4, head_dim=32, eps=1e-6, qwen3_next=True, split=True, linear=[t == "linear_attention" for t in types],
             lin_k_heads=2, lin_v_heads=2, lin_dk=12, lin_dv=8, conv=3, rotary_dim=8, theta=10000.0,
             moe_layers=[True] * 4, experts=4, top_k=2, expert_size=16, norm_topk=True, shared=24)
    out.append(("qwen3_5_moe", cfg, a, {}))
    return out


def qwen3_next_params(a, rnd):
    """(1 + w) norms near 0; the DeltaNet's gated norm (a plain weight) near 1, decay rates exp(A_log) in
    [0.05, 1.6] with dt_bias near 0.5, so that states neither vanish nor stay undecayed."""
    L, D, Hh, KVh = a["layers"], a["head_dim"], a["heads"], a["kv_heads"]
    Hk, Hv, Dk, Dv, K = a["lin_k_heads"], a["lin_v_heads"], a["lin_dk"], a["lin_dv"], a["conv"]
    offset = lambda n: rnd(n, std=0.1)  # noqa: E731
    p = {"model.embed_tokens.weight": rnd(V, C, std=1.0), "model.norm.weight": offset(C),
         "lm_head.weight": rnd(V, C, std=C ** -0.5)}
    for l in range(L):
        pre = f"model.layers.{l}."
        p[pre + "input_layernorm.weight"] = offset(C)
        p[pre + "post_attention_layernorm.weight"] = offset(C)
        if a["linear"][l]:
            la = pre + "linear_attn."
            ch = 2 * Hk * Dk + Hv * Dv
            if a.get("split"):
                p[la + "in_proj_qkv.weight"] = rnd(2 * Hk * Dk + Hv * Dv, C, std=C ** -0.5)
                p[la + "in_proj_z.weight"] = rnd(Hv * Dv, C, std=C ** -0.5)
                p[la + "in_proj_b.weight"] = rnd(Hv, C, std=C ** -0.5)
                p[la + "in_proj_a.weight"] = rnd(Hv, C, std=C ** -0.5)
            else:
                p[la + "in_proj_qkvz.weight"] = rnd(2 * Hk * Dk + 2 * Hv * Dv, C, std=C ** -0.5)
                p[la + "in_proj_ba.weight"] = rnd(2 * Hv, C, std=C ** -0.5)
            p[la + "conv1d.weight"] = rnd(ch, 1, K, std=0.5)
            p[la + "dt_bias"] = rnd(Hv, std=0.3) + 0.5
            p[la + "A_log"] = (torch.sigmoid(rnd(Hv, std=1.5)) * 1.55 + 0.05).log().float().double()
            p[la + "norm.weight"] = rnd(Dv, std=0.1) + 1.0
            p[la + "out_proj.weight"] = rnd(C, Hv * Dv, std=(Hv * Dv) ** -0.5)
        else:
            p[pre + "self_attn.q_proj.weight"] = rnd(2 * Hh * D, C, std=C ** -0.5)
            p[pre + "self_attn.k_proj.weight"] = rnd(KVh * D, C, std=C ** -0.5)
            p[pre + "self_attn.v_proj.weight"] = rnd(KVh * D, C, std=C ** -0.5)
            p[pre + "self_attn.o_proj.weight"] = rnd(C, Hh * D, std=(Hh * D) ** -0.5)
            p[pre + "self_attn.q_norm.weight"] = offset(D)
            p[pre + "self_attn.k_norm.weight"] = offset(D)
        if a["moe_layers"][l]:
            E, EI, S = a["experts"], a["expert_size"], a["shared"]
            p[pre + "mlp.gate.weight"] = rnd(E, C, std=3 * C ** -0.5)
            p[pre + "mlp.experts.gate_up_proj"] = rnd(E, 2 * EI, C, std=C ** -0.5)
            p[pre + "mlp.experts.down_proj"] = rnd(E, C, EI, std=EI ** -0.5)
            p[pre + "mlp.shared_expert.gate_proj.weight"] = rnd(S, C, std=C ** -0.5)
            p[pre + "mlp.shared_expert.up_proj.weight"] = rnd(S, C, std=C ** -0.5)
            p[pre + "mlp.shared_expert.down_proj.weight"] = rnd(C, S, std=S ** -0.5)
            p[pre + "mlp.shared_expert_gate.weight"] = rnd(1, C, std=C ** -0.5)
        else:
            p[pre + "mlp.gate_proj.weight"] = rnd(I, C, std=C ** -0.5)
            p[pre + "mlp.up_proj.weight"] = rnd(I, C, std=C ** -0.5)
            p[pre + "mlp.down_proj.weight"] = rnd(C, I, std=I ** -0.5)
    return p


def proportional_inv_freq(theta, fraction, dim):
    """transformers' _compute_proportional_rope_parameters: the head's first floor(fraction * dim / 2) pairs at
    base^(-2i / dim), the others frequency 0 (cos 1, sin 0: they pass through)."""
    angles = int(fraction * dim // 2)
    inv = torch.zeros(dim // 2)
    inv[:angles] = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.float64) / dim))
    return inv


def gemma4_forward(a, p, ids, positions, doc_ids):
    """Gemma4TextModel + Gemma4ForCausalLM, from the transformers 5 modeling file: plain-weight norms, value
    norms without a weight, unscaled scores, full layers with their own head size and (k_eq_v) the keys as values,
    the last layers attending to the keys and values of the last earlier layer of their type, per-layer inputs
    (PLE), layer scalars, final soft-capping."""
    B, T = ids.shape
    L, P, Hh, eps = a["layers"], a["ple"], a["heads"], a["eps"]
    x = p["model.embed_tokens.weight"][ids] * math.sqrt(a["hidden"])
    ple = None
    if P:
        own = (p["model.embed_tokens_per_layer.weight"][ids] * math.sqrt(P)).reshape(B, T, L, P)
        proj = (x @ p["model.per_layer_model_projection.weight"].T) * a["hidden"] ** -0.5
        proj = rms_norm(proj.reshape(B, T, L, P), p["model.per_layer_projection_norm.weight"], eps, False)
        ple = (proj + own) * 2 ** -0.5
    i = torch.arange(T)
    causal = i[:, None] >= i[None, :]
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
    stored = {}
    for l in range(L):
        pre = f"model.layers.{l}."
        D, KVl, src = a["head_dims"][l], a["kv_heads_per_layer"][l], a["kv_source"][l]
        mask = causal[None] & same_doc
        if a["windows"][l]:
            mask = mask & ((i[:, None] - i[None, :]) < a["windows"][l])[None]
        inv = a["inv_freqs"][l]
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps, False)
        q = (h @ p[pre + "self_attn.q_proj.weight"].T).view(B, T, Hh, D)
        q = apply_rope(rms_norm(q, p[pre + "self_attn.q_norm.weight"], eps, False), positions, inv)
        if src >= 0:
            k, v = stored[src]
        else:
            k = (h @ p[pre + "self_attn.k_proj.weight"].T).view(B, T, KVl, D)
            v = k if a["k_eq_v"][l] else (h @ p[pre + "self_attn.v_proj.weight"].T).view(B, T, KVl, D)
            k = apply_rope(rms_norm(k, p[pre + "self_attn.k_norm.weight"], eps, False), positions, inv)
            v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
            stored[l] = (k, v)
        rep = Hh // k.shape[2]
        kk, vv = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, kk).masked_fill(~mask[:, None], float("-inf"))
        o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), vv).reshape(B, T, Hh * D)
        o = o @ p[pre + "self_attn.o_proj.weight"].T
        x = x + rms_norm(o, p[pre + "post_attention_layernorm.weight"], eps, False)
        h = rms_norm(x, p[pre + "pre_feedforward_layernorm.weight"], eps, False)
        m = act(a["act"], h @ p[pre + "mlp.gate_proj.weight"].T) * (h @ p[pre + "mlp.up_proj.weight"].T)
        m = m @ p[pre + "mlp.down_proj.weight"].T
        if a.get("experts"):
            m = rms_norm(m, p[pre + "post_feedforward_layernorm_1.weight"], eps, False) + gemma4_experts(a, p, pre, x)
        x = x + rms_norm(m, p[pre + "post_feedforward_layernorm.weight"], eps, False)
        if P:
            g = act(a["act"], x @ p[pre + "per_layer_input_gate.weight"].T) * ple[:, :, l]
            g = g @ p[pre + "per_layer_projection.weight"].T
            x = x + rms_norm(g, p[pre + "post_per_layer_input_norm.weight"], eps, False)
        x = x * p[pre + "layer_scalar"]
    x = rms_norm(x, p["model.norm.weight"], eps, False)
    logits = x @ p["model.embed_tokens.weight"].T
    cap = a["final_softcap"]
    return cap * torch.tanh(logits / cap) if cap else logits


def gemma4_experts(a, p, pre, x):
    """Gemma4TextRouter + Gemma4TextExperts beside the dense MLP, on the residual stream x: the router normalizes
    x without a weight, scales it by router.scale * C^-1/2, takes the top-k softmax probabilities, renormalizes
    them and multiplies each by its expert's per_expert_scale; the experts run on pre_feedforward_layernorm_2(x);
    their sum is normed by post_feedforward_layernorm_2."""
    eps, C = a["eps"], x.shape[-1]
    r = x.reshape(-1, C)
    routed = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * p[pre + "router.scale"] * C ** -0.5
    probs = torch.softmax(routed @ p[pre + "router.proj.weight"].T, -1)
    top, idx = torch.topk(probs, a["top_k"], -1)
    top = top / top.sum(-1, keepdim=True) * p[pre + "router.per_expert_scale"][idx]
    h = rms_norm(r, p[pre + "pre_feedforward_layernorm_2.weight"], eps, False)
    y = routed_experts(a, h, top, idx, p[pre + "experts.gate_up_proj"], p[pre + "experts.down_proj"]).reshape(x.shape)
    return rms_norm(y, p[pre + "post_feedforward_layernorm_2.weight"], eps, False)


def gemma4_fixture(arch):
    """Six layers (sliding, full, sliding, full, sliding, full; window 4), sliding heads of 16 and full heads of 32
    with one key/value head whose keys are also its values (attention_k_eq_v), proportional rope on a quarter of
    the full heads, the last two layers sharing the keys and values of layers 2 and 3 with double-wide MLPs,
    per-layer inputs of 8, final soft-capping."""
    L, P, D, GD = 6, 8, 16, 32
    types = ["sliding_attention", "full_attention"] * 3
    cfg = base_config("gemma4_text", "Gemma4ForCausalLM", L, head_dim=D, global_head_dim=GD,
                      num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=2,
                      use_double_wide_mlp=True, hidden_size_per_layer_input=P, vocab_size_per_layer_input=V,
                      hidden_activation="gelu_pytorch_tanh", sliding_window=WINDOW, layer_types=types,
                      final_logit_softcapping=3.0, tie_word_embeddings=True, rms_norm_eps=1e-6, pad_token_id=0,
                      attention_bias=False, enable_moe_block=False,
                      rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                       "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                          "rope_theta": 1000000.0}})
    full = [t == "full_attention" for t in types]
    a = arch(L, gemma=True, gemma4=True, tied=True, head_dim=D, act="gelu_pytorch_tanh", eps=1e-6, final_softcap=3.0,
             windows=[0 if f else WINDOW for f in full], ple=P,
             head_dims=[GD if f else D for f in full], kv_heads_per_layer=[1 if f else KV for f in full],
             k_eq_v=full, kv_source=[-1, -1, -1, -1, 2, 3], mlp_sizes=[I, I, I, I, 2 * I, 2 * I],
             inv_freqs=[proportional_inv_freq(1e6, 0.25, GD) if f else 1.0 / (10000.0 ** (
                 torch.arange(0, D, 2, dtype=torch.float64) / D)) for f in full])
    out = [("gemma4_text", cfg, a, {})]
    # The MoE block of 26B-A4B: four layers with experts beside the dense MLP (top-2 of 4 experts of 16), keys as
    # values on the full layers, no shared layers and no per-layer inputs.
    types = ["sliding_attention", "full_attention"] * 2
    full = [t == "full_attention" for t in types]
    cfg = base_config("gemma4_text", "Gemma4ForCausalLM", 4, head_dim=D, global_head_dim=GD,
                      num_global_key_value_heads=1, attention_k_eq_v=True, num_kv_shared_layers=0,
                      hidden_size_per_layer_input=0, hidden_activation="gelu_pytorch_tanh", sliding_window=WINDOW,
                      layer_types=types, final_logit_softcapping=3.0, tie_word_embeddings=True, rms_norm_eps=1e-6,
                      pad_token_id=0, attention_bias=False, enable_moe_block=True, num_experts=4, top_k_experts=2,
                      moe_intermediate_size=16, intermediate_size=24,
                      rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                       "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                          "rope_theta": 1000000.0}})
    a = arch(4, gemma=True, gemma4=True, tied=True, head_dim=D, act="gelu_pytorch_tanh", eps=1e-6, final_softcap=3.0,
             windows=[0 if f else WINDOW for f in full], ple=0, experts=4, top_k=2, expert_size=16,
             head_dims=[GD if f else D for f in full], kv_heads_per_layer=[1 if f else KV for f in full],
             k_eq_v=full, kv_source=[-1] * 4, mlp_sizes=[24] * 4,
             inv_freqs=[proportional_inv_freq(1e6, 0.25, GD) if f else 1.0 / (10000.0 ** (
                 torch.arange(0, D, 2, dtype=torch.float64) / D)) for f in full])
    out.append(("gemma4_moe", cfg, a, {}))
    return out


def gemma4_params(a, rnd):
    """Gemma 4's tensors: norms near 1 (plain weights), layer scalars near but not at 1. The q and k norms are near
    0.2: Gemma 4 does not scale scores by D^-1/2, and weights near 1 would peak the softmax so much that bf16
    rounding of q and k alone would move the logits by a quarter (trained checkpoints learn small ones)."""
    L, P, Hh = a["layers"], a["ple"], a["heads"]
    norm = lambda n: rnd(n, std=0.1) + 1.0  # noqa: E731
    p = {"model.embed_tokens.weight": rnd(V, C, std=0.25), "model.norm.weight": norm(C),
         }
    if P:
        p.update({"model.embed_tokens_per_layer.weight": rnd(V, L * P, std=0.2),
                  "model.per_layer_model_projection.weight": rnd(L * P, C, std=C ** -0.5),
                  "model.per_layer_projection_norm.weight": norm(P)})
    for l in range(L):
        pre = f"model.layers.{l}."
        D, KVl, Il = a["head_dims"][l], a["kv_heads_per_layer"][l], a["mlp_sizes"][l]
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            p[pre + n + ".weight"] = norm(C)
        # The per-layer input is normed after a projection from only P values: near 1, its rounding noise would
        # dominate what bf16 gives (the bf16 test's tolerance is the other fixtures').
        p[pre + "post_per_layer_input_norm.weight"] = norm(C) * 0.3
        p[pre + "self_attn.q_proj.weight"] = rnd(Hh * D, C, std=C ** -0.5)
        p[pre + "self_attn.q_norm.weight"] = norm(D) * 0.2
        if a["kv_source"][l] < 0:
            p[pre + "self_attn.k_proj.weight"] = rnd(KVl * D, C, std=C ** -0.5)
            p[pre + "self_attn.k_norm.weight"] = norm(D) * 0.2
            if not a["k_eq_v"][l]:
                p[pre + "self_attn.v_proj.weight"] = rnd(KVl * D, C, std=C ** -0.5)
        p[pre + "self_attn.o_proj.weight"] = rnd(C, Hh * D, std=(Hh * D) ** -0.5)
        p[pre + "mlp.gate_proj.weight"] = rnd(Il, C, std=C ** -0.5)
        p[pre + "mlp.up_proj.weight"] = rnd(Il, C, std=C ** -0.5)
        p[pre + "mlp.down_proj.weight"] = rnd(C, Il, std=Il ** -0.5)
        if P:
            p[pre + "per_layer_input_gate.weight"] = rnd(P, C, std=C ** -0.5)
            p[pre + "per_layer_projection.weight"] = rnd(C, P, std=P ** -0.5)
        else:
            del p[pre + "post_per_layer_input_norm.weight"]
        if a.get("experts"):
            E, EI = a["experts"], a["expert_size"]
            # A wide router with rows of different scales: every token's 2nd and 3rd probabilities at least 2.4%
            # apart, so that bf16 rounding cannot change a choice (rounded to f32, the stored dtype).
            scales = torch.linspace(1.0, 2.5, E)[:, None]
            p[pre + "router.proj.weight"] = (rnd(E, C, std=4.0) * scales).float().double()
            p[pre + "router.scale"] = norm(C)
            p[pre + "router.per_expert_scale"] = rnd(E, std=0.2) + 1.0
            p[pre + "experts.gate_up_proj"] = rnd(E, 2 * EI, C, std=C ** -0.5)
            p[pre + "experts.down_proj"] = rnd(E, C, EI, std=EI ** -0.5)
            for n in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"):
                p[pre + n + ".weight"] = norm(C)
        p[pre + "layer_scalar"] = rnd(1, std=0.1) + 1.0
    return p


def loss_fn(logits, targets):
    keep = targets != -100
    lp = torch.log_softmax(logits[keep], -1)
    return -lp.gather(-1, targets[keep][:, None].long()).mean()


# ---------------------------------------------------------------------------------------------------------------
# The fixtures: config.json as transformers writes it + the same architecture in the reference's terms
# ---------------------------------------------------------------------------------------------------------------
V, C, I, H, KV = 128, 32, 64, 4, 2
WINDOW = 4


def base_config(model_type, arch_name, layers, **extra):
    cfg = {"architectures": [arch_name], "model_type": model_type, "vocab_size": V, "hidden_size": C,
           "intermediate_size": I, "num_hidden_layers": layers, "num_attention_heads": H,
           "num_key_value_heads": KV, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
           "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    cfg.update(extra)
    return cfg


def fixtures():
    """(name, config.json dict, reference arch dict, options)."""
    out = []
    std_rope = {"theta": 10000.0}

    def arch(layers, **kw):
        a = {"layers": layers, "heads": H, "kv_heads": KV, "head_dim": C // H, "hidden": C, "eps": 1e-5,
             "gemma": False, "qk_norm": False, "qkv_bias": False, "tied": False, "act": "silu",
             "attn_softcap": 0.0, "final_softcap": 0.0, "windows": [0] * layers, "ropes": [std_rope] * layers}
        a.update(kw)
        a["attn_scale"] = a.get("attn_scale", a["head_dim"] ** -0.5)
        return a

    # Llama 2 style: old rope form (rope_theta, rope_scaling null), untied, silu.
    out.append(("llama", base_config("llama", "LlamaForCausalLM", 2, hidden_act="silu", rope_theta=10000.0,
                                     rope_scaling=None, tie_word_embeddings=False, attention_bias=False,
                                     mlp_bias=False), arch(2), {}))
    # Llama 3.2 style: llama3 rope scaling (old form with rope_type), tied embeddings, 3 layers.
    l3 = {"theta": 500000.0, "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max": 64}
    out.append(("llama3", base_config("llama", "LlamaForCausalLM", 3, hidden_act="silu", rope_theta=500000.0,
                                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 64},
                                      tie_word_embeddings=True, head_dim=16),
                arch(3, tied=True, head_dim=16, ropes=[l3] * 3), {}))
    # Mistral: sliding window on every layer; new rope form (rope_parameters); sharded checkpoint.
    out.append(("mistral", base_config("mistral", "MistralForCausalLM", 2, hidden_act="silu",
                                       sliding_window=WINDOW, tie_word_embeddings=False,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                arch(2, windows=[WINDOW] * 2, ropes=[{"theta": 1000000.0}] * 2), {"shards": 2}))
    # Qwen2.5: q/k/v biases, tied, sliding window on layers >= max_window_layers when enabled.
    out.append(("qwen2", base_config("qwen2", "Qwen2ForCausalLM", 2, hidden_act="silu", rope_theta=1000000.0,
                                     rope_scaling=None, tie_word_embeddings=True, use_sliding_window=True,
                                     sliding_window=WINDOW, max_window_layers=1),
                arch(2, qkv_bias=True, tied=True, windows=[0, WINDOW], ropes=[{"theta": 1000000.0}] * 2), {}))
    # Qwen3: explicit head_dim (heads * head_dim != hidden), q/k RMSNorm over head_dim; new rope form.
    out.append(("qwen3", base_config("qwen3", "Qwen3ForCausalLM", 2, hidden_act="silu", head_dim=16,
                                     tie_word_embeddings=False, attention_bias=False,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                arch(2, head_dim=16, qk_norm=True, ropes=[{"theta": 1000000.0}] * 2), {}))
    # Gemma 2: sandwich norms, (1+w) norms, sqrt(hidden) embedding scale, GeGLU-tanh, attention and final
    # soft-capping (small caps so that they bite), query_pre_attn_scalar, alternating sliding layers.
    out.append(("gemma2", base_config("gemma2", "Gemma2ForCausalLM", 3, head_dim=16,
                                      hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                                      attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                      sliding_window=WINDOW, rope_theta=10000.0, tie_word_embeddings=True,
                                      rms_norm_eps=1e-6, pad_token_id=0),
                arch(3, gemma=True, tied=True, head_dim=16, act="gelu_pytorch_tanh", attn_scale=24 ** -0.5,
                     attn_softcap=2.0, final_softcap=3.0, windows=[WINDOW, 0, WINDOW], eps=1e-6), {}))
    # Gemma 3 text: q/k norms with (1+w), sliding pattern (every 2nd layer global), local rope base for sliding
    # layers and linear-scaled global rope, in the new nested rope_parameters form.
    g3_global = {"theta": 100000.0, "type": "linear", "factor": 4.0}
    g3_local = {"theta": 10000.0}
    out.append(("gemma3_text", base_config("gemma3_text", "Gemma3ForCausalLM", 3, head_dim=16,
                                           hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=16,
                                           sliding_window=WINDOW, sliding_window_pattern=2,
                                           final_logit_softcapping=None, attn_logit_softcapping=None,
                                           tie_word_embeddings=True, rms_norm_eps=1e-6, pad_token_id=0,
                                           rope_parameters={
                                               "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                  "rope_theta": 100000.0},
                                               "sliding_attention": {"rope_type": "default",
                                                                     "rope_theta": 10000.0}}),
                arch(3, gemma=True, tied=True, head_dim=16, act="gelu_pytorch_tanh", qk_norm=True,
                     attn_scale=16 ** -0.5, windows=[WINDOW, 0, WINDOW], eps=1e-6,
                     ropes=[g3_local, g3_global, g3_local]), {}))
    out += rope_scaling_fixtures(arch)
    out += moe_fixtures(arch)
    out += gemma4_fixture(arch)
    out += qwen3_next_fixture(arch)
    return out


def moe_fixtures(arch):
    """Mixtral (every layer sparse, top-2 of 4, renormalized) and Qwen3-MoE (top-3 of 8 experts of 24, not
    renormalized; layer 1 dense through mlp_only_layers)."""
    out = []
    out.append(("mixtral", base_config("mixtral", "MixtralForCausalLM", 2, hidden_act="silu", rope_theta=1000000.0,
                                       num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                                       router_aux_loss_coef=0.02, output_router_logits=False,
                                       tie_word_embeddings=False),
                arch(2, ropes=[{"theta": 1000000.0}] * 2, moe_layers=[True, True], experts=4, top_k=2,
                     expert_size=I, norm_topk=True), {"per_expert": True}))
    out.append(("qwen3_moe", base_config("qwen3_moe", "Qwen3MoeForCausalLM", 3, hidden_act="silu", head_dim=16,
                                         num_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
                                         norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
                                         router_aux_loss_coef=0.001, tie_word_embeddings=False,
                                         attention_bias=False,
                                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                arch(3, head_dim=16, qk_norm=True, ropes=[{"theta": 1000000.0}] * 3,
                     moe_layers=[True, False, True], experts=8, top_k=3, expert_size=24, norm_topk=False), {}))
    return out


def per_expert_layout(weights):
    """transformers 4's per-expert Mixtral names (block_sparse_moe.experts.E.w1/w2/w3) for the stacked experts."""
    out = {}
    for name, t in weights.items():
        if ".mlp.experts." not in name and not name.endswith(".mlp.gate.weight"):
            out[name] = t
            continue
        layer = name[:name.index(".mlp.") + 1]
        block = layer + "block_sparse_moe."
        if name.endswith(".mlp.gate.weight"):
            out[block + "gate.weight"] = t
        elif name.endswith("gate_up_proj"):
            EI = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[block + f"experts.{e}.w1.weight"] = t[e, :EI].clone()
                out[block + f"experts.{e}.w3.weight"] = t[e, EI:].clone()
        else:
            for e in range(t.shape[0]):
                out[block + f"experts.{e}.w2.weight"] = t[e].clone()
    return out


ORIGINAL = 8  # the rope-scaling fixtures' original context: the batch (T = 11) goes past it, the packed row not
PROMPT = 6    # cache timeline of the "generate.*" outputs: a prompt of 6, then one token per call


def rope_scaling_fixtures(arch):
    """yarn, longrope and dynamic rope scaling, each past its original length (extra outputs: see rope_outputs)."""
    out = []
    # YaRN (DeepSeek-style mscale / mscale_all_dim attention factor), head_dim 16; betas below 1 and
    # truncate false put the ramp's ends between dimensions 2 and 5.
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL, "beta_fast": 0.05,
            "beta_slow": 0.01, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False}
    yarn_ref = {"theta": 10000.0, "type": "yarn", "factor": 4.0, "original_max": ORIGINAL, "beta_fast": 0.05,
                "beta_slow": 0.01, "mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False}
    out.append(("llama_yarn", base_config("llama", "LlamaForCausalLM", 2, hidden_act="silu", rope_theta=10000.0,
                                          max_position_embeddings=4 * ORIGINAL, rope_scaling=yarn, head_dim=16,
                                          tie_word_embeddings=False),
                arch(2, head_dim=16, ropes=[yarn_ref] * 2), {"rope_outputs": True}))
    # LongRoPE (Phi-3 style: no factor, so the attention factor comes from max_position_embeddings / original),
    # in the new rope_parameters form on qwen2.
    short, long = [1.0, 1.1, 1.3, 1.7], [1.0, 1.9, 3.5, 6.0]
    longrope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long,
                "original_max_position_embeddings": ORIGINAL}
    longrope_ref = {"theta": 10000.0, "type": "longrope", "short_factor": short, "long_factor": long,
                    "original_max": ORIGINAL, "max_pos": 4 * ORIGINAL}
    out.append(("qwen2_longrope", base_config("qwen2", "Qwen2ForCausalLM", 2, hidden_act="silu",
                                              max_position_embeddings=4 * ORIGINAL, rope_parameters=longrope,
                                              tie_word_embeddings=True, use_sliding_window=False),
                arch(2, qkv_bias=True, tied=True, ropes=[longrope_ref] * 2), {"rope_outputs": True}))
    # Dynamic NTK (legacy key "type"): scales past max_position_embeddings itself.
    dynamic_ref = {"theta": 10000.0, "type": "dynamic", "factor": 3.0, "max_pos": ORIGINAL}
    out.append(("llama_dynamic", base_config("llama", "LlamaForCausalLM", 2, hidden_act="silu", rope_theta=10000.0,
                                             max_position_embeddings=ORIGINAL,
                                             rope_scaling={"type": "dynamic", "factor": 3.0},
                                             tie_word_embeddings=False),
                arch(2, ropes=[dynamic_ref] * 2), {"rope_outputs": True}))
    return out


def rope_outputs(a, p, ids, positions, doc_ids):
    """Length-dependent rope checks: "short.logits" is the packed row 1 alone (largest position 4, within the
    original length: longrope's short factors, dynamic unscaled); "generate.logits" is row 0 on the KV-cache
    timeline of transformers' generate (prompt of PROMPT tokens in one call, then one token per call; each key
    keeps the rotation of its call)."""
    with torch.no_grad():
        short = forward({"arch": a}, p, ids[1:].long(), positions[1:], doc_ids[1:])
        T = ids.shape[1]
        seq_len = torch.tensor([[PROMPT if t < PROMPT else t + 1 for t in range(T)]])
        gen = forward({"arch": a}, p, ids[:1].long(), positions[:1], doc_ids[:1], token_seq_len=seq_len)
    return {"short.logits": short.float(), "generate.logits": gen.float(),
            "generate.prompt_len": torch.tensor([PROMPT], dtype=torch.int32)}


def make_params(a, gen):
    """HF tensor names -> float64 tensors (values rounded through float32, the stored dtype)."""
    D, L = a["head_dim"], a["layers"]

    def rnd(*shape, std):
        return (torch.randn(*shape, generator=gen) * std).float().double()

    def norm(n):  # weights near 1 (or near 0 for Gemma's (1 + w)) but not exactly, so mistakes show
        return rnd(n, std=0.1) + (0.0 if a["gemma"] else 1.0)

    if a.get("gemma4"):
        return gemma4_params(a, rnd)
    if a.get("qwen3_next"):
        return qwen3_next_params(a, rnd)

    p = {"model.embed_tokens.weight": rnd(V, C, std=0.25 if a["tied"] else 1.0), "model.norm.weight": norm(C)}
    if not a["tied"]:
        p["lm_head.weight"] = rnd(V, C, std=C ** -0.5)
    for l in range(L):
        pre = f"model.layers.{l}."
        p[pre + "input_layernorm.weight"] = norm(C)
        p[pre + "post_attention_layernorm.weight"] = norm(C)
        if a["gemma"]:
            p[pre + "pre_feedforward_layernorm.weight"] = norm(C)
            p[pre + "post_feedforward_layernorm.weight"] = norm(C)
        for name, out_dim in (("q_proj", H * D), ("k_proj", KV * D), ("v_proj", KV * D)):
            p[pre + f"self_attn.{name}.weight"] = rnd(out_dim, C, std=C ** -0.5)
            if a["qkv_bias"]:
                p[pre + f"self_attn.{name}.bias"] = rnd(out_dim, std=0.3)
        p[pre + "self_attn.o_proj.weight"] = rnd(C, H * D, std=(H * D) ** -0.5)
        if a["qk_norm"]:
            p[pre + "self_attn.q_norm.weight"] = norm(D)
            p[pre + "self_attn.k_norm.weight"] = norm(D)
        if a.get("moe_layers", [False] * L)[l]:
            E, EI = a["experts"], a["expert_size"]
            # A wide router: well-separated probabilities, so that the top-k choice is not a near tie.
            p[pre + "mlp.gate.weight"] = rnd(E, C, std=3 * C ** -0.5)
            p[pre + "mlp.experts.gate_up_proj"] = rnd(E, 2 * EI, C, std=C ** -0.5)
            p[pre + "mlp.experts.down_proj"] = rnd(E, C, EI, std=EI ** -0.5)
            continue
        p[pre + "mlp.gate_proj.weight"] = rnd(I, C, std=C ** -0.5)
        p[pre + "mlp.up_proj.weight"] = rnd(I, C, std=C ** -0.5)
        p[pre + "mlp.down_proj.weight"] = rnd(C, I, std=I ** -0.5)
    return p


def make_batch(gen):
    T = 11
    ids = torch.randint(0, V, (2, T), generator=gen, dtype=torch.int32)
    docs = [[0] * T, [0] * 4 + [1] * 5 + [2] * 2]
    doc_ids = torch.tensor(docs, dtype=torch.int32)
    positions = []
    for row in docs:
        pos, prev, n = [], None, 0
        for d in row:
            n = 0 if d != prev else n + 1
            prev = d
            pos.append(n)
        positions.append(pos)
    positions = torch.tensor(positions, dtype=torch.int32)
    targets = torch.randint(0, V, (2, T), generator=gen, dtype=torch.int32)
    targets[0, 3] = -100
    targets[1, 3] = -100  # last token of document 0 in the packed row
    targets[1, 8] = -100
    targets[1, 10] = -100
    return ids, positions, doc_ids, targets


def grad_names(a):
    L = a["layers"]
    if a.get("gemma4") and a.get("experts"):  # the router's three parts, both expert tensors, the norms around
        return ["model.embed_tokens.weight", "model.layers.0.router.proj.weight", "model.layers.0.router.scale",
                "model.layers.1.router.per_expert_scale", "model.layers.0.experts.gate_up_proj",
                "model.layers.3.experts.down_proj", "model.layers.2.pre_feedforward_layernorm_2.weight",
                "model.layers.1.post_feedforward_layernorm_1.weight", "model.layers.3.mlp.down_proj.weight",
                "model.layers.1.self_attn.k_proj.weight"]
    if a.get("gemma4"):  # the embedding (tied), a full layer's k_eq_v keys, a shared layer's MLP, the PLE weights
        return ["model.embed_tokens.weight", "model.layers.1.self_attn.k_proj.weight",
                "model.layers.2.self_attn.v_proj.weight", "model.layers.5.mlp.down_proj.weight",
                "model.layers.5.self_attn.q_proj.weight", "model.embed_tokens_per_layer.weight",
                "model.per_layer_model_projection.weight", "model.layers.3.per_layer_input_gate.weight",
                "model.layers.4.post_per_layer_input_norm.weight", "model.per_layer_projection_norm.weight",
                "model.layers.1.self_attn.k_norm.weight", "model.norm.weight"]
    if a.get("split"):  # Qwen3.5-MoE: the four input projections, the convolution, the attention layer's q_proj
        la = "model.layers.0.linear_attn."
        return ["model.embed_tokens.weight", la + "in_proj_qkv.weight", la + "in_proj_z.weight",
                la + "in_proj_b.weight", la + "in_proj_a.weight", la + "conv1d.weight", la + "A_log",
                "model.layers.3.linear_attn.out_proj.weight", "model.layers.2.self_attn.q_proj.weight",
                "model.layers.1.mlp.shared_expert.up_proj.weight", "model.layers.0.mlp.gate.weight",
                "model.norm.weight"]
    if a.get("qwen3_next"):  # every DeltaNet tensor, the gated q_proj, the shared expert and its gate, a router
        la = "model.layers.0.linear_attn."
        return ["model.embed_tokens.weight", la + "in_proj_qkvz.weight", la + "in_proj_ba.weight",
                la + "conv1d.weight", la + "dt_bias", la + "A_log", la + "norm.weight", la + "out_proj.weight",
                "model.layers.2.linear_attn.in_proj_qkvz.weight", "model.layers.1.self_attn.q_proj.weight",
                "model.layers.1.self_attn.q_norm.weight", "model.layers.3.mlp.shared_expert.down_proj.weight",
                "model.layers.0.mlp.shared_expert_gate.weight", "model.layers.0.mlp.gate.weight",
                "model.layers.2.mlp.up_proj.weight", "model.norm.weight"]
    last_mlp = (f"model.layers.{L - 1}.mlp.experts.down_proj" if a.get("moe_layers", [False] * L)[L - 1]
                else f"model.layers.{L - 1}.mlp.down_proj.weight")
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", last_mlp, "model.norm.weight"]
    if a.get("moe_layers", [False] * L)[0]:
        names += ["model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj"]
    if a["qkv_bias"]:
        names.append("model.layers.0.self_attn.k_proj.bias")
    if a["qk_norm"]:
        names.append("model.layers.0.self_attn.k_norm.weight")
    if a["gemma"]:
        names.append(f"model.layers.{L - 1}.post_feedforward_layernorm.weight")
    return names


def write_fixture(root, name, cfg, a, opts, seed):
    gen = torch.Generator().manual_seed(seed)
    p = make_params(a, gen)
    ids, positions, doc_ids, targets = make_batch(gen)
    wanted = grad_names(a)
    for n in wanted:
        p[n].requires_grad_(True)
    router_logits = []
    logits = forward({"arch": a}, p, ids.long(), positions, doc_ids, router_logits=router_logits)
    loss = loss_fn(logits, targets)
    loss.backward(retain_graph=bool(router_logits))
    aux = {}
    if router_logits:
        router = "model.layers.0.mlp.gate.weight"
        kept = p[router].grad.clone()
        p[router].grad = None
        aux_loss = load_balancing_loss(router_logits, a["experts"], a["top_k"])
        aux_loss.backward(inputs=[p[router]])
        aux = {"aux_loss": aux_loss.detach().reshape(1).float(), "grad_aux." + router: p[router].grad.float()}
        p[router].grad = kept

    d = os.path.join(root, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    weights = {k: v.detach().float() for k, v in p.items()}
    if opts.get("per_expert"):
        weights = per_expert_layout(weights)
    shards = opts.get("shards", 1)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), weights, {"format": "pt"})
    else:
        names = sorted(weights)
        weight_map, total = {}, 0
        for s in range(shards):
            part = names[s::shards]
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(os.path.join(d, fname), {k: weights[k] for k in part}, {"format": "pt"})
            for k in part:
                weight_map[k] = fname
                total += weights[k].numel() * 4
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
            f.write("\n")
    # What `lmtune eval` computes for row 0 as one text sample: mean next-token cross-entropy (no extra RNG draws,
    # so the other outputs are unchanged).
    eval_loss = loss_fn(logits[:1, :-1], ids[:1, 1:].clone())
    ref = {"ids": ids, "positions": positions, "doc_ids": doc_ids, "targets": targets,
           "logits": logits.detach().float(), "loss": loss.detach().reshape(1).float()}
    for n in wanted:
        ref["grad." + n] = p[n].grad.float()
    if opts.get("rope_outputs"):
        ref.update(rope_outputs(a, p, ids, positions, doc_ids))
    ref.update(aux)
    write_safetensors(os.path.join(d, "reference.safetensors"), ref,
                      {"loss_f64": repr(loss.item()), "eval_loss_row0_f64": repr(eval_loss.item()),
                       "generator": "scripts/reference_models.py"})
    print(f"{name:12s} loss {loss.item():.6f}  |logits| max {logits.abs().max().item():.3f}  grads {len(wanted)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "models", "fixtures"))
    ap.add_argument("--only", nargs="*", help="write only these fixtures (the others keep their files)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for seed, (name, cfg, a, opts) in enumerate(fixtures()):
        if not args.only or name in args.only:
            write_fixture(args.out, name, cfg, a, opts, 1234 + seed)


if __name__ == "__main__":
    main()
