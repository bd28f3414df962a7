"""One module per cloud (``aws``, ``gcp``, ``local``), each a :class:`kit.clouds.base.Cloud`.

Everything kit knows that differs between clouds lives there: the spec model, the instance
catalog, tags, capacity errors, the data disk's device, the Terraform variables, the event source
and the backend. Nothing outside this package branches on the cloud name: it asks ``get(name)``.
A new cloud is a new module here and its name in ``NAMES``.
"""

from __future__ import annotations

import importlib
from typing import Any

from kit.clouds.base import Cloud

NAMES = ("aws", "gcp", "local")


def get(name: str) -> Cloud[Any]:
    if name not in NAMES:
        from kit.errors import InputError
        from kit.validation import shown

        raise InputError(f"unknown cloud {shown(name)}", where="cloud", fix=f"use one of {', '.join(NAMES)}")
    return importlib.import_module(f"kit.clouds.{name}").CLOUD
