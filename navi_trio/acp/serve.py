"""The `navi acp` process: ACP on stdin/stdout until stdin closes or a signal comes."""

from __future__ import annotations

import signal

import trio

from navi_trio.acp.agent import Agent, serve_on, stdio
from navi_trio.acp.backend import BackendOptions, open_backend
from navi_trio.acp.servers import ServerHost


async def serve(options: BackendOptions, mode: str | None, profile: str | None) -> None:
    """Serve ACP on stdin/stdout until stdin closes; SIGTERM / SIGINT end it as that does."""
    async with stdio() as (stdin, stdout), open_backend(options) as backend:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                # The editor's MCP servers run in this nursery, as this process's user.
                host = ServerHost(nursery, options.settings)
                agent = Agent(backend, mode, profile, host)

                async def on_signal() -> None:
                    async for _ in signals:
                        await stdin.aclose()  # as if the editor closed it
                        return

                nursery.start_soon(on_signal)
                await serve_on(agent, stdin, stdout)
                nursery.cancel_scope.cancel()
