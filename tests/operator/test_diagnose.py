"""Reading why a child is not ready from what Kubernetes reports: unschedulable pods, crashes with the
process's termination message, image pulls, and rollout progress."""

from __future__ import annotations

from starsd_operator.constants import LABEL_POOL
from starsd_operator.diagnose import GPU_UNUSABLE, first_problem, pod_problems, rollout

from starsd.devices import cuda_refusal

from . import factories as f

MISSING_MODEL = "model path /models/draft does not exist"


def crashing(name: str = "chat-draft-7d9-x", message: str = MISSING_MODEL) -> dict[str, object]:
    return f.pod(
        name,
        "draft",
        phase="Running",
        containerStatuses=[
            {
                "name": "draft",
                "ready": False,
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s"}},
                "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": message}},
            }
        ],
    )


def test_a_missing_model_reads_as_the_processs_own_message() -> None:
    [problem] = pod_problems(crashing())
    assert problem.reason == "ContainerFailing"
    assert MISSING_MODEL in problem.message
    assert "chat-draft-7d9-x" in problem.message and "exit code 2" in problem.message


def test_a_crash_between_restarts_still_reads_as_failing() -> None:
    pod = crashing()
    pod["status"]["containerStatuses"][0]["state"] = {"running": {}}  # type: ignore[index]
    [problem] = pod_problems(pod)
    assert problem.reason == "ContainerFailing" and MISSING_MODEL in problem.message


def test_a_container_that_exited_now() -> None:
    pod = f.pod(
        "p",
        "target",
        containerStatuses=[
            {"name": "target", "restartCount": 0, "state": {"terminated": {"exitCode": 1, "message": "boom"}}}
        ],
    )
    [problem] = pod_problems(pod)
    assert problem.reason == "ContainerFailing" and problem.message.endswith(": boom")


def test_a_long_log_tail_keeps_its_end() -> None:
    [problem] = pod_problems(crashing(message="x" * 5000 + " the error"))
    assert problem.message.endswith("the error") and len(problem.message) < 500


def test_an_unknown_node_pool_reads_as_unschedulable() -> None:
    pod = f.pod(
        "chat-target-h100-0",
        "target",
        "h100",
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector.",
            }
        ],
    )
    [problem] = pod_problems(pod)
    assert problem.reason == "Unschedulable"
    assert "didn't match Pod's node affinity/selector" in problem.message
    assert "chat-target-h100-0" in problem.message


def test_image_pull_and_configuration_errors() -> None:
    def waiting(reason: str) -> dict[str, object]:
        status = {"name": "c", "state": {"waiting": {"reason": reason, "message": "details"}}}
        return f.pod("p", "draft", containerStatuses=[status])

    assert pod_problems(waiting("ImagePullBackOff"))[0].reason == "ImagePullFailed"
    assert pod_problems(waiting("CreateContainerConfigError"))[0].reason == "ContainerConfigError"
    assert pod_problems(waiting("ContainerCreating")) == []


def test_a_failed_pod() -> None:
    pod = f.pod("p", "draft", phase="Failed", reason="Evicted", message="low on memory")
    [problem] = pod_problems(pod)
    assert problem.reason == "PodFailed" and "Evicted" in problem.message and "low on memory" in problem.message


def test_healthy_and_starting_pods_have_no_problem() -> None:
    running = f.pod(
        "p",
        "draft",
        phase="Running",
        containerStatuses=[{"name": "draft", "ready": True, "restartCount": 0, "state": {"running": {}}}],
    )
    assert pod_problems(running) == []
    assert pod_problems(f.pod("q", "draft", phase="Pending")) == []


def test_first_problem_prefers_pods_in_name_order_then_deployments() -> None:
    stuck = {
        "metadata": {"name": "chat-draft"},
        "status": {"conditions": [{"type": "Progressing", "reason": "ProgressDeadlineExceeded", "message": "m"}]},
    }
    assert first_problem([crashing("b"), crashing("a")], [stuck]).message.startswith("pod a")  # type: ignore[union-attr]
    problem = first_problem([], [stuck])
    assert problem is not None and problem.reason == "ProgressDeadlineExceeded"
    assert first_problem([], [None]) is None


def test_rollout_progress() -> None:
    assert rollout(f.workload("StatefulSet", "s", 3)).complete
    assert not rollout(f.workload("StatefulSet", "s", 3, ready=2)).complete
    assert not rollout(f.workload("StatefulSet", "s", 3), desired=4).complete  # not yet resized
    stale = f.workload("StatefulSet", "s", 3)
    stale["metadata"]["generation"] = 2  # the controller has not seen the new template yet
    assert not rollout(stale).complete
    assert not rollout(None, desired=1).complete
    assert rollout(f.workload("StatefulSet", "s", 0)).complete


def test_a_gpu_pod_that_cannot_use_its_gpu_names_its_pool_node_and_image_variant() -> None:
    said = cuda_refusal("cuda", torch_version="2.9.0+cpu", cuda_build=None, visible=0, node="ip-10-0-3-7.ec2.internal")
    assert said is not None
    pod = crashing("chat-target-h100-0", said)
    pod["metadata"]["labels"][LABEL_POOL] = "h100"  # type: ignore[index]
    [problem] = pod_problems(pod)
    assert problem.reason == GPU_UNUSABLE
    assert problem.message.startswith("pool h100: pod chat-target-h100-0")
    assert "ip-10-0-3-7.ec2.internal" in problem.message and "CPU-only build" in problem.message
    assert said in problem.message  # whole: the node at its start survives


def test_other_crashes_are_not_taken_for_a_gpu_refusal() -> None:
    [problem] = pod_problems(crashing(message="CUDA out of memory"))
    assert problem.reason == "ContainerFailing"
