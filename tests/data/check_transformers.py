#!/usr/bin/env python3
"""mpar and Hugging Face transformers, both ways, with the real programs:

(a) train_gpt trains a GPT a few steps (tp 2 x pp 2) on a token file and exports it with --hf-gpt2;
    transformers' GPT2LMHeadModel loads the file (from_pretrained, beside a config.json) and its logits
    equal those gpt_logits (an mpar program) computes from the same file.
(b) transformers creates a GPT-2-shaped model with random weights and saves it with save_pretrained
    (safetensors); gpt_logits loads it on one rank and at tp 2 x pp 2, and the logits equal transformers'.

Both check the padded vocabulary columns: mpar pads 100 ids to 112 (a multiple of lcm(16, tp)); those
columns of mpar's logits must be masked (below -1e29), and mpar's loss (its own cross-entropy layer)
must equal transformers' cross-entropy over the 100 real ids.

Tolerance: logits within 1e-4 * max(1, max |logit|) (both fp32; the sums run in other orders), the
loss within 1e-5 relative.

    check_transformers.py --train-gpt EXE --gpt-logits EXE --work DIR
Exit status: 0 passed, 1 failed, 77 skipped (numpy, torch or transformers missing).
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

V, LAYERS, HIDDEN, HEADS, SEQ = 100, 2, 32, 4, 16


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"command failed with status {r.returncode}")
    return r.stdout


def model_args():
    return ["--vocab", str(V), "--layers", str(LAYERS), "--hidden", str(HIDDEN), "--heads", str(HEADS), "--seq", str(SEQ)]


def mpar_logits(exe, weights, ids, targets, out, tp=1, pp=1):
    import numpy as np
    stdout = run([exe, "--safetensors", weights, "--hf-gpt2", *model_args(), "--tp", str(tp), "--pp", str(pp),
                  "--ids", ",".join(map(str, ids)), "--targets", ",".join(map(str, targets)), "--out", out])
    loss = float(stdout.split("loss")[-1])
    return np.load(out), loss


def compare(label, hf_logits, hf_loss, logits, loss):
    import numpy as np
    failures = 0
    real, pad = logits[:, :V], logits[:, V:]
    scale = max(1.0, float(np.max(np.abs(hf_logits))))
    err = float(np.max(np.abs(real - hf_logits)))
    print(f"{label}: mpar logits [{logits.shape[0]}, {logits.shape[1]}], max |mpar - transformers| = {err:.3g} "
          f"(max |logit| {scale:.3g}); loss mpar {loss:.7f} transformers {hf_loss:.7f}; "
          f"{pad.shape[1]} padded columns, largest {float(pad.max()) if pad.size else float('nan'):.3g}")
    if err > 1e-4 * scale:
        print(f"{label}: FAILED: logits differ by {err}")
        failures += 1
    if pad.shape[1] == 0 or not np.all(pad < -1e29):
        print(f"{label}: FAILED: the padded vocabulary columns are not masked")
        failures += 1
    if abs(loss - hf_loss) > 1e-5 * abs(hf_loss):
        print(f"{label}: FAILED: the loss differs")
        failures += 1
    return failures


def hf_forward(model, ids, targets):
    import torch
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
        loss = torch.nn.functional.cross_entropy(logits.double(), torch.tensor(targets)).item()
    return logits.numpy(), loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-gpt", required=True)
    ap.add_argument("--gpt-logits", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    try:
        import numpy as np
        import torch
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"skipped: {e} (pip install torch transformers numpy; see scripts/install-deps.sh)")
        return 77
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    rng = np.random.default_rng(7)
    ids = [int(x) for x in rng.integers(0, V, SEQ)]
    targets = ids[1:] + [int(rng.integers(0, V))]
    cfg = GPT2Config(vocab_size=V, n_positions=SEQ, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=V - 1, eos_token_id=V - 1)
    failures = 0

    # (a) mpar -> transformers. A token file in llm.c's format: ids with some structure to learn (a walk).
    tokens = np.cumsum(rng.integers(1, 4, 20000)) % V
    train = os.path.join(a.work, "train.bin")
    with open(train, "wb") as f:
        header = [20240520, 1, len(tokens)] + [0] * 253
        f.write(struct.pack("<256i", *header))
        f.write(tokens.astype("<u2").tobytes())
    export_dir = os.path.join(a.work, "mpar_export")
    os.makedirs(export_dir)
    exported = os.path.join(export_dir, "model.safetensors")
    out = run([a.train_gpt, "--data", train, *model_args(), "--tp", "2", "--pp", "2", "--batch", "8",
               "--microbatches", "2", "--steps", "5", "--lr", "1e-2", "--export", exported, "--hf-gpt2", "--quiet"])
    print("\n".join(l for l in out.splitlines() if l.startswith(("summary", "exported"))))
    cfg.save_pretrained(export_dir)  # config.json beside the weights: a directory from_pretrained reads
    loaded = GPT2LMHeadModel.from_pretrained(export_dir)
    with open(os.path.join(export_dir, "model.safetensors"), "rb") as f:
        names = set(json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))) - {"__metadata__"}
    expected = {n for n, _ in loaded.named_parameters()} - {"lm_head.weight"}
    if names != expected:
        print("(a) FAILED: the export's names differ from GPT2LMHeadModel's:", sorted(names ^ expected))
        failures += 1
    if not torch.equal(loaded.lm_head.weight, loaded.transformer.wte.weight):
        print("(a) FAILED: lm_head is not tied to wte after loading")
        failures += 1
    hf_logits, hf_loss = hf_forward(loaded, ids, targets)
    logits, loss = mpar_logits(a.gpt_logits, exported, ids, targets, os.path.join(a.work, "a.npy"))
    failures += compare("(a) train_gpt tp2 pp2 --export --hf-gpt2 -> GPT2LMHeadModel.from_pretrained", hf_logits,
                        hf_loss, logits, loss)

    # (b) transformers -> mpar: random weights, every parameter perturbed (layer norms included).
    torch.manual_seed(3)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf_dir = os.path.join(a.work, "hf_model")
    try:
        model.save_pretrained(hf_dir, safe_serialization=True)
    except TypeError:  # versions where safetensors is the only format
        model.save_pretrained(hf_dir)
    weights = os.path.join(hf_dir, "model.safetensors")
    if not os.path.exists(weights):
        print("(b) FAILED: save_pretrained wrote no model.safetensors:", os.listdir(hf_dir))
        return 1
    hf_logits, hf_loss = hf_forward(model, ids, targets)
    for tp, pp in ((1, 1), (2, 2)):
        logits, loss = mpar_logits(a.gpt_logits, weights, ids, targets, os.path.join(a.work, f"b{tp}{pp}.npy"), tp, pp)
        failures += compare(f"(b) save_pretrained -> mpar tp{tp} pp{pp}", hf_logits, hf_loss, logits, loss)

    print(f"{'FAILED' if failures else 'passed'}: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
