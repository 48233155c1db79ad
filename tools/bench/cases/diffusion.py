"""PyTorch side-by-side cases for the diffusion group (tools/bench/vs_torch.py).

Each torch function is the op's exact math (docs/ops/diffusion.md): fp32 upcast, one
rounding at the store. Large shapes are the issue's DiT shape B=16, S=4096, H=3072 (Flux /
SD3 hidden size) and SD-like UNet/VAE group norms; small ones are a single image's worth
of a few tokens, timed via CUDA graphs.
"""

import math

import torch
import torch.nn.functional as F

B, S, H = 16, 4096, 3072


def _elem(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _mod(b, s, h, per_token, dtype, scale=0.1):
    shape = (b, s, h) if per_token else (b, h)
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def _bcast(m):
    return m if m.dim() == 3 else m[:, None, :]


# ---- residual_gate_add ----

def _residual_gate_add(b, s, h, per_token, dtype, small):
    def make():
        return {
            "residual": torch.randn(b, s, h, device="cuda").to(dtype),
            "x": torch.randn(b, s, h, device="cuda").to(dtype),
            "gate": _mod(b, s, h, per_token, dtype, 1.0),
            "out": torch.empty(b, s, h, device="cuda", dtype=dtype),
        }

    def ref(t):
        y = t["residual"].float() + _bcast(t["gate"].float()) * t["x"].float()
        return (y.to(dtype),)

    gate_elems = b * (s if per_token else 1) * h
    return dict(
        op="diffusion.residual_gate_add",
        shape=f"B={b} S={s} H={h} gate {'[B,S,H]' if per_token else '[B,H]'} {dtype}"
              .replace("torch.", ""),
        small=small,
        make=make,
        kreg=lambda op, t: op(t["residual"], t["x"], t["gate"], t["out"]),
        torch=ref,
        check=lambda t: (t["out"],),
        tol=(1e-2, 1e-2),
        bytes=_elem(dtype) * (3 * b * s * h + gate_elems),
    )


# ---- norm_scale_shift ----

def _norm_scale_shift(b, s, h, per_token, affine, dtype, small, eps=1e-6):
    def make():
        return {
            "x": torch.randn(b, s, h, device="cuda").to(dtype),
            "scale": _mod(b, s, h, per_token, dtype),
            "shift": _mod(b, s, h, per_token, dtype),
            "weight": (1 + 0.1 * torch.randn(h, device="cuda")).to(dtype),
            "bias": (0.1 * torch.randn(h, device="cuda")).to(dtype),
            "out": torch.empty(b, s, h, device="cuda", dtype=dtype),
        }

    def ref(t):
        w = t["weight"].float() if affine else None
        bb = t["bias"].float() if affine else None
        y = F.layer_norm(t["x"].float(), (h,), w, bb, eps)
        y = y * (1 + _bcast(t["scale"].float())) + _bcast(t["shift"].float())
        return (y.to(dtype),)

    mod_elems = b * (s if per_token else 1) * h
    return dict(
        op="diffusion.norm_scale_shift",
        shape=(f"B={b} S={s} H={h} scale/shift {'[B,S,H]' if per_token else '[B,H]'}"
               f"{' affine' if affine else ''} {dtype}").replace("torch.", ""),
        small=small,
        make=make,
        # weight and bias are optional tensors: None omits them.
        kreg=lambda op, t: op(t["x"], t["scale"], t["shift"],
                              t["weight"] if affine else None, t["bias"] if affine else None,
                              t["out"], eps=eps),
        torch=ref,
        check=lambda t: (t["out"],),
        tol=(2e-2, 2e-2),
        bytes=_elem(dtype) * (2 * b * s * h + 2 * mod_elems + (2 * h if affine else 0)),
    )


# ---- timestep_embedding ----

def _timestep_embedding(n, dim, flip, shift, dtype, small, scale=1.0, max_period=10000):
    def make():
        return {
            "t": (torch.rand(n, device="cuda") * 1000).to(dtype),
            "out": torch.empty(n, dim, device="cuda", dtype=torch.float32),
        }

    def ref(t):  # diffusers' get_timestep_embedding
        half = dim // 2
        exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32,
                                                        device=t["t"].device)
        exponent = exponent / (half - shift)
        emb = t["t"][:, None].float() * torch.exp(exponent)[None, :]
        emb = scale * emb
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        if flip:
            emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
        if dim % 2 == 1:
            emb = F.pad(emb, (0, 1, 0, 0))
        return (emb,)

    return dict(
        op="diffusion.timestep_embedding",
        shape=f"N={n} dim={dim} flip={flip} shift={shift} t {dtype}".replace("torch.", ""),
        small=small,
        make=make,
        kreg=lambda op, t: op(t["t"], t["out"], dim=dim, flip_sin_to_cos=flip,
                              downscale_freq_shift=float(shift), scale=float(scale),
                              max_period=max_period),
        torch=ref,
        check=lambda t: (t["out"],),
        # t up to 1000: an fp32 ulp of a frequency moves an argument by ~1e-4.
        tol=(2e-3, 1e-3),
        bytes=4 * n * dim + _elem(dtype) * n,
    )


# ---- group_norm_silu ----

def _group_norm_silu(n, c, spatial, groups, dtype, small, eps=1e-5):
    def make():
        return {
            "x": torch.randn(n, c, *spatial, device="cuda").to(dtype),
            "weight": (1 + 0.1 * torch.randn(c, device="cuda")).to(dtype),
            "bias": (0.1 * torch.randn(c, device="cuda")).to(dtype),
            "out": torch.empty(n, c, *spatial, device="cuda", dtype=dtype),
        }

    def ref(t):
        y = F.group_norm(t["x"].float(), groups, t["weight"].float(), t["bias"].float(), eps)
        return (F.silu(y).to(dtype),)

    numel = n * c * math.prod(spatial)
    return dict(
        op="diffusion.group_norm_silu",
        shape=f"N={n} C={c} {'x'.join(map(str, spatial))} G={groups} {dtype}"
              .replace("torch.", ""),
        small=small,
        make=make,
        kreg=lambda op, t: op(t["x"], t["weight"], t["bias"], t["out"], num_groups=groups,
                              eps=eps),
        torch=ref,
        check=lambda t: (t["out"],),
        tol=(2e-2, 2e-2),
        bytes=_elem(dtype) * (2 * numel + 2 * c),
    )


def cases():
    """Yields one dict per (op, shape)."""
    bf16 = torch.bfloat16
    # The DiT shape, and a single image's few tokens.
    for per_token in (False, True):
        yield _residual_gate_add(B, S, H, per_token, bf16, False)
    yield _residual_gate_add(1, 16, H, False, bf16, True)
    yield _norm_scale_shift(B, S, H, False, False, bf16, False)
    yield _norm_scale_shift(B, S, H, True, True, bf16, False)
    yield _norm_scale_shift(1, 16, H, False, False, bf16, True)
    # Flux / SD3 use flip_sin_to_cos=True, shift 0, dim 256; SD UNets dim 320, shift 1.
    yield _timestep_embedding(16, 256, True, 0, torch.float32, True)
    yield _timestep_embedding(2, 320, False, 1, torch.float32, True)
    yield _timestep_embedding(65536, 1024, True, 0, torch.float32, False)
    # SD 1.x/2.x at 512 px: UNet/VAE 64x64 latents with 512 and 320 channels, 32 groups;
    # a VAE decoder stage (128 channels at 256x256); a tiny one.
    yield _group_norm_silu(16, 512, (64, 64), 32, bf16, False)
    yield _group_norm_silu(16, 320, (64, 64), 32, bf16, False)
    yield _group_norm_silu(2, 128, (256, 256), 32, bf16, False)
    yield _group_norm_silu(1, 320, (8, 8), 32, bf16, True)
