"""The API layer over the official client, against a stand-in API server on loopback: the requests it
sends (server-side apply, label selectors, the atomic JSON patch) and how it reads failures."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client
from starsd_operator import constants as c
from starsd_operator.kube import ApiServer, KubeError

from . import factories as f


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any


class Api(BaseHTTPRequestHandler):
    seen: ClassVar[list[Seen]] = []
    answers: ClassVar[dict[tuple[str, str], tuple[int, Any]]] = {}

    def _handle(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        self.seen.append(
            Seen(self.command, parts.path, parse_qs(parts.query), self.headers.get("Content-Type", ""), body)
        )
        code, answer = self.answers.get((self.command, parts.path), (200, body or {}))
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = do_DELETE = _handle

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[ApiServer]:
    Api.seen.clear()
    Api.answers.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    previous = client.Configuration.get_default_copy()
    config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    client.Configuration.set_default(config)
    try:
        yield ApiServer()
    finally:
        client.Configuration.set_default(previous)
        server.shutdown()
        server.server_close()


def status_error(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}


@pytest.mark.parametrize(
    ("kind", "api_version", "path"),
    [
        ("Deployment", "apps/v1", "/apis/apps/v1/namespaces/ml/deployments/x"),
        ("StatefulSet", "apps/v1", "/apis/apps/v1/namespaces/ml/statefulsets/x"),
        ("Service", "v1", "/api/v1/namespaces/ml/services/x"),
        ("NetworkPolicy", "networking.k8s.io/v1", "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies/x"),
    ],
)
def test_apply_is_a_forced_server_side_apply(api: ApiServer, kind: str, api_version: str, path: str) -> None:
    obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x", "namespace": "ml"}, "spec": {"a": 1}}
    api.apply(obj)
    [seen] = Api.seen
    assert (seen.method, seen.path) == ("PATCH", path)
    assert seen.content_type == "application/apply-patch+yaml"
    assert seen.query == {"fieldManager": [c.FIELD_MANAGER], "force": ["true"]}
    assert seen.body == obj


def test_list_selects_by_label_and_returns_plain_dicts(api: ApiServer) -> None:
    pod = f.pod("p", "draft", phase="Running")
    Api.answers[("GET", "/api/v1/namespaces/ml/pods")] = (200, {"kind": "PodList", "items": [pod]})
    assert api.list("Pod", "ml", "app.kubernetes.io/instance=chat") == [pod]
    assert Api.seen[0].query == {"labelSelector": ["app.kubernetes.io/instance=chat"]}


def test_deleting_what_is_gone_is_fine(api: ApiServer) -> None:
    path = "/apis/apps/v1/namespaces/ml/statefulsets/old"
    Api.answers[("DELETE", path)] = (404, status_error(404, "not found"))
    api.delete("StatefulSet", "ml", "old")
    assert Api.seen[0].query["propagationPolicy"] == ["Background"]
    Api.answers[("DELETE", path)] = (403, status_error(403, "forbidden"))
    with pytest.raises(KubeError, match="forbidden"):
        api.delete("StatefulSet", "ml", "old")


def test_swap_replicas_is_one_atomic_json_patch(api: ApiServer) -> None:
    assert api.swap_replicas("ml", "chat", 3, 7)
    [seen] = Api.seen
    assert (seen.method, seen.path) == ("PATCH", "/apis/starsd.io/v1alpha1/namespaces/ml/starsdclusters/chat")
    assert seen.content_type == "application/json-patch+json"
    assert seen.body == [
        {"op": "test", "path": "/spec/targets/replicas", "value": 3},
        {"op": "replace", "path": "/spec/targets/replicas", "value": 7},
    ]


def test_swap_draft_replicas_patches_the_draft_count(api: ApiServer) -> None:
    assert api.swap_draft_replicas("ml", "chat", 2, 3)
    [seen] = Api.seen
    assert (seen.method, seen.path) == ("PATCH", "/apis/starsd.io/v1alpha1/namespaces/ml/starsdclusters/chat")
    assert seen.body == [
        {"op": "test", "path": "/spec/draft/replicas", "value": 2},
        {"op": "replace", "path": "/spec/draft/replicas", "value": 3},
    ]


def test_swap_replicas_reports_a_lost_race(api: ApiServer) -> None:
    Api.answers[("PATCH", "/apis/starsd.io/v1alpha1/namespaces/ml/starsdclusters/chat")] = (
        422,
        status_error(422, "the server rejected our request due to an error in our request"),
    )
    assert api.swap_replicas("ml", "chat", 3, 7) is False


def test_refusals_carry_the_api_servers_message(api: ApiServer) -> None:
    path = "/apis/apps/v1/namespaces/ml/statefulsets/x"
    Api.answers[("PATCH", path)] = (422, status_error(422, 'StatefulSet.apps "x" is invalid: spec.replicas'))
    obj = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "x", "namespace": "ml"}}
    with pytest.raises(KubeError, match="is invalid") as caught:
        api.apply(obj)
    assert caught.value.status == 422 and caught.value.permanent


def test_an_unreachable_api_server_is_a_temporary_kube_error() -> None:
    previous = client.Configuration.get_default_copy()
    config = client.Configuration(host="http://127.0.0.1:9")
    config.retries = 0
    client.Configuration.set_default(config)
    try:
        with pytest.raises(KubeError) as caught:
            ApiServer().list("Pod", "ml", "a=b")
    finally:
        client.Configuration.set_default(previous)
    assert caught.value.status == 0 and not caught.value.permanent


def test_unknown_kinds_are_refused(api: ApiServer) -> None:
    with pytest.raises(ValueError, match="ConfigMap"):
        api.list("ConfigMap", "ml", "a=b")
