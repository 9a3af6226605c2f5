#!/usr/bin/python3
"""PyTorch float64 reference for gpt-train's fused attention test (tests/attention_test.cpp).

    attention_torch_reference.py DIR

DIR/cases.json: [{"B", "T", "H", "D", "qkv": file, "dout": file}, ...] with raw little-endian float32
files (relative to DIR): qkv [B*T, 3*H*D] (per token q for heads 0..H-1, then k, then v) and dout
[B*T, H*D]. For each case i writes DIR/out_i.bin [B*T, H*D], DIR/lse_i.bin [B, H, T] (natural-log
log-sum-exp of each query row's scaled causal scores) and DIR/dqkv_i.bin [B*T, 3*H*D], all raw float64,
computed in float64 with autograd from the textbook definition softmax(Q K^T / sqrt(D) + causal mask) V.
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
        qkv = load(os.path.join(root, c["qkv"]), B * T * 3 * H * D).view(B, T, 3, H, D).requires_grad_(True)
        dout = load(os.path.join(root, c["dout"]), B * T * H * D).view(B, T, H, D)
        q, k, v = (qkv[:, :, p].transpose(1, 2) for p in range(3))  # [B, H, T, D]
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
