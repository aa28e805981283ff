"""mypyc's class markers, for the adapters compiled with mypyc; no-ops when interpreted.

* ``trait``: the orchestrator and the executor adapter are each one class
  assembled from mixins (``WaitHandling``, ``InboundHandlers``, ...). A native
  class may have only one ordinary base, so the mixins are traits.
* ``mypyc_attr(allow_interpreted_subclasses=True)``: the executor adapter and
  its bases, which tests subclass (``FlakyAdapter``). Caution: a compiled caller
  ignores an interpreted subclass's override of a *trait* method; override only
  the adapter's own methods and :class:`~.outbound.OutboundSends`'.

The type checker (and so mypyc) takes the ``TYPE_CHECKING`` branch and sees
``mypy_extensions``' markers; at run time they are identities, so neither mode
needs ``mypy_extensions`` installed. This module itself must stay interpreted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
    from mypy_extensions import trait as trait
else:

    def trait(cls: type) -> type:
        return cls

    def mypyc_attr(*_names: str, **_values: Any) -> Any:
        return trait
