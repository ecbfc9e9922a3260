#!/usr/bin/env python3
"""Reads mpar's safetensors exports with the `safetensors` package and numpy, and compares every
value with mpar's own dump; with torch + transformers also loads the GPT-2-named export into
`GPT2LMHeadModel` and compares its logits with mpar's.

    check_safetensors.py DIR      (DIR holds mpar.safetensors, gpt2.safetensors, expected.txt, logits.txt)

Exit status: 0 passed, 1 failed, 77 skipped (safetensors or numpy missing).
"""
import os
import sys


def main():
    d = sys.argv[1]
    try:
        import numpy as np
        from safetensors.numpy import load_file
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    # expected.txt: one tensor per line: name, rank, dims..., values (mpar's own values, %.9g).
    expected = {}
    with open(os.path.join(d, "expected.txt")) as f:
        for line in f:
            parts = line.split()
            rank = int(parts[1])
            shape = tuple(int(x) for x in parts[2 : 2 + rank])
            expected[parts[0]] = np.array([float(x) for x in parts[2 + rank :]], dtype=np.float32).reshape(shape)
    got = load_file(os.path.join(d, "mpar.safetensors"))
    failures = 0
    if set(got) != set(expected):
        print("names differ:", sorted(set(got) ^ set(expected)))
        failures += 1
    for name, want in expected.items():
        if name in got and (got[name].dtype != np.float32 or got[name].shape != want.shape or not np.array_equal(got[name], want)):
            print(f"{name}: differs (dtype {got[name].dtype}, shape {got[name].shape} vs {want.shape})")
            failures += 1
    gpt2 = load_file(os.path.join(d, "gpt2.safetensors"))
    qkv = expected["block0.attn.qkv.weight"]
    if not np.array_equal(gpt2["transformer.h.0.attn.c_attn.weight"], qkv.reshape(qkv.shape[0], -1)):
        print("c_attn.weight is not the flattened qkv weight")
        failures += 1
    print(f"safetensors + numpy: {len(expected)} tensors compared, {failures} failures")
    try:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"transformers comparison skipped: {e}")
        return 1 if failures else 0
    meta = {}
    with open(os.path.join(d, "logits.txt")) as f:
        header = f.readline().split()
        meta = dict(zip(header[0::2], (int(x) for x in header[1::2])))
        ids = [int(x) for x in f.readline().split()]
        logits = np.array([float(x) for x in f.read().split()], dtype=np.float32).reshape(len(ids), meta["vocab"])
    cfg = GPT2Config(vocab_size=meta["vocab"], n_positions=meta["seq"], n_embd=meta["hidden"], n_layer=meta["layers"],
                     n_head=meta["heads"], activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     bos_token_id=meta["vocab"] - 1, eos_token_id=meta["vocab"] - 1,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    model = GPT2LMHeadModel(cfg)
    state = {k: torch.from_numpy(v) for k, v in gpt2.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "lm_head.weight" and not m.endswith(".attn.bias") and not m.endswith("masked_bias")]
    if missing or unexpected:
        print("state dict mismatch: missing", missing, "unexpected", unexpected)
        return 1
    model.eval()
    with torch.no_grad():
        hf = model(torch.tensor([ids])).logits[0].numpy()
    err = float(np.max(np.abs(hf - logits)))
    print(f"transformers GPT2LMHeadModel logits vs mpar: max abs difference {err:.3g}")
    if err > 1e-4:
        failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
