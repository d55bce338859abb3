"""What goes on the wire: payload rules, message shapes, the protobuf mapping, addresses.

:mod:`~walchannel.wire.payload` (SPEC "Payloads"), :mod:`~walchannel.wire.messages`
(the up-message bodies), :mod:`~walchannel.wire.protobuf` (bodies to and from the
generated messages, SPEC "Wire format"), :mod:`~walchannel.wire.address`
(host:port, allowed hosts, proxies). The frozen contract is :mod:`walchannel.contract`.
"""
