#!/usr/bin/python3
"""PyTorch side of the CPU training-throughput benchmark: trains the gpt-train architecture
(scripts/torch_gpt.py) on random tokens with AdamW and global-norm gradient clipping, exactly the work a
gpt-train step does, and reports tokens/s, mean step time and peak resident memory.

    bench_torch.py --layers L --hidden C --heads H --seq T --batch B --vocab V [--ffn F] [--steps N]
                   [--warmup W] [--threads K] [--dtype fp32|bf16] [--json]

The vocabulary is padded to a multiple of 128 as gpt-train does. bf16 runs the forward pass (and so the
matching backward kernels) under torch.autocast("cpu", dtype=torch.bfloat16) with fp32 weights and
optimizer state, the usual PyTorch mixed-precision recipe. With --json a single JSON line
{"impl": "pytorch", "tokens_per_s", "step_ms", "peak_rss_mb", ...} is printed last.

Threads: this torch links the pthread build of OpenBLAS, whose thread pool torch.set_num_threads does not
control, next to torch's own OpenMP pool. --threads K therefore sets OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS to K before torch is loaded, and OMP_WAIT_POLICY defaults to PASSIVE because
spinning OpenMP workers otherwise starve the BLAS threads (and vice versa) when the two pools share few
cores; on 2 cores this more than doubled throughput. Variables already set in the environment win.
"""

import argparse
import contextlib
import json
import os
import resource
import sys
import time

# torch is imported in main(), after the thread environment has been set (see configure_threads).
torch = None
torch_gpt = None

LR = 1e-4
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)  # gpt-train's optimizer defaults
EPS = 1e-8
CLIP_GRAD = 1.0


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--ffn", type=int, default=0, help="MLP hidden size (default 4 * hidden)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--json", action="store_true", help="print one JSON result line")
    args = parser.parse_args(argv)
    for name in ("layers", "hidden", "heads", "seq", "batch", "vocab", "steps"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive")
    if args.warmup < 0 or args.ffn < 0 or args.threads < 0:
        parser.error("--warmup, --ffn and --threads must not be negative")
    return args


def configure_threads(threads):
    """Sets the thread-pool environment; must run before torch (and so libgomp, OpenBLAS) is loaded."""
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        os.environ.setdefault("OPENBLAS_NUM_THREADS", str(threads))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def import_torch():
    global torch, torch_gpt
    import torch as torch_module
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_gpt as torch_gpt_module
    torch, torch_gpt = torch_module, torch_gpt_module


def make_optimizer(model):
    """AdamW with weight decay on matrices (embeddings included) and none on biases and layernorm gains."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS)


def train_step(model, optimizer, batch, autocast):
    optimizer.zero_grad(set_to_none=True)
    with autocast():
        loss = model.loss(batch[:, :-1], batch[:, 1:])
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_GRAD)
    optimizer.step()
    return loss.detach(), grad_norm


def main(argv=None):
    args = parse_args(argv)
    configure_threads(args.threads)
    import_torch()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = torch_gpt.GPTConfig(num_layers=args.layers, hidden_size=args.hidden, num_heads=args.heads,
                              ffn_hidden_size=args.ffn or 4 * args.hidden, seq_length=args.seq,
                              vocab_size=args.vocab, padded_vocab_size=torch_gpt.padded_vocab_size(args.vocab))
    try:
        model = torch_gpt.GPT(cfg)
    except ValueError as e:
        print(f"bench_torch: error: {e}", file=sys.stderr)
        return 2
    torch_gpt.init_weights(model, seed=args.seed)
    model.train()
    optimizer = make_optimizer(model)
    if args.dtype == "bf16":
        autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext

    # Data is generated up front so that the timed loop measures training only.
    total = args.warmup + args.steps
    batches = torch.randint(0, cfg.vocab_size, (total, args.batch, cfg.seq_length + 1))

    for step in range(args.warmup):
        train_step(model, optimizer, batches[step], autocast)
    step_seconds = []
    for step in range(args.warmup, total):
        start = time.perf_counter()
        loss, grad_norm = train_step(model, optimizer, batches[step], autocast)
        loss = loss.item()  # forces completion of the step before the clock stops
        step_seconds.append(time.perf_counter() - start)

    tokens_per_step = args.batch * cfg.seq_length
    elapsed = sum(step_seconds)
    result = {
        "impl": "pytorch",
        "tokens_per_s": tokens_per_step * len(step_seconds) / elapsed,
        "step_ms": 1000.0 * elapsed / len(step_seconds),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,  # Linux reports KiB
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "layers": cfg.num_layers, "hidden": cfg.hidden_size, "heads": cfg.num_heads,
        "ffn": cfg.ffn_hidden_size, "seq": cfg.seq_length, "batch": args.batch,
        "vocab": cfg.vocab_size, "padded_vocab": cfg.padded_vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "steps": args.steps, "warmup": args.warmup,
        "final_loss": loss, "final_grad_norm": float(grad_norm),
        "torch_version": torch.__version__,
        "env": {k: os.environ.get(k, "") for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY")},
    }
    print(f"pytorch {args.dtype} threads={result['threads']}: {result['tokens_per_s']:.1f} tokens/s, "
          f"{result['step_ms']:.1f} ms/step, peak RSS {result['peak_rss_mb']:.0f} MB, "
          f"loss {loss:.4f} ({result['parameters']} parameters, {args.steps} timed steps)")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
