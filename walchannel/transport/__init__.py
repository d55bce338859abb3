"""How the channel reaches the engine: the seam, discovery, and gRPC.

:mod:`~walchannel.transport.base` (:class:`~walchannel.transport.base.Transport`,
the seam the channel talks to; SPEC "The channel"),
:mod:`~walchannel.transport.discovery` (SPEC "Discovery"),
:mod:`~walchannel.transport.grpc` (the one implementation over ``grpc.aio``).
"""
