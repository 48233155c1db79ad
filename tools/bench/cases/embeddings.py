"""vs_torch.py cases for the embeddings group: lookup and vocab_parallel_lookup in bf16 at
the DeepSeek-V3 (V = 129280, H = 7168) and Llama-3-8B (V = 128256, H = 4096) embedding
shapes, large (T = 32768, the issue's target) and decode-sized (T = 1, 16, 64: CUDA
graphs).

lookup's torch side is F.embedding (ids in range: torch refuses others); kreg's call also
passes the device-side counter of out-of-range ids, as a serving loop would. The
vocab-parallel case is rank 3 of 8 (Vs = V / 8) with ids over the whole vocabulary, so
about 1/8 of the rows are read; its torch side is the mask / gather / fill that SGLang's
VocabParallelEmbedding emits (sglang#30948).

bytes: lookup reads and writes T*H*e and reads the ids; vocab_parallel_lookup reads only
the rows of ids inside the shard (counted from the case's fixed ids), writes T*H*e and
reads the ids.
"""

import torch
import torch.nn.functional as F

DTYPE = torch.bfloat16
ELEM = 2
MODELS = [(129280, 7168, "DeepSeek-V3"), (128256, 4096, "Llama-3-8B")]
TOKENS = [1, 16, 64, 32768]
SMALL_MAX_T = 64
RANKS = 8
RANK = 3


def _ids(t, v, seed):
    """The case's ids, the same on every make() (so that bytes are exact), int64."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, v, (t,), generator=g, dtype=torch.int64)


def _lookup_case(t, v, h, model):
    ids_cpu = _ids(t, v, 16 + t)

    def make():
        return {
            "ids": ids_cpu.to("cuda"),
            "table": torch.randn(v, h, dtype=DTYPE, device="cuda"),
            "out": torch.empty(t, h, dtype=DTYPE, device="cuda"),
            "invalid": torch.zeros(1, dtype=torch.int32, device="cuda"),
        }

    return dict(
        op="embeddings.lookup",
        shape=f"T={t} V={v} H={h} bf16 ({model})",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, d: op(d["ids"], d["table"], d["out"], d["invalid"]),
        torch=lambda d: (F.embedding(d["ids"], d["table"]),),
        check=lambda d: (d["out"],),
        tol=(0.0, 0.0),
        bytes=ELEM * 2 * t * h + 8 * t,  # rows read and written, ids
    )


def _vocab_parallel_case(t, v, h, model):
    vs = v // RANKS
    start = RANK * vs
    ids_cpu = _ids(t, v, 32 + t)
    inside = int(((ids_cpu >= start) & (ids_cpu < start + vs)).sum())

    def make():
        return {
            "ids": ids_cpu.to("cuda"),
            "table_shard": torch.randn(vs, h, dtype=DTYPE, device="cuda"),
            "out": torch.empty(t, h, dtype=DTYPE, device="cuda"),
        }

    def reference(d):
        ids = d["ids"]
        mask = (ids >= start) & (ids < start + vs)
        local = torch.where(mask, ids - start, torch.zeros_like(ids))
        return (F.embedding(local, d["table_shard"]).masked_fill(~mask[:, None], 0),)

    return dict(
        op="embeddings.vocab_parallel_lookup",
        shape=f"T={t} Vs={vs} H={h} rank {RANK}/{RANKS} bf16 ({model})",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, d: op(d["ids"], d["table_shard"], d["out"], vocab_start=start),
        torch=reference,
        check=lambda d: (d["out"],),
        tol=(0.0, 0.0),
        bytes=ELEM * (inside + t) * h + 8 * t,  # shard rows read, all rows written, ids
    )


def cases():
    for v, h, model in MODELS:
        for t in TOKENS:
            yield _lookup_case(t, v, h, model)
            yield _vocab_parallel_case(t, v, h, model)
