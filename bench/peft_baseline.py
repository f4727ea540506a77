#!/usr/bin/env python3
"""PyTorch + transformers + PEFT LoRA training throughput: the baseline for `lmtune bench train`.

Same arguments and JSON fields as `lmtune bench train` (bench/bench_common.py; docs/benchmarks.md), "tool": "peft".
The step is what a PEFT user writes: a bf16 (or f32) transformers model with attn_implementation="sdpa", LoRA via
peft.LoraConfig on the modules lmtune's all-linear targets (q, k, v, o, gate, up, down projections; not lm_head),
adapter weights in f32 (PEFT's autocast_adapter_dtype), loss = model(input_ids, labels=input_ids).loss (the mean
next-token cross-entropy over B x (T - 1) positions: transformers shifts the labels inside, exactly what lmtune
computes from its shifted targets), global-norm clipping at 1.0 (lmtune's train.grad_clip default), and
torch.optim.AdamW with lmtune's defaults (betas 0.9/0.999, eps 1e-8, weight decay 0; torch's default decay is
0.01), constant learning rate, no dropout. Gradient checkpointing is transformers' non-reentrant one.

  python3 bench/peft_baseline.py --model DIR --seq 2048 --batch 8 --steps 10 --json [--compile]
  python3 bench/peft_baseline.py --model DIR ... --batches batches.safetensors --init-adapter DIR --losses

--quantize nf4 loads the base in 4 bits through bitsandbytes (QLoRA as PEFT users run it: NF4, double-quantized
scales, bf16 compute; "tool": "peft+bnb-nf4"), the peer of `lmtune bench train --quantize nf4`.

--compile runs the model under torch.compile (the default inductor backend; "tool": "peft+compile"), the one-flag
speed-up a PyTorch user reaches for; the warm-up steps include the compilation.

Under torchrun (torchrun --nproc_per_node N bench/peft_baseline.py ...) it trains with DistributedDataParallel
(NCCL on CUDA, gloo on the CPU), one process per GPU (cuda:LOCAL_RANK), --batch rows per rank: the peer of
`lmtune bench train --devices 0,1,...`. Rank 0 prints the aggregate tokens/s and each rank's.

Runs on CUDA (device auto) or the CPU. Needs torch, transformers and peft; nothing is downloaded.
"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def main():
    p = bc.parser(__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="run the model under torch.compile")
    p.add_argument("--quantize", choices=["none", "nf4"], default="none",
                   help="nf4: the base in 4 bits through bitsandbytes (QLoRA)")
    a = p.parse_args()
    bc.check_args(a)
    try:
        import torch
        import transformers
        import peft
    except ImportError as e:
        bc.fail(f"peft_baseline.py needs torch, transformers and peft ({e}); "
                "on a machine without them use bench/torch_cpu_baseline.py")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    ranks, rank, local_rank = (int(os.environ.get(k, d)) for k, d in
                               (("WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)))
    if a.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(a.device)
    if ranks > 1:
        if a.compile or a.quantize != "none":
            bc.fail("under torchrun, --compile and --quantize are not supported")
        import torch.distributed as tdist
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        tdist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    torch.manual_seed(a.seed)

    config = transformers.AutoConfig.from_pretrained(a.model)
    if a.quantize == "nf4":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as e:
            bc.fail(f"--quantize nf4 needs bitsandbytes ({e})")
        if not glob.glob(os.path.join(a.model, "*.safetensors")):
            bc.fail("--quantize nf4 needs a model with *.safetensors weights")
        bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                              bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype)
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa",
                                                                  quantization_config=bnb, device_map={"": device})
        weights = "loaded, nf4 (bitsandbytes)"
    elif glob.glob(os.path.join(a.model, "*.safetensors")):
        model = transformers.AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa")
        weights = "loaded"
    else:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(dtype)
        weights = "random (no *.safetensors)"
    model.config.use_cache = False
    if a.quantize == "none":
        model.to(device)
    base_params = sum(p.numel() for p in model.parameters())
    embed_params = model.get_input_embeddings().weight.numel()
    if a.grad_checkpointing == "on":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if a.init_adapter:
        model = peft.PeftModel.from_pretrained(model, a.init_adapter, is_trainable=True)
        a.rank = int(model.peft_config["default"].r)
        a.alpha = float(model.peft_config["default"].lora_alpha)
    else:
        model = peft.get_peft_model(model, peft.LoraConfig(r=a.rank, lora_alpha=a.alpha, lora_dropout=0.0,
                                                           target_modules=a.target_kinds or None, bias="none",
                                                           target_parameters=a.target_parameters or None,
                                                           task_type="CAUSAL_LM"))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    adapter_dtypes = sorted({str(p.dtype) for p in trainable})
    optimizer = torch.optim.AdamW(trainable, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    cfg = config.to_dict()
    batches = bc.token_batches(torch, a, config.vocab_size, ranks)
    bc.log(f"peft: {cfg.get('model_type')} on {device}, {a.precision}, weights {weights}, batch {a.batch} x seq "
           f"{a.seq}, rank {a.rank}, checkpointing {a.grad_checkpointing}, {n_trainable} trainable ({adapter_dtypes})")

    forward = torch.compile(model) if a.compile else model
    if ranks > 1:  # gradients averaged over ranks in buckets, overlapped with backward (PyTorch's defaults)
        forward = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)

    def step(ids, phases):
        loss = forward(input_ids=ids, labels=ids, use_cache=False).loss
        return bc.backward_and_update(torch, loss, trainable, optimizer, phases)

    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    info = {"batches": batches, "config": cfg, "rank": rank, "ranks": ranks, "params_base": base_params, "embed_params": embed_params,
            "params_trainable": n_trainable, "device_name": f"{device} {name}",
            "extra": {"transformers": transformers.__version__, "peft": peft.__version__, "weights": weights}}
    tool = "peft" + ("+bnb-nf4" if a.quantize == "nf4" else "") + ("+compile" if a.compile else "")
    bc.run(torch, a, tool + (f"+ddp{ranks}" if ranks > 1 else ""), device, sync, step, info)
    if ranks > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
