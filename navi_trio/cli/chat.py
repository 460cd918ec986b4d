"""`navi chat`: the terminal client, with a daemon started for it when none answers.

The backend options passed on to that daemon are chosen here, so the line saying which
model was picked shows in this terminal.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TextIO

import trio

from navi_trio.cli.common import llm_given, llm_settings, load_settings
from navi_trio.llm.factory import CONFIGURING_ENV, backend_configured
from navi_trio.settings import Settings


def serve_args_for_chat(args: argparse.Namespace, err: TextIO) -> list[str]:
    """The backend options of the daemon `navi chat` is about to start: `--local` passed
    on, else the choice made here (its one line shows in this terminal, not in the
    daemon's log) and passed on explicitly.
    """
    settings = llm_settings(args, err)
    if settings.llm_backend == "local":
        from navi_trio.llm.local import resolve_model_file

        resolve_model_file(settings.model_file)  # a missing extra or file: say so here
        extra = ["--model-file", str(settings.model_file)] if args.model_file else []
        return ["--local", *extra]
    if llm_given(args) or backend_configured(os.environ, given=False):
        return []  # configured in the environment: the daemon inherits it
    return ["--backend", "ollama"]


def wanted_backend(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The backend asked for here and the setting that asked, or None (nothing asked):
    ``("local", "--local")``, ``("ollama", "OLLAMA_HOST=http://…")``."""
    if args.local:
        return "local", "--local"
    named = [f"{name}={environ[name]}" for name in CONFIGURING_ENV if environ.get(name, "").strip()]
    if not named:
        return None
    backend = load_settings(args, dict(environ)).llm_backend.strip().lower()
    return backend, " and ".join(named)


def cmd_chat(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from navi_trio.client.daemon import daemon_needed
    from navi_trio.client.main import chat

    settings = Settings.from_env(os.environ)
    serve_args: list[str] = []
    if trio.run(daemon_needed, args.url):
        serve_args = serve_args_for_chat(args, err)
    return chat(
        url=args.url,
        data_dir=settings.data_dir,
        session_id=args.session,
        profile=args.profile,
        token=args.token,
        err=err,
        serve_args=serve_args,
        want_backend=wanted_backend(args, os.environ),
    )
