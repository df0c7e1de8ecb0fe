"""Models for the benchmarks, built in code with random weights (no torchvision, no downloads).

* :func:`mlp` — 3 Linear(1024, 1024) layers with ReLU, batch 8.
* :func:`resnet18` — the ResNet-18 shape (BasicBlock ×[2, 2, 2, 2], BatchNorm in eval mode),
  input 1×3×224×224.
* :func:`gpt` — a GPT-2-small-shaped decoder: 6 layers, d_model 512, 8 heads, MLP 4×, vocab 8192,
  sequence 128, causal ``scaled_dot_product_attention``.
* :func:`llama_meta` — a ~1.6e9-parameter bf16 Llama shape on the meta device (export/params only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelCase:
    """A benchmark model: the module, example inputs and export options."""

    name: str
    module: nn.Module
    args: tuple
    dynamic_shapes: object = None
    # Tolerance of the max abs error against eager (fp32 reorderings; matmul K up to 2048).
    atol: float = 1e-3


# ----------------------------------------------------------------------------- MLP
class MLP(nn.Module):
    def __init__(self, width: int = 1024, depth: int = 3):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


def mlp(batch: int = 8, width: int = 1024) -> ModelCase:
    torch.manual_seed(0)
    return ModelCase("mlp", MLP(width).eval(), (torch.randn(batch, width),))


# ----------------------------------------------------------------------------- ResNet-18
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def _randomize_bn(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)


def resnet18(batch: int = 1, size: int = 224) -> ModelCase:
    torch.manual_seed(0)
    model = ResNet18()
    _randomize_bn(model)
    return ModelCase("resnet18", model.eval(), (torch.randn(batch, 3, size, size),), atol=1e-2)


# ----------------------------------------------------------------------------- GPT
@dataclass
class GPTConfig:
    vocab: int = 8192
    d_model: int = 512
    n_layer: int = 6
    n_head: int = 8
    max_seq: int = 1024


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        hd = c // self.n_head
        q = q.view(b, t, self.n_head, hd).transpose(1, 2)
        k = k.view(b, t, self.n_head, hd).transpose(1, 2)
        v = v.view(b, t, self.n_head, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tok(ids) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def gpt(seq: int = 128, batch: int = 1, *, dynamic: bool = False) -> ModelCase:
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg).eval()
    ids = torch.randint(0, cfg.vocab, (batch, seq))
    dyn = None
    name = "gpt"
    if dynamic:
        # Multiples of 16 keep the attention tiles full; the range covers prompt lengths.
        s = torch.export.Dim("seq_div16", min=1, max=cfg.max_seq // 16)
        dyn = {"ids": {1: 16 * s}}
        name = "gpt-dyn"
    return ModelCase(name, model, (ids,), dynamic_shapes=dyn, atol=5e-3)


# ----------------------------------------------------------------------------- Llama (meta)
@dataclass
class LlamaConfig:
    vocab: int = 32000
    d_model: int = 2048
    n_layer: int = 24
    n_head: int = 32
    n_kv_head: int = 4
    ffn: int = 8192


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        hd = cfg.d_model // cfg.n_head
        self.n_head, self.n_kv, self.hd = cfg.n_head, cfg.n_kv_head, hd
        self.norm1 = RMSNorm(cfg.d_model)
        self.q = nn.Linear(cfg.d_model, cfg.n_head * hd, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.n_kv_head * hd, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.n_kv_head * hd, bias=False)
        self.o = nn.Linear(cfg.n_head * hd, cfg.d_model, bias=False)
        self.norm2 = RMSNorm(cfg.d_model)
        self.gate = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.n_head, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        rep = self.n_head // self.n_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def llama_meta(seq: int = 64) -> ModelCase:
    """~1.5e9 parameters (bf16) on the meta device: for export/params benchmarks only."""
    cfg = LlamaConfig()
    with torch.device("meta"):
        model = Llama(cfg).to(torch.bfloat16).eval()
    ids = torch.zeros(1, seq, dtype=torch.int64, device="meta")
    return ModelCase("llama-1.6b-meta", model, (ids,))


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _check() -> None:  # pragma: no cover - manual sanity check
    for case in (mlp(), resnet18(), gpt(), llama_meta()):
        print(
            case.name,
            f"{param_count(case.module) / 1e6:.1f}M params",
            math.prod(case.args[0].shape),
        )


if __name__ == "__main__":
    _check()
