#!/usr/bin/python3
"""Generation speed of `gpt-train generate` against PyTorch on the same weights and the same machine.

Makes a GPT-2-shaped checkpoint (one training step on synthetic data, so the weights are real trained
ones and every layer counts), exports it with `gpt-train convert` to Hugging Face GPT-2 safetensors, and
decodes greedily from the same prompt with both:
  - gpt-train generate (key/value cache, --temperature 0);
  - a small PyTorch GPT-2 written here from the published architecture (pre-LN, tanh GELU, tied head),
    with its own preallocated key/value cache, reading the exported safetensors.
Reports one-token decoding steps per second for each (the prompt's pass excluded), their ratio, and how many of the greedy tokens
agree (candidates are the byte tokenizer's 257 ids, as gpt-train's generate restricts them; compared as
decoded text, invalid UTF-8 replaced on both sides).

  /usr/bin/python3 bench/generate_bench.py --gpt-train build/gpt-train --threads 2 [--dtype bf16]
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, e in header.items():
            if name == "__metadata__":
                continue
            a, b = e["data_offsets"]
            f.seek(base + a)
            assert e["dtype"] == "F32", e["dtype"]
            out[name] = torch.from_numpy(np.frombuffer(f.read(b - a), np.float32).reshape(e["shape"]).copy())
        return out


class TorchGpt2:
    def __init__(self, w, layers, heads, dtype):
        self.w = {k: v.to(dtype) for k, v in w.items()}
        self.L, self.H = layers, heads
        self.length = 0  # positions in the key/value cache

    def step(self, ids, cache):
        """ids: [n] new tokens at positions len(cache)...; returns logits of the last one."""
        w, H = self.w, self.H
        past = self.length
        self.length += ids.shape[0]
        n = ids.shape[0]
        x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][past:past + n]
        C = x.shape[-1]
        D = C // H
        for l in range(self.L):
            p = f"transformer.h.{l}."
            h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
            qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = (t.view(n, H, D).transpose(0, 1) for t in qkv.split(C, dim=-1))
            if len(cache) <= l:  # preallocated per layer, filled in place (no concatenation per step)
                shape = (H, self.w["transformer.wpe.weight"].shape[0], D)
                cache.append((torch.empty(shape, dtype=x.dtype), torch.empty(shape, dtype=x.dtype)))
            cache[l][0][:, past:past + n] = k
            cache[l][1][:, past:past + n] = v
            T = past + n
            k, v = cache[l][0][:, :T], cache[l][1][:, :T]
            mask = torch.ones(n, T, dtype=torch.bool).tril(T - n)
            s = (q @ k.transpose(1, 2)) * (1.0 / D ** 0.5)
            a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
            x = x + a.transpose(0, 1).reshape(n, C) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
            h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = F.layer_norm(x[-1:], (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], 1e-5)
        return (x @ w["transformer.wte.weight"].T)[0].float()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpt-train", default="build/gpt-train")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--new-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--prompt", default="In the beginning the Universe was created. This has made a lot of people "
                    "very angry and been widely regarded as a bad move.")
    ap.add_argument("--work-dir", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    work = a.work_dir or tempfile.mkdtemp(prefix="generate_bench_")
    os.makedirs(work, exist_ok=True)
    ckpt, st = os.path.join(work, "ckpt"), os.path.join(work, "model.safetensors")
    sets = [f"model.num_layers={a.layers}", f"model.hidden_size={a.hidden}", f"model.num_heads={a.heads}",
            f"model.seq_length={a.seq}", f"model.vocab_size={a.vocab}", "model.ffn_hidden_size=0",
            "training.micro_batch_size=1", "training.global_batch_size=1", "training.train_iters=1",
            f"precision.dtype={a.dtype}", "eval.interval=0", "logging.metrics_file=", f"checkpoint.dir={ckpt}",
            "data.train=[]", "data.synthetic=random"]
    if not os.path.isdir(ckpt):
        cmd = [a.gpt_train, "train", "--config", "configs/tiny-cpu.yaml"] + sum((["--set", s] for s in sets), [])
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    if not os.path.exists(st):
        subprocess.run([a.gpt_train, "convert", "--from", ckpt, "--to", st], check=True, env=env,
                       stdout=subprocess.DEVNULL)

    # gpt-train (the checkpoint trained on synthetic data records no tokenizer: bytes by flag)
    r = subprocess.run([a.gpt_train, "generate", "--load", ckpt, "--tokenizer", "bytes", "--prompt", a.prompt,
                        "--temperature", "0", "--max-new-tokens", str(a.new_tokens)],
                       check=True, env=env, capture_output=True)
    ours = float(re.search(r"([0-9.]+) tokens/s", r.stderr.decode()).group(1))
    text_ours = r.stdout.decode()[len(a.prompt):-1]  # the prompt, the new text, one newline

    # PyTorch on the exported weights
    model = TorchGpt2(read_safetensors(st), a.layers, a.heads, torch.float32 if a.dtype == "fp32" else torch.bfloat16)
    ids = [256] + list(a.prompt.encode())
    cache = []
    with torch.no_grad():
        logits = model.step(torch.tensor(ids), cache)
        new_ids, steps = [], 0  # steps: one-token decoding passes, as gpt-train counts them
        t0 = time.perf_counter()
        while len(new_ids) < a.new_tokens:
            nxt = int(torch.argmax(logits[:257]))
            if nxt == 256:
                break
            new_ids.append(nxt)
            if len(new_ids) == a.new_tokens or len(ids) + len(new_ids) == a.seq:
                break
            logits = model.step(torch.tensor([nxt]), cache)
            steps += 1
        torch_s = time.perf_counter() - t0
    theirs = steps / torch_s
    text_theirs = bytes(new_ids).decode("utf-8", "replace")
    agree = 0
    for x, y in zip(text_ours, text_theirs):
        if x != y:
            break
        agree += 1
    cpu = "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    print(f"CPU: {cpu}, {a.threads} thread(s); GPT-2 shape L={a.layers} C={a.hidden} H={a.heads} V={a.vocab}, "
          f"{a.dtype}, prompt {len(ids)} tokens, greedy")
    print(f"gpt-train generate: {ours:8.1f} tokens/s")
    print(f"PyTorch {torch.__version__:>10}: {theirs:8.1f} tokens/s   ({len(new_ids)} tokens)")
    print(f"ratio gpt-train / PyTorch: {ours / theirs:.2f}x;  greedy text identical for {agree} of "
          f"{max(len(text_ours), len(text_theirs))} characters")


if __name__ == "__main__":
    main()
