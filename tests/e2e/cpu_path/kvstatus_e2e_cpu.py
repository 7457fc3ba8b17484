"""The e2e tier's test-only sglang plugin: turns off one GPU-only path of sglang 0.5.23's PD prefill.

Registered in the entry-point group ``sglang.srt.plugins`` by the ``kvstatus_e2e_cpu-0.0.0.dist-info``
beside it (found because tests/e2e/cpu_path is on the servers' PYTHONPATH; nothing is pip-installed).

Upstream path avoided: ``sglang.srt.disaggregation.prefill`` (``send_kv_chunk``) checks
``sender.supports_host_tensor_indices``; ``MooncakeKVSender`` sets it True, and then the prefill copies the
page indices into *pinned* host memory and records a ``torch.cuda.Event`` for the transfer worker to wait on.
Both need CUDA. With the attribute False, the prefill takes its other branch (``kv_to_page_indices`` on the
host), which is what every non-mooncake sender does.
"""

from __future__ import annotations


def register() -> None:
    """sglang calls this early in every process; patch the class attribute (import is cheap: sglang is loaded)."""
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    MooncakeKVSender.supports_host_tensor_indices = False
