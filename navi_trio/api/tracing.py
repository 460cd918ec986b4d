"""Whether a daemon traces, and the exporter it traces to (the standard OTel variables).

Tracing is on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set and
`OTEL_SDK_DISABLED` is not true; it exports over OTLP/HTTP. The SDK (the
`navi-trio[otel]` extra) is imported only then; with the variable set and the extra
missing, the daemon does not start, with one line saying what to install. A message's
W3C trace context is client input: `trace_carrier` keeps it only when well formed and
within the standard's bounds, and drops it otherwise, never the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from navi_trio.core.turn import TRACESTATE_MAX_CHARS as TRACESTATE_MAX_CHARS
from navi_trio.core.turn import trace_carrier as trace_carrier
from navi_trio.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from navi_trio.api.traces import TraceObserver

EXTRA = "navi-trio[otel]"


def traces_endpoint(environ: Mapping[str, str]) -> str | None:
    """Where traces go, or None when tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    direct = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if direct:
        return direct
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return base.rstrip("/") + "/v1/traces" if base else None


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
