#!/usr/bin/env python3
"""PyTorch on one GPU, the peer of train_gpt --backend cuda: the same GPT, batch and optimizer, eager or compiled.

The model is bench/train_gpt/pytorch_gpt.py's (mpar's models::GptPipelinePart in PyTorch: learned positions, pre-LN
blocks with a fused QKV linear, causal scaled_dot_product_attention, tanh GeLU MLP of width 4h, final LayerNorm,
head tied to the token embedding over the vocabulary padded to a multiple of 16, no dropout). One training step is
what mpar's trainer does per step: the whole batch of --batch sequences forward and backward in one micro-batch, the
forward under torch.autocast("cuda", torch.bfloat16) for --precision bf16 (fp32 parameters, as mpar's fp32 masters
with bf16 compute), global gradient-norm clipping at 1.0, AdamW (fused). Tokens are random ids: the throughput of a
step does not depend on the text.

  torch_gpt_cuda.py --mode eager|compile --hidden H --layers L --heads N --seq S --vocab V --batch B
                    [--precision bf16|fp32] [--warm W] [--steps K] [--peak-tflops P]

The first --warm steps (with --mode compile: the compilation) are not counted; the step time is the mean of the
--steps counted steps, each timed to a device synchronisation, as train_gpt's summary averages its steps after the
first. FLOPs per step are mpar's count (plan::GptModel::model_flops, Narayanan et al. 2021): 3 l (24 B s h^2 +
4 B s^2 h) + 6 B s h V, no recomputation; MFU = those FLOPs per second over --peak-tflops. The last line printed is
one JSON object. Exits 2 with the reason when PyTorch or a CUDA device is missing.
"""
import argparse
import json
import os
import sys
import time


def model_flops(layers, hidden, seq, vocab, batch):
    """FLOPs of one training step as mpar counts them (include/mpar/plan/model.hpp, GptModel::model_flops)."""
    per_layer_forward = 24 * batch * seq * hidden * hidden + 4 * batch * seq * seq * hidden
    return 3 * layers * per_layer_forward + 6 * batch * seq * hidden * vocab


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["eager", "compile"], required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True, help="the padded vocabulary train_gpt reports")
    p.add_argument("--batch", type=int, required=True, help="sequences per step (one micro-batch)")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--warm", type=int, default=2, help="uncounted steps first (compile: includes compiling)")
    p.add_argument("--steps", type=int, default=5, help="counted steps")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200 SXM: 989)")
    a = p.parse_args(argv)
    if a.hidden % a.heads:
        p.error(f"--hidden {a.hidden} is not divisible by --heads {a.heads}")
    if min(a.hidden, a.layers, a.heads, a.seq, a.vocab, a.batch, a.steps) < 1 or a.warm < 0:
        p.error("sizes and --steps must be at least 1, --warm at least 0")
    return a


def main(argv):
    args = parse(argv)
    try:
        import torch
    except ImportError as e:
        print(f"torch_gpt_cuda.py: needs PyTorch, and python3 cannot import torch ({e}); pip install torch",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"torch_gpt_cuda.py: torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pytorch_gpt import Gpt  # the model definition shared with the CPU baseline

    dev = torch.device("cuda")
    torch.manual_seed(1)
    model = Gpt(args.vocab, args.hidden, args.heads, args.layers, args.seq).to(dev)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.999), eps=1e-8, fused=True)
    step_model = torch.compile(model) if args.mode == "compile" else model
    bf16 = args.precision == "bf16"
    gen = torch.Generator(device=dev).manual_seed(1234)

    def step():
        x = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev, generator=gen)
        y = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev, generator=gen)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    name = torch.cuda.get_device_name(0)
    print(f"torch_gpt_cuda: torch {torch.__version__} on {name}, {args.mode}, {params} parameters (hidden "
          f"{args.hidden}, {args.layers} layers, {args.heads} heads, seq {args.seq}, vocab {args.vocab}), batch "
          f"{args.batch}, {args.precision}, AdamW; {args.warm} warm-up + {args.steps} counted steps", flush=True)
    t0 = time.perf_counter()
    for _ in range(args.warm):
        step()
    torch.cuda.synchronize()
    warm_seconds = time.perf_counter() - t0
    walls, loss = [], 0.0
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = step()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t)
        loss = out.item()
    step_seconds = sum(walls) / len(walls)
    flops = model_flops(args.layers, args.hidden, args.seq, args.vocab, args.batch)
    tflops = flops / step_seconds / 1e12
    tokens = args.batch * args.seq / step_seconds
    print(f"torch_gpt_cuda: {tokens:.0f} tokens/s, {step_seconds * 1e3:.1f} ms/step, {tflops:.1f} model TFLOP/s, "
          f"MFU {tflops / args.peak_tflops:.3f} (peak {args.peak_tflops:g}); warm-up {warm_seconds:.1f} s; "
          f"loss {loss:.4f}; peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    print(json.dumps({"bench": "torch_gpt_cuda", "mode": args.mode, "tokens_per_second": tokens,
                      "step_seconds": step_seconds, "model_flops_per_step": flops, "model_tflops": tflops,
                      "mfu": tflops / args.peak_tflops, "peak_tflops": args.peak_tflops, "warm_seconds": warm_seconds,
                      "loss": loss, "parameters": params, "torch": torch.__version__, "gpu": name,
                      "precision": args.precision, "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                      "seq": args.seq, "vocab": args.vocab, "batch": args.batch}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
