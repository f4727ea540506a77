#!/usr/bin/env python3
"""Reference HF -> GGUF converter for the tests: writes what llama.cpp's convert_hf_to_gguf.py writes for a small
llama / mistral / qwen2 / qwen3 / gemma2 / gemma3 checkpoint, with its own minimal GGUF writer (numpy only), so that
lmtune's GGUF reader, name mapping and tokenizer rebuilding are checked against an independent implementation of the
converter's published rules (standard library only):
  - names token_embd / blk.N.{attn_norm, attn_q, ...} / output_norm / output (output omitted when tied);
  - q/k rows permuted per head (LlamaModel.permute) for the llama architecture;
  - Gemma norm weights stored as w + 1;
  - llama3 rope scaling as the rope_freqs.weight tensor (LlamaModel.generate_extra_tensors);
  - 1-D tensors in F32, matrices in the requested type (f32 | f16 | q8_0, ggml's reference quantize_row_q8_0);
  - tokenizer.ggml.*: byte-level tokenizers as model "gpt2" with merges and the pre-tokenizer named by its regex;
    SentencePiece-style ones (byte_fallback BPE) as model "llama" with scores (a piece made by the k-th merge scores
    -k, as SentencePiece's BPE pieces are ordered) and token types.
Usage: hf_to_gguf.py MODEL_DIR OUT.gguf [f32|f16|q8_0]
"""
import json
import math
import os
import struct
import sys

LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
            "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
        "gemma3_text": "gemma3"}

# ---- minimal GGUF writer ------------------------------------------------------------------------------------------
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9


def gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == T_U32: return struct.pack("<I", v)
    if t == T_I32: return struct.pack("<i", v)
    if t == T_F32: return struct.pack("<f", v)
    if t == T_BOOL: return struct.pack("<B", 1 if v else 0)
    if t == T_STR: return gguf_str(v)
    et, items = v
    return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, x) for x in items)


def write_gguf(path, kvs, tensors, align=32):
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for key, t, v in kvs:
        out += gguf_str(key) + struct.pack("<I", t) + gguf_value(t, v)
    offset, blobs = 0, []
    for name, ggml_type, dims, data in tensors:
        out += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
        blobs.append((offset, data))
        offset += len(data) + (-len(data) % align)
    out += b"\0" * (-len(out) % align)
    for i, (off, data) in enumerate(blobs):
        out += data
        if i + 1 < len(blobs): out += b"\0" * (-len(data) % align)
    with open(path, "wb") as f:
        f.write(out)


# ---- checkpoint (a tensor is (shape, flat list of floats)) --------------------------------------------------------
def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__": continue
        b, e = info["data_offsets"]
        raw = data[b:e]
        if info["dtype"] == "F32": v = list(struct.unpack("<%df" % (len(raw) // 4), raw))
        elif info["dtype"] == "F16": v = list(struct.unpack("<%de" % (len(raw) // 2), raw))
        elif info["dtype"] == "BF16":
            u = struct.unpack("<%dH" % (len(raw) // 2), raw)
            v = list(struct.unpack("<%df" % len(u), struct.pack("<%dI" % len(u), *[x << 16 for x in u])))
        else: raise SystemExit(f"unsupported dtype {info['dtype']} in {name}")
        out[name] = (info["shape"], v)
    return out


def permute(w, n_head, n_head_kv):  # convert_hf_to_gguf.py LlamaModel.permute, on rows
    shape, v = w
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    rows = shape[0]
    cols = len(v) // rows
    half = rows // n_head // 2
    out = [0.0] * len(v)
    for h in range(n_head):
        for j in range(2):
            for k in range(half):
                src = h * 2 * half + j * half + k  # reshape(n_head, 2, half) ...
                dst = h * 2 * half + k * 2 + j     # ... .swapaxes(1, 2)
                out[dst * cols:(dst + 1) * cols] = v[src * cols:(src + 1) * cols]
    return (shape, out)


def roundf(x):  # C's roundf: half away from zero
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def quantize_q8_0(v):  # ggml's quantize_row_q8_0_ref
    out = bytearray()
    for b in range(0, len(v), 32):
        block = [struct.unpack("<f", struct.pack("<f", x))[0] for x in v[b:b + 32]]
        amax = max(abs(x) for x in block)
        d = struct.unpack("<f", struct.pack("<f", amax / 127.0))[0]
        inv = struct.unpack("<f", struct.pack("<f", 1.0 / d))[0] if d else 0.0
        out += struct.pack("<e", d)
        out += struct.pack("<32b", *[roundf(struct.unpack("<f", struct.pack("<f", x * inv))[0]) for x in block])
    return bytes(out)


def tensor_entry(name, w, kind):
    shape, v = w
    dims = list(reversed(shape))
    if len(shape) == 1 or kind == "f32": return (name, 0, dims, struct.pack("<%df" % len(v), *v))
    if kind == "q8_0" and shape[-1] % 32 == 0: return (name, 8, dims, quantize_q8_0(v))
    return (name, 1, dims, struct.pack("<%de" % len(v), *v))  # f16 (also q8_0's fallback for rows it cannot quantize)


HF_TO_GGUF = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "pre_feedforward_layernorm": "ffn_norm",
              "post_feedforward_layernorm": "post_ffw_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def convert_tensors(cfg, weights, arch, kind):
    gemma = arch.startswith("gemma")
    out = []
    for name, w in weights.items():
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings", gemma): continue
        if name.endswith("norm.weight") and gemma: w = (w[0], [x + 1 for x in w[1]])
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = permute(w, cfg["num_attention_heads"], cfg["num_attention_heads"])
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = permute(w, cfg["num_attention_heads"], cfg.get("num_key_value_heads"))
        if name == "model.embed_tokens.weight": gname = "token_embd.weight"
        elif name == "model.norm.weight": gname = "output_norm.weight"
        elif name == "lm_head.weight": gname = "output.weight"
        else:
            parts = name.split(".")  # model.layers.N.<module>.<weight|bias>
            module = ".".join(parts[3:-1])
            if module == "post_attention_layernorm":
                mapped = "post_attention_norm" if gemma else "ffn_norm"
            else:
                mapped = HF_TO_GGUF[module]
            gname = f"blk.{parts[2]}.{mapped}.{parts[-1]}"
        out.append(tensor_entry(gname, w, kind))
    rope = cfg.get("rope_scaling") or {}
    if arch == "llama" and rope.get("rope_type", rope.get("type")) == "llama3":
        factors = llama3_factors(cfg)
        out.append(("rope_freqs.weight", 0, [len(factors)], struct.pack("<%df" % len(factors), *factors)))
    return out


def llama3_factors(cfg):  # LlamaModel.generate_extra_tensors
    rope = cfg["rope_scaling"]
    base = cfg.get("rope_theta", 10000.0)
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
    freqs = [f32(1.0 / f32(base ** f32(i / dim))) for i in range(0, dim, 2)]
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high: out.append(1.0)
        elif wavelen > old / low: out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


# ---- metadata -----------------------------------------------------------------------------------------------------
def model_kvs(cfg, arch, kind):
    a = arch + "."
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    kv = [("general.architecture", T_STR, arch), ("general.type", T_STR, "model"), ("general.name", T_STR, "tiny"),
          (a + "block_count", T_U32, cfg["num_hidden_layers"]),
          (a + "context_length", T_U32, cfg["max_position_embeddings"]),
          (a + "embedding_length", T_U32, cfg["hidden_size"]),
          (a + "feed_forward_length", T_U32, cfg["intermediate_size"]),
          (a + "attention.head_count", T_U32, heads),
          (a + "attention.head_count_kv", T_U32, cfg.get("num_key_value_heads", heads)),
          (a + "rope.freq_base", T_F32, cfg.get("rope_theta", 10000.0)),
          (a + "attention.layer_norm_rms_epsilon", T_F32, cfg.get("rms_norm_eps", 1e-6)),
          ("general.file_type", T_U32, {"f32": 0, "f16": 1, "q8_0": 7}[kind])]
    if "head_dim" in cfg:
        kv += [(a + "attention.key_length", T_U32, head_dim), (a + "attention.value_length", T_U32, head_dim)]
    if arch == "llama":
        kv += [(a + "vocab_size", T_U32, cfg["vocab_size"]), (a + "rope.dimension_count", T_U32, head_dim)]
    rope = cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type")) == "linear":
        kv += [(a + "rope.scaling.type", T_STR, "linear"), (a + "rope.scaling.factor", T_F32, rope["factor"])]
    if arch == "gemma2":
        kv += [(a + "attn_logit_softcapping", T_F32, cfg.get("attn_logit_softcapping") or 0.0),
               (a + "final_logit_softcapping", T_F32, cfg.get("final_logit_softcapping") or 0.0)]
    if arch in ("gemma2", "gemma3") and cfg.get("sliding_window"):
        kv.append((a + "attention.sliding_window", T_U32, cfg["sliding_window"]))
    return kv


def tokenizer_kvs(model_dir, cfg):
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    tcfg_path = os.path.join(model_dir, "tokenizer_config.json")
    tcfg = json.load(open(tcfg_path, encoding="utf-8")) if os.path.exists(tcfg_path) else {}
    model = tok["model"]
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    n = max(list(model["vocab"].values()) + list(added)) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [1] * n
    for t, i in model["vocab"].items(): tokens[i] = t
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = 3 if t["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    kv = []
    if model.get("byte_fallback"):
        for i, t in enumerate(tokens):
            if len(t) == 6 and t.startswith("<0x") and t.endswith(">") and types[i] == 1: types[i] = 6
        if model.get("unk_token") in model["vocab"]: types[model["vocab"][model["unk_token"]]] = 2
        scores = [-1e9] * n
        for i, t in enumerate(tokens):
            if types[i] == 1 and len(t) == 1: scores[i] = 0.0
        for rank, m in enumerate(merges):
            piece = m.replace(" ", "", 1)
            if piece in model["vocab"] and scores[model["vocab"][piece]] == -1e9:
                scores[model["vocab"][piece]] = -float(rank + 1)
        prefix = "Prepend" in json.dumps(tok.get("normalizer"))
        kv += [("tokenizer.ggml.model", T_STR, "llama"), ("tokenizer.ggml.pre", T_STR, "default"),
               ("tokenizer.ggml.tokens", T_ARR, (T_STR, tokens)), ("tokenizer.ggml.scores", T_ARR, (T_F32, scores)),
               ("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
               ("tokenizer.ggml.add_space_prefix", T_BOOL, prefix)]
    else:
        text = json.dumps(tok.get("pre_tokenizer"))
        pre = "llama-bpe" if json.dumps(LLAMA3_RE)[1:-1] in text else "qwen2" if json.dumps(QWEN2_RE)[1:-1] in text \
            else "default"
        kv += [("tokenizer.ggml.model", T_STR, "gpt2"), ("tokenizer.ggml.pre", T_STR, pre),
               ("tokenizer.ggml.tokens", T_ARR, (T_STR, tokens)),
               ("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
               ("tokenizer.ggml.merges", T_ARR, (T_STR, merges))]

    def token_of(key):
        v = tcfg.get(key)
        v = v["content"] if isinstance(v, dict) else v
        ids = [i for i, t in enumerate(tokens) if t == v] if v else []
        return ids[0] if ids else None
    for key, gkey in (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"), ("unk_token", "unknown")):
        i = token_of(key)
        if i is None and key != "unk_token" and cfg.get(key + "_id") is not None:
            i = cfg[key + "_id"] if isinstance(cfg[key + "_id"], int) else cfg[key + "_id"][0]
        if i is not None: kv.append((f"tokenizer.ggml.{gkey}_token_id", T_U32, i))
    add_bos = tcfg.get("add_bos_token")
    if add_bos is None:
        add_bos = "TemplateProcessing" in json.dumps(tok.get("post_processor")) and "bos" in json.dumps(
            tok.get("post_processor")).lower() or "<s>" in json.dumps(tok.get("post_processor"))
    kv.append(("tokenizer.ggml.add_bos_token", T_BOOL, bool(add_bos)))
    template = tcfg.get("chat_template")
    jinja = os.path.join(model_dir, "chat_template.jinja")
    if os.path.exists(jinja): template = open(jinja, encoding="utf-8").read()
    if isinstance(template, str): kv.append(("tokenizer.chat_template", T_STR, template))
    return kv


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) > 3 else "f32"
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    arch = ARCH[cfg["model_type"]]
    weights = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    kvs = model_kvs(cfg, arch, kind) + tokenizer_kvs(model_dir, cfg)
    write_gguf(out, kvs, convert_tensors(cfg, weights, arch, kind))


if __name__ == "__main__":
    main()
