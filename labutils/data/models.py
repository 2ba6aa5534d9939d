"""The course's three small models, one per workload, each a training step of a few ms on a core.

* ``DigitsCNN``: two 3x3 convolutions and two linear layers for 8x8 digits (~38 k parameters);
* ``CharGPT``: a tiny decoder-only transformer (GPT) over characters (~114 k parameters);
* ``ClipCNN3d``: two 3-D convolutions over (time, height, width) for moving-digit clips
  (~6 k parameters but the most arithmetic per parameter: the ratio 03c_scenarios measures).

Used through ``labutils.data.workloads`` by 02_pytorch_essentials, 03c_scenarios and the DDP,
pipeline and tensor-parallel labs (``CharGPT`` has the attention/MLP blocks those labs split).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class DigitsCNN(nn.Module):
    """(B, 1, 8, 8) images -> (B, 10) logits."""

    def __init__(self, channels=16, hidden=64, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.fc1 = nn.Linear(2 * channels * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):                        # (B, 1, 8, 8)
        x = F.relu(self.conv1(x))                # (B, C, 8, 8)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # (B, 2C, 4, 4)
        x = F.relu(self.fc1(x.flatten(1)))       # (B, hidden)
        return self.fc2(x)                       # (B, 10)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t sees only positions <= t."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.n_head = n_head
        # No bias: a key bias has zero gradient (softmax ignores a shift shared by all keys),
        # and Adam would turn that gradient's rounding noise into rank-dependent updates.
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):                                      # (B, T, C)
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)                  # 3 x (B, T, C)
        q, k, v = (z.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for z in (q, k, v))                         # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))   # (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    """(B, T) token ids -> (B, T, vocab_size) logits of the next character (after nanoGPT)."""

    def __init__(self, vocab_size, block_size=32, n_embd=64, n_head=4, n_layer=2):
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx):                                    # (B, T)
        T = idx.shape[1]
        if T > self.block_size:
            raise ValueError(f"sequence length {T} > block_size {self.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)              # (B, T, C)
        return self.head(self.ln_f(self.blocks(x)))            # (B, T, vocab)

    @torch.no_grad()
    def generate(self, idx, new_tokens, generator=None):
        """Sample ``new_tokens`` characters after the prompt ``idx`` (B, T)."""
        for _ in range(new_tokens):
            logits = self(idx[:, -self.block_size:])[:, -1]    # (B, vocab)
            nxt = torch.multinomial(F.softmax(logits, -1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


class ClipCNN3d(nn.Module):
    """(B, 1, T, H, W) clips -> (B, num_classes) logits; 3-D kernels see motion across frames."""

    def __init__(self, channels=8, num_classes=4, frames=8, size=16):
        super().__init__()
        self.conv1 = nn.Conv3d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv3d(channels, 2 * channels, 3, padding=1)
        self.fc = nn.Linear(2 * channels * (frames // 4) * (size // 4) ** 2, num_classes)

    def forward(self, x):                                   # (B, 1, T, H, W)
        x = F.max_pool3d(F.relu(self.conv1(x)), 2)          # (B, C, T/2, H/2, W/2)
        x = F.max_pool3d(F.relu(self.conv2(x)), 2)          # (B, 2C, T/4, H/4, W/4)
        return self.fc(x.flatten(1))                        # (B, classes)


def mlp(sizes=(64, 256, 256, 10), seed=None):
    """A plain MLP, ``nn.Sequential`` of Linear layers with ReLU between them (01's FLOP count,
    03d's gradient-sync model, 04c's emulated-DDP model, 06c1's ZeRO model). ``seed``: the same weights everywhere."""
    if seed is not None:
        torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
