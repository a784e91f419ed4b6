"""Property-based checks: no input makes request parsing or gRPC validation fail other than cleanly."""

from __future__ import annotations

import json
import math

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

from starsd.draft.core import validate_request
from starsd.draft.sessions import SessionError
from starsd.openai_api.errors import RequestError
from starsd.openai_api.request import Limits, parse_completion
from starsd.proposals import GREEDY_BELOW
from starsd.proto import starsd_pb2 as pb

LIMITS = Limits(vocab_size=512, max_context=256, max_tokens_cap=128)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)
FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "seed", "stream", "stop", "model", "n", "logprobs"]
bodies = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), json_values, max_size=8)


@settings(max_examples=400, deadline=None)
@given(bodies | json_values)
def test_any_json_body_parses_or_is_refused_with_a_4xx(body: object) -> None:
    try:
        req = parse_completion(body, LIMITS, ("target",))
    except RequestError as err:
        assert 400 <= err.status < 500
        assert err.message
        json.dumps(err.body())  # the error itself is valid JSON
        return
    assert 1 <= req.max_tokens <= LIMITS.max_tokens_cap
    assert 0 <= req.temperature <= 2 and 0 < req.top_p <= 1
    assert req.prompt
    if isinstance(req.prompt, list):
        assert all(0 <= t < LIMITS.vocab_size for t in req.prompt)


@settings(max_examples=400, deadline=None)
@given(
    session_id=st.integers(0, 2**64 - 1),
    seq=st.integers(0, 2**64 - 1),
    tokens=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=300),
    gamma=st.integers(0, 2**32 - 1),
    sample=st.booleans(),
    temperature=st.floats(width=32),
    top_p=st.floats(width=32),
    top_k=st.integers(0, 2**32 - 1),
    release=st.booleans(),
    rtt=st.floats(width=32),
)
def test_any_grpc_request_is_valid_or_invalid_argument(**fields: object) -> None:
    rtt = fields.pop("rtt")
    req = pb.ProposeRequest(target_id="t", rtt_seconds=rtt, **fields)  # type: ignore[arg-type]
    try:
        validate_request(req, vocab_size=512, max_gamma=16, max_context=256)
    except SessionError as err:
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.message
        return
    assert req.session_id > 0 and req.seq >= 1
    if not req.release:
        assert 1 <= req.gamma <= 16
        assert all(0 <= t < 512 for t in req.tokens)
        if req.sample:
            assert math.isfinite(req.temperature) and req.temperature >= GREEDY_BELOW
            assert 0 < req.top_p <= 1
