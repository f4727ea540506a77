#!/usr/bin/python3
"""PEFT's own LoRA on the newer architectures' fixtures, as the reference for lmtune's adapters
(tests/models/fixtures/<case>/, tests/models/peft_lora_test.cpp). Needs transformers 5 and peft >= 0.18 (the GPU
machine's Python).

Usage: python3 scripts/reference_peft_lora.py OUT_ROOT [CASE ...]

For each case (CASES below: a model fixture of scripts/reference_models.py, peft's target_modules and, for LoRA
on the experts of a mixture of experts, target_parameters), attaches a peft LoRA adapter (rank 4, alpha 8), draws
every A and B at random (so every factor gets a gradient), and in float64 on the CPU (transformers' eager experts)
computes the logits of the fixture's two rows of ids (positions 0.., one document per row), the mean
cross-entropy over its targets, and the loss's gradient for every A and B. Writes OUT_ROOT/<case>/: the adapter
as peft saves it (adapter_config.json, adapter_model.safetensors in f32) and reference.safetensors: logits, loss,
and "grad.<key>" for every key of adapter_model.safetensors.
"""
import json
import os
import sys

import peft
import safetensors.torch as st
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.relpath(os.path.join(HERE, "..", "tests", "models", "fixtures"))  # as the adapter records it

# case: (model fixture, peft's target_modules, target_parameters)
CASES = {
    # 3 layers, 8 experts, top 3, layer 1 dense: attention and both stacked expert weights
    "qwen3_moe_expert_lora": ("qwen3_moe", ["q_proj", "v_proj"],
                              ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    # stored in transformers 4's per-expert layout: attention
    "mixtral_lora": ("mixtral", ["q_proj", "k_proj", "v_proj", "o_proj"], []),
    # per-layer inputs, shared key/value layers (they have q and o only), double-wide MLPs, keys as values
    "gemma4_text_lora": ("gemma4_text", ["q_proj", "o_proj", "up_proj", "down_proj"], []),
    # the 26B-A4B block: the dense MLP beside the experts (layers.N.experts, not mlp.experts)
    "gemma4_moe_lora": ("gemma4_moe", ["q_proj", "o_proj", "down_proj"],
                        ["experts.gate_up_proj", "experts.down_proj"]),
    # Gated DeltaNet layers' projections, gated attention, the shared expert's gate, and the experts' down_proj:
    # peft 0.21 reads gate_proj / up_proj / down_proj as the experts' fused parameters on this model type (its
    # transformers-5 conversion of MoE targets), so "down_proj" becomes target_parameters, and the shared expert's
    # and the dense layer's MLPs cannot be targeted by name.
    "qwen3_next_lora": ("qwen3_next", ["q_proj", "o_proj", "in_proj_qkvz", "in_proj_ba", "out_proj",
                                       "shared_expert_gate", "down_proj"], []),
    # Qwen3.5's separate DeltaNet projections
    "qwen3_5_moe_lora": ("qwen3_5_moe", ["q_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a",
                                         "out_proj"], []),
}


def run(case, out):
    fixture_name, modules, params = CASES[case]
    fixture = os.path.join(FIXTURES, fixture_name)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.float64,
                                                              experts_implementation="eager")
    kwargs = {"target_parameters": params} if params else {}
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=modules, **kwargs)
    model = peft.get_peft_model(model, config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:  # values an f32 file holds exactly
                p.copy_((torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3).float().double())
    ref = st.load_file(os.path.join(fixture, "reference.safetensors"))
    ids, targets = ref["ids"].long(), ref["targets"].long()
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100)
    loss.backward()

    model.save_pretrained(out)
    if os.path.exists(os.path.join(out, "README.md")):
        os.remove(os.path.join(out, "README.md"))
    path = os.path.join(out, "adapter_model.safetensors")
    saved = st.load_file(path)
    st.save_file({k: v.float().contiguous() for k, v in saved.items()}, path)
    grads = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            key = name.replace(".default", "")
            assert key in saved, (key, sorted(saved))
            assert p.grad is not None, f"{case}: {name} got no gradient (a module the model does not use)"
            grads["grad." + key] = p.grad.float().contiguous()
    tensors = {"logits": logits.detach().float().contiguous(), "loss": loss.detach().float().reshape(1)}
    tensors.update(grads)
    st.save_file(tensors, os.path.join(out, "reference.safetensors"))
    print(case, len(saved), "adapter tensors, loss", float(loss))
    for k in sorted(saved):
        print(" ", k, list(saved[k].shape))


def main():
    root, cases = sys.argv[1], sys.argv[2:] or list(CASES)
    for case in cases:
        run(case, os.path.join(root, case))
    print("peft", peft.__version__, "transformers", transformers.__version__)


if __name__ == "__main__":
    main()
