#!/usr/bin/python3
"""PEFT's own LoRA on the experts of a mixture of experts (target_parameters), as the reference for lmtune's
(tests/models/fixtures/qwen3_moe_expert_lora/). Needs transformers 5 and peft >= 0.18 (the GPU machine's Python).

Usage: python3 scripts/reference_expert_lora.py OUT_DIR

Takes the qwen3_moe fixture (tests/models/fixtures/qwen3_moe: 3 layers, 8 experts, top 3, layer 1 dense), attaches
a peft LoRA adapter (rank 4, alpha 8) on q_proj and v_proj and on the experts' stacked gate_up_proj and down_proj
(`target_parameters`), draws every A and B at random (so every factor gets a gradient), and in float64 on the CPU
(transformers' eager experts) computes the logits of the fixture's two rows of ids (positions 0.., one document
per row) and the mean cross-entropy over its targets, and the loss's gradient for every A and B. Writes
OUT_DIR/adapter/ (adapter_config.json and adapter_model.safetensors, f32) and OUT_DIR/reference.safetensors:
logits, loss, and "grad.<key>" for every key of adapter_model.safetensors.
"""
import json
import os
import sys

import peft
import safetensors.torch as st
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "models", "fixtures", "qwen3_moe")


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float64,
                                                              experts_implementation="eager")
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                             target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    model = peft.get_peft_model(model, config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:  # values an f32 file holds exactly
                p.copy_((torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3).float().double())
    ref = st.load_file(os.path.join(FIXTURE, "reference.safetensors"))
    ids, targets = ref["ids"].long(), ref["targets"].long()
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100)
    loss.backward()

    model.save_pretrained(os.path.join(out, "adapter"))
    path = os.path.join(out, "adapter", "adapter_model.safetensors")
    saved = st.load_file(path)
    st.save_file({k: v.float().contiguous() for k, v in saved.items()}, path)
    grads = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            key = name.replace(".default", "")
            assert key in saved, (key, sorted(saved))
            grads["grad." + key] = p.grad.float().contiguous()
    tensors = {"logits": logits.detach().float().contiguous(), "loss": loss.detach().float().reshape(1)}
    tensors.update(grads)
    st.save_file(tensors, os.path.join(out, "reference.safetensors"))
    for k in sorted(saved):
        print(k, list(saved[k].shape))
    print(json.dumps(json.load(open(os.path.join(out, "adapter", "adapter_config.json"))), sort_keys=True))
    print("peft", peft.__version__, "transformers", transformers.__version__, "loss", float(loss))


if __name__ == "__main__":
    main()
