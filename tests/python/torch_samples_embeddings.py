"""torch_samples for the embeddings group (merged into torch_samples.BUILDERS at import):
lookup and vocab_parallel_lookup on small tables (H not a multiple of 8, one-token calls),
both id dtypes, repeated ids and out-of-range ids (negative, = V, past int32 for i64),
which both backends turn into zero rows, counted by lookup's counter."""

import torch

import torch_samples as base

Sample = base.Sample


def _ids(m, t, v, dtype, tail):
    """t ids: random ones in [0, v) with a repeat, then the given `tail`."""
    ids = m.randint(0, v, t - len(tail), dtype=torch.int64).cpu().tolist()
    if len(ids) > 1:
        ids[-1] = ids[0]
    return m.tensor(ids + tail, dtype)


def _lookup(m, dt):
    out = []
    # (T, V, H, id dtype, last ids: out of range but for the T = 1 call's). Every sample passes the counter, starting
    # non-zero (it accumulates): test_kreg_torch compares every written tensor, so an
    # omitted one has nothing to compare (the C++ tests cover the omitted counter).
    cases = ((6, 11, 37, torch.int64, [-1, 11, 1 << 33]),
             (4, 5, 64, torch.int32, [5]),
             (1, 3, 9, torch.int64, [2]))
    for t, v, h, idt, tail in cases:
        args = (_ids(m, t, v, idt, tail), m.randn(v, h, dtype=dt), m.empty(t, h, dtype=dt),
                m.tensor([3], torch.int32))
        out.append(Sample(args, {}, f"T={t} V={v} H={h} {str(idt)[6:]} {base._SHORT[dt]}"))
    return out


def _vocab_parallel_lookup(m, dt):
    out = []
    # (T, Vs, H, id dtype, vocab_start): ids inside the shard (with repeats) and, for T > 2,
    # the two ids just outside it.
    for t, vs, h, idt, start in ((7, 6, 37, torch.int64, 12), (3, 4, 64, torch.int32, 0),
                                 (1, 2, 9, torch.int64, 1 << 33)):
        bad = [start - 1, start + vs] if t > 2 else []
        ids = _ids(m, t, vs, torch.int64, []).cpu() + start
        ids[: len(bad)] = torch.tensor(bad, dtype=torch.int64)
        args = (m.to(ids.to(idt)), m.randn(vs, h, dtype=dt), m.empty(t, h, dtype=dt))
        out.append(Sample(args, {"vocab_start": start},
                          f"T={t} Vs={vs} H={h} start={start} {str(idt)[6:]} {base._SHORT[dt]}"))
    return out


BUILDERS = {
    "embeddings.lookup": _lookup,
    "embeddings.vocab_parallel_lookup": _vocab_parallel_lookup,
}
