"""Starting a sweep's Ray actors (run/ray_executor.py's transports), all at once: joined to the
cluster (run/ray_cluster.py), sized to its devices, each started or lost as it started (its
node died), and never a wait without a line saying for what."""

from __future__ import annotations

import dataclasses
import re
import sys

from attnbench.errors import ClusterLost, UsageError
from attnbench.run.executing.ray_cluster import actor_options, actor_start_problem, connect
from attnbench.run.executing.ray_executor import START_TIMEOUT_S, RayActor, exit_detail, free_text
from attnbench.run.executing.worker import WorkerSpec

START_NOTICE_S = 10.0  # actors not started by then: a line says what the sweep waits for


def start(address: str | None, spec: WorkerSpec, actors: int | None, command: str) -> list:
    """Connect to Ray and start one actor per device (ray_cluster.actor_options), all at
    once, saying what it waits for when they are not placed at once. Returns their
    transports, started; those lost as they started are left out, with a line each; none
    started is ClusterLost (a cluster refusing them for its authentication: UsageError)."""
    ray = connect(address, command)
    n, options = actor_options(ray, spec.device, spec.threads, actors)
    spec = dataclasses.replace(spec, plugins=tuple(str(p) for p in spec.plugins))
    proxies = [RayActor(ray, options, spec, i) for i in range(n)]
    short = _short_of(ray, options, n)
    for proxy in proxies:
        proxy.launch()
    refs = [p._info_ref for p in proxies]
    first = 0.0 if short else min(START_NOTICE_S, START_TIMEOUT_S)
    waiting = ray.wait(refs, num_returns=n, timeout=first)[1]
    if waiting:
        print(
            f"ray: waiting up to {START_TIMEOUT_S:g} s for Ray to place and start "
            f"{len(waiting)} of {n} actors ({_need_text(options)} each){short}",
            file=sys.stderr,
        )
        waiting = ray.wait(refs, num_returns=n, timeout=START_TIMEOUT_S - first)[1]
    if waiting:  # some not started yet
        for proxy in proxies:
            proxy.close()
        raise UsageError(
            f"Ray did not start {n} actors ({_need_text(options)} each) within "
            f"{START_TIMEOUT_S:g} s; cap them with --ray-actors"
        )
    infos = [_info(ray, p) for p in proxies]
    return _up(proxies, infos)


def _short_of(ray, options: dict, n: int) -> str:
    """'': the cluster has the CPUs (and GPUs) of ``n`` actors free; else what it has."""
    free = ray.available_resources()
    need = {r: (options.get(k) or 0) * n for k, r in (("num_cpus", "CPU"), ("num_gpus", "GPU"))}
    if all(free.get(r, 0) >= v for r, v in need.items()):
        return ""
    return f": the cluster has {free_text(free)} free, other jobs hold the rest"


def _need_text(options: dict) -> str:
    """'1 CPU' or '1 GPU, 2 CPU': what one actor asks Ray for."""
    need = [(options.get("num_gpus"), "GPU"), (options.get("num_cpus"), "CPU")]
    return ", ".join(f"{v:g} {r}" for v, r in need if v)


def _up(proxies: list[RayActor], infos: list) -> list[RayActor]:
    """The actors that started; one lost as it started (its node died) leaves with a line
    saying where and how many go on; none left is ClusterLost, one line."""
    failed = [(p, i) for p, i in zip(proxies, infos) if isinstance(i, BaseException)]
    for proxy, _ in failed:
        proxy.close()
    if len(failed) == len(proxies):  # none started
        problem = actor_start_problem(failed[0][1])
        if problem is not None:
            raise UsageError(problem)
        causes = "; ".join(f"actor {p.where['actor']}{_lost_on(i)}" for p, i in failed)
        raise ClusterLost(
            f"every Ray actor was lost as it started ({causes}); nothing was written: check "
            f"the cluster (ray status) and run the command again"
        )
    up = []
    for proxy, info in zip(proxies, infos):
        if not isinstance(info, BaseException):
            proxy.started(info)
            up.append(proxy)
    for proxy, info in failed:
        print(
            f"lost: actor {proxy.where['actor']} as it started{_lost_on(info)}; going on with "
            f"{len(up)} executor{'s' if len(up) != 1 else ''}",
            file=sys.stderr,
        )
    return up


def _lost_on(exc: BaseException) -> str:
    """' on the node at 10.0.0.2 (the node running it died)': where and why, as far as Ray's
    error says."""
    m = re.search(r"\bip: (\S+)", str(exc))
    return f"{f' on the node at {m.group(1)}' if m else ''} ({exit_detail(exc)})"


def _info(ray, proxy: RayActor):
    """A started actor's ``info`` (its start is over), or the RayActorError of one that died
    starting."""
    try:
        return ray.get(proxy._info_ref)
    except ray.exceptions.RayActorError as exc:
        return exc
