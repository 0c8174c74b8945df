"""API handlers, one module per API family.

Each module registers its handlers with :func:`tidelog.broker.handlers.registry.handles`;
importing this package imports every module in it, so adding an API is adding a module.
ApiVersions advertises exactly the APIs registered here.
"""

from __future__ import annotations

import importlib
import pkgutil

from tidelog.broker.handlers.registry import HANDLERS, handles

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["HANDLERS", "handles"]
