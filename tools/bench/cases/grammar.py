"""vs_torch.py cases for the grammar group: apply_token_bitmask at V = 128000 (Llama 3's
vocabulary, xgrammar's benchmark size) with xgrammar's two mask patterns: 1024 random
tokens banned per row (most words all-allowed: the kernel reads the mask and touches
almost no logits) and 120000 banned (most logits become -inf), at B = 1 (decode: CUDA
graphs, small=True), 64 and 512, in f32 (xgrammar's benchmark dtype) and bf16; and B = 64 with
indices (every fourth row, xgrammar's "stride 4").

The torch side unpacks the bits and calls masked_fill (the same result, exactly).
`bytes`: the bitmask rows read plus one store per banned logit (allowed logits need not
be touched at all).
"""

import torch

V = 128000
W = (V + 31) // 32


def _bitmask(allowed):
    """bool [B, V] -> int32 [B, W]: bit j of word w set = token 32 w + j allowed."""
    b = allowed.shape[0]
    padded = torch.zeros(b, W * 32, dtype=torch.int64, device=allowed.device)
    padded[:, :V] = allowed.long()
    weights = torch.tensor([1 << j for j in range(32)], dtype=torch.int64, device=allowed.device)
    words = (padded.view(b, W, 32) * weights).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _unpack(bitmask):
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :V].bool()


def _case(b, banned, dtype, stride):
    # A slice, not a list of rows: indexing with a Python list copies an index tensor from
    # the host, which a CUDA graph capture (the B = 1 cases) refuses.
    rows = slice(0, b, stride)
    n_rows = len(range(0, b, stride))

    def make():
        allowed = torch.ones(b, V, dtype=torch.bool, device="cuda")
        for r in range(b):
            allowed[r, torch.randperm(V, device="cuda")[:banned]] = False
        d = {"logits": torch.randn(b, V, device="cuda").to(dtype), "bitmask": _bitmask(allowed)}
        d["indices"] = torch.arange(0, b, stride, dtype=torch.int32, device="cuda") if stride > 1 else None
        return d

    def reference(t):
        logits = t["logits"].clone()
        masked = logits[rows].masked_fill(~_unpack(t["bitmask"][rows]), float("-inf"))
        logits[rows] = masked
        return (logits,)

    elem = torch.tensor([], dtype=dtype).element_size()
    name = {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype]
    label = f"B={b} V={V} banned={banned} {name}" + (f" indices=::{stride}" if stride > 1 else "")
    return dict(
        op="grammar.apply_token_bitmask",
        shape=label,
        small=b == 1,
        make=make,
        kreg=lambda op, t: op(t["logits"], t["bitmask"], t["indices"]),
        torch=reference,
        check=lambda t: (t["logits"],),
        tol=(0, 0),
        bytes=n_rows * (4 * W + elem * banned),
    )


def cases():
    for dtype in (torch.float32, torch.bfloat16):
        for b in (1, 64, 512):
            for banned in (1024, 120000):
                yield _case(b, banned, dtype, 1)
    yield _case(64, 120000, torch.bfloat16, 4)
