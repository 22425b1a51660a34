"""F.scaled_dot_product_attention with one backend forced (torch.nn.attention.sdpa_kernel).
When the backend cannot take a case, PyTorch's reasons become the row's (unsupported) reason.

Static capabilities are what PyTorch builds: the efficient and cuDNN backends are CUDA only;
flash and math also run on the CPU (flash: aten::_scaled_dot_product_flash_attention_for_cpu,
which takes every dtype, head dim and attn_mask here). Finer limits (flash on CUDA: float16 /
bfloat16, no attn_mask; head-dim and alignment limits) differ between torch versions and GPUs,
so PyTorch itself says them at call time."""
from attnbench.masks import MASKS
from attnbench.registry import register
from attnbench.sdpa import forced

DEVICES = {"flash": ("cpu", "cuda"), "efficient": ("cuda",), "cudnn": ("cuda",),
           "math": ("cpu", "cuda")}

for _name, _devices in DEVICES.items():
    register(f"sdpa_{_name}", devices=_devices, masks=MASKS, backend=_name,
             description=f"F.scaled_dot_product_attention with only the {_name} backend")(
        forced(_name))
