#!/usr/bin/python3
"""PyTorch LoRA training throughput without transformers or PEFT: the CPU baseline for `lmtune bench train`
where only torch is installed (Debian's python3-torch 1.13 on the development machine).

The model is scripts/reference_models.py's independent decoder (the oracle of lmtune's parity tests; llama,
mistral, qwen2, qwen3 configs), here in f32 (or bf16) instead of f64; LoRA is hand-written (A kaiming-uniform,
B zero, f32, scale alpha / r, as PEFT), the optimizer torch.optim.AdamW with lmtune's defaults (betas 0.9/0.999,
eps 1e-8, weight decay 0), global-norm clipping at 1.0, loss = mean next-token cross-entropy over B x (T - 1).
Same arguments and JSON fields as bench/peft_baseline.py ("tool": "torch-reference"), with these defaults:
--precision f32, --grad-checkpointing off (the only setting: the reference forward is one function).
Attention materializes the [B, H, T, T] scores, as the reference does: this is a small-model baseline.

  /usr/bin/python3 bench/torch_cpu_baseline.py --model DIR --seq 256 --batch 4 --steps 10 --json
"""
import glob
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import bench_common as bc  # noqa: E402


def arch_from_config(cfg):
    """The reference's architecture dict (reference_models.fixtures() documents the keys) from config.json."""
    kind = cfg.get("model_type")
    if kind not in ("llama", "mistral", "qwen2", "qwen3"):
        bc.fail(f"torch_cpu_baseline.py: model_type {kind!r} is not supported (llama, mistral, qwen2, qwen3)")
    if cfg.get("attention_bias") and kind != "qwen2" or cfg.get("mlp_bias"):
        bc.fail("torch_cpu_baseline.py: o_proj / MLP biases are not supported")
    layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    rope = {"theta": float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "llama3":
        rope.update(type="llama3", factor=scaling["factor"], low_freq_factor=scaling["low_freq_factor"],
                    high_freq_factor=scaling["high_freq_factor"],
                    original_max=scaling["original_max_position_embeddings"])
    elif rope_type == "linear":
        rope.update(type="linear", factor=scaling["factor"])
    elif rope_type != "default":
        bc.fail(f"torch_cpu_baseline.py: rope type {rope_type!r} is not supported")
    window = cfg.get("sliding_window") or 0
    if kind == "mistral":
        windows = [window] * layers
    elif kind in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        windows = [window if l >= cfg.get("max_window_layers", layers) else 0 for l in range(layers)]
    else:
        windows = [0] * layers
    return {"layers": layers, "heads": heads, "kv_heads": cfg.get("num_key_value_heads") or heads,
            "head_dim": head_dim, "hidden": cfg["hidden_size"], "eps": cfg.get("rms_norm_eps", 1e-6),
            "gemma": False, "qk_norm": kind == "qwen3", "qkv_bias": kind == "qwen2" or bool(cfg.get("attention_bias")),
            "tied": bool(cfg.get("tie_word_embeddings", False)), "act": cfg.get("hidden_act", "silu"),
            "attn_softcap": 0.0, "final_softcap": 0.0, "windows": windows, "ropes": [rope] * layers,
            "attn_scale": head_dim ** -0.5}


def load_weights(torch, model_dir, cfg, arch):
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if files:
        p = {}
        for f in files:
            p.update({k: bc.to_tensor(torch, v).float() for k, v in bc.read_safetensors(f).items()})
        return p, "loaded"
    # Random weights from the config's shapes, N(0, initializer_range) and unit norms, as HF's init.
    std, C, I, V = cfg.get("initializer_range", 0.02), cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV, D = arch["heads"], arch["kv_heads"], arch["head_dim"]
    shapes = {"model.embed_tokens.weight": (V, C)}
    if not arch["tied"]:
        shapes["lm_head.weight"] = (V, C)
    for l in range(arch["layers"]):
        pre = f"model.layers.{l}."
        shapes.update({pre + "self_attn.q_proj.weight": (H * D, C), pre + "self_attn.k_proj.weight": (KV * D, C),
                       pre + "self_attn.v_proj.weight": (KV * D, C), pre + "self_attn.o_proj.weight": (C, H * D),
                       pre + "mlp.gate_proj.weight": (I, C), pre + "mlp.up_proj.weight": (I, C),
                       pre + "mlp.down_proj.weight": (C, I)})
    p = {k: torch.randn(*s) * std for k, s in shapes.items()}
    for l in range(arch["layers"]):
        pre = f"model.layers.{l}."
        p[pre + "input_layernorm.weight"] = torch.ones(C)
        p[pre + "post_attention_layernorm.weight"] = torch.ones(C)
        if arch["qkv_bias"]:
            for n, out in (("q_proj", H * D), ("k_proj", KV * D), ("v_proj", KV * D)):
                p[pre + f"self_attn.{n}.bias"] = torch.zeros(out)
        if arch["qk_norm"]:
            p[pre + "self_attn.q_norm.weight"] = torch.ones(D)
            p[pre + "self_attn.k_norm.weight"] = torch.ones(D)
    p["model.norm.weight"] = torch.ones(C)
    return p, "random (no *.safetensors)"


def lora_modules(arch, kinds):
    out = []
    for l in range(arch["layers"]):
        for k in kinds:
            out.append(f"model.layers.{l}.{'mlp' if k in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{k}")
    return out


def make_lora(torch, a, p, arch):
    """module -> [A, B] f32 leaves; fresh (PEFT's init) or from --init-adapter (a PEFT adapter directory)."""
    lora = {}
    if a.init_adapter:
        conf = json.load(open(os.path.join(a.init_adapter, "adapter_config.json")))
        if conf.get("use_rslora"):
            bc.fail("torch_cpu_baseline.py: rsLoRA adapters are not supported")
        a.rank, a.alpha = int(conf["r"]), float(conf["lora_alpha"])
        st = bc.read_safetensors(os.path.join(a.init_adapter, "adapter_model.safetensors"))
        for key, entry in st.items():
            module, part = key.replace("base_model.model.", "", 1).rsplit(".", 2)[0:2]
            lora.setdefault(module, [None, None])[0 if part == "lora_A" else 1] = bc.to_tensor(torch, entry).float()
        for m, (A, B) in lora.items():
            if A is None or B is None or m + ".weight" not in p:
                bc.fail(f"--init-adapter {a.init_adapter}: incomplete or unknown module {m}")
    else:
        for m in lora_modules(arch, a.target_kinds):
            out_f, in_f = p[m + ".weight"].shape
            A = torch.empty(a.rank, in_f)
            torch.nn.init.kaiming_uniform_(A, a=math.sqrt(5))  # PEFT's (and nn.Linear's) init
            lora[m] = [A, torch.zeros(out_f, a.rank)]
    for pair in lora.values():
        for t in pair:
            t.requires_grad_(True)
    return lora


def main():
    ap = bc.parser(__doc__.splitlines()[0])
    ap.set_defaults(precision="f32", grad_checkpointing="off")
    a = ap.parse_args()
    bc.check_args(a)
    if a.grad_checkpointing == "on":
        bc.fail("torch_cpu_baseline.py: --grad-checkpointing on is not supported (the reference forward is one "
                "function); use off")
    try:
        import torch
        import reference_models as rm
    except ImportError as e:
        bc.fail(f"torch_cpu_baseline.py needs torch ({e}); Debian: apt-get install python3-torch")
    torch.set_default_dtype(torch.float32)  # reference_models sets float64 for its fixtures
    if a.device not in ("auto", "cpu"):
        bc.fail("torch_cpu_baseline.py runs on the CPU only (--device cpu)")
    torch.set_num_threads(a.threads if a.threads > 0 else os.cpu_count())
    torch.manual_seed(a.seed)
    device = torch.device("cpu")
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32

    cfg = json.load(open(os.path.join(a.model, "config.json")))
    arch = arch_from_config(cfg)
    p, weights = load_weights(torch, a.model, cfg, arch)
    base_params = sum(t.numel() for t in p.values())
    p = {k: v.to(dtype) for k, v in p.items()}
    lora = make_lora(torch, a, p, arch)
    p["lora_scale"] = a.alpha / a.rank
    trainable = [t for pair in lora.values() for t in pair]
    n_trainable = sum(t.numel() for t in trainable)
    optimizer = torch.optim.AdamW(trainable, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    batches = bc.token_batches(torch, a, cfg["vocab_size"])
    spec = {"arch": arch}
    bc.log(f"torch-reference: {cfg['model_type']} on cpu ({torch.get_num_threads()} threads), {a.precision}, "
           f"weights {weights}, batch {a.batch} x seq {a.seq}, rank {a.rank}, {n_trainable} trainable")

    def step(ids, phases):
        B, T = ids.shape
        positions = torch.arange(T, dtype=torch.int32).expand(B, T)
        doc_ids = torch.zeros(B, T, dtype=torch.int32)
        targets = torch.full((B, T), -100, dtype=torch.int64)
        targets[:, :-1] = ids[:, 1:]
        q = dict(p)
        for m, (A, Bm) in lora.items():
            q[m + ".lora_A"], q[m + ".lora_B"] = A.to(dtype), Bm.to(dtype)
        loss = rm.loss_fn(rm.forward(spec, q, ids, positions, doc_ids).float(), targets)
        return bc.backward_and_update(torch, loss, trainable, optimizer, phases)

    info = {"batches": batches, "config": cfg, "params_base": base_params,
            "embed_params": p["model.embed_tokens.weight"].numel(), "params_trainable": n_trainable,
            "device_name": f"cpu ({torch.get_num_threads()} threads)", "extra": {"weights": weights}}
    bc.run(torch, a, "torch-reference", device, lambda: None, step, info)


if __name__ == "__main__":
    main()
