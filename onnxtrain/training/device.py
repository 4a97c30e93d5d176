"""Where training runs: a device string or a list of execution providers, resolved once.

``device`` is ONNX Runtime's training-API spelling: ``"cpu"``, ``"cuda"`` or
``"cuda:<id>"``. ``providers`` is onnxruntime's list of execution providers
(names, or ``(name, options)`` pairs). Given only ``providers``, the device is
the first provider's (``CUDAExecutionProvider`` with ``device_id`` 1 ->
``cuda:1``); given only ``device``, the providers are that device's
(``CUDAExecutionProvider`` then ``CPUExecutionProvider`` for CUDA). Parameters,
gradients and optimizer state are kept in the device's memory.

``device="cuda"`` turns TF32 off (``use_tf32=0``), as PyTorch's matrix
products have it by default, so that float32 training computes in float32
(onnxruntime's default is TF32). Pass ``providers=`` with ``use_tf32="1"``
for TF32's speed. Its CUDA arena grows by what each allocation asks
(``arena_extend_strategy=kSameAsRequested``), not to the next power of two,
onnxruntime's default, which can hold far more than a step needs (GPT-2
small, 8 x 128, on an H200: 13.3 GB against 10.6 GB). The sessions of a
module on a device share one arena (:mod:`onnxtrain.training.options`) where
the providers leave the arena as these defaults have it (:func:`shares_arena`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import onnxruntime as ort

DeviceType = Literal["cpu", "cuda"]
#: ``name`` or ``(name, options)``, as ``onnxruntime.InferenceSession(providers=...)`` takes them.
ProviderSpec = str | tuple[str, Mapping[str, Any]]

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
#: Providers whose tensors live in CUDA memory.
_CUDA_PROVIDERS = frozenset({CUDA_PROVIDER, "TensorrtExecutionProvider"})
#: The CUDA provider's arena settings for ``device="cuda"``.
CUDA_ARENA_OPTIONS: Mapping[str, str] = {"arena_extend_strategy": "kSameAsRequested"}
#: Provider options that capture a session's run as a graph and replay it (CUDA's, TensorRT's, DirectML's,
#: WebGPU's): refused, see :func:`resolve`.
GRAPH_CAPTURE_OPTIONS = ("enable_cuda_graph", "trt_cuda_graph_enable", "enable_graph_capture", "enableGraphCapture")
#: The CUDA provider's options that configure its memory arena or replace it.
_CUDA_ARENA_KEYS = (
    "arena_extend_strategy",
    "gpu_mem_limit",
    "gpu_external_alloc",
    "gpu_external_free",
    "gpu_external_empty_cache",
    "default_memory_arena_cfg",
)


@dataclass(frozen=True)
class Device:
    """A device: ``type`` (``"cpu"`` or ``"cuda"``) and ``id``."""

    type: DeviceType = "cpu"
    id: int = 0

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"{self.type}:{self.id}"

    @classmethod
    def parse(cls, device: str | Device) -> Device:
        """``"cpu"``, ``"cuda"``, ``"cuda:1"`` -> :class:`Device`; ``ValueError`` for anything else."""
        if isinstance(device, Device):
            return device
        if not isinstance(device, str):
            raise TypeError(f"device must be a string such as 'cpu', 'cuda' or 'cuda:1', not {type(device).__name__}")
        kind, _, index = device.strip().lower().partition(":")
        if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
            raise ValueError(f"device={device!r} is not a device; use 'cpu', 'cuda' or 'cuda:<id>' (e.g. 'cuda:1')")
        if kind == "cpu":
            if index and index != "0":
                raise ValueError(f"device={device!r}: the CPU has no index; use 'cpu'")
            return cls("cpu", 0)
        return cls("cuda", int(index or 0))

    def providers(self) -> list[ProviderSpec]:
        """The execution providers that run on this device, CPU last as the fallback."""
        if self.type == "cpu":
            return [CPU_PROVIDER]
        return [(CUDA_PROVIDER, {"device_id": str(self.id), "use_tf32": "0", **CUDA_ARENA_OPTIONS}), CPU_PROVIDER]


def _provider_name(provider: Any) -> str:
    if isinstance(provider, str):
        return provider
    if isinstance(provider, tuple) and len(provider) == 2 and isinstance(provider[0], str):
        return provider[0]
    raise TypeError(f"each provider must be a name or a (name, options) pair, not {provider!r}")


def _device_of(provider: ProviderSpec) -> Device:
    name = _provider_name(provider)
    if name not in _CUDA_PROVIDERS:
        return Device("cpu")
    options = provider[1] if isinstance(provider, tuple) else {}
    return Device("cuda", int(options.get("device_id", 0)))


def shares_arena(providers: Sequence[ProviderSpec]) -> bool:
    """Whether sessions with ``providers`` may allocate from one arena shared with the device's other sessions.

    On the CPU, always. With the CUDA provider first, where its options set
    none of the arena's settings (:data:`_CUDA_ARENA_KEYS`) but to the values
    ``device="cuda"`` gives them: the shared arena has those settings, and a
    user's own (a memory limit, an allocator of theirs) are kept by arenas
    of each session's own. Any other provider first: never.
    """
    first = providers[0]
    name = _provider_name(first)
    if name == CPU_PROVIDER:
        return True
    if name != CUDA_PROVIDER:
        return False
    options = first[1] if isinstance(first, tuple) else {}
    return all(str(options[key]) == CUDA_ARENA_OPTIONS.get(key) for key in _CUDA_ARENA_KEYS if key in options)


def resolve(device: str | Device | None, providers: Sequence[ProviderSpec] | None) -> tuple[Device, list[ProviderSpec]]:
    """The device and the provider list for a session; errors name what this onnxruntime lacks."""
    if providers is not None:
        if isinstance(providers, (str, tuple)) or not providers:
            raise TypeError(
                f"providers must be a non-empty list of provider names or (name, options) pairs, not {providers!r}"
            )
        providers = list(providers)
        inferred = _device_of(providers[0])
        if device is not None and Device.parse(device) != inferred:
            raise ValueError(
                f"device={str(device)!r} disagrees with providers: the first provider "
                f"{_provider_name(providers[0])!r} runs on {inferred}; pass one of them, or make them agree"
            )
        chosen = inferred
    else:
        chosen = Device.parse("cpu" if device is None else device)
        providers = chosen.providers()
    _refuse_graph_capture(providers)
    available = ort.get_available_providers()
    missing = [_provider_name(p) for p in providers if _provider_name(p) not in available]
    if missing:
        hint = " (install onnxruntime-gpu for CUDA)" if any(m in _CUDA_PROVIDERS for m in missing) else ""
        raise ValueError(
            f"this onnxruntime build has no {missing}{hint}; it has {available}. "
            f"Choose device='cpu' or providers from that list"
        )
    return chosen, providers


def _refuse_graph_capture(providers: Sequence[ProviderSpec]) -> None:
    """A ``ValueError`` where a provider's options turn on the capture of a session's run as a graph replayed
    at the next runs (:data:`GRAPH_CAPTURE_OPTIONS`)."""
    for provider in providers:
        options = provider[1] if isinstance(provider, tuple) else {}
        for key in GRAPH_CAPTURE_OPTIONS:
            if str(options.get(key, "0")).strip().lower() not in ("0", "false", ""):
                raise ValueError(
                    f"provider option {key}={options[key]!r} of {_provider_name(provider)}: a captured graph "
                    "replays the addresses of its first runs, and the runtime binds each step's batch and each "
                    "eval's inputs anew, so a replay would read stale data. Remove the option"
                )


__all__ = [
    "CPU_PROVIDER",
    "CUDA_ARENA_OPTIONS",
    "CUDA_PROVIDER",
    "GRAPH_CAPTURE_OPTIONS",
    "Device",
    "DeviceType",
    "ProviderSpec",
    "resolve",
    "shares_arena",
]
