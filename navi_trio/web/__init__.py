"""The browser client's static files (HTML, CSS, JS modules): no Python here.

`navi serve` serves them at ``/`` on the WebSocket port (navi_trio/api/web.py); they ship
as package data, with no build step and nothing fetched from elsewhere.
"""
