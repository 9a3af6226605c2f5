#!/usr/bin/python3
"""PyTorch float64 reference for gpt-train's fused attention test (tests/attention_test.cpp).

    attention_torch_reference.py DIR

DIR/cases.json: [{"B", "T", "H", "G", "D", "qkv": file, "dout": file}, ...] with raw little-endian float32
files (relative to DIR): qkv [B*T, (H+2G)*D] (per token q for heads 0..H-1, then k for key/value heads
0..G-1, then v; G is optional and defaults to H) and dout [B*T, H*D]. Query head h uses key/value head
h // (H/G) (grouped-query attention, repeat_interleave of K and V as Hugging Face's repeat_kv does). For each
case i writes DIR/out_i.bin [B*T, H*D], DIR/lse_i.bin [B, H, T] (natural-log log-sum-exp of each query
row's scaled causal scores) and DIR/dqkv_i.bin [B*T, (H+2G)*D], all raw float64, computed in float64 with
autograd from the textbook definition softmax(Q K^T / sqrt(D) + causal mask) V.
Malformed input exits with status 2 and a message naming the file.
"""
import json
import os
import sys

import numpy as np
import torch


def load(path, count):
    data = np.fromfile(path, dtype="<f4")
    if data.size != count:
        sys.exit(f"{path}: expected {count} float32 values, found {data.size}")
    return torch.from_numpy(data.astype(np.float64))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    try:
        with open(os.path.join(root, "cases.json")) as f:
            cases = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{os.path.join(root, 'cases.json')}: {e}", file=sys.stderr)
        sys.exit(2)
    for i, c in enumerate(cases):
        B, T, H, D = (int(c[k]) for k in "BTHD")
        G = int(c.get("G", H))
        if G <= 0 or H % G:
            sys.exit(f"case {i}: G={G} does not divide H={H}")
        qkv = load(os.path.join(root, c["qkv"]), B * T * (H + 2 * G) * D).view(B, T, H + 2 * G, D)
        qkv.requires_grad_(True)
        dout = load(os.path.join(root, c["dout"]), B * T * H * D).view(B, T, H, D)
        q = qkv[:, :, :H].transpose(1, 2)  # [B, H, T, D]
        k, v = (qkv[:, :, H + p * G:H + (p + 1) * G].transpose(1, 2).repeat_interleave(H // G, dim=1)
                for p in range(2))
        scores = q @ k.transpose(-1, -2) / D ** 0.5
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # [B, H, T]
        out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2)  # [B, T, H, D]
        out.backward(dout)
        out.detach().numpy().astype("<f8").tofile(os.path.join(root, f"out_{i}.bin"))
        lse.detach().numpy().astype("<f8").tofile(os.path.join(root, f"lse_{i}.bin"))
        qkv.grad.numpy().astype("<f8").tofile(os.path.join(root, f"dqkv_{i}.bin"))


if __name__ == "__main__":
    main()
