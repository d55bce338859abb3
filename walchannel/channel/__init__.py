"""The durable channel: a run's stream to its engine, every row committed before it is sent.

:mod:`~walchannel.channel.grpc_channel` (:class:`GrpcEngineChannel`, the
harness's face, and how it is composed), :mod:`~walchannel.channel.blocking`
(the same from threads), :mod:`~walchannel.channel.interface` (the
protocols and values they share). The rest are its parts, each named for
its responsibility. SPEC "The channel".
"""
