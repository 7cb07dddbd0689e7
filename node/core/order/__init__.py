"""The ordering core: a consistent total order over a DAG of writers' nodes.

`Linearizer` is the entry point; `OrderNode` is what it orders and
`OrderUpdate` what it reports. The modules, smallest idea first: `clock`
(who has seen what), `topolist` (the deterministic tentative order),
`consensus` (rounds, anchors, votes: what is confirmed), `linearizer`
(ties them together, relayed writers, indexer changes).
"""

from .linearizer import Linearizer, RoleChange
from .values import OrderError, OrderNode, OrderUpdate

__all__ = ["Linearizer", "OrderError", "OrderNode", "OrderUpdate", "RoleChange"]
