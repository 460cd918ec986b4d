"""`navi acp`: navi as an Agent Client Protocol agent for editors (Zed, JetBrains, Neovim).

The process is `navi_trio.acp.serve`. It needs pydantic and the ACP SDK's schema models
(the ``acp`` extra); this package's ``__init__`` imports nothing, so a module of it that
needs neither (the JSON-RPC lines, the update texts) loads without them.
"""
