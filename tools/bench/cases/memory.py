"""PyTorch side-by-side cases for the memory group (tools/bench/vs_torch.py).

memory.copy_rows reads its row range from two device scalars; the torch baseline is the
plain slice copy of the same rows (its offset and count are Python constants, which is
what a host would need a synchronisation to learn). check() returns the rows kreg wrote.
"""

import torch


def _copy_rows_case(label, src_rows, dst_rows, trailing, dtype, offset, count, on_src, small):
    row = 1
    for d in trailing:
        row *= d
    elem = torch.empty((), dtype=dtype).element_size()
    n = max(0, min(count, (src_rows if on_src else dst_rows) - offset,
                   dst_rows if on_src else src_rows))
    src_at = offset if on_src else 0
    dst_at = 0 if on_src else offset

    def make():
        return {
            "src": torch.randn(src_rows, *trailing, device="cuda").to(dtype),
            "dst": torch.zeros(dst_rows, *trailing, device="cuda", dtype=dtype),
            "offset": torch.tensor([offset], device="cuda", dtype=torch.int64),
            "count": torch.tensor([count], device="cuda", dtype=torch.int32),
        }

    return dict(
        op="memory.copy_rows",
        shape=label,
        small=small,
        make=make,
        kreg=lambda op, t: op(t["src"], t["dst"], t["offset"], t["count"],
                              offset_on_src=on_src),
        torch=lambda t: (t["src"][src_at:src_at + n].clone(),),
        check=lambda t: (t["dst"][dst_at:dst_at + n],),
        tol=(0.0, 0.0),
        bytes=2 * n * row * elem,
    )


def cases():
    """Yields one dict per (op, shape)."""
    # Large: whole-buffer moves (e.g. hidden states of a 32k-token prefill, Llama-3-8B
    # H = 4096, and DeepSeek-V3 MLA KV rows of 576 elements).
    yield _copy_rows_case("src 32768x4096 -> dst, offset on src 0, count 32768, bf16",
                          32768, 32768, (4096,), torch.bfloat16, 0, 32768, True, False)
    yield _copy_rows_case("src 16384x4096 -> dst 32768x4096 at 8192, bf16",
                          16384, 32768, (4096,), torch.bfloat16, 8192, 16384, False, False)
    yield _copy_rows_case("MLA KV 262144x576 rows 65536.. (count 131072), bf16",
                          262144, 131072, (576,), torch.bfloat16, 65536, 131072, True, False)
    # Decode-sized: a handful of rows.
    yield _copy_rows_case("src 64x4096 rows 3..19, bf16", 64, 16, (4096,), torch.bfloat16,
                          3, 16, True, True)
    yield _copy_rows_case("MLA KV 4096x576 -> dst at 100, 8 rows, bf16", 8, 4096, (576,),
                          torch.bfloat16, 100, 8, False, True)
