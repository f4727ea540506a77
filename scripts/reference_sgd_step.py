#!/usr/bin/python3
"""Independent float64 reference for one LoRA SGD step of lmtune's trainer (tests/train/fixtures/sgd_step/,
sgd_step_qwen3_moe/ and sgd_step_qwen3_next/).

Run with Debian's PyTorch:  /usr/bin/python3 scripts/reference_sgd_step.py

Takes the Llama fixture model and batch of scripts/reference_models.py (tests/models/fixtures/llama: weights in
model.safetensors, the packed batch ids/positions/doc_ids/targets in reference.safetensors), attaches a LoRA
adapter (rank 4, alpha 8, q_proj and v_proj, A and B random so both get gradients), and computes with the
reference model of reference_models.py (LoRA patched into its `linear`):

  loss = mean token cross-entropy over targets != -100      (one micro-batch: lmtune's token-weighted loss)
  g    = d loss / d (A, B);  norm = ||g||_2 over all adapter tensors
  c    = min(1, max_norm / (norm + 1e-6))                    (torch.nn.utils.clip_grad_norm_; max_norm = norm / 2)
  new  = p - lr * c * g                                      (torch.optim.SGD, no momentum, no weight decay)

and writes the adapter as a PEFT directory (adapter/) plus expected.safetensors: loss, grad_norm, max_norm, lr and
"new.<module>.lora_A|B" for every module. The same step on the qwen3_moe fixture (a mixture of experts; LoRA on
q_proj and v_proj of every layer and on down_proj of its one dense MLP layer) goes to sgd_step_qwen3_moe/, and on
the qwen3_next fixture (LoRA on its attention layers' q_proj, its Gated DeltaNet layers' in_proj_qkvz and out_proj,
and its dense layer's down_proj) to sgd_step_qwen3_next/.
"""
import json
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference_models as rm  # noqa: E402

torch.set_default_dtype(torch.float64)
RANK, ALPHA, LR = 4, 8.0, 0.5
STEPS = (("llama", "sgd_step", ("q_proj", "v_proj")),
         ("qwen3_moe", "sgd_step_qwen3_moe", ("q_proj", "v_proj", "down_proj")),
         ("qwen3_next", "sgd_step_qwen3_next", ("q_proj", "in_proj_qkvz", "out_proj", "down_proj")))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    types = {"F32": torch.float32, "I32": torch.int32}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=types[info["dtype"]]).reshape(info["shape"]).clone()
    return out


def step(name, out_name, targets):
    root = os.path.join(HERE, "..")
    fixture = os.path.join(root, "tests", "models", "fixtures", name)
    out_dir = os.path.join(root, "tests", "train", "fixtures", out_name)
    spec = next(f for f in rm.fixtures() if f[0] == name)
    arch = spec[2]
    p = {k: v.double() for k, v in read_safetensors(os.path.join(fixture, "model.safetensors")).items()}
    ref = read_safetensors(os.path.join(fixture, "reference.safetensors"))

    gen = torch.Generator().manual_seed(4321)
    lora = {}
    for layer in range(arch["layers"]):
        for t in targets:
            block = ("mlp" if t in ("gate_proj", "up_proj", "down_proj") else
                     "linear_attn" if t.startswith("in_proj") or t == "out_proj" else "self_attn")
            module = f"model.layers.{layer}.{block}.{t}"
            if module + ".weight" not in p:  # an expert layer has no dense MLP
                continue
            w = p[module + ".weight"]
            a = (torch.randn(RANK, w.shape[1], generator=gen) * 0.3).float().double().requires_grad_(True)
            b = (torch.randn(w.shape[0], RANK, generator=gen) * 0.3).float().double().requires_grad_(True)
            lora[module] = (a, b)
    scale = ALPHA / RANK
    base_linear = rm.linear

    def linear_with_lora(params, name, x, bias):
        y = base_linear(params, name, x, bias)
        if name in lora:
            a, b = lora[name]
            y = y + scale * ((x @ a.T) @ b.T)  # PEFT: lora_B(lora_A(dropout(x))) * scaling, dropout off
        return y

    rm.linear = linear_with_lora
    try:
        logits = rm.forward({"arch": arch}, p, ref["ids"].long(), ref["positions"], ref["doc_ids"])
    finally:
        rm.linear = base_linear
    loss = rm.loss_fn(logits, ref["targets"])
    loss.backward()
    params = [t for ab in lora.values() for t in ab]
    norm = torch.sqrt(sum((t.grad ** 2).sum() for t in params))
    max_norm = float(norm) / 2
    coef = min(1.0, max_norm / (float(norm) + 1e-6))

    os.makedirs(os.path.join(out_dir, "adapter"), exist_ok=True)
    adapter = {}
    for module, (a, b) in lora.items():
        adapter[f"base_model.model.{module}.lora_A.weight"] = a.detach().float()
        adapter[f"base_model.model.{module}.lora_B.weight"] = b.detach().float()
    rm.write_safetensors(os.path.join(out_dir, "adapter", "adapter_model.safetensors"), adapter, {"format": "pt"})
    with open(os.path.join(out_dir, "adapter", "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0,
                   "target_modules": list(targets), "bias": "none", "base_model_name_or_path": name}, f, indent=2)
        f.write("\n")
    expected = {"loss": loss.detach().reshape(1).float(), "grad_norm": norm.detach().reshape(1).float(),
                "max_norm": torch.tensor([max_norm]).float(), "lr": torch.tensor([LR]).float()}
    for module, (a, b) in lora.items():
        expected[f"new.{module}.lora_A"] = (a - LR * coef * a.grad).detach().float()
        expected[f"new.{module}.lora_B"] = (b - LR * coef * b.grad).detach().float()
    rm.write_safetensors(os.path.join(out_dir, "expected.safetensors"), expected,
                         {"generator": "scripts/reference_sgd_step.py", "loss_f64": repr(loss.item()),
                          "grad_norm_f64": repr(norm.item()), "max_norm_f64": repr(max_norm)})
    print(f"{name}: loss {loss.item():.6f}  grad norm {norm.item():.6f}  clip coefficient {coef:.4f}")


def main():
    for name, out_name, targets in STEPS:
        step(name, out_name, targets)


if __name__ == "__main__":
    main()
