"""What the PyTorch baselines of `lmtune bench train` share (bench/peft_baseline.py, bench/torch_cpu_baseline.py):
the arguments, the token batches (lmtune's --save-batches file, or random Zipf ids as lmtune draws them), the
timed loop (forward / backward / optimizer, synchronized between phases), the FLOPs and MFU conventions and the
JSON fields. docs/benchmarks.md documents them; the field names are lmtune's (docs/cli.md, `bench train --json`).

Works with torch 1.13 (Debian's python3-torch) and 2.x. Standard library + torch only.
"""
import argparse
import json
import math
import os
import resource
import struct
import sys
import time

LORA_KINDS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, help="model directory with config.json (+ *.safetensors weights)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=0, help="LoRA alpha (default 2 x rank, as lmtune)")
    p.add_argument("--targets", default="all-linear", help="all-linear or a comma list of module kinds")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps before the timed ones")
    p.add_argument("--grad-checkpointing", choices=["on", "off"], default="on")
    p.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--peak-tflops", type=float, default=0, help="the device's peak TFLOP/s for MFU")
    p.add_argument("--peak-matmul-size", type=int, default=-1,
                   help="n of the n^3 matmul measuring the device's peak (default 4096 on GPUs, 1024 on CPUs; 0: skip)")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--losses", action="store_true", help="include every step's loss (warm-up first)")
    p.add_argument("--batches", help="train on lmtune's --save-batches file (input_ids i32 [steps, batch, seq])")
    p.add_argument("--init-adapter", help="start from this PEFT adapter directory (e.g. lmtune's --save-init-adapter)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default: all cores)")
    return p


def check_args(a):
    for name, low in (("seq", 2), ("batch", 1), ("rank", 1), ("steps", 1), ("warmup", 0)):
        if getattr(a, name) < low:
            fail(f"--{name} must be at least {low} (got {getattr(a, name)})")
    if a.lr <= 0:
        fail("--lr must be positive")
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        fail(f"--model {a.model}: no config.json there")
    if a.alpha <= 0:
        a.alpha = 2.0 * a.rank
    a.target_kinds = LORA_KINDS if a.targets == "all-linear" else [t for t in a.targets.split(",") if t]
    # "experts": LoRA on a mixture of experts' stacked expert weights (peft's target_parameters), as lmtune's
    a.target_parameters = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"] if "experts" in a.target_kinds else []
    a.target_kinds = [t for t in a.target_kinds if t != "experts"]
    unknown = [t for t in a.target_kinds if t not in LORA_KINDS]
    if unknown or not (a.target_kinds or a.target_parameters):
        kinds = LORA_KINDS + ["experts"]
        fail(f"--targets: unknown module kind(s) {unknown}; use all-linear or a comma list of {kinds}")


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def read_safetensors(path):
    """name -> (dtype string, shape, raw bytes); standard library only."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def to_tensor(torch, entry):
    dtype, shape, raw = entry
    if dtype == "BF16":
        return torch.frombuffer(bytearray(raw), dtype=torch.int16).view(torch.bfloat16).float().reshape(shape)
    kinds = {"F32": torch.float32, "F16": torch.float16, "I32": torch.int32, "I64": torch.int64}
    if dtype not in kinds:
        raise ValueError(f"unsupported safetensors dtype {dtype}")
    return torch.frombuffer(bytearray(raw), dtype=kinds[dtype]).reshape(shape).clone()


def token_batches(torch, a, vocab, ranks=1):
    """[steps, B * ranks, T] int64 ids: lmtune's file, or Zipf-distributed ids (p(id) ~ 1/(id+1), as lmtune draws
    them, though not the same ids: pass --batches for identical data). Rank r trains on rows [r*B, (r+1)*B), as
    `lmtune bench train --devices` does."""
    need = a.warmup + a.steps
    rows = a.batch * ranks
    if a.batches:
        st = read_safetensors(a.batches)
        if "input_ids" not in st:
            fail(f"--batches {a.batches}: no tensor 'input_ids'")
        ids = to_tensor(torch, st["input_ids"]).long()
        if ids.dim() != 3 or ids.shape[1] != rows or ids.shape[2] != a.seq:
            fail(f"--batches {a.batches} holds {list(ids.shape)}, --batch/--seq ask for [steps, {rows}, {a.seq}]")
        if ids.shape[0] < need:
            fail(f"--batches {a.batches} holds {ids.shape[0]} steps, --warmup + --steps need {need}")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            fail(f"--batches {a.batches}: ids outside the vocabulary [0, {vocab})")
        return ids
    g = torch.Generator().manual_seed(a.seed)
    probs = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    return torch.multinomial(probs, need * rows * a.seq, replacement=True, generator=g).reshape(need, rows, a.seq)


def matmul_tflops(torch, device, dtype, n, sync, reps=5):
    x = torch.randn(n, n, device=device).to(dtype)
    y = torch.randn(n, n, device=device).to(dtype)
    t0 = time.perf_counter()
    i = 0
    while i < 2 or time.perf_counter() - t0 < 0.3:  # warm-up, as lmtune's time_op
        torch.matmul(x, y)
        sync()
        i += 1
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.matmul(x, y)
        sync()
        times.append(time.perf_counter() - t)
    times.sort()
    return 2.0 * n ** 3 / times[len(times) // 2] / 1e12


def flops_per_token(cfg, params_base, embed_params, lora_params, seq):
    """lmtune's convention (cli/cmd_bench_train.cpp): 6 x weights in matmuls (all parameters except an untied
    input embedding; a tied one is the lm_head) + 12·L·H·D·T; the "LoRA" count 4 x frozen + 6 x LoRA + 12LHDT."""
    base = params_base - (0 if cfg.get("tie_word_embeddings", False) else embed_params)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    attention = 12.0 * cfg["num_hidden_layers"] * heads * head_dim * seq
    return base + lora_params, 6.0 * (base + lora_params) + attention, 4.0 * base + 6.0 * lora_params + attention


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def backward_and_update(torch, loss, trainable, optimizer, phases):
    """The rest of one training step after the forward pass, the same for every baseline: backward, clipping at
    1.0 (as lmtune), AdamW, each phase timed. Returns the loss value."""
    value = loss.item()
    phases.lap("forward")
    loss.backward()
    phases.lap("backward")
    torch.nn.utils.clip_grad_norm_(trainable, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    phases.lap("optimizer")
    return value


def run(torch, a, tool, device, sync, model_step, info):
    """The timed loop. model_step(ids, phases) runs one training step on [B, T] ids, calling phases.lap(name)
    after the forward (loss on the host), the backward and the optimizer; it returns the loss. Under torchrun
    (info["rank"], info["ranks"]) each rank takes its rows of every step; rank 0 reports the aggregate tokens/s
    (all ranks' tokens over the slowest rank's time) and each rank's, and the other ranks print nothing."""
    ids_all = info["batches"]
    rank, ranks = info.get("rank", 0), info.get("ranks", 1)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    peak_n = a.peak_matmul_size if a.peak_matmul_size >= 0 else (4096 if cuda else 1024)
    measured = float("nan")
    if peak_n > 0:
        measured = matmul_tflops(torch, device, dtype, peak_n, sync)
        log(f"matmul {peak_n}^3 {a.precision}: {measured:.3g} TFLOP/s (the measured peak)")

    class Phases:
        def __init__(self):
            self.s = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
            self.on = False

        def start(self):
            self.last = time.perf_counter()

        def lap(self, name):
            if not self.on:
                return
            sync()
            now = time.perf_counter()
            self.s[name] += now - self.last
            self.last = now

    phases = Phases()
    losses, timed = [], 0.0
    total = a.warmup + a.steps
    for s in range(total):
        if s == a.warmup:
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            phases.on = True
        ids = ids_all[s][rank * a.batch:(rank + 1) * a.batch].to(device)
        sync()
        t0 = time.perf_counter()
        phases.start()
        loss = model_step(ids, phases)
        sync()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            timed += dt
        losses.append(loss)
        log(f"{'timed' if s >= a.warmup else 'warm-up'} step {s + 1}/{total} | loss {loss:.4f} | {dt:.3f} s | "
            f"{a.batch * a.seq / dt:.0f} tok/s")
    peak = torch.cuda.max_memory_allocated(device) if cuda else peak_rss_bytes()
    n = float(a.steps)
    per_rank = [timed]
    if ranks > 1:
        import torch.distributed as tdist
        per_rank = [None] * ranks
        tdist.all_gather_object(per_rank, timed)
        if rank != 0:
            return None
    tokens_per_s = ranks * a.batch * a.seq * n / max(per_rank)
    matmul_params, fpt, fpt_lora = flops_per_token(info["config"], info["params_base"], info["embed_params"],
                                                   info["params_trainable"], a.seq)
    achieved, achieved_lora = fpt * tokens_per_s / 1e12, fpt_lora * tokens_per_s / 1e12
    given = a.peak_tflops if a.peak_tflops > 0 else float("nan")

    def num(x):
        return x if math.isfinite(x) else None

    j = {"tool": tool, "device": info["device_name"], "model": a.model, "model_type": info["config"].get("model_type"),
         "seq": a.seq, "batch": a.batch, "rank": a.rank, "alpha": a.alpha, "targets": a.targets,
         "grad_checkpointing": a.grad_checkpointing == "on", "precision": a.precision, "lr": a.lr,
         "warmup": a.warmup, "steps": a.steps, "tokens_per_step": a.batch * a.seq, "tokens_per_s": tokens_per_s,
         "step_s": timed / n, "forward_s": phases.s["forward"] / n, "backward_s": phases.s["backward"] / n,
         "optimizer_s": phases.s["optimizer"] / n, "gpu_kernel_s": None, "peak_mem_bytes": int(peak),
         "peak_mem_kind": "torch.cuda.max_memory_allocated" if cuda else "process peak RSS",
         "params_total": info["params_base"] + info["params_trainable"],
         "params_trainable": info["params_trainable"], "params_matmul": matmul_params, "flops_per_token": fpt,
         "flops_per_token_lora": fpt_lora, "achieved_tflops": achieved, "measured_peak_tflops": num(measured),
         "mfu_measured_peak": num(achieved / measured), "mfu_lora_measured_peak": num(achieved_lora / measured),
         "given_peak_tflops": num(given), "mfu_given_peak": num(achieved / given),
         "mfu_lora_given_peak": num(achieved_lora / given), "skipped_steps": 0, "final_loss": num(losses[-1]),
         "torch": torch.__version__, "threads": torch.get_num_threads()}
    j["ranks"] = ranks
    if ranks > 1:
        j["tokens_per_step"] = ranks * a.batch * a.seq
        j["per_rank_tokens_per_s"] = [a.batch * a.seq * n / t for t in per_rank]
    j.update(info.get("extra", {}))
    if a.losses:
        j["losses"] = [num(x) for x in losses]
    if a.json:
        print(json.dumps(j))
    else:
        mfu = "-" if j["mfu_measured_peak"] is None else f"{100 * j['mfu_measured_peak']:.1f}%"
        print(f"{tool} on {j['device']}: {tokens_per_s:.1f} tokens/s, {timed / n:.4f} s/step (forward "
              f"{j['forward_s']:.4f}, backward {j['backward_s']:.4f}, optimizer {j['optimizer_s']:.4f}), peak "
              f"{peak / 2**20:.1f} MiB ({j['peak_mem_kind']}), {achieved:.4g} TFLOP/s, MFU {mfu} of the measured "
              f"peak, final loss {losses[-1]:.4f}")
    return j
