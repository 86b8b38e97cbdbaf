"""What gRPC needs around the protocols: the server in every worker (``server``), its interceptors (request ids and
access lines, the core's gate: ``interceptors``), the one error edge every method answers through (``edge``), and
``grpc.health.v1`` (``health``). The protocols' servicers are in :mod:`serve.protocols`."""
