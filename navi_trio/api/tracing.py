"""Whether a daemon traces, and the exporter it traces to (the standard OTel variables).

Tracing is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set and
`OTEL_SDK_DISABLED` is not true; it exports over OTLP/HTTP. The SDK (the
`navi-trio[otel]` extra) is imported only then; with the variable set and the extra
missing, the daemon does not start, with one line saying what to install. A message's
W3C trace context is client input: `trace_carrier` keeps it only when well formed and
within the standard's bounds, and drops it otherwise, never the message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from navi_trio.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from navi_trio.api.traces import TraceObserver

EXTRA = "navi-trio[otel]"

# W3C Trace Context, level 1: version 00 only (a later version is not ours to read).
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
TRACESTATE_MAX_CHARS = 512  # what the standard lets a vendor cut at
TRACESTATE_MAX_MEMBERS = 32
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z0-9][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)


def traces_endpoint(environ: Mapping[str, str]) -> str | None:
    """Where traces go, or None when tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    direct = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if direct:
        return direct
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + "/v1/traces" if base else None


def trace_carrier(traceparent: Any, tracestate: Any) -> dict[str, str] | None:
    """A message's trace context as a W3C carrier, or None when it has none or a bad one.

    `traceparent` must be a version-00 header (55 characters, lower-case hex, ids not
    all zero); `tracestate`, kept only beside a good one, at most 512 characters of at
    most 32 well-formed members, else left out. Nothing here raises: a bad value is
    dropped and the message goes on without it."""
    if not isinstance(traceparent, str) or not _TRACEPARENT.fullmatch(traceparent):
        return None
    carrier = {"traceparent": traceparent}
    if isinstance(tracestate, str) and 0 < len(tracestate) <= TRACESTATE_MAX_CHARS:
        members = [m.strip(" \t") for m in tracestate.split(",")]
        members = [m for m in members if m]
        if 0 < len(members) <= TRACESTATE_MAX_MEMBERS and all(
            _TRACESTATE_MEMBER.fullmatch(m) for m in members
        ):
            carrier["tracestate"] = ",".join(members)
    return carrier


def content_recorded(environ: Mapping[str, str]) -> bool:
    return environ.get("NAVI_OTEL_CONTENT", "").strip() == "1"


def open_tracing(environ: Mapping[str, str]) -> tuple[TraceObserver, TracerProvider] | None:
    """The daemon's trace observer and its provider (to shut down, which flushes), or None
    when tracing is off. ConfigError when it is asked for and the SDK is missing."""
    if traces_endpoint(environ) is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from navi_trio.api.traces import TraceObserver
    except ImportError as e:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is missing "
            f"({e.name}): install {EXTRA!r}, or unset the variable"
        ) from None
    # The exporter reads the endpoint, headers and timeout from the same variables.
    provider = TracerProvider(resource=Resource.create({"service.name": "navi"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    tracer = provider.get_tracer("navi_trio")
    return TraceObserver(tracer, content=content_recorded(environ)), provider
