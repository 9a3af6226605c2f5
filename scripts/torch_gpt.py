"""PyTorch definition of the gpt-train model, used as the independent reference for gradient tests
(tests/torch_reference.py) and as the PyTorch side of the CPU throughput benchmark (scripts/bench_torch.py).

Conventions (they are how gpt-train lays out its parameters; C hidden, H heads, G query groups (H when
num_query_groups is 0), D = C/H, F ffn_hidden_size, Vp padded vocabulary, T seq_length):
- Config options beyond the GPT-2 defaults: position_embedding_type "learned_absolute" | "rope",
  rotary_base (10000), rotary_percent (in (0, 1], 1.0), normalization "LayerNorm" | "RMSNorm", swiglu
  (False), num_query_groups (0 = H), untie_embeddings_and_output_weights (False), add_bias_linear (True),
  layernorm_eps (1e-5, used by both norms).
- embedding.word_embeddings.weight [Vp, C]; embedding.position_embeddings.weight [T, C] only with
  learned_absolute positions.
- Per layer: ln1 / ln2 (.weight [C], .bias [C] only for LayerNorm; RMSNorm y = x / sqrt(mean(x^2) + eps) *
  weight); attention.qkv.weight [(H + 2G) * D, C] whose output columns are [q heads 0..H-1 | k groups
  0..G-1 | v groups 0..G-1], each head-major, query head h reading group h // (H / G) (Hugging Face's
  repeat_kv); attention.proj.weight [C, C]; mlp.fc1.weight [F, C], or [2F, C] = [gate | up] with swiglu
  (silu(gate) * up, else GELU tanh); mlp.fc2.weight [C, F]. Every linear has a bias ([rows]) only when
  add_bias_linear.
- RoPE, rotate-half (GPT-NeoX / Megatron-LM default / HF Llama): R = int(D * rotary_percent) (even, >= 2),
  inv_freq = 1 / rotary_base ** (arange(0, R, 2) / R), angle[t, i] = t * inv_freq[i] in the model's
  dtype; on the first R dims of every q head and k group, after the qkv projection (+ bias), x1 = x[:R/2],
  x2 = x[R/2:R] -> [x1 cos - x2 sin, x2 cos + x1 sin]; dims R..D-1 and v are not rotated.
- final_ln (.weight, .bias only for LayerNorm); output_layer.weight [Vp, C] only when untied (logits =
  final_norm(x) @ output_layer.weight^T), else the head is the word embedding.
- Registration order, which named_parameters() and parameter_shapes() follow: embedding, then each layer's
  ln1, qkv, proj, ln2, fc1, fc2 (weight before bias), then final_ln, then output_layer.

The maths otherwise follows gpt-train: pre-norm blocks, causal softmax attention, padded vocabulary
columns masked to -inf, mean cross-entropy over every token.
"""

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    padded_vocab_size: int
    # Llama-style options; the defaults are the GPT-2 model.
    position_embedding_type: str = "learned_absolute"
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    normalization: str = "LayerNorm"
    swiglu: bool = False
    num_query_groups: int = 0
    untie_embeddings_and_output_weights: bool = False
    add_bias_linear: bool = True
    layernorm_eps: float = 1e-5

    SIZE_FIELDS = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "seq_length", "vocab_size",
                   "padded_vocab_size")

    @property
    def head_dim(self):
        return self.hidden_size // self.num_heads

    @property
    def query_groups(self):
        return self.num_query_groups or self.num_heads

    @property
    def rotary_dims(self):
        """Leading dims of each head that RoPE rotates; 0 with learned positions."""
        if self.position_embedding_type != "rope":
            return 0
        return int(self.head_dim * self.rotary_percent)

    @property
    def fc1_width(self):
        return 2 * self.ffn_hidden_size if self.swiglu else self.ffn_hidden_size

    def validate(self):
        """Raises ValueError naming the first field that makes the architecture impossible."""
        for name in self.SIZE_FIELDS:
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"config.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"config.hidden_size ({self.hidden_size}) is not divisible by "
                             f"config.num_heads ({self.num_heads})")
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(f"config.padded_vocab_size ({self.padded_vocab_size}) is smaller than "
                             f"config.vocab_size ({self.vocab_size})")
        for name, allowed in (("position_embedding_type", POSITION_EMBEDDING_TYPES),
                              ("normalization", NORMALIZATIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"config.{name} must be one of {', '.join(map(repr, allowed))}, "
                                 f"got {getattr(self, name)!r}")
        for name in ("swiglu", "untie_embeddings_and_output_weights", "add_bias_linear"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"config.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("rotary_base", "layernorm_eps"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"config.{name} must be a positive number, got {value!r}")
        if not _is_number(self.rotary_percent) or not 0 < self.rotary_percent <= 1:
            raise ValueError(f"config.rotary_percent must be in (0, 1], got {self.rotary_percent!r}")
        groups = self.num_query_groups
        if not _is_int(groups) or groups < 0:
            raise ValueError(f"config.num_query_groups must be a non-negative integer (0 = num_heads), "
                             f"got {groups!r}")
        if groups and self.num_heads % groups != 0:
            raise ValueError(f"config.num_query_groups ({groups}) does not divide config.num_heads "
                             f"({self.num_heads})")
        R = self.rotary_dims
        if self.position_embedding_type == "rope" and (R < 2 or R % 2 != 0):
            raise ValueError(f"config.rotary_percent ({self.rotary_percent}) gives {R} rotary dims of the "
                             f"head's {self.head_dim}; RoPE needs an even number, at least 2")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def padded_vocab_size(vocab, divisible_by=128):
    """Megatron's padding (tensor parallel 1): the smallest multiple of divisible_by holding the vocabulary."""
    return ((vocab + divisible_by - 1) // divisible_by) * divisible_by


def parameter_shapes(cfg):
    """Global name -> shape of every parameter, in the order named_parameters() yields them."""
    C, Vp, T = cfg.hidden_size, cfg.padded_vocab_size, cfg.seq_length
    qkv_rows = (cfg.num_heads + 2 * cfg.query_groups) * cfg.head_dim
    norm_bias = cfg.normalization == "LayerNorm"

    shapes = {"embedding.word_embeddings.weight": (Vp, C)}
    if cfg.position_embedding_type == "learned_absolute":
        shapes["embedding.position_embeddings.weight"] = (T, C)

    def norm(prefix):
        shapes[prefix + ".weight"] = (C,)
        if norm_bias:
            shapes[prefix + ".bias"] = (C,)

    def linear(prefix, rows, cols):
        shapes[prefix + ".weight"] = (rows, cols)
        if cfg.add_bias_linear:
            shapes[prefix + ".bias"] = (rows,)

    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        norm(p + "ln1")
        linear(p + "attention.qkv", qkv_rows, C)
        linear(p + "attention.proj", C, C)
        norm(p + "ln2")
        linear(p + "mlp.fc1", cfg.fc1_width, C)
        linear(p + "mlp.fc2", C, cfg.ffn_hidden_size)
    norm("final_ln")
    if cfg.untie_embeddings_and_output_weights:
        shapes["output_layer.weight"] = (Vp, C)
    return shapes


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dimension (no bias, no centring)."""

    def __init__(self, size, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg):
    if cfg.normalization == "RMSNorm":
        return RMSNorm(cfg.hidden_size, eps=cfg.layernorm_eps)
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.layernorm_eps)


def rotary_tables(T, R, base, dtype, device):
    """cos, sin [T, R/2] of angle[t, i] = t / base^(2i/R), computed in `dtype`."""
    inv_freq = 1.0 / (base ** (torch.arange(0, R, 2, dtype=dtype, device=device) / R))
    angles = torch.outer(torch.arange(T, dtype=dtype, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """Rotate-half RoPE on the first R = 2 * cos.shape[-1] dims of x [..., T, D]; the rest pass through."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)


class Embedding(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        if cfg.position_embedding_type == "learned_absolute":
            self.position_embeddings = nn.Embedding(cfg.seq_length, cfg.hidden_size)
        else:
            self.position_embeddings = None  # rotary positions act inside attention

    def forward(self, tokens):
        x = self.word_embeddings(tokens)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        return x


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_heads, self.num_groups, self.head_dim = cfg.num_heads, cfg.query_groups, cfg.head_dim
        self.rotary_dims, self.rotary_base = cfg.rotary_dims, float(cfg.rotary_base)
        qkv_rows = (cfg.num_heads + 2 * cfg.query_groups) * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, qkv_rows, bias=cfg.add_bias_linear)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.add_bias_linear)
        # True above the diagonal: key positions a query may not see.
        future = torch.ones(cfg.seq_length, cfg.seq_length, dtype=torch.bool).triu(1)
        self.register_buffer("future_mask", future, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        H, G, D = self.num_heads, self.num_groups, self.head_dim
        q, k, v = self.qkv(x).split((H * D, G * D, G * D), dim=-1)  # head-major columns
        q = q.view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        k, v = (t.view(B, T, G, D).transpose(1, 2) for t in (k, v))  # [B, G, T, D]
        if self.rotary_dims:
            # Angles in the model's dtype (the weights'; float64 in the reference, fp32 under autocast).
            cos, sin = rotary_tables(T, self.rotary_dims, self.rotary_base, self.qkv.weight.dtype, x.device)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if G != H:  # consecutive query heads share a key/value group
            k, v = (t.repeat_interleave(H // G, dim=1) for t in (k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # [B, H, T, T]
        scores = scores.masked_fill(self.future_mask[:T, :T], float("-inf"))
        context = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, H, T, D]
        return self.proj(context.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.swiglu = cfg.swiglu
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.fc1_width, bias=cfg.add_bias_linear)
        self.fc2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=cfg.add_bias_linear)

    def forward(self, x):
        h = self.fc1(x)
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return self.fc2(h)


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = make_norm(cfg)
        self.attention = CausalSelfAttention(cfg)
        self.ln2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x):
        h = x + self.attention(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embedding = Embedding(cfg)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.num_layers))
        self.final_ln = make_norm(cfg)
        if cfg.untie_embeddings_and_output_weights:
            self.output_layer = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        else:
            self.output_layer = None  # the head is the word embedding
        # True for the padding columns of the vocabulary, which must never receive probability.
        padding = torch.arange(cfg.padded_vocab_size) >= cfg.vocab_size
        self.register_buffer("vocab_padding", padding, persistent=False)

    def forward(self, tokens):
        """tokens [B, t] (t <= seq_length) -> logits [B, t, padded_vocab], padding columns = -inf."""
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        head = self.output_layer if self.output_layer is not None else self.embedding.word_embeddings
        logits = F.linear(self.final_ln(x), head.weight)
        return logits.masked_fill(self.vocab_padding, float("-inf"))

    def loss(self, tokens, targets):
        """Mean cross-entropy over all B*t target tokens."""
        logits = self.forward(tokens)
        if logits.dtype in (torch.bfloat16, torch.float16):
            logits = logits.float()  # reduced-precision compute, fp32 loss as gpt-train does
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def init_weights(model, std=0.02, seed=0):
    """Megatron-style initialisation for benchmarking: N(0, std) weights (embeddings and the untied
    output layer included), output projections of each residual branch scaled by 1/sqrt(2L), zero
    biases, unit norm gains (LayerNorm and RMSNorm)."""
    generator = torch.Generator().manual_seed(seed)
    scaled_std = std / math.sqrt(2.0 * model.cfg.num_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln1.weight") or name.endswith("ln2.weight") or name == "final_ln.weight":
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                s = scaled_std if name.endswith("proj.weight") or name.endswith("fc2.weight") else std
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float32) * s)
