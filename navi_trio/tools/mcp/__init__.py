"""Tools from MCP servers: one actor per configured server (`servers.McpServers`), its
tools as navi tools (`connection.McpTool`).

The SDK (``mcp``) is imported only when a server starts or is called, so ``navi run``
without MCP servers does not load it.
"""

from navi_trio.tools.mcp.servers import McpServers as McpServers
from navi_trio.tools.mcp.servers import probe as probe
