"""Reference for real/tests/train_reference.rs: the same Llama-3 model and inner step written
independently in PyTorch, torchtitan-style (complex RoPE, repeat_kv, F.scaled_dot_product_attention,
F.rms_norm), with torch.optim.AdamW, LambdaLR warmup, clip_grad_norm_ and PRIME's max-z-loss.

Usage: python train_reference.py DIR. For every DIR/*/case.json (shape and optimiser settings),
reads params.bin (fp32), tokens.bin (int64, rows x (seq + 1)) and writes logits.bin (the forward
pass on the inputs of all rows), stats.bin (loss, z-loss, grad norm per step, fp64) and
params_after.bin (fp32) next to them. Only the standard library and torch are needed.
"""
import json
import math
import pathlib
import sys

import torch
import torch.nn.functional as F


def load(path, dtype):
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=dtype)


def save(path, t):
    path.write_bytes(bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist()))


def run(case_dir):
    c = json.loads((case_dir / "case.json").read_text())
    L, D, H, KV, FF, V = c["layers"], c["dim"], c["heads"], c["kv_heads"], c["ffn"], c["vocab"]
    theta, eps, tied = c["rope_theta"], c["norm_eps"], c["tied"]
    hd = D // H
    names = [("tok_embeddings.weight", (V, D))]
    for i in range(L):
        p = f"layers.{i}."
        names += [
            (p + "attention_norm.weight", (D,)),
            (p + "attention.wq.weight", (H * hd, D)),
            (p + "attention.wk.weight", (KV * hd, D)),
            (p + "attention.wv.weight", (KV * hd, D)),
            (p + "attention.wo.weight", (D, H * hd)),
            (p + "ffn_norm.weight", (D,)),
            (p + "feed_forward.w1.weight", (FF, D)),
            (p + "feed_forward.w2.weight", (D, FF)),
            (p + "feed_forward.w3.weight", (FF, D)),
        ]
    names += [("norm.weight", (D,))]
    if not tied:
        names += [("output.weight", (V, D))]

    flat = load(case_dir / "params.bin", torch.float32)
    P, at = {}, 0
    for n, shape in names:
        k = math.prod(shape)
        P[n] = flat[at : at + k].view(shape).clone().requires_grad_(True)
        at += k
    assert at == flat.numel(), (at, flat.numel())
    params = [P[n] for n, _ in names]

    seq = c["seq_len"]
    tokens = load(case_dir / "tokens.bin", torch.int64).view(-1, seq + 1)
    freqs = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64)[: hd // 2] / hd))
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), freqs)
    freqs_cis = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)

    def rope(x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        f = freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, -1)
        return torch.view_as_real(xc * f).flatten(3).type_as(x)

    def rms(x, w):
        return F.rms_norm(x.float(), (D,), w, eps)

    def forward(tok):
        B, T = tok.shape
        h = F.embedding(tok, P["tok_embeddings.weight"])
        for i in range(L):
            p = f"layers.{i}."
            x = rms(h, P[p + "attention_norm.weight"])
            q = (x @ P[p + "attention.wq.weight"].T).view(B, T, H, hd)
            k = (x @ P[p + "attention.wk.weight"].T).view(B, T, KV, hd)
            v = (x @ P[p + "attention.wv.weight"].T).view(B, T, KV, hd)
            q, k = rope(q), rope(k)
            k = torch.repeat_interleave(k, H // KV, dim=2)
            v = torch.repeat_interleave(v, H // KV, dim=2)
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            h = h + a.transpose(1, 2).reshape(B, T, D) @ P[p + "attention.wo.weight"].T
            x = rms(h, P[p + "ffn_norm.weight"])
            gate = F.silu(x @ P[p + "feed_forward.w1.weight"].T)
            up = x @ P[p + "feed_forward.w3.weight"].T
            h = h + (gate * up) @ P[p + "feed_forward.w2.weight"].T
        head = P["tok_embeddings.weight"] if tied else P["output.weight"]
        return rms(h, P["norm.weight"]) @ head.T

    with torch.no_grad():
        save(case_dir / "logits.bin", forward(tokens[:, :seq]).reshape(-1))

    opt = torch.optim.AdamW(
        params, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"], weight_decay=c["weight_decay"]
    )
    warmup = c["warmup_steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s / warmup if s < warmup else 1.0)
    rows, mb = tokens.shape[0], c["micro_batch"]
    stats = []
    for _ in range(c["steps"]):
        opt.zero_grad()
        ce_total = z_total = 0.0
        for start in range(0, rows, mb):
            part = tokens[start : start + mb]
            share = part.shape[0] / rows
            logits = forward(part[:, :seq]).reshape(-1, V)
            ce = F.cross_entropy(logits, part[:, 1:].reshape(-1))
            z = c["z_loss"] * logits.max(dim=-1)[0].pow(2).mean()
            ((ce + z) * share).backward()
            ce_total += ce.item() * share
            z_total += z.item() * share
        norm = torch.nn.utils.clip_grad_norm_(params, c["grad_clip"]).item()
        opt.step()
        sched.step()
        stats += [ce_total, z_total, norm]
    save(case_dir / "stats.bin", torch.tensor(stats, dtype=torch.float64))
    save(case_dir / "params_after.bin", torch.cat([p.detach().reshape(-1) for p in params]))


if __name__ == "__main__":
    torch.set_num_threads(1)
    for case in sorted(pathlib.Path(sys.argv[1]).glob("*/case.json")):
        run(case.parent)
