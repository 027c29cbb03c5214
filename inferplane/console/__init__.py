"""The web console served by the gateway at `/ui` (docs/console.md): fleet map, models,
live charts, keys and usage, a playground; read-only except `inferplane restart`."""

from inferplane.console.app import ConsoleApp, attach

__all__ = ["ConsoleApp", "attach"]
