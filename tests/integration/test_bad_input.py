"""Bad input gets a clear 4xx or INVALID_ARGUMENT, and the servers keep serving."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from starsd.local import LocalStar, http_json
from starsd.proto import starsd_pb2 as pb
from starsd.proto import starsd_pb2_grpc as pb_grpc


def _post_raw(url: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(f"{url}/v1/completions", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize(
    ("payload", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'"just a string"', 400, "JSON object"),
        (json.dumps({"prompt": "x", "max_tokens": -5}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "x", "max_tokens": 10**9}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "x", "temperature": "warm"}).encode(), 400, "temperature"),
        (json.dumps({"prompt": "x", "stop": {"a": 1}}).encode(), 400, "stop"),
        (json.dumps({"prompt": [1] * 5000, "max_tokens": 8}).encode(), 400, "context"),
        (json.dumps({"prompt": "x", "model": "no-such-model"}).encode(), 404, "does not exist"),
    ],
)
def test_bad_http_requests_get_a_clear_4xx(star4: LocalStar, payload: bytes, status: int, words: str) -> None:
    got, body = _post_raw(star4.urls[3], payload)
    assert got == status
    assert words in body["error"]["message"]
    ok, good = http_json(f"{star4.urls[3]}/v1/completions", {"prompt": "x", "max_tokens": 4, "temperature": 0})
    assert ok == 200 and len(good["starsd"]["token_ids"]) == 4


def test_an_oversized_body_is_refused(star4: LocalStar) -> None:
    got, body = _post_raw(star4.urls[3], json.dumps({"prompt": "x" * (2 << 20)}).encode())
    assert got == 413 and "bytes" in body["error"]["message"]


def _requests(*reqs: pb.ProposeRequest):
    yield from reqs


def test_out_of_order_grpc_requests_are_invalid_argument(star4: LocalStar) -> None:
    """One stream, one request at a time: each bad message is answered with its error, the stream lives on."""
    import asyncio

    invalid, not_found = grpc.StatusCode.INVALID_ARGUMENT.value[0], grpc.StatusCode.NOT_FOUND.value[0]
    base = dict(target_id="probe", session_id=77, gamma=2, tokens=[1, 2, 3], top_p=1.0)

    async def exchange() -> list[pb.ProposeResponse]:
        queue: asyncio.Queue[pb.ProposeRequest] = asyncio.Queue()

        async def outgoing():  # type: ignore[no-untyped-def]
            while True:
                yield await queue.get()

        answers = []
        async with grpc.aio.insecure_channel(star4.draft_address) as channel:
            call = pb_grpc.DraftStub(channel).Propose(outgoing())
            for req in (
                pb.ProposeRequest(seq=1, **base),
                pb.ProposeRequest(seq=5, **base),  # skipped sequence numbers
                pb.ProposeRequest(seq=2, **{**base, "gamma": 999}),  # malformed
                pb.ProposeRequest(seq=2, **base),  # still in order: served
                pb.ProposeRequest(target_id="probe", session_id=78, seq=3, gamma=2, tokens=[1]),  # unknown
            ):
                queue.put_nowait(req)
                answers.append(await asyncio.wait_for(call.read(), 30))
            call.cancel()
        return answers

    answers = asyncio.run(exchange())
    assert [a.error_code for a in answers] == [0, invalid, invalid, 0, not_found]
    assert "out-of-order" in answers[1].error_message
    assert "gamma" in answers[2].error_message
    assert len(answers[0].token_ids) == 2 and len(answers[3].token_ids) == 2
    assert [(a.session_id, a.seq) for a in answers] == [(77, 1), (77, 5), (77, 2), (77, 2), (78, 3)]


def test_a_stream_without_target_id_is_aborted_and_the_draft_keeps_serving(star4: LocalStar) -> None:
    with grpc.insecure_channel(star4.draft_address) as channel:
        stub = pb_grpc.DraftStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Propose(_requests(pb.ProposeRequest(session_id=1, seq=1, gamma=2, tokens=[1])), timeout=30))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "target_id" in info.value.details()
        ok = list(
            stub.Propose(
                _requests(pb.ProposeRequest(target_id="p2", session_id=1, seq=1, gamma=2, tokens=[1], top_p=1.0)),
                timeout=30,
            )
        )
        assert ok[0].error_code == 0 and len(ok[0].token_ids) == 2
    ok, _ = http_json(f"{star4.urls[0]}/v1/completions", {"prompt": "x", "max_tokens": 4, "temperature": 0})
    assert ok == 200


def test_grpc_health_reports_serving(star4: LocalStar) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(star4.draft_address) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="starsd.v1.Draft"))
    assert status.status == health_pb2.HealthCheckResponse.SERVING


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "starsd.cli", *args], capture_output=True, text=True, timeout=180)


def test_a_wrong_model_path_exits_with_a_clear_message(tmp_path: Path) -> None:
    for command in (
        ["target", "--model", str(tmp_path / "missing"), "--port", "0"],
        ["draft", "--model", str(tmp_path / "missing"), "--port", "0", "--metrics-port", "0"],
    ):
        result = _run_cli(*command)
        assert result.returncode == 2
        assert "does not exist" in result.stderr


def test_a_target_refuses_a_draft_with_another_vocabulary(mismatched_pair: tuple[Path, Path], tmp_path: Path) -> None:
    star = LocalStar(draft_model=mismatched_pair[0], target_model=mismatched_pair[1], targets=1, log_dir=tmp_path)
    from starsd.local import StartError

    with pytest.raises(StartError) as info:
        star.start(timeout=180)
    assert "vocabulary" in str(info.value)
