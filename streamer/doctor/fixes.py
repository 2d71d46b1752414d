"""What to turn on, per capability and per instrumentation language (``telemetry.sdk.language``).

The option names are the instrumentations' own, as their documentation spells them; where an instrumentation records
parameters under a name the daemon does not read (pg's ``db.postgresql.values``, otelpgx's ``pgx.query.parameters``),
the fix says so and names the hook that writes ``db.query.parameter.<i>`` instead.
"""

from __future__ import annotations

PARAMETERS = {
    "python": "psycopg / psycopg2: PsycopgInstrumentor().instrument(capture_parameters=True) (Psycopg2Instrumentor "
    "likewise; dbapi: trace_integration(..., capture_parameters=True)); the SQLAlchemy instrumentation has no such "
    "option: instrument the driver under it as well",
    "java": "OTel Java agent: -Dotel.instrumentation.jdbc.experimental.capture-query-parameters=true "
    "(OTEL_INSTRUMENTATION_JDBC_EXPERIMENTAL_CAPTURE_QUERY_PARAMETERS=true) records db.query.parameter.<i> and turns "
    "the sanitizer off; otel.instrumentation.common.db-statement-sanitizer.enabled=false alone only keeps the "
    "literals written in the SQL (a PreparedStatement's ? stay)",
    "nodejs": "@opentelemetry/instrumentation-pg: enhancedDatabaseReporting: true records db.postgresql.values, "
    "which the daemon does not read; set db.query.parameter.<i> from queryConfig.values in a requestHook",
    "go": "XSAM/otelsql: otelsql.WithAttributesGetter(...) returning db.query.parameter.<i> for each argument; "
    "exaring/otelpgx: WithIncludeQueryParameters() records pgx.query.parameters, which the daemon does not read",
}
PARAMETERS_SQLALCHEMY = ("SQLAlchemy's instrumentation records no parameters: also instrument its driver, e.g. "
                         "PsycopgInstrumentor().instrument(capture_parameters=True)")  # fmt: skip
VERSION = ("set the resource attribute service.version to the build: OTEL_RESOURCE_ATTRIBUTES=service.version=<v> "
           "(every SDK reads it), or in the SDK's Resource")  # fmt: skip
ROUTES = {
    "python": "use the framework's instrumentation (Flask, Django, FastAPI): it sets http.route on server spans",
    "java": "the Java agent's servlet / Spring MVC / JAX-RS instrumentation sets http.route: keep it enabled",
    "nodejs": "@opentelemetry/instrumentation-express (or -fastify, -koa) with instrumentation-http sets http.route",
    "go": "otelhttp derives http.route from the ServeMux pattern (r.Pattern, Go 1.22+: register patterns); before "
    "v0.65 wrap handlers with otelhttp.WithRouteTag(route, h); or otelmux / otelgin",
}
ROUTES_ANY = "set http.route (the route template, not the path) on server spans: the framework's instrumentation does"
CODE = ("auto-instrumentation records no code.*: configure [codeloc] (codeloc.source_root, codeloc.services) with a "
        "checkout of the service, or record code.function.name / code.file.path on the spans")  # fmt: skip
SAMPLING = ("keep every trace that writes (no head sampling on write paths), or sample with the W3C threshold "
            "(tracestate ot=th:) so that the daemon can weigh what it saw")  # fmt: skip
CDC_CAPTURE = "add the table to the connector's table.include.list (or: trace-repro local capture schema.table)"
CDC_BEFORE = "ALTER TABLE {table} REPLICA IDENTITY FULL (the before image then carries every column)"
CDC_TRACE_COLUMN = ("optional: a column holding the writer's trace id ([correlation] trace_column) correlates "
                    "changes with traces at full strength")  # fmt: skip
CDC_ENVELOPE = ("the full envelope with the JSON converter: drop ExtractNewRecordState (the unwrap SMT), "
                "value.converter=org.apache.kafka.connect.json.JsonConverter")  # fmt: skip
CDC_DECIMAL = ("decimal.handling.mode=string (or double) on the connector, or keep precise with "
               "value.converter.schemas.enable=true so that the scale travels with the value")  # fmt: skip
LANGUAGES = tuple(PARAMETERS)


def by_language(options: dict[str, str], language: str, default: str = "") -> str:
    """The fix for ``language``, or every language's (one per line, prefixed) when it is not known."""
    if language in options:
        return options[language]
    return default or " | ".join(f"{lang}: {text}" for lang, text in options.items())
