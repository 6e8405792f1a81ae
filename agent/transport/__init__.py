from agent.transport.base import Message, Transport, TransportError, Will

__all__ = ["Message", "Transport", "TransportError", "Will"]
