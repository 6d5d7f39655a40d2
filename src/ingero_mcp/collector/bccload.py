"""Finds BCC's Python bindings, which come from the system package (python3-bpfcc), not from PyPI.

A virtual environment does not see /usr/lib/python3/dist-packages, so on ImportError the `bcc`
package alone is loaded from the known system locations (nothing else from there enters the
interpreter). The PyPI package named `bcc` is an unrelated lattice library and is refused.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

SYSTEM_DIRS: tuple[str, ...] = (
    "/usr/lib/python3/dist-packages",
    "/usr/lib/python3/site-packages",
    "/opt/bcc/usr/lib/python3/dist-packages",
    "/usr/share/bcc/python",
)

INSTALL_HINT = (
    "BCC's Python bindings were not found. Install them from the system packages: "
    "Debian/Ubuntu `apt-get install python3-bpfcc` (and `linux-headers-$(uname -r)` or, on Debian, "
    "linux-headers-amd64), Fedora/RHEL `dnf install python3-bcc kernel-devel`. "
    "Do NOT `pip install bcc` (an unrelated PyPI package). If BCC lives elsewhere, set "
    "BCC_PYTHONPATH=/path/to/dist-packages."
)


class BccMissing(RuntimeError):
    """BCC's Python bindings cannot be imported; the message says what to install."""


def _is_real_bcc(module: ModuleType) -> bool:
    return hasattr(module, "BPF") and hasattr(module, "lib")


def _candidate_dirs() -> list[str]:
    extra = [p for p in os.environ.get("BCC_PYTHONPATH", "").split(os.pathsep) if p]
    return extra + list(SYSTEM_DIRS)


def _load_from(directory: str) -> ModuleType | None:
    init = Path(directory) / "bcc" / "__init__.py"
    if not init.is_file():
        return None
    spec = importlib.util.spec_from_file_location("bcc", init, submodule_search_locations=[str(init.parent)])
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bcc"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        for name in [n for n in sys.modules if n == "bcc" or n.startswith("bcc.")]:
            del sys.modules[name]
        raise
    return module


def import_bcc() -> ModuleType:
    """The `bcc` module (system BCC), or BccMissing with what to install."""
    try:
        import bcc  # type: ignore[import-not-found]

        if _is_real_bcc(bcc):
            return bcc
        del sys.modules["bcc"]
    except ImportError:
        pass
    except OSError as exc:  # libbcc.so missing behind an importable module
        raise BccMissing(f"BCC's Python module is present but libbcc cannot be loaded ({exc}). {INSTALL_HINT}") from exc
    errors: list[str] = []
    for directory in _candidate_dirs():
        try:
            module = _load_from(directory)
        except OSError as exc:
            errors.append(f"{directory}: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - report any failure of a found copy
            errors.append(f"{directory}: {type(exc).__name__}: {exc}")
            continue
        if module is not None and _is_real_bcc(module):
            return module
    detail = f" (tried: {'; '.join(errors)})" if errors else ""
    raise BccMissing(INSTALL_HINT + detail)
