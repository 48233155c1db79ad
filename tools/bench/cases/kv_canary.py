"""kv_canary cases for tools/bench/vs_torch.py (docs/ops/kv_canary.md).

kv_canary.verify over 1M KV slots (1024 requests of 1024 tokens), records only and with
the real-data hash of 128-byte rows. The torch baseline is a plain re-implementation of
the same check with int64 tensor arithmetic (wrapping multiplies, masked right shifts
for the unsigned ones): gathers, the splitmix64 finaliser, and a count of failing rows.
Both sides count the same planted corruptions (every 4099th token expectation is wrong,
every 8191st slot's data is flipped); kreg's count is cumulative, so check() reads it
after the single checked call.
"""

import torch

SEED = 0x4B5643414E415259
GOLDEN = 0x9E3779B97F4A7C15
C1 = 0xBF58476D1CE4E5B9
C2 = 0x94D049BB133111EB


def _s64(x):
    """A uint64 constant as the int64 with the same bits."""
    return x - (1 << 64) if x >= 1 << 63 else x


def _srl(z, k):
    return (z >> k) & ((1 << (64 - k)) - 1)


def fmix(z):
    z = (z ^ _srl(z, 30)) * _s64(C1)
    z = (z ^ _srl(z, 27)) * _s64(C2)
    return z ^ _srl(z, 31)


def chain_mix(prev, token, position):
    return fmix(fmix(prev ^ token) + position + _s64(GOLDEN))


def data_hash(rows):
    """rows: [n, R] uint8 -> [n] int64."""
    words = rows.contiguous().view(torch.int64)
    idx = torch.arange(1, words.shape[1] + 1, device=rows.device, dtype=torch.int64)
    h = fmix(words + idx * _s64(GOLDEN)).sum(dim=1)
    return fmix(h + rows.shape[1])


def torch_verify(canary, plan, kv):
    slot, token, pos, prev = plan.unbind(1)
    rec = canary[slot]
    prev_chain = torch.where(prev < 0, torch.full_like(prev, _s64(SEED)),
                             canary[prev.clamp(min=0), 2])
    chain = chain_mix(prev_chain, token, pos)
    bad = (rec[:, 0] != token) | (rec[:, 1] != pos) | (rec[:, 2] != chain)
    if kv is not None:
        bad = bad | (rec[:, 3] != data_hash(kv[slot]))
    return bad.sum().reshape(1)


def _case(requests, length, row_bytes, small):
    n = requests * length
    num_slots = n + n // 4

    def make():
        g = torch.Generator(device="cuda")
        g.manual_seed(7)
        dev = "cuda"
        slots = torch.randperm(num_slots, generator=g, device=dev)[:n].view(requests, length)
        tokens = torch.randint(0, 128000, (requests, length), generator=g, device=dev)
        kv = torch.randint(0, 256, (num_slots, row_bytes), generator=g, device=dev,
                           dtype=torch.uint8)
        canary = torch.zeros((num_slots, 4), device=dev, dtype=torch.int64)
        prev = torch.full((requests,), _s64(SEED), device=dev, dtype=torch.int64)
        for p in range(length):  # the chains, one position at a time
            s = slots[:, p]
            chain = chain_mix(prev, tokens[:, p], torch.full_like(prev, p))
            canary[s, 0] = tokens[:, p]
            canary[s, 1] = p
            canary[s, 2] = chain
            prev = chain
        if row_bytes:
            canary[:, 3] = data_hash(kv)
        pos = torch.arange(length, device=dev).expand(requests, length)
        prev_slot = torch.cat([torch.full((requests, 1), -1, device=dev), slots[:, :-1]], 1)
        plan = torch.stack([slots, tokens, pos, prev_slot], dim=2).reshape(n, 4).contiguous()
        plan[::4099, 1] += 1  # wrong expected tokens
        if row_bytes:
            kv[plan[::8191, 0], 0] ^= 1  # corrupted K/V bytes
        t = {
            "canary": canary,
            "plan": plan,
            "violations": torch.zeros((4096, 4), device=dev, dtype=torch.int64),
            "count": torch.zeros((1,), device=dev, dtype=torch.int64),
        }
        if row_bytes:
            t["kv"] = kv
        return t

    what = f"{row_bytes}-byte rows hashed" if row_bytes else "records only"
    return dict(
        op="kv_canary.verify",
        shape=f"{n} slots ({requests} x {length}) {what}",
        small=small,
        make=make,
        kreg=lambda op, t: op(t["canary"], t["plan"], t["violations"], t["count"],
                              t.get("kv")),
        torch=lambda t: (torch_verify(t["canary"], t["plan"], t.get("kv")),),
        check=lambda t: (t["count"],),
        tol=(0, 0),
        # plan rows and records read once, the previous slot's chain hash, the K/V rows.
        bytes=n * (32 + 32 + 8 + row_bytes),
    )


def cases():
    """Yields one dict per (op, shape)."""
    yield _case(1024, 1024, 0, small=False)
    yield _case(1024, 1024, 128, small=False)
    yield _case(64, 1, 0, small=True)  # a decode step of 64 requests
    yield _case(64, 1, 128, small=True)
