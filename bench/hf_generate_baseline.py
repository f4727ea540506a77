"""The peer of `lmtune bench generate`: transformers' generate on the same model directory and random prompts
(greedy, no EOS, exactly --new-tokens per sequence), bf16, SDPA attention. Prefill is timed as one forward over
the prompts; decode as generate's time minus that, over the tokens after the first. Field names are lmtune's
(docs/cli.md, `bench generate --json`). Needs torch + transformers and a CUDA device (or --device cpu).
"""
import argparse
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--cache", choices=["dynamic", "static"], default="dynamic",
                   help="transformers' KV cache (static: fixed shapes, as torch.compile wants)")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward (with --cache static)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.prompt_tokens < 1 or a.batch < 1 or a.new_tokens < 2:
        sys.exit("hf_generate_baseline: --prompt-tokens and --batch must be >= 1, --new-tokens >= 2")

    dev = torch.device(a.device)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev)
    model.eval()
    if a.compile:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(a.seed)
    ids = torch.randint(0, vocab, (a.batch, a.prompt_tokens), generator=g).to(dev)
    mask = torch.ones_like(ids)
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0, attention_mask=mask,
                  cache_implementation=a.cache if a.cache == "static" else None)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        for _ in range(2):  # warm-up (and compilation)
            model.generate(ids, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, **kwargs)
        sync()
        t0 = time.perf_counter()
        model(ids, attention_mask=mask)
        sync()
        prefill_s = time.perf_counter() - t0
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, **kwargs)
        sync()
        total_s = time.perf_counter() - t0
    generated = out.shape[1] - a.prompt_tokens
    decode_s = max(total_s - prefill_s, 1e-9)
    decode = a.batch * (generated - 1) / decode_s
    j = {"tool": "transformers", "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
         "model": a.model, "batch": a.batch, "prompt_tokens": a.prompt_tokens, "new_tokens": generated,
         "cache": a.cache, "compile": a.compile,
         "prefill_tokens_per_s": a.batch * a.prompt_tokens / prefill_s, "decode_tokens_per_s": decode,
         "decode_ms_per_step": 1e3 * a.batch / decode,
         "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0}
    if a.json:
        print(json.dumps(j))
    else:
        for k, v in j.items():
            print(f"{k:22s} {v}")


if __name__ == "__main__":
    main()
