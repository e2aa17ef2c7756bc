"""The contract of a component that carries state across a restart (torchtitan's `Stateful`).

The optimizer, the sharded embedding, the reader and the loop's own totals each hand out a
`state_dict()` of tensors and plain values and take it back with `load_state_dict()`; the
checkpointer (`trainer.checkpoint`) saves `{name: component.state_dict()}` and knows nothing of
what is inside.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def require_keys(state: Mapping[str, Any], keys: Iterable[str], component: str) -> None:
    """Raise `ValueError` naming the keys of `keys` that `state` lacks (a checkpoint of other code)."""
    if missing := [k for k in keys if k not in state]:
        raise ValueError(
            f"{component} state lacks {missing}: the checkpoint was written by another version of the "
            "trainer; delete the run's checkpoint directory to start it again"
        )
