"""Text the locator reads from spans (stack traces, routes, statements) never makes it raise, whatever it is."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.codeloc.routes import normalise_route, request_of
from processors.codeloc.stacktrace import MAX_FRAMES, frames
from processors.codeloc.statements import normalise, shape_of

LINES = st.lists(
    st.one_of(
        st.text(max_size=80),
        st.builds(
            lambda f, n, fn: f'  File "{f}", line {n}, in {fn}',
            st.text(max_size=20),
            st.integers(0, 10**6),
            st.text(max_size=10),
        ),
        st.builds(
            lambda c, m, f: f"\tat {c}.{m}({f}.java:1)",
            st.text(max_size=20),
            st.text(max_size=10),
            st.text(max_size=10),
        ),
        st.sampled_from(["Caused by: x", "During handling of the above exception, another exception occurred:"]),
    ),
    max_size=30,
).map("\n".join)
SQLISH = st.lists(
    st.sampled_from(["SELECT", "UPDATE", "t", "SET", "a", "=", "%s", "%(x)s", "$1", ":n", "?", "::int", "(", ")", ",",
                     "WHERE", "FROM", "'", '"', ";", "FOR UPDATE", "INSERT INTO", "VALUES", "--", "/*"]),
    max_size=25,
).map(" ".join)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(LINES)
def test_any_stack_trace_text_gives_frames_or_none(text: str) -> None:
    """Python, Java, garbage or a mix: a list of at most ``MAX_FRAMES`` frames."""
    assert len(frames(text)) <= MAX_FRAMES


@settings(max_examples=300, deadline=None)
@given(st.one_of(SQLISH, st.text(max_size=200)))
def test_any_statement_text_gives_a_shape_or_none(text: str) -> None:
    """sqlglot on whatever a span or a checkout holds: a shape or None, and a normalised text."""
    shape_of(text)
    assert isinstance(normalise(text), str)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=100), st.text(max_size=100))
def test_any_route_and_span_name_give_a_request(route: str, name: str) -> None:
    method, normalised = request_of(route, name)
    assert normalised == normalise_route(normalised) and "/" not in (normalised[:1] + normalised[-1:])
    assert method in {"", "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}
