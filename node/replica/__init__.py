"""The replica layer: one topic's replica and its total order, above `node.state`.

Layers, lowest first: `node.core` (events, the graph, the store protocol, the
order algorithms) < `node.state` (authorization and state resolution) <
`node.replica`. All three are sans-IO; the runtime and the adapters sit above.

Modules of `node.replica`:

    replica      `Replica`: receiving, reads, commit hand-over (callers import it here)
    authoring    making local events: publish, dummies, acks, relayed writers' events
    state_ops    topic-state operations: join, invite, ban, add_writer, set_role, set_state
    read_access  who may read the topic now (`may_read`, `membership_of`): the read rule
    joining      a join from outside: the member's `join_terms`, the joiner's `sign_join`
    types        ReplicaConfig, TopicParams, Received and the replica's errors
    ordering     `TopicOrder`: feeds the graph and the state's roles into the linearizer
    order_duties what the order asks of a local author: parents to keep, when to ack
    order_views  what readers of the order see: the views, `OrderStatus`, `Rewind`
"""
