"""The pypepper.scheduler import path for channels: :mod:`pypepper_dramatiq.channels.channel`."""

from .channels.channel import POLL_INTERVAL, Channel, ChannelConnector, ChannelManager, manager
from .transport import SendResult

__all__ = [
    "POLL_INTERVAL",
    "Channel",
    "ChannelConnector",
    "ChannelManager",
    "SendResult",
    "manager",
]
