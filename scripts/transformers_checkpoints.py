#!/usr/bin/python3
"""Tiny random checkpoints of the newer families written by transformers itself, with transformers' logits and loss
as the reference (tests/models/fixtures/hf_<family>/, tests/models/transformers_written_test.cpp). Needs
transformers 5 (the GPU machine's Python).

Usage: python3 scripts/transformers_checkpoints.py OUT_ROOT [FAMILY ...]

For each family, the config of the matching fixture of scripts/reference_models.py (tests/models/fixtures/<fixture>/
config.json) builds a model with transformers' own initialisation (`from_config`, float32), every parameter then
moved by seeded noise so that norms, gates and routers are not at their initial values; `save_pretrained` writes it
(config.json and model.safetensors as transformers writes them: stacked experts, its own config keys). Loaded back
from those files in float64 on the CPU (eager experts), transformers computes the logits of that fixture's two rows of ids (positions 0.., one document per row)
and the mean cross-entropy over its targets: OUT_ROOT/hf_<family>/reference.safetensors holds ids, targets, logits
and loss.
"""
import os
import sys

import safetensors.torch as st
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "models", "fixtures")
FAMILIES = {"mixtral": "mixtral", "qwen3_moe": "qwen3_moe", "qwen3_next": "qwen3_next",
            "qwen3_5_moe": "qwen3_5_moe", "gemma4": "gemma4_text", "gemma4_moe": "gemma4_moe"}


def run(family, out):
    fixture = os.path.join(FIXTURES, FAMILIES[family])
    config = transformers.AutoConfig.from_pretrained(fixture)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # tied weights are one parameter: moved once
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    model.save_pretrained(out)
    ref = st.load_file(os.path.join(fixture, "reference.safetensors"))
    ids, targets = ref["ids"].long(), ref["targets"].long()
    # The reference from the files just written (their round trip included), eager experts in float64.
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64,
                                                              experts_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                 ignore_index=-100)
    st.save_file({"ids": ref["ids"], "targets": ref["targets"], "logits": logits.float().contiguous(),
                  "loss": loss.float().reshape(1)}, os.path.join(out, "reference.safetensors"))
    print(family, type(model).__name__, "loss", float(loss), sorted(os.listdir(out)))


def main():
    root, families = sys.argv[1], sys.argv[2:] or list(FAMILIES)
    for family in families:
        run(family, os.path.join(root, "hf_" + family))
    print("transformers", transformers.__version__, "torch", torch.__version__)


if __name__ == "__main__":
    main()
