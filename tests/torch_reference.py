#!/usr/bin/python3
"""PyTorch reference for gpt-train's whole-model gradient test: reads a model's weights and a token
batch written by the C++ side, computes the loss and every parameter's gradient with PyTorch, and writes
them back in the same manifest format so the C++ test can compare.

    torch_reference.py IN_DIR OUT_DIR [--threads K]
    torch_reference.py --selftest

IN_DIR/manifest.json: {"config": {num_layers, hidden_size, num_heads, ffn_hidden_size, seq_length,
vocab_size, padded_vocab_size, and optionally the Llama-style options position_embedding_type,
rotary_base, rotary_percent, normalization, swiglu, num_query_groups, untie_embeddings_and_output_weights,
add_bias_linear, layernorm_eps (absent = the GPT-2 model; see scripts/torch_gpt.py for their meaning and
the parameter layout)}, "tensors": [{"name", "shape", "file"}, ...]} with one raw little-endian
float32 file per parameter (file relative to IN_DIR), and IN_DIR/tokens.bin: int32 [B, seq_length + 1]
(inputs = tokens[:, :T], targets = tokens[:, 1:]). The model runs in float64 (the written results) and in
float32 (a measure of how far float32 arithmetic drifts, reported alongside). Outputs:
OUT_DIR/loss.json {"loss": float64, "loss_fp32": float32 loss, "batch_size": B} and OUT_DIR/manifest.json
(same layout, "dtype": "float64", each tensor entry with "dtype" and "fp32_max_abs_diff") plus one raw
little-endian float64 gradient file per parameter named "<parameter name>.bin". Malformed input exits
with status 2 and a message naming the file and what is wrong. --selftest checks this script itself
(finite differences, an independent NumPy forward pass, file round trip, malformed-input detection) and
exits 0 when every check passes, 1 otherwise.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch
from torch.nn.utils import stateless

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import torch_gpt  # noqa: E402

CONFIG_KEYS = torch_gpt.GPTConfig.SIZE_FIELDS  # required
OPTIONAL_CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(torch_gpt.GPTConfig)
                             if f.name not in CONFIG_KEYS)  # absent = GPTConfig's default
FLOAT_CONFIG_KEYS = ("rotary_base", "rotary_percent", "layernorm_eps")


class ReferenceInputError(Exception):
    """The input directory does not describe a valid model and batch."""


# ----------------------------------------------------------------------------------------------- input

def read_json(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ReferenceInputError(f"{path}: file not found")
    except json.JSONDecodeError as e:
        raise ReferenceInputError(f"{path}: invalid JSON: {e}")


def parse_config(manifest, path):
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise ReferenceInputError(f"{path}: missing object 'config'")
    raw = manifest["config"]
    missing = [k for k in CONFIG_KEYS if k not in raw]
    if missing:
        raise ReferenceInputError(f"{path}: config is missing key(s) {', '.join(missing)}")
    values = {k: raw[k] for k in CONFIG_KEYS + OPTIONAL_CONFIG_KEYS if k in raw}
    for k in FLOAT_CONFIG_KEYS:  # JSON writes 10000.0 as 10000
        if k in values and isinstance(values[k], int) and not isinstance(values[k], bool):
            values[k] = float(values[k])
    try:
        cfg = torch_gpt.GPTConfig(**values)
        cfg.validate()
    except ValueError as e:
        raise ReferenceInputError(f"{path}: {e}")
    return cfg


def read_raw(path, dtype, count, what):
    """Reads exactly `count` elements of little-endian `dtype` from path."""
    try:
        size = os.path.getsize(path)
    except OSError:
        raise ReferenceInputError(f"{path}: {what} file not found")
    itemsize = np.dtype(dtype).itemsize
    if size != count * itemsize:
        raise ReferenceInputError(f"{path}: {what} has {size} bytes, expected {count * itemsize} "
                                  f"({count} x {np.dtype(dtype).name})")
    return np.fromfile(path, dtype=dtype, count=count)


def load_parameters(in_dir, manifest, cfg, path):
    """Returns name -> float32 array for every parameter, checking names, shapes and file sizes."""
    entries = manifest.get("tensors")
    if not isinstance(entries, list):
        raise ReferenceInputError(f"{path}: missing list 'tensors'")
    expected = torch_gpt.parameter_shapes(cfg)
    params = {}
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not all(k in entry for k in ("name", "shape", "file")):
            raise ReferenceInputError(f"{path}: tensors[{index}] needs 'name', 'shape' and 'file'")
        name, shape = entry["name"], entry["shape"]
        if name not in expected:
            raise ReferenceInputError(f"{path}: tensors[{index}] has unknown parameter name '{name}'")
        if name in params:
            raise ReferenceInputError(f"{path}: parameter '{name}' is listed twice")
        if entry.get("dtype", "float32") != "float32":
            raise ReferenceInputError(f"{path}: parameter '{name}' has dtype '{entry['dtype']}', "
                                      f"expected float32")
        if not isinstance(shape, list) or tuple(shape) != expected[name]:
            raise ReferenceInputError(f"{path}: parameter '{name}' has shape {shape}, expected "
                                      f"{list(expected[name])} for this config")
        count = int(np.prod(shape))
        data = read_raw(os.path.join(in_dir, entry["file"]), "<f4", count, f"parameter '{name}'")
        if not np.all(np.isfinite(data)):
            raise ReferenceInputError(f"{entry['file']}: parameter '{name}' holds non-finite values")
        params[name] = data.reshape(shape)
    missing = [n for n in expected if n not in params]
    if missing:
        raise ReferenceInputError(f"{path}: missing parameter(s) {', '.join(missing)}")
    return params


def load_tokens(path, cfg):
    """tokens.bin: int32 [B, seq_length + 1], every id in [0, vocab_size)."""
    row = cfg.seq_length + 1
    try:
        size = os.path.getsize(path)
    except OSError:
        raise ReferenceInputError(f"{path}: token file not found")
    if size == 0 or size % (4 * row) != 0:
        raise ReferenceInputError(f"{path}: {size} bytes is not a positive multiple of "
                                  f"(seq_length + 1) * 4 = {4 * row}")
    tokens = np.fromfile(path, dtype="<i4").reshape(-1, row)
    bad = (tokens < 0) | (tokens >= cfg.vocab_size)
    if bad.any():
        b, t = np.argwhere(bad)[0]
        raise ReferenceInputError(f"{path}: token [{b}, {t}] = {tokens[b, t]} is outside "
                                  f"[0, vocab_size = {cfg.vocab_size})")
    return tokens.astype(np.int64)


# ------------------------------------------------------------------------------------------- compute

def build_model(cfg, params, dtype):
    model = torch_gpt.GPT(cfg).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(np.asarray(params[name])).to(dtype))
    return model


def loss_and_grads(cfg, params, tokens, dtype):
    """Loss (python float) and name -> gradient (numpy, `dtype`) of the mean cross-entropy."""
    model = build_model(cfg, params, dtype)
    batch = torch.from_numpy(tokens)
    loss = model.loss(batch[:, :-1], batch[:, 1:])
    loss.backward()
    grads = {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}
    return loss.item(), grads


def run_reference(in_dir, out_dir):
    manifest_path = os.path.join(in_dir, "manifest.json")
    manifest = read_json(manifest_path)
    cfg = parse_config(manifest, manifest_path)
    params = load_parameters(in_dir, manifest, cfg, manifest_path)
    tokens = load_tokens(os.path.join(in_dir, "tokens.bin"), cfg)

    loss64, grads64 = loss_and_grads(cfg, params, tokens, torch.float64)
    loss32, grads32 = loss_and_grads(cfg, params, tokens, torch.float32)
    if not math.isfinite(loss64):
        raise ReferenceInputError(f"{in_dir}: the loss is not finite ({loss64})")

    os.makedirs(out_dir, exist_ok=True)
    entries = []
    for name, grad in grads64.items():
        file = name + ".bin"
        grad.astype("<f8").tofile(os.path.join(out_dir, file))
        diff = float(np.max(np.abs(grads32[name].astype(np.float64) - grad)))
        entries.append({"name": name, "shape": list(grad.shape), "file": file, "dtype": "float64",
                        "fp32_max_abs_diff": diff})
    out_manifest = {"config": dataclass_dict(cfg), "dtype": "float64", "tensors": entries}
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(out_manifest, f, indent=1)
    with open(os.path.join(out_dir, "loss.json"), "w", encoding="utf-8") as f:
        json.dump({"loss": loss64, "loss_fp32": loss32, "batch_size": int(tokens.shape[0])}, f)
    return loss64, loss32


def dataclass_dict(cfg):
    return {k: getattr(cfg, k) for k in CONFIG_KEYS + OPTIONAL_CONFIG_KEYS}


# ------------------------------------------------------------------------------------------ selftest

def numpy_loss(cfg, params, tokens):
    """The model's loss written again from the definition in plain float64 NumPy, sharing no code with
    torch_gpt, so that a wrong layout there (head order, query groups, rotary pairs, gate/up order, tying,
    masking) shows up as a mismatch."""
    P = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    B, T = inputs.shape
    C, H, Fw = cfg.hidden_size, cfg.num_heads, cfg.ffn_hidden_size
    D = C // H
    G = cfg.num_query_groups if cfg.num_query_groups else H
    eps = cfg.layernorm_eps
    rope = cfg.position_embedding_type == "rope"
    R = int(D * cfg.rotary_percent) if rope else 0

    def norm(x, prefix):
        w = P[prefix + ".weight"]
        if cfg.normalization == "RMSNorm":
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * w + P[prefix + ".bias"]

    def linear(x, prefix):
        y = x @ P[prefix + ".weight"].T
        return y + P[prefix + ".bias"] if cfg.add_bias_linear else y

    def gelu_tanh(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

    # RoPE as a complex rotation: dim i and dim i + R/2 are the real and imaginary parts of one number,
    # turned by position * base^(-2i/R).
    theta = np.power(float(cfg.rotary_base), -2.0 * np.arange(R // 2) / R)
    rotation = np.exp(1j * np.arange(T)[:, None] * theta)  # [T, R/2]

    def rotate(x):  # x [B, T, D]
        z = (x[..., :R // 2] + 1j * x[..., R // 2:R]) * rotation
        return np.concatenate([z.real, z.imag, x[..., R:]], -1)

    x = P["embedding.word_embeddings.weight"][inputs]
    if not rope:
        x = x + P["embedding.position_embeddings.weight"][:T]
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        qkv = linear(norm(x, p + "ln1"), p + "attention.qkv")
        heads = []
        for h in range(H):
            g = h // (H // G)  # consecutive query heads share group g
            q = qkv[:, :, h * D:(h + 1) * D]
            k = qkv[:, :, H * D + g * D:H * D + (g + 1) * D]
            v = qkv[:, :, (H + G) * D + g * D:(H + G) * D + (g + 1) * D]
            if rope:
                q, k = rotate(q), rotate(k)
            s = np.einsum("btd,bsd->bts", q, k) / np.sqrt(D)
            s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            heads.append(np.einsum("bts,bsd->btd", s / s.sum(-1, keepdims=True), v))
        x = x + linear(np.concatenate(heads, -1), p + "attention.proj")
        m = linear(norm(x, p + "ln2"), p + "mlp.fc1")
        if cfg.swiglu:
            gate, up = m[..., :Fw], m[..., Fw:]
            m = gate / (1.0 + np.exp(-gate)) * up
        else:
            m = gelu_tanh(m)
        x = x + linear(m, p + "mlp.fc2")
    x = norm(x, "final_ln")
    untied = cfg.untie_embeddings_and_output_weights
    head = P["output_layer.weight"] if untied else P["embedding.word_embeddings.weight"]
    logits = x @ head[:cfg.vocab_size].T  # padding never competes
    top = logits.max(-1, keepdims=True)
    logz = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return float(np.mean(logz - picked))


def random_parameters(cfg, rng):
    """float64 weights large enough that every nonlinearity is exercised (not near-identity)."""
    params = {}
    for name, shape in torch_gpt.parameter_shapes(cfg).items():
        if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "final_ln.weight":
            params[name] = 1.0 + 0.3 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            params[name] = 0.2 * rng.standard_normal(shape)
        else:
            params[name] = 0.5 * rng.standard_normal(shape)
    return params


def written_config(cfg):
    """The manifest config as the C++ side may write it: optional keys only where they differ from the
    default, so that the GPT-2 case reads a config without any of them."""
    defaults = {f.name: f.default for f in dataclasses.fields(torch_gpt.GPTConfig)}
    return {k: v for k, v in dataclass_dict(cfg).items() if k in CONFIG_KEYS or v != defaults[k]}


def write_inputs(in_dir, cfg, params, tokens, entries_hook=None):
    """Writes params (as float32) and tokens in the IN_DIR format; entries_hook may corrupt the list."""
    os.makedirs(in_dir, exist_ok=True)
    entries = []
    for name, value in params.items():
        file = name.replace(".", "_") + ".f32"
        np.asarray(value, dtype="<f4").tofile(os.path.join(in_dir, file))
        entries.append({"name": name, "shape": list(np.shape(value)), "file": file})
    if entries_hook:
        entries = entries_hook(entries)
    with open(os.path.join(in_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"config": written_config(cfg), "tensors": entries}, f)
    np.asarray(tokens, dtype="<i4").tofile(os.path.join(in_dir, "tokens.bin"))


def _tiny(**options):
    sizes = dict(num_layers=2, hidden_size=8, num_heads=2, ffn_hidden_size=20, seq_length=5, vocab_size=11,
                 padded_vocab_size=16)
    return torch_gpt.GPTConfig(**dict(sizes, **options))


# The model variants the selftest checks end to end: GPT-2 (every option at its default); Llama (rotary
# positions, RMSNorm, SwiGLU, 2 key/value groups for 4 heads, untied head, no linear biases); and a
# one-layer mix that rotates 4 of each head's 8 dims at another base and pairs the other options
# differently (LayerNorm with its biases and a non-default eps, GELU, one key/value group, tied head).
SELFTEST_CONFIGS = {
    "gpt2": _tiny(),
    "llama": _tiny(hidden_size=16, num_heads=4, ffn_hidden_size=12, position_embedding_type="rope",
                   normalization="RMSNorm", swiglu=True, num_query_groups=2,
                   untie_embeddings_and_output_weights=True, add_bias_linear=False),
    "partial rope": _tiny(num_layers=1, hidden_size=16, num_heads=2, ffn_hidden_size=12,
                          position_embedding_type="rope", rotary_percent=0.5, rotary_base=500.0,
                          num_query_groups=1, layernorm_eps=1e-3),
}


def check_model(cfg, tag, tmp, rng, check):
    """Checks 1-5 for one config; returns (float32 params, tokens) for the malformed-input cases."""
    params = random_parameters(cfg, rng)
    tokens = rng.integers(0, cfg.vocab_size, size=(3, cfg.seq_length + 1))

    # 1. Backward agrees with central finite differences of the forward, for every parameter element.
    model = build_model(cfg, params, torch.float64)
    names = [n for n, _ in model.named_parameters()]
    if names != list(torch_gpt.parameter_shapes(cfg)):
        check(f"{tag}: parameter names", False, "named_parameters() order differs from parameter_shapes()")
    batch = torch.from_numpy(tokens)

    wrapper = _LossWrapper(model)

    def loss_of(*tensors):
        substitutes = {"model." + n: t for n, t in zip(names, tensors)}
        return stateless.functional_call(wrapper, substitutes, (batch[:, :-1], batch[:, 1:]))

    inputs = tuple(torch.from_numpy(params[n]).clone().requires_grad_(True) for n in names)
    try:
        ok = torch.autograd.gradcheck(loss_of, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)
        check(f"{tag}: gradcheck", ok, f"{sum(t.numel() for t in inputs)} parameter elements")
    except RuntimeError as e:
        check(f"{tag}: gradcheck", False, str(e).splitlines()[0])

    # 2. The torch model computes the loss the definition says (independent NumPy forward).
    loss64, grads64 = loss_and_grads(cfg, params, tokens, torch.float64)
    ref = numpy_loss(cfg, params, tokens)
    check(f"{tag}: numpy forward", abs(loss64 - ref) <= 1e-12 * abs(ref),
          f"torch {loss64:.15g} numpy {ref:.15g}")

    # 3. Padding rows of the embedding (never looked up) and of the head (masked) get no gradient.
    heads = ["embedding.word_embeddings.weight"]
    if cfg.untie_embeddings_and_output_weights:
        heads.append("output_layer.weight")
    pad = max(float(np.max(np.abs(grads64[n][cfg.vocab_size:]))) for n in heads)
    check(f"{tag}: padding rows", pad == 0.0, f"max |grad| of padded rows of {' and '.join(heads)} {pad:.3g}")

    # 4. float32 agrees with float64 to float32 accuracy.
    params32 = {k: v.astype(np.float32) for k, v in params.items()}
    loss32, grads32 = loss_and_grads(cfg, params32, tokens, torch.float32)
    loss64_of_32, grads64_of_32 = loss_and_grads(cfg, params32, tokens, torch.float64)
    worst = max(float(np.max(np.abs(grads32[n] - grads64_of_32[n])) /
                      (np.max(np.abs(grads64_of_32[n])) + 1e-30)) for n in names)
    check(f"{tag}: float32 vs float64",
          abs(loss32 - loss64_of_32) < 1e-5 * abs(loss64_of_32) and worst < 1e-4,
          f"loss diff {abs(loss32 - loss64_of_32):.3g}, worst relative gradient diff {worst:.3g}")

    # 5. File round trip through the IN_DIR / OUT_DIR formats, the config echoed in full.
    in_dir, out_dir = os.path.join(tmp, tag, "in"), os.path.join(tmp, tag, "out")
    write_inputs(in_dir, cfg, params32, tokens)
    run_reference(in_dir, out_dir)
    with open(os.path.join(out_dir, "loss.json"), encoding="utf-8") as f:
        written = json.load(f)
    out_manifest = read_json(os.path.join(out_dir, "manifest.json"))
    same = (written["loss"] == loss64_of_32 and len(out_manifest["tensors"]) == len(names)
            and out_manifest["config"] == dataclass_dict(cfg))
    for entry in out_manifest["tensors"]:
        data = np.fromfile(os.path.join(out_dir, entry["file"]), dtype="<f8").reshape(entry["shape"])
        same = same and entry["dtype"] == "float64" and np.array_equal(data, grads64_of_32[entry["name"]])
    check(f"{tag}: file round trip", same,
          f"loss {written['loss']:.15g}, {len(out_manifest['tensors'])} gradients")
    return params32, tokens


def selftest():
    torch.manual_seed(0)
    rng = np.random.default_rng(1234)
    failures = []

    def check(name, ok, detail):
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}")
        if not ok:
            failures.append(name)

    with tempfile.TemporaryDirectory() as tmp:
        inputs = {tag: check_model(cfg, tag, tmp, rng, check) for tag, cfg in SELFTEST_CONFIGS.items()}

        # 6. Malformed inputs are refused with a message, never computed on.
        gpt2 = SELFTEST_CONFIGS["gpt2"]

        def corrupt_tokens(d):
            bad = np.full((2, gpt2.seq_length + 1), gpt2.vocab_size, dtype="<i4")
            bad.tofile(os.path.join(d, "tokens.bin"))

        def short_tokens(d):
            np.zeros(gpt2.seq_length, dtype="<i4").tofile(os.path.join(d, "tokens.bin"))

        def truncate_file(d):
            path = os.path.join(d, "final_ln_bias.f32")
            with open(path, "r+b") as f:
                f.truncate(4)

        def set_config(**changes):
            def hook(d):
                m = read_json(os.path.join(d, "manifest.json"))
                m["config"].update(changes)
                with open(os.path.join(d, "manifest.json"), "w", encoding="utf-8") as f:
                    json.dump(m, f)
            return hook

        def wrong_shape(entries):
            entries[0]["shape"] = entries[0]["shape"][::-1]
            return entries

        # case -> (model whose inputs are corrupted, tensor-list hook, directory hook)
        cases = {
            "missing tensor": ("gpt2", lambda e: e[:-1], None),
            "duplicate tensor": ("gpt2", lambda e: e + e[:1], None),
            "shape mismatch": ("gpt2", wrong_shape, None),
            "unknown name": ("gpt2", lambda e: e + [dict(e[0], name="layers.9.ln1.weight")], None),
            "token out of range": ("gpt2", None, corrupt_tokens),
            "token file size": ("gpt2", None, short_tokens),
            "tensor file size": ("gpt2", None, truncate_file),
            "config": ("gpt2", None, set_config(num_heads=3)),
            "position table with rope": ("gpt2", None, set_config(position_embedding_type="rope")),
            "biases without add_bias_linear": ("gpt2", None, set_config(add_bias_linear=False)),
            "missing output layer": ("llama", lambda e: [x for x in e if x["name"] != "output_layer.weight"],
                                     None),
            "position_embedding_type": ("llama", None, set_config(position_embedding_type="alibi")),
            "normalization": ("llama", None, set_config(normalization="BatchNorm")),
            "num_query_groups": ("llama", None, set_config(num_query_groups=3)),
            "rotary_percent range": ("llama", None, set_config(rotary_percent=1.5)),
            "odd rotary dims": ("llama", None, set_config(rotary_percent=0.75)),
            "swiglu type": ("llama", None, set_config(swiglu="true")),
            "layernorm_eps": ("llama", None, set_config(layernorm_eps=0)),
        }
        for case, (tag, entries_hook, dir_hook) in cases.items():
            bad_dir = os.path.join(tmp, case.replace(" ", "_"))
            params32, tokens = inputs[tag]
            write_inputs(bad_dir, SELFTEST_CONFIGS[tag], params32, tokens, entries_hook)
            if dir_hook:
                dir_hook(bad_dir)
            try:
                run_reference(bad_dir, os.path.join(bad_dir, "out"))
                check(f"rejects {case}", False, "accepted")
            except ReferenceInputError as e:
                check(f"rejects {case}", True, str(e).replace(tmp, "<tmp>"))

    print("selftest:", "FAILED " + ", ".join(failures) if failures else "all checks passed")
    return 0 if not failures else 1


class _LossWrapper(torch.nn.Module):
    """Exposes GPT.loss as forward() so functional_call can substitute the parameters."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs, targets):
        return self.model.loss(inputs, targets)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("in_dir", nargs="?")
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--selftest", action="store_true", help="check this script and exit 0/1")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(max(1, args.threads))
    if args.selftest:
        return selftest()
    if not args.in_dir or not args.out_dir:
        parser.error("IN_DIR and OUT_DIR are required (or --selftest)")
    try:
        loss64, loss32 = run_reference(args.in_dir, args.out_dir)
    except ReferenceInputError as e:
        print(f"torch_reference: error: {e}", file=sys.stderr)
        return 2
    print(f"torch_reference: loss {loss64:.15g} (float32 {loss32:.9g}) written to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
