"""Test-only shims that let megatron-core 0.16.1 pipeline schedules run on a CPU-only torch.

Owns: the few patches of megatron-core internals that a CPU run needs (see
/work/shared/reference/megatron-cpu/FACTS.md, section 2). Apply them only when
``torch.cuda.is_available()`` is False; on a GPU machine nothing here is used.

Where megatron-core 0.16.1 hard-codes CUDA on the pipeline path:
  * ``pipeline_parallel/schedules.py``: ``torch.zeros([], ..., device="cuda")`` at the start of
    every schedule;
  * ``pipeline_parallel/p2p_communication.py``: receive buffers on
    ``torch.cuda.current_device()`` and ``torch.cuda.synchronize()`` after batched p2p;
  * local layers: ``GlobalMemoryBuffer`` and tensor-parallel helpers allocate on
    ``torch.cuda.current_device()``;
  * ``tensor_parallel/random.py``: the CUDA RNG tracker's ``fork()`` (entered by the local
    attention) needs CUDA RNG state;
  * optimizer / DDP / grad-norm helpers (only with megatron's DDP and optimizer) allocate
    ``device="cuda"`` tensors.
Two more things are settings, not shims, and live in the trainer: an explicit causal attention
mask (the default mask is built on "cuda") and untied embeddings (PP>1 moves the tied weight to
CUDA); ``clip_grad=0`` avoids the CUDA-only gradient clipping assert.

Must not import anything from pipeswift_slurm. Pinned to megatron-core 0.16.1 internals.
"""

from __future__ import annotations

import contextlib
import importlib

import torch

_CPU = torch.device("cpu")

# Modules whose module-global ``torch`` is swapped for the proxy below.
_PIPELINE_MODULES = ("megatron.core.pipeline_parallel.schedules",
                     "megatron.core.pipeline_parallel.p2p_communication")
_TRAINING_MODULES = ("megatron.core.optimizer.optimizer", "megatron.core.optimizer.clip_grads",
                     "megatron.core.distributed.finalize_model_grads",
                     "megatron.core.distributed.param_and_grad_buffer",
                     "megatron.core.distributed.distributed_data_parallel", "megatron.core.utils")


def _to_cpu(device):
    """Map any CUDA device spelling (``"cuda"``, ``"cuda:0"``, an int) to the CPU device."""
    if device is None:
        return None
    if isinstance(device, int) or str(device).startswith("cuda"):
        return _CPU
    return device


class _CudaProxy:
    """``torch.cuda`` as seen by the patched modules: no device, no synchronisation."""

    def __getattr__(self, name):
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device():
        return _CPU

    @staticmethod
    def synchronize(*_args, **_kwargs):
        return None


class _TorchProxy:
    """``torch`` as seen by the patched modules: tensor factories map "cuda" to the CPU."""

    cuda = _CudaProxy()

    def __getattr__(self, name):
        return getattr(torch, name)


def _cpu_factory(factory):
    def make(*args, device=None, **kwargs):
        return factory(*args, device=_to_cpu(device), **kwargs)
    return staticmethod(make)


for _name in ("zeros", "empty", "ones", "tensor", "full"):
    setattr(_TorchProxy, _name, _cpu_factory(getattr(torch, _name)))


def _install_cpu_rng_tracker():
    """Replace the CUDA RNG tracker by one whose ``fork()`` is a no-op (dropout then draws
    from the default CPU generator)."""
    from megatron.core.tensor_parallel import random as tp_random

    class CpuRNGStatesTracker(tp_random.CudaRNGStatesTracker):
        def add(self, name, seed):
            self.states_[name] = seed

        @contextlib.contextmanager
        def fork(self, name="model-parallel-rng"):
            yield

    tp_random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def apply(training: bool = True) -> list[str]:
    """Patch megatron-core so that its schedules, p2p and local layers run on the CPU.

    Args:
        training: also patch the optimizer, DDP and grad-norm modules (megatron DDP path).

    Returns:
        The names of the modules whose ``torch`` global was replaced (empty on a CUDA machine).
    """
    if torch.cuda.is_available():
        return []
    torch.cuda.current_device = lambda: _CPU
    torch.cuda.synchronize = lambda *_a, **_k: None
    _install_cpu_rng_tracker()
    proxy = _TorchProxy()
    names = _PIPELINE_MODULES + (_TRAINING_MODULES if training else ())
    patched = []
    for name in names:
        module = importlib.import_module(name)
        if getattr(module, "torch", None) is torch:
            module.torch = proxy
            patched.append(name)
    return patched
