"""A stand-in for ``sgl_kernel`` (sglang's CUDA kernel library), for the e2e tier on CPU only.

sglang 0.5.23 on CPU (``SGLANG_USE_CPU_ENGINE=1``) imports ``sgl_kernel`` unconditionally, and no CPU
build of it exists on the package index. With ``--attention-backend torch_native`` none of its kernels
is called, so this stub only has to import. Any attribute (and any submodule) resolves to an object
that raises :class:`SglKernelStubCalled` when called or used as a tensor op, so a code path that does
need a real kernel fails loudly, naming it, instead of computing garbage.

Lives under tests/e2e/cpu_path (on PYTHONPATH of the e2e servers only), never in the kvstatus wheel.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Optional, Sequence

__version__ = "0.0.0+kvstatus-e2e-stub"


class SglKernelStubCalled(RuntimeError):
    """An sgl_kernel function was called: the e2e tier's CPU setup took a GPU path it should avoid."""


class _Loud:
    """Any sgl_kernel attribute: importable, attribute-able, never callable."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise SglKernelStubCalled(
            f"{self._name} was called, but sgl_kernel is the e2e tier's stub (tests/e2e/cpu_path): "
            "this sglang code path needs a real kernel build; avoid it with a flag, as the other CPU workarounds do"
        )

    def __getattr__(self, attr: str) -> _Loud:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Loud(f"{self._name}.{attr}")

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<sgl_kernel stub {self._name}>"


def _module_getattr(module_name: str) -> Any:
    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Loud(f"{module_name}.{attr}")

    return __getattr__


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import sgl_kernel.anything`` succeed with a module of loud attributes."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[types.ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []  # a package, so deeper submodules import too
        module.__getattr__ = _module_getattr(spec.name)  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


__getattr__ = _module_getattr(__name__)
sys.meta_path.append(_StubFinder())
