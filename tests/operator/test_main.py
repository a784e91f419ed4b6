"""The operator's startup: registered handlers, kopf settings, and the `starsd operator` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any, cast

import kopf
import pytest
from starsd_operator import constants as c
from starsd_operator import handlers, main
from starsd_operator.controller import Config, Memory

from starsd.commands import operator as command

from . import factories as f
from .fakekube import FakeKube


def test_handlers_are_registered_for_the_custom_resource() -> None:
    registry = main.build_registry(main.Options(tick_interval=7))
    changing = registry._changing.get_all_handlers()
    assert {str(h.reason) for h in changing if h.reason} == {"create", "update"}
    assert [h.initial for h in changing if h.reason is None] == [True]  # on.resume: every object at startup
    assert {h.id for h in changing} == {"reconcile", "reconcile/spec"}
    for h in changing:
        assert h.selector is not None
        assert (h.selector.group, h.selector.version, h.selector.plural) == (c.GROUP, c.VERSION, c.PLURAL)
    [timer] = registry._spawning.get_all_handlers()
    assert timer.id == "tick" and timer.interval == 7  # type: ignore[attr-defined]
    login, startup = registry._activities.get_all_handlers()
    assert login.fn is kopf.login_via_client and startup.id == "startup"


def test_spec_changes_only_trigger_the_update_handler() -> None:
    registry = main.build_registry(main.Options())
    [update] = [h for h in registry._changing.get_all_handlers() if str(h.reason) == "update"]
    assert update.field == ("spec",)


def test_settings() -> None:
    settings = main.build_settings()
    assert settings.peering.standalone is True
    assert settings.persistence.finalizer == "starsd.io/finalizer"
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert isinstance(settings.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)


def test_peered_settings() -> None:
    settings = main.build_settings(peering="starsd-operator")
    assert settings.peering.standalone is False and settings.peering.mandatory is True
    assert settings.peering.name == "starsd-operator" and settings.peering.clusterwide is True
    assert settings.peering.lifetime == main.PEERING_LIFETIME
    assert main.build_settings(namespaced=True, peering="p").peering.clusterwide is False


def test_peered_replicas_get_distinct_priorities(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf pauses every operator of an equal priority: each replica draws its own."""
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(main.kube, "load_config", lambda: None)
    monkeypatch.setattr(main.kube, "ApiServer", lambda: "api")
    monkeypatch.setattr(main.kopf, "run", lambda **kw: seen.append(kw))
    for _ in range(3):
        main.run(main.Options(peering="p"), env={})
    assert all(kw["standalone"] is False and kw["peering_name"] == "p" for kw in seen)
    assert len({kw["priority"] for kw in seen}) == 3
    main.run(main.Options(peering="p", priority=7), env={})
    assert seen[-1]["priority"] == 7


def test_run_passes_options_to_kopf(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(main.kube, "load_config", lambda: None)
    monkeypatch.setattr(main.kube, "ApiServer", lambda: "api")
    monkeypatch.setattr(main.kopf, "run", lambda **kw: seen.update(kw))
    main.run(main.Options(namespace="ml", liveness_port=9999), env={"STARSD_DRAFT_IMAGE": "x:1"})
    assert seen["namespaces"] == ["ml"] and seen["clusterwide"] is False and seen["standalone"] is True
    assert seen["liveness_endpoint"] == "http://0.0.0.0:9999/healthz"
    assert seen["memo"]["config"].images.draft == "x:1" and seen["memo"]["kube"] == "api"
    assert seen["settings"].scanning.disabled is True  # one namespace: no cluster-wide scans (a Role suffices)
    assert seen["memo"]["config"].allow_load_url_annotation is False
    main.run(main.Options(allow_load_url_annotation=True), env={})
    assert seen["clusterwide"] is True and seen["namespaces"] == ()
    assert seen["settings"].scanning.disabled is False and seen["memo"]["config"].allow_load_url_annotation


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.configure(parser)
    return parser.parse_args(list(argv))


def test_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[main.Options] = []
    monkeypatch.setattr(main, "run", seen.append)
    assert command.run(parse("--namespace", "ml", "--liveness-port", "8081", "--interval", "2")) == 0
    assert seen[-1] == main.Options(namespace="ml", liveness_port=8081, tick_interval=2.0, load_timeout=3.0)
    command.run(parse("--liveness", "http://0.0.0.0:9000/healthz"))
    assert seen[-1].liveness_port == 9000 and seen[-1].namespace is None
    assert seen[-1].allow_load_url_annotation is False  # the annotation is refused unless asked for
    command.run(parse("--allow-load-url-annotation"))
    assert seen[-1].allow_load_url_annotation is True
    assert seen[-1].peering is None  # standalone unless asked
    command.run(parse("--peering", "starsd-operator", "--priority", "3"))
    assert (seen[-1].peering, seen[-1].priority) == ("starsd-operator", 3)
    with pytest.raises(SystemExit):
        parse("--liveness-port", "70000")
    with pytest.raises(SystemExit):
        parse("--liveness", "0.0.0.0:9000")


def body(*args: Any, **kw: Any) -> kopf.Body:
    return kopf.Body(cast(kopf.RawBody, f.body(*args, **kw)))


def test_the_reconcile_handler_maps_errors_for_kopf(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[tuple[str, str]] = []  # kopf.event needs a running operator; e2e/ sees the real Events
    monkeypatch.setattr(kopf, "event", lambda _body, *, type, reason, message: posted.append((type, reason)))
    kube = FakeKube()
    memo = kopf.Memo(kube=kube, config=Config())
    patch = kopf.Patch()
    logger = logging.getLogger("test")
    run = asyncio.run
    run(handlers.reconcile(body=body(generation=4), patch=patch, memo=memo, logger=logger))
    assert patch["status"] == {
        "observedGeneration": 4,
        "images": {"draft": "starsd/draft:0.1.0", "target": "starsd/target:0.1.0"},  # pinned (imagepolicy.py)
    }
    assert posted and set(posted) == {("Normal", c.EVENT_CREATED)}
    assert isinstance(handlers.clusters(memo).memory(("ml", "chat")), Memory)
    with pytest.raises(kopf.PermanentError, match="invalid spec"):
        run(handlers.reconcile(body=body(f.spec(pools=[]), generation=5), patch=kopf.Patch(), memo=memo, logger=logger))
    kube.fail_apply = handlers.KubeError(500, "etcd is down")
    with pytest.raises(kopf.TemporaryError, match="etcd is down"):
        run(handlers.reconcile(body=body(generation=6), patch=kopf.Patch(), memo=memo, logger=logger))
    kube.fail_apply = handlers.KubeError(422, "invalid quantity")
    with pytest.raises(kopf.PermanentError, match="invalid quantity"):
        run(handlers.reconcile(body=body(generation=7), patch=kopf.Patch(), memo=memo, logger=logger))


def test_successful_ticks_are_not_logged() -> None:
    quiet = main.QuietTicks()

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, None, None)

    assert not quiet.filter(record("Timer 'tick' succeeded."))
    assert quiet.filter(record("Handler 'reconcile' succeeded."))
    assert quiet.filter(record("Timer 'tick' failed with an exception. Will retry."))
    assert not quiet.filter(record("Indexer 'watched_pods' succeeded."))
    assert not quiet.filter(record("Handler 'changed_services' succeeded."))
    assert not quiet.filter(record("Handler 'seen' succeeded."))
    assert quiet.filter(record("Handler 'changed_services' failed with an exception. Will retry."))


def test_each_per_object_line_names_its_cluster_once() -> None:
    names = main.ObjectNames()
    message = "Created: created %s %s"
    line = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, ("Service", "x"), None)
    line.k8s_ref = {"namespace": "ml", "name": "chat", "kind": "StarSDCluster"}
    assert names.filter(line) and names.filter(line)  # a second handler with the filter changes nothing
    assert line.getMessage() == "[ml/chat] Created: created Service x"
    plain = logging.LogRecord("starsd_operator.main", logging.INFO, __file__, 1, "starsd operator: all", None, None)
    assert names.filter(plain) and plain.getMessage() == "starsd operator: all"


def test_starsd_operator_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from starsd import cli

    with pytest.raises(SystemExit) as exited:
        cli.main(["operator", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--namespace", "--liveness-port", "--liveness", "--interval", "--load-timeout"):
        assert flag in out
