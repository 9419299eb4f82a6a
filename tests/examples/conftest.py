"""Fixtures for the example tests."""
import socket

import pytest


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a socket fails the test: proves loading works offline."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
