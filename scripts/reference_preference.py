#!/usr/bin/python3
"""Independent float64 reference for lmtune's preference objectives (tests/train/fixtures/preference/).

Run with Debian's PyTorch:  /usr/bin/python3 scripts/reference_preference.py

Takes the Llama fixture model of scripts/reference_models.py (tests/models/fixtures/llama), attaches a LoRA adapter
(rank 4, alpha 8, q_proj and v_proj, A and B random so the policy differs from the adapter-off reference), and a
fixed batch of 3 pairs of random token sequences (a prompt, then a chosen or a rejected response of different
lengths). Each sequence runs alone (batch of one, positions from 0). With TRL's definitions:

  logp(y|x) = sum over response tokens t of log p(t | tokens before t)   (policy: with LoRA; reference: without)
  DPO:   z = beta ((lc - rc) - (lr - rr));  loss = -(1 - ls) logsigmoid(z) - ls logsigmoid(-z)
         rewards beta (logp - ref)
  SimPO: a = logp / response tokens;  z = beta (a_c - a_r) - gamma;  loss = -logsigmoid(z);  rewards beta a
  ORPO:  nll = mean token NLL over all chosen response tokens of the batch;
         log_odds = (a_c - a_r) - (log1p(-exp(a_c)) - log1p(-exp(a_r)));  loss = nll - beta mean(logsigmoid(log_odds))
         rewards beta a
  (pair losses averaged over the pairs), and the gradients of each loss with respect to every A and B.

Writes adapter/ (PEFT), pairs.safetensors (ids [6, L] padded with -1, prompt_len [6], length [6]; sequence 2p is
pair p's chosen response, 2p + 1 its rejected one) and expected.safetensors (per objective: loss, chosen_reward,
rejected_reward and grad.<module>.lora_A|B; settings in the metadata and in "settings.<objective>").
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import reference_models as rm  # noqa: E402
from reference_sgd_step import read_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)
RANK, ALPHA = 4, 8.0
TARGETS = ("q_proj", "v_proj")
# (prompt length, chosen length, rejected length) per pair
SHAPES = [(3, 4, 2), (2, 3, 5), (4, 2, 3)]
SETTINGS = {"dpo": {"beta": 0.5, "label_smoothing": 0.1, "gamma": 0.0},
            "simpo": {"beta": 2.0, "label_smoothing": 0.0, "gamma": 0.5},
            "orpo": {"beta": 0.25, "label_smoothing": 0.0, "gamma": 0.0}}


def make_sequences(gen, vocab):
    seqs = []  # (ids, prompt_len)
    for prompt_len, lc, lr in SHAPES:
        prompt = torch.randint(3, vocab, (prompt_len,), generator=gen)
        for n in (lc, lr):
            seqs.append((torch.cat([prompt, torch.randint(3, vocab, (n,), generator=gen)]), prompt_len))
    return seqs


def logp(arch, p, ids, prompt_len):
    T = ids.shape[0]
    logits = rm.forward({"arch": arch}, p, ids[None], torch.arange(T, dtype=torch.int32)[None],
                        torch.zeros(1, T, dtype=torch.int32))[0]
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None]).squeeze(-1)  # lp[i] = log p(ids[i+1])
    return lp[prompt_len - 1:].sum(), T - prompt_len


def objective(name, lp, ref, n):
    s = SETTINGS[name]
    beta, ls = s["beta"], s["label_smoothing"]
    c, r = lp[0::2], lp[1::2]
    if name == "dpo":
        z = beta * ((c - ref[0::2]) - (r - ref[1::2]))
        loss = (-(1 - ls) * F.logsigmoid(z) - ls * F.logsigmoid(-z)).mean()
        return loss, beta * (c - ref[0::2]), beta * (r - ref[1::2])
    a = lp / n
    ac, ar = a[0::2], a[1::2]
    if name == "simpo":
        z = beta * (ac - ar) - s["gamma"]
        loss = (-(1 - ls) * F.logsigmoid(z) - ls * F.logsigmoid(-z)).mean()
    else:
        nll = -c.sum() / n[0::2].sum()
        log_odds = (ac - ar) - (torch.log1p(-torch.exp(ac)) - torch.log1p(-torch.exp(ar)))
        loss = nll - beta * F.logsigmoid(log_odds).mean()
    return loss, beta * ac, beta * ar


def main():
    root = os.path.join(HERE, "..")
    fixture = os.path.join(root, "tests", "models", "fixtures", "llama")
    out_dir = os.path.join(root, "tests", "train", "fixtures", "preference")
    arch = next(f for f in rm.fixtures() if f[0] == "llama")[2]
    p = {k: v.double() for k, v in read_safetensors(os.path.join(fixture, "model.safetensors")).items()}
    vocab = p["lm_head.weight"].shape[0]

    gen = torch.Generator().manual_seed(2468)
    lora = {}
    for layer in range(arch["layers"]):
        for t in TARGETS:
            module = f"model.layers.{layer}.self_attn.{t}"
            w = p[module + ".weight"]
            a = (torch.randn(RANK, w.shape[1], generator=gen) * 0.3).float().double().requires_grad_(True)
            b = (torch.randn(w.shape[0], RANK, generator=gen) * 0.3).float().double().requires_grad_(True)
            lora[module] = (a, b)
    seqs = make_sequences(gen, vocab)
    scale = ALPHA / RANK
    base_linear = rm.linear
    enabled = [True]

    def linear_with_lora(params, name, x, bias):
        y = base_linear(params, name, x, bias)
        if enabled[0] and name in lora:
            a, b = lora[name]
            y = y + scale * ((x @ a.T) @ b.T)
        return y

    rm.linear = linear_with_lora
    enabled[0] = False
    with torch.no_grad():
        ref = torch.stack([logp(arch, p, ids, pl)[0] for ids, pl in seqs])
    enabled[0] = True
    n = torch.tensor([float(len(ids) - pl) for ids, pl in seqs])

    expected = {"ref_logps": ref.float()}
    meta = {"generator": "scripts/reference_preference.py"}
    for name in ("dpo", "simpo", "orpo"):
        for ab in lora.values():
            for t in ab:
                t.grad = None
        lp = torch.stack([logp(arch, p, ids, pl)[0] for ids, pl in seqs])
        loss, cr, rr = objective(name, lp, ref, n)
        loss.backward()
        s = SETTINGS[name]
        expected[f"{name}.loss"] = loss.detach().reshape(1).float()
        expected[f"{name}.chosen_reward"] = cr.detach().float()
        expected[f"{name}.rejected_reward"] = rr.detach().float()
        expected[f"settings.{name}"] = torch.tensor([s["beta"], s["label_smoothing"], s["gamma"]]).float()
        for module, (a, b) in lora.items():
            expected[f"{name}.grad.{module}.lora_A"] = a.grad.float()
            expected[f"{name}.grad.{module}.lora_B"] = b.grad.float()
        expected["logps"] = lp.detach().float()
        meta[f"{name}_loss_f64"] = repr(loss.item())
        print(f"{name}: loss {loss.item():.6f}  chosen {cr.detach().tolist()}  rejected {rr.detach().tolist()}")

    os.makedirs(os.path.join(out_dir, "adapter"), exist_ok=True)
    adapter = {}
    for module, (a, b) in lora.items():
        adapter[f"base_model.model.{module}.lora_A.weight"] = a.detach().float()
        adapter[f"base_model.model.{module}.lora_B.weight"] = b.detach().float()
    rm.write_safetensors(os.path.join(out_dir, "adapter", "adapter_model.safetensors"), adapter, {"format": "pt"})
    with open(os.path.join(out_dir, "adapter", "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0,
                   "target_modules": list(TARGETS), "bias": "none", "base_model_name_or_path": "llama"}, f, indent=2)
        f.write("\n")
    L = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), L), -1, dtype=torch.int32)
    for i, (s, _) in enumerate(seqs):
        ids[i, :len(s)] = s.int()
    pairs = {"ids": ids, "prompt_len": torch.tensor([pl for _, pl in seqs], dtype=torch.int32),
             "length": torch.tensor([len(s) for s, _ in seqs], dtype=torch.int32)}
    rm.write_safetensors(os.path.join(out_dir, "pairs.safetensors"), pairs, {"format": "pt"})
    rm.write_safetensors(os.path.join(out_dir, "expected.safetensors"), expected, meta)


if __name__ == "__main__":
    main()
