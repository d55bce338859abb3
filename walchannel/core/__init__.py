"""The run's decisions: the driver and its pure parts (no I/O, no clock, no grpc).

:mod:`~walchannel.core.driver` (the channel's state machine, SPEC "State
machine"), :mod:`~walchannel.core.end_status` (what an ended stream
says), :mod:`~walchannel.core.engine_refusals` (what the engine refuses
and what walchannel says of it), :mod:`~walchannel.core.watchdog` (when a
stream is dead), :mod:`~walchannel.core.checkpoints` (when the log is
checkpointed). The log's own state machine is :mod:`walchannel.log.state`,
beside the log it decides for.
"""
