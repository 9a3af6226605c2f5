"""PyTorch definition of the gpt-train model, used as the independent reference for gradient tests
(tests/torch_reference.py) and as the PyTorch side of the CPU throughput benchmark (scripts/bench_torch.py).

The module tree is laid out so that `named_parameters()` yields exactly gpt-train's global parameter names
(embedding.word_embeddings.weight, layers.{i}.attention.qkv.weight, final_ln.bias, ...). The maths follows
gpt-train: learned position embeddings, pre-LN blocks, fused qkv projection whose output rows are
[q | k | v] with each part head-major, causal softmax attention, GELU (tanh approximation), final
layernorm, output head tied to the token embedding, padded vocabulary columns masked to -inf, mean
cross-entropy over every token.
"""

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERNORM_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    padded_vocab_size: int

    def validate(self):
        """Raises ValueError naming the first field that makes the architecture impossible."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"config.{field.name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads != 0:
            raise ValueError(f"config.hidden_size ({self.hidden_size}) is not divisible by "
                             f"config.num_heads ({self.num_heads})")
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(f"config.padded_vocab_size ({self.padded_vocab_size}) is smaller than "
                             f"config.vocab_size ({self.vocab_size})")


def padded_vocab_size(vocab, divisible_by=128):
    """Megatron's padding (tensor parallel 1): the smallest multiple of divisible_by holding the vocabulary."""
    return ((vocab + divisible_by - 1) // divisible_by) * divisible_by


def parameter_shapes(cfg):
    """Global name -> shape of every parameter, in the order named_parameters() yields them."""
    C, F_, Vp, T = cfg.hidden_size, cfg.ffn_hidden_size, cfg.padded_vocab_size, cfg.seq_length
    shapes = {"embedding.word_embeddings.weight": (Vp, C), "embedding.position_embeddings.weight": (T, C)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "ln1.weight": (C,), p + "ln1.bias": (C,),
            p + "attention.qkv.weight": (3 * C, C), p + "attention.qkv.bias": (3 * C,),
            p + "attention.proj.weight": (C, C), p + "attention.proj.bias": (C,),
            p + "ln2.weight": (C,), p + "ln2.bias": (C,),
            p + "mlp.fc1.weight": (F_, C), p + "mlp.fc1.bias": (F_,),
            p + "mlp.fc2.weight": (C, F_), p + "mlp.fc2.bias": (C,),
        })
    shapes.update({"final_ln.weight": (C,), "final_ln.bias": (C,)})
    return shapes


class Embedding(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.seq_length, cfg.hidden_size)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.word_embeddings(tokens) + self.position_embeddings(positions)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        # True above the diagonal: key positions a query may not see.
        future = torch.ones(cfg.seq_length, cfg.seq_length, dtype=torch.bool).triu(1)
        self.register_buffer("future_mask", future, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        H, D = self.num_heads, self.head_dim
        q, k, v = self.qkv(x).split(C, dim=-1)  # each [B, T, C], head-major columns
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # [B, H, T, T]
        scores = scores.masked_fill(self.future_mask[:T, :T], float("-inf"))
        context = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, H, T, D]
        return self.proj(context.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size)
        self.fc2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden_size, eps=LAYERNORM_EPS)
        self.attention = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden_size, eps=LAYERNORM_EPS)
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
        self.final_ln = nn.LayerNorm(cfg.hidden_size, eps=LAYERNORM_EPS)
        # True for the padding columns of the vocabulary, which must never receive probability.
        padding = torch.arange(cfg.padded_vocab_size) >= cfg.vocab_size
        self.register_buffer("vocab_padding", padding, persistent=False)

    def forward(self, tokens):
        """tokens [B, t] (t <= seq_length) -> logits [B, t, padded_vocab], padding columns = -inf."""
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = F.linear(self.final_ln(x), self.embedding.word_embeddings.weight)
        return logits.masked_fill(self.vocab_padding, float("-inf"))

    def loss(self, tokens, targets):
        """Mean cross-entropy over all B*t target tokens."""
        logits = self.forward(tokens)
        if logits.dtype in (torch.bfloat16, torch.float16):
            logits = logits.float()  # reduced-precision compute, fp32 loss as gpt-train does
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def init_weights(model, std=0.02, seed=0):
    """Megatron-style initialisation for benchmarking: N(0, std) weights, output projections of each
    residual branch scaled by 1/sqrt(2L), zero biases, unit layernorm gains."""
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
