#!/usr/bin/env python3
"""Checks the float64 references of scripts/reference_models.py against transformers + peft.

The test fixtures of the preference objectives (tests/train/fixtures/preference/, scripts/reference_preference.py)
and of log-likelihood scoring (tests/infer/fixtures/logprobs/, scripts/reference_logprobs.py) are computed by
lmtune's own float64 PyTorch model. This script recomputes them with transformers' LlamaForCausalLM and a peft
LoRA adapter (float64 on the CPU; `disable_adapter()` for DPO's reference), so that the fixtures, and through them
lmtune, agree with the implementation users compare against:

  python3 scripts/check_references_transformers.py      # needs torch, transformers, peft, safetensors

It also recomputes the rope-scaling model fixtures (tests/models/fixtures/{llama_yarn,qwen2_longrope,
llama_dynamic}) with transformers' own models: logits and loss past the original length, the packed row alone,
and the KV-cache timeline of generate (--rope: only these), the mixture-of-experts fixtures
(tests/models/fixtures/{mixtral,qwen3_moe}, --moe: only these) with transformers' Mixtral and Qwen3-MoE classes:
logits of each document alone, the loss, and the load-balancing loss of the whole batch, and the Gemma 4 fixture
(tests/models/fixtures/gemma4_text, --gemma4: only this; --save-gemma4-config=DIR also writes the config.json
transformers saves for it) with Gemma4ForCausalLM: each document alone, the loss and a cached decode; and the
Qwen3-Next fixtures (tests/models/fixtures/{qwen3_next,qwen3_5_moe}, --qwen3-next: only these;
--save-qwen3-next-config=DIR) the same way with Qwen3NextForCausalLM and Qwen3_5MoeForCausalLM (their Gated
DeltaNet layers in transformers' own chunked and recurrent forms).

Prints the largest relative difference per quantity and exits 1 if any exceeds 1e-5 (the fixtures are float32).
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
import transformers
import peft

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LLAMA = os.path.join(ROOT, "tests", "models", "fixtures", "llama")
TOL = 1e-5
worst = {}


def compare(what, got, want):
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item()
    worst[what] = max(worst.get(what, 0.0), err)


def model_with(adapter_dir):
    base = transformers.LlamaForCausalLM.from_pretrained(LLAMA, dtype=torch.float64, attn_implementation="eager")
    return peft.PeftModel.from_pretrained(base, adapter_dir, is_trainable=True).eval()


def log_probs(model, ids):
    logits = model(input_ids=torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits, -1)


def preference():
    d = os.path.join(ROOT, "tests", "train", "fixtures", "preference")
    model = model_with(os.path.join(d, "adapter"))
    pairs, want = load_file(os.path.join(d, "pairs.safetensors")), load_file(os.path.join(d, "expected.safetensors"))
    seqs = [(pairs["ids"][i, :pairs["length"][i]].tolist(), int(pairs["prompt_len"][i]))
            for i in range(pairs["ids"].shape[0])]

    def logp(ids, prompt_len):
        lp = log_probs(model, ids)[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
        return lp[prompt_len - 1:].sum()

    with torch.no_grad(), model.disable_adapter():
        ref = torch.stack([logp(s, pl) for s, pl in seqs])
    compare("preference reference log-probs", ref, want["ref_logps"])
    n = torch.tensor([float(len(s) - pl) for s, pl in seqs], dtype=torch.float64)
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    for name in ("dpo", "simpo", "orpo"):
        beta, ls, gamma = want[f"settings.{name}"].double().tolist()
        model.zero_grad()
        lp = torch.stack([logp(s, pl) for s, pl in seqs])
        compare("preference policy log-probs", lp, want["logps"])
        c, r = lp[0::2], lp[1::2]
        if name == "dpo":
            z = beta * ((c - ref[0::2]) - (r - ref[1::2]))
            loss = (-(1 - ls) * F.logsigmoid(z) - ls * F.logsigmoid(-z)).mean()
            cr, rr = beta * (c - ref[0::2]), beta * (r - ref[1::2])
        else:
            a = lp / n
            ac, ar = a[0::2], a[1::2]
            if name == "simpo":
                z = beta * (ac - ar) - gamma
                loss = (-(1 - ls) * F.logsigmoid(z) - ls * F.logsigmoid(-z)).mean()
            else:
                log_odds = (ac - ar) - (torch.log1p(-torch.exp(ac)) - torch.log1p(-torch.exp(ar)))
                loss = -c.sum() / n[0::2].sum() - beta * F.logsigmoid(log_odds).mean()
            cr, rr = beta * ac, beta * ar
        loss.backward()
        compare(f"{name} loss", loss.detach(), want[f"{name}.loss"])
        compare(f"{name} rewards", torch.cat([cr, rr]).detach(),
                torch.cat([want[f"{name}.chosen_reward"], want[f"{name}.rejected_reward"]]))
        for pname, p in params.items():  # base_model.model.<module>.lora_A.default.weight
            module, kind = pname[len("base_model.model."):].rsplit(".lora_", 1)
            compare(f"{name} adapter gradients", p.grad, want[f"{name}.grad.{module}.lora_{kind[0]}"])


def logprobs():
    d = os.path.join(ROOT, "tests", "infer", "fixtures", "logprobs")
    vocab = json.load(open(os.path.join(d, "tokenizer.json")))["model"]["vocab"]
    want = json.load(open(os.path.join(d, "expected.json")))
    records = [json.loads(line) for line in open(os.path.join(d, "records.jsonl"))]
    model = model_with(os.path.join(ROOT, "tests", "train", "fixtures", "sgd_step", "adapter"))
    for kind in ("base", "lora"):
        for rec, exp in zip(records, want[kind]):
            ctx = [1] + [vocab[ch] for ch in rec["prompt"]]
            cont = [vocab[ch] for ch in rec["completion"]]
            with torch.no_grad():
                if kind == "base":
                    with model.disable_adapter():
                        lp = log_probs(model, ctx + cont)
                else:
                    lp = log_probs(model, ctx + cont)
            got = [lp[len(ctx) + j - 1, t].item() for j, t in enumerate(cont)]
            compare(f"scoring log-probs ({kind})", got, [t["logprob"] for t in exp])
            for j, t in enumerate(exp):
                top = torch.topk(lp[len(ctx) + j - 1], len(t["top"]))
                compare(f"scoring top log-probs ({kind})", top.values, [v for _, v in t["top"]])


def fresh_model(fixture, **kwargs):
    """A newly loaded model: transformers' dynamic rope keeps state between calls, so each check starts afresh."""
    return transformers.AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.float64,
                                                             attn_implementation="eager", **kwargs).eval()


def rope_scaling():
    """The rope-scaling fixtures of scripts/reference_models.py (yarn, longrope, dynamic; past the original
    length): logits and loss of the batch, the packed row alone, and the KV-cache timeline of generate."""
    for name in ("llama_yarn", "qwen2_longrope", "llama_dynamic"):
        d = os.path.join(ROOT, "tests", "models", "fixtures", name)
        ref = load_file(os.path.join(d, "reference.safetensors"))
        ids, pos, docs = ref["ids"].long(), ref["positions"].long(), ref["doc_ids"]
        T = ids.shape[1]
        with torch.no_grad():
            # The batch: transformers' rope length is the largest position of the call (row 0's), so each
            # document of the packed row 1 runs beside row 0, right-padded (a causal mask ignores the padding).
            model = fresh_model(d)
            logits = torch.zeros(ref["logits"].shape, dtype=torch.float64)
            logits[0] = model(input_ids=ids[:1], position_ids=pos[:1]).logits[0]
            for doc in docs[1].unique():
                cols = (docs[1] == doc).nonzero().flatten()
                n = len(cols)
                pair = torch.zeros(2, T, dtype=torch.long)
                pair[0], pair[1, :n] = ids[0], ids[1, cols]
                mask = torch.ones(2, T, dtype=torch.long)
                mask[1, n:] = 0
                positions = torch.stack([pos[0], torch.arange(T)])
                logits[1, cols] = model(input_ids=pair, attention_mask=mask, position_ids=positions).logits[1, :n]
            compare(f"{name} batch logits", logits, ref["logits"])
            targets = ref["targets"].long()
            keep = targets != -100
            compare(f"{name} batch loss", F.cross_entropy(logits[keep], targets[keep]), ref["loss"])
            # The packed row alone: every document within the original length.
            model = fresh_model(d)
            short = torch.zeros(ref["short.logits"].shape, dtype=torch.float64)
            for doc in docs[1].unique():
                cols = (docs[1] == doc).nonzero().flatten()
                short[0, cols] = model(input_ids=ids[1:, cols], position_ids=pos[1:, cols]).logits[0]
            compare(f"{name} packed row alone logits", short, ref["short.logits"])
            # generate's timeline: the prompt, then one token per call through the cache.
            model = fresh_model(d)
            P = int(ref["generate.prompt_len"][0])
            out = model(input_ids=ids[:1, :P], use_cache=True)
            steps = [out.logits[0, -1]]
            for t in range(P, T):
                out = model(input_ids=ids[:1, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
                steps.append(out.logits[0, -1])
            compare(f"{name} cached generate logits", torch.stack(steps), ref["generate.logits"][0, P - 1:])


def mixtures_of_experts():
    """mixtral (stored per expert, as transformers 4 wrote it) and qwen3_moe (stacked, as transformers 5 writes):
    each document of the batch alone (transformers has no packed-document mask), the loss, and
    load_balancing_loss_func over the router logits of all 22 tokens."""
    for name in ("mixtral", "qwen3_moe"):
        d = os.path.join(ROOT, "tests", "models", "fixtures", name)
        ref = load_file(os.path.join(d, "reference.safetensors"))
        ids, docs = ref["ids"].long(), ref["doc_ids"]
        # The default experts backend (torch grouped_mm) takes no float64; the eager loop over experts does.
        model = fresh_model(d, experts_implementation="eager")
        logits = torch.zeros(ref["logits"].shape, dtype=torch.float64)
        router = {}
        with torch.no_grad():
            for b in range(ids.shape[0]):
                for doc in docs[b].unique():
                    cols = (docs[b] == doc).nonzero().flatten()
                    out = model(input_ids=ids[b:b + 1, cols], output_router_logits=True)
                    logits[b, cols] = out.logits[0]
                    for layer, rl in enumerate(out.router_logits):
                        for j, c in enumerate(cols.tolist()):
                            router[(layer, b, c)] = rl.reshape(len(cols), -1)[j]
        compare(f"{name} logits", logits, ref["logits"])
        targets = ref["targets"].long()
        keep = targets != -100
        compare(f"{name} loss", F.cross_entropy(logits[keep], targets[keep]), ref["loss"])
        layers = sorted({k[0] for k in router})
        per_layer = tuple(torch.stack([router[(l, b, c)] for b in range(ids.shape[0]) for c in range(ids.shape[1])])
                          for l in layers)
        cfg = model.config
        experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
        module = sys.modules[type(model).__module__]
        aux = module.load_balancing_loss_func(per_layer, experts, cfg.num_experts_per_tok)
        compare(f"{name} router aux loss", aux, ref["aux_loss"])


def gemma4(saved_config=None):
    """gemma4_text and gemma4_moe (Gemma4ForCausalLM): each document of the batch alone, the loss, and row 0
    decoded through transformers' cache one token at a time after a prompt of 3 (its sliding layers' cache past the
    window of 4, gemma4_text's shared layers reading the keys of layers 2 and 3) against the recomputed reference.
    With saved_config, gemma4_text's config as transformers writes it back (save_pretrained) goes there, for
    lmtune's parser test."""
    for name in ("gemma4_text", "gemma4_moe"):
        documents_and_decode(name, saved_config if name == "gemma4_text" else None)


def documents_and_decode(name, saved_config):
    d = os.path.join(ROOT, "tests", "models", "fixtures", name)
    ref = load_file(os.path.join(d, "reference.safetensors"))
    ids, docs = ref["ids"].long(), ref["doc_ids"]
    model = fresh_model(d, experts_implementation="eager")
    logits = torch.zeros(ref["logits"].shape, dtype=torch.float64)
    with torch.no_grad():
        for b in range(ids.shape[0]):
            for doc in docs[b].unique():
                cols = (docs[b] == doc).nonzero().flatten()
                logits[b, cols] = model(input_ids=ids[b:b + 1, cols]).logits[0]
        compare(f"{name} logits", logits, ref["logits"])
        targets = ref["targets"].long()
        keep = targets != -100
        compare(f"{name} loss", F.cross_entropy(logits[keep], targets[keep]), ref["loss"])
        P = 3
        out = model(input_ids=ids[:1, :P], use_cache=True)
        steps = [out.logits[0, -1]]
        for t in range(P, ids.shape[1]):
            out = model(input_ids=ids[:1, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[0, -1])
        compare(f"{name} cached generate logits", torch.stack(steps), ref["logits"][0, P - 1:])
    if saved_config:
        model.config.save_pretrained(saved_config)


def main():
    torch.manual_seed(0)
    only_rope = "--rope" in sys.argv[1:]
    only_moe = "--moe" in sys.argv[1:]
    only_gemma4 = "--gemma4" in sys.argv[1:]
    only_next = "--qwen3-next" in sys.argv[1:]
    saved = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--save-gemma4-config=")), None)
    saved_next = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--save-qwen3-next-config=")), None)
    only = only_rope or only_moe or only_gemma4 or only_next
    if only_gemma4 or not only:
        gemma4(saved)
    if only_next or not only:
        documents_and_decode("qwen3_next", saved_next)
        documents_and_decode("qwen3_5_moe", None)
    if not only:
        preference()
        logprobs()
    if only_rope or not only:
        rope_scaling()
    if only_moe or not only:
        mixtures_of_experts()
    bad = False
    for what, err in worst.items():
        print(f"{what:40s} max relative difference {err:.2e}")
        bad |= err > TOL
    print(f"transformers {transformers.__version__}, peft {peft.__version__}: {'FAIL' if bad else 'agree'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
