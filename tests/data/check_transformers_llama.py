#!/usr/bin/env python3
"""mpar's Llama family and Hugging Face transformers' LlamaForCausalLM, both ways, with the real programs:

(a) train_gpt --model llama trains a few steps (tp 2 x pp 2) on a token file and exports with --hf-llama, which
    writes model.safetensors and config.json; LlamaForCausalLM.from_pretrained(dir) loads that directory as it is
    (mpar's config.json, rotary base 50000, not transformers' default) and its logits equal those gpt_logits (an
    mpar program) computes from the same file, and those it computes from the same run exported under mpar's own
    names (the run repeated: training is deterministic), which no conversion touches.
(b) transformers creates a LlamaForCausalLM with random weights (grouped-query attention: 4 heads, 2 key/value
    heads; MLP 64; RMSNorm epsilon 1e-6; every parameter perturbed, norms included) and saves it with
    save_pretrained; gpt_logits loads it on one rank (sizes given, checked against config.json) and at tp 2 x pp 2
    (sizes from config.json alone), and the logits equal transformers'; with --generate, mpar's generate program
    loads the same directory (sizes from config.json) and its greedy ids equal transformers' generate(do_sample=False).

Both check the padded vocabulary: mpar pads 100 ids to 112; those columns of mpar's logits must be masked (below
-1e29), and mpar's loss (its own cross-entropy layer) must equal transformers' cross-entropy over the 100 real ids.
Tolerance: logits within 1e-4 * max(1, max |logit|) (both fp32, sums in other orders), the loss within 1e-5
relative.

    check_transformers_llama.py --train-gpt EXE --gpt-logits EXE [--generate EXE] --work DIR
Exit status: 0 passed, 1 failed, 77 skipped (numpy, torch or transformers missing).
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

V, LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, SEQ = 100, 2, 32, 4, 2, 64, 16


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        raise SystemExit(f"command failed with status {r.returncode}")
    return r.stdout


def model_args(rope_theta):
    return ["--model", "llama", "--vocab", str(V), "--layers", str(LAYERS), "--hidden", str(HIDDEN), "--heads",
            str(HEADS), "--kv-heads", str(KV_HEADS), "--ffn", str(FFN), "--seq", str(SEQ), "--rope-theta",
            str(rope_theta)]


def mpar_logits(exe, weights, ids, targets, out, rope_theta, tp=1, pp=1, hf=True, sizes=True):
    """sizes=False gives no model sizes: gpt_logits reads them from the config.json beside the weights."""
    import numpy as np
    stdout = run([exe, "--safetensors", weights, *(["--hf-llama"] if hf else []), *(model_args(rope_theta) if sizes else []),
                  "--tp", str(tp), "--pp", str(pp), "--ids", ",".join(map(str, ids)), "--targets",
                  ",".join(map(str, targets)), "--out", out])
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
    ap.add_argument("--generate")
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    try:
        import numpy as np
        import torch
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"skipped: {e} (pip install torch transformers numpy; see scripts/install-deps.sh)")
        return 77
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, numpy {np.__version__}")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    rng = np.random.default_rng(11)
    ids = [int(x) for x in rng.integers(0, V, SEQ)]
    targets = ids[1:] + [int(rng.integers(0, V))]
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
    theta_a = 50000.0
    out = run([a.train_gpt, "--data", train, *model_args(theta_a), "--tp", "2", "--pp", "2", "--batch", "8",
               "--microbatches", "2", "--steps", "5", "--lr", "1e-2", "--export", exported, "--hf-llama", "--quiet"])
    print("\n".join(l for l in out.splitlines() if l.startswith(("summary", "exported"))))
    with open(os.path.join(export_dir, "config.json")) as f:
        print("config.json:", json.dumps(json.load(f), sort_keys=True))
    loaded = LlamaForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32)
    cfg = loaded.config
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    got = (cfg.vocab_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size,
           cfg.num_hidden_layers, float(theta), cfg.tie_word_embeddings)
    if got != (V, HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, theta_a, False):
        print("(a) FAILED: transformers read another configuration from mpar's config.json:", got)
        failures += 1
    with open(exported, "rb") as f:
        names = set(json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))) - {"__metadata__"}
    expected = {n for n, _ in loaded.named_parameters()}
    if names != expected:
        print("(a) FAILED: the export's names differ from LlamaForCausalLM's:", sorted(names ^ expected))
        failures += 1
    hf_logits, hf_loss = hf_forward(loaded, ids, targets)
    logits, loss = mpar_logits(a.gpt_logits, exported, ids, targets, os.path.join(a.work, "a.npy"), theta_a)
    failures += compare("(a) train_gpt --model llama tp2 pp2 --export --hf-llama -> LlamaForCausalLM.from_pretrained",
                        hf_logits, hf_loss, logits, loss)
    own = os.path.join(a.work, "mpar_names.safetensors")
    run([a.train_gpt, "--data", train, *model_args(theta_a), "--tp", "2", "--pp", "2", "--batch", "8",
         "--microbatches", "2", "--steps", "5", "--lr", "1e-2", "--export", own, "--quiet"])
    logits, loss = mpar_logits(a.gpt_logits, own, ids, targets, os.path.join(a.work, "a_own.npy"), theta_a, hf=False)
    failures += compare("(a) the same run under mpar's names -> mpar", hf_logits, hf_loss, logits, loss)

    # (b) transformers -> mpar: random weights, every parameter perturbed (the norms' gains included).
    theta_b = 10000.0
    cfg = LlamaConfig(vocab_size=V, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQ,
                      rms_norm_eps=1e-6, rope_theta=theta_b, tie_word_embeddings=False, attention_bias=False,
                      mlp_bias=False, hidden_act="silu", bos_token_id=0, eos_token_id=1)
    torch.manual_seed(5)
    model = LlamaForCausalLM(cfg).float()
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
    # At tp 1 the sizes are given and must agree with config.json; at tp 2 x pp 2 they come from it alone. The
    # RMSNorm epsilon (1e-6, not mpar's default) is never given: only config.json tells it.
    for tp, pp in ((1, 1), (2, 2)):
        logits, loss = mpar_logits(a.gpt_logits, weights, ids, targets, os.path.join(a.work, f"b{tp}{pp}.npy"),
                                   theta_b, tp, pp, sizes=tp == 1)
        failures += compare(f"(b) save_pretrained -> mpar tp{tp} pp{pp}", hf_logits, hf_loss, logits, loss)

    if a.generate:
        prompt, count = ids[:4], 10
        with torch.no_grad():
            hf_ids = model.generate(torch.tensor([prompt]), max_new_tokens=count, do_sample=False,
                                    pad_token_id=0)[0].tolist()[len(prompt):]
        out = run([a.generate, "--safetensors", weights, "--hf-llama", "--prompt-ids",
                   ",".join(map(str, prompt)), "--tokens", str(count), "--temperature", "0"])
        ours = [int(x) for x in out.strip().splitlines()[-1].split(",")]
        print(f"(b) greedy ids: mpar generate {ours}, transformers {hf_ids}")
        if ours != hf_ids:
            print("(b) FAILED: mpar's greedy generation differs from transformers'")
            failures += 1

    print(f"{'FAILED' if failures else 'passed'}: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
