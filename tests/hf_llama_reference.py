#!/usr/bin/python3
"""An independent NumPy reading of a Hugging Face LlamaForCausalLM directory (config.json and
model.safetensors, or the shards of model.safetensors.index.json), written from HF's conventions
(modeling_llama.py), not from gpt-train's: RMSNorm, rotary embedding with rotate_half, repeat_kv for the
key/value groups, SwiGLU MLP, lm_head or the tied embed_tokens. Used by tests/convert_llama_test.cpp.

  loss DIR TOKENS          mean next-token loss of the int32 rows in TOKENS (seq_length + 1 each), float64
  to_bf16_shards DIR OUT   OUT: the same model as BF16 in two shards with an index (round to nearest even)
  same_as_bf16 DIR BF16    checks that DIR's F32 tensors are exactly BF16's values; prints "ok"
"""
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    data = open(path, 'rb').read()
    n = struct.unpack('<Q', data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop('__metadata__', None)
    out, end = {}, 0
    for name, e in header.items():
        b, s = e['data_offsets']
        raw = data[8 + n + b:8 + n + s]
        if e['dtype'] == 'F32':
            a = np.frombuffer(raw, dtype='<f4')
        elif e['dtype'] == 'BF16':
            a = (np.frombuffer(raw, dtype='<u2').astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit('%s: unexpected dtype %s' % (name, e['dtype']))
        out[name] = a.reshape(e['shape'])
        end = max(end, s)
    assert 8 + n + end == len(data), path
    return out


def read_model(d):
    cfg = json.load(open(os.path.join(d, 'config.json')))
    assert cfg['architectures'] == ['LlamaForCausalLM'] and cfg['model_type'] == 'llama', cfg
    index = os.path.join(d, 'model.safetensors.index.json')
    w = {}
    if os.path.exists(index):
        for f in sorted(set(json.load(open(index))['weight_map'].values())):
            w.update(read_safetensors(os.path.join(d, f)))
    else:
        w = read_safetensors(os.path.join(d, 'model.safetensors'))
    return cfg, w


def loss(d, tokens_path):
    cfg, w = read_model(d)
    L, C, F = cfg['num_hidden_layers'], cfg['hidden_size'], cfg['intermediate_size']
    H, G, V = cfg['num_attention_heads'], cfg['num_key_value_heads'], cfg['vocab_size']
    D, eps, theta = C // H, cfg['rms_norm_eps'], cfg['rope_theta']
    tied = cfg['tie_word_embeddings']
    assert cfg['hidden_act'] == 'silu' and not cfg['attention_bias'] and not cfg['mlp_bias']
    assert cfg['rope_scaling'] is None and cfg.get('head_dim', D) == D
    want = {'model.embed_tokens.weight': (V, C), 'model.norm.weight': (C,)}
    if not tied:
        want['lm_head.weight'] = (V, C)
    for i in range(L):
        p = 'model.layers.%d.' % i
        want.update({p + 'input_layernorm.weight': (C,), p + 'post_attention_layernorm.weight': (C,),
                     p + 'self_attn.q_proj.weight': (H * D, C), p + 'self_attn.k_proj.weight': (G * D, C),
                     p + 'self_attn.v_proj.weight': (G * D, C), p + 'self_attn.o_proj.weight': (C, H * D),
                     p + 'mlp.gate_proj.weight': (F, C), p + 'mlp.up_proj.weight': (F, C),
                     p + 'mlp.down_proj.weight': (C, F)})
    assert set(w) == set(want), sorted(set(w) ^ set(want))
    for k, s in want.items():
        assert w[k].shape == s, (k, w[k].shape, s)
    w = {k: v.astype(np.float64) for k, v in w.items()}

    T = cfg['max_position_embeddings']  # gpt-train exports its seq_length
    tok = np.fromfile(tokens_path, dtype='<i4').reshape(-1, T + 1)
    x, y = tok[:, :-1], tok[:, 1:]
    B = x.shape[0]

    def rms_norm(h, g):  # LlamaRMSNorm
        return g * (h / np.sqrt((h ** 2).mean(-1, keepdims=True) + eps))

    def rotate_half(t):
        return np.concatenate([-t[..., D // 2:], t[..., :D // 2]], -1)

    inv_freq = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    freqs = np.outer(np.arange(T, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], -1)  # [T, D]
    cos, sin = np.cos(emb), np.sin(emb)

    def heads(t, n):
        return t.reshape(B, T, n, D).transpose(0, 2, 1, 3)

    def repeat_kv(t):  # [B, G, T, D] -> [B, H, T, D]: query head h reads group h // (H / G)
        return np.repeat(t, H // G, axis=1)

    def silu(t):
        return t / (1 + np.exp(-t))

    h = w['model.embed_tokens.weight'][x]
    future = np.triu(np.ones((T, T), bool), 1)
    for i in range(L):
        p = 'model.layers.%d.' % i
        a = rms_norm(h, w[p + 'input_layernorm.weight'])
        q = heads(a @ w[p + 'self_attn.q_proj.weight'].T, H)
        k = heads(a @ w[p + 'self_attn.k_proj.weight'].T, G)
        v = heads(a @ w[p + 'self_attn.v_proj.weight'].T, G)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k), repeat_kv(v)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
        s[:, :, future] = -np.inf
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, H * D)
        h = h + o @ w[p + 'self_attn.o_proj.weight'].T
        m = rms_norm(h, w[p + 'post_attention_layernorm.weight'])
        m = silu(m @ w[p + 'mlp.gate_proj.weight'].T) * (m @ w[p + 'mlp.up_proj.weight'].T)
        h = h + m @ w[p + 'mlp.down_proj.weight'].T
    head = w['model.embed_tokens.weight'] if tied else w['lm_head.weight']
    logits = rms_norm(h, w['model.norm.weight']) @ head.T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    print(repr(-np.take_along_axis(logp, y[..., None], -1).mean()))


def bf16_bits(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype('<u2')


def write_bf16(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        b = bf16_bits(a).tobytes()
        header[name] = {'dtype': 'BF16', 'shape': list(a.shape), 'data_offsets': [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    text = json.dumps(header).encode()
    text += b' ' * (-(8 + len(text)) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)) + text + b''.join(blobs))


def to_bf16_shards(d, out):
    cfg, w = read_model(d)
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, 'config.json'), 'w'))
    names = sorted(w)
    shards = {'model-00001-of-00002.safetensors': names[:len(names) // 2],
              'model-00002-of-00002.safetensors': names[len(names) // 2:]}
    weight_map = {}
    for f, part in shards.items():
        write_bf16(os.path.join(out, f), {n: w[n] for n in part})
        weight_map.update({n: f for n in part})
    json.dump({'metadata': {}, 'weight_map': weight_map}, open(os.path.join(out, 'model.safetensors.index.json'), 'w'))


def same_as_bf16(d, bf16_dir):
    _, a = read_model(d)
    _, b = read_model(bf16_dir)
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for k in a:
        assert a[k].dtype == np.float32 and np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k
    print('ok')


if __name__ == '__main__':
    {'loss': loss, 'to_bf16_shards': to_bf16_shards, 'same_as_bf16': same_as_bf16}[sys.argv[1]](*sys.argv[2:])
