"""`navi web`: the browser page's address, with a one-time sign-in link.

The code goes in the address's fragment; opened within a minute, the page signs in as
the token's user, once. The token itself never goes into the link. Without a daemon it
says so and exits 1: the page is served by the daemon.
"""

from __future__ import annotations

import argparse
import os
from typing import TextIO
from urllib.parse import urlsplit, urlunsplit

import trio

from navi_trio import wire
from navi_trio.cli.common import EXIT_ERROR, EXIT_OK, load_settings
from navi_trio.settings import Settings

PROBE_TIMEOUT = 2.0


def page_address(ws_url: str, code: str) -> str:
    """The page's http(s) address of the daemon at `ws_url`, the code in its fragment."""
    from navi_trio.client.daemon import host_port

    host_port(ws_url)  # UsageError naming what is wrong with it
    parts = urlsplit(ws_url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return urlunsplit((scheme, parts.netloc, "/", "", f"signin={code}"))


def cmd_web(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    settings = load_settings(args)
    return trio.run(_web, args, settings, out, err)


async def _web(args: argparse.Namespace, settings: Settings, out: TextIO, err: TextIO) -> int:
    from navi_trio.api.auth import resolve_token
    from navi_trio.api.daemon_client import daemon_answers
    from navi_trio.api.endpoint import Endpoint, connect
    from navi_trio.api.remote import DEFAULT_URL

    url = args.url or DEFAULT_URL
    page_address(url, "")  # a wrong --url is said before anything is asked
    if not await daemon_answers(url, PROBE_TIMEOUT):
        print(
            f"navi: error: no navi daemon answers at {url}: start one with `navi serve`, "
            "then run `navi web` again",
            file=err,
        )
        return EXIT_ERROR
    token = resolve_token(args.token, settings.data_dir, dict(os.environ))
    async with connect(Endpoint(url, token)) as daemon:
        answer = await daemon.request(wire.signin_code())
    code = str(answer.get("code", ""))
    seconds = answer.get("expires_in_sec", 60)
    print(page_address(url, code), file=out, flush=True)
    print(
        f"navi: a one-time sign-in link: it works once, within {seconds:g} s; "
        "run `navi web` again for another",
        file=err,
    )
    return EXIT_OK
