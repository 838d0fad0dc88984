"""The pypepper.scheduler import path for channels: :mod:`pypepper_dramatiq.channels.channel`."""

from .channels.admission import SendResult
from .channels.channel import POLL_INTERVAL, Channel, ChannelConnector, ChannelManager, manager

__all__ = [
    "POLL_INTERVAL",
    "Channel",
    "ChannelConnector",
    "ChannelManager",
    "SendResult",
    "manager",
]
