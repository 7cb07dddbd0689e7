"""The replica layer: one topic's replica and its total order, above `node.state`.

Layers, lowest first: `node.core` (events, the graph, the store protocol, the
order algorithms) < `node.state` (authorization and state resolution) <
`node.replica` (a `Replica` joins the two: authoring, receiving, state actions,
and `ordering`, which feeds the graph and the roles of the state into the
linearizer). All three are sans-IO; the runtime and the adapters sit above.
"""
