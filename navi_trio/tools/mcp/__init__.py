"""Tools from MCP servers (docs/pages/mcp.md, "MCP servers").

- `servers.McpServers`: one actor per configured server, under the runtime's nursery;
  the tool registry's source of ``mcp__<server>__<tool>`` tools;
- `connection.McpConnection` / `connection.McpTool`: our connection to one server (the
  actor: session, restarts, process group) and a server's tool as a navi tool;
- `content`, `schema`, `stderr`: results as text, input schemas checked and capped,
  the child's stderr into the log.

The SDK (``mcp``) is imported only when a server starts or is called: importing this
package does not load it, so ``navi run`` without MCP servers starts as fast as before
(tests/test_mcp_client.py checks it).
"""

from navi_trio.tools.mcp.servers import McpServers as McpServers
from navi_trio.tools.mcp.servers import probe as probe
