"""Scale-out on Ray Serve: N replicas of the OpenAI-compatible server behind one route.

``rapidmoe serve MODEL --ray-replicas N`` (or ``run`` below) starts a local Ray, deploys the
application ``deployment`` builds and blocks until Ctrl-C. Each replica is a Ray actor (its own
process) that opens the model and serves ``server.create_app``'s routes unchanged:
/v1/chat/completions, /v1/completions (streaming included), /v1/models, /health, /metrics, ...
Ray Serve's HTTP proxy listens on one address and hands each request to a replica; its router
picks, of two replicas, the one with fewer requests in flight. Inside a replica the server's own
scheduler batches that replica's requests as ``rapidmoe serve`` does (``ServerConfig.parallel``
slots, ``queue`` waiting); Ray sends a replica at most ``parallel + queue`` requests at once and
holds the rest, so a busy replica does not answer 503 while another is idle.

Every answer carries the header ``x-rapidmoe-replica`` naming the replica that produced it (Ray's
replica id), to see the spread and to find a replica's log.

Threads: each replica runs ``cores // replicas`` CPU threads (at least one) unless ``n_threads``
is given, and asks Ray for that many CPUs (at most cores / replicas, so that all replicas fit on
one machine), so N replicas on one machine share its cores instead of each starting a thread per
core. Memory: the weights are memory-mapped read-only from the same
file in every replica, so on one machine the page cache holds them once; see docs/SCALING.md.

In Python::

    from ray import serve
    from rapidmoe_gguf.ray_serve import deployment
    serve.run(deployment("model.gguf", replicas=2, model_kwargs={"n_ctx": 4096}), route_prefix="/")

Ray Serve is an optional extra (``pip install 'rapidmoe-gguf[ray]'``); the rest of the package
does not import it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from .errors import RapidMoEError
from .server import ServerConfig

REPLICA_HEADER = "x-rapidmoe-replica"
APP_NAME = "rapidmoe"


def _serve():
    """Ray Serve, or a clear error naming the extra that brings it."""
    try:
        from ray import serve
    except ImportError as exc:
        raise RapidMoEError(f"ray_serve: Ray Serve is not installed ({exc}); install the optional extra with "
                            "pip install 'rapidmoe-gguf[ray]' (it brings ray[serve])") from None
    return serve


def replica_threads(replicas: int, cores: int | None = None) -> int:
    """CPU threads per replica: the machine's cores shared out, at least one each."""
    if replicas < 1:
        raise RapidMoEError(f"ray_serve: replicas must be >= 1, got {replicas}")
    return max(1, (cores or os.cpu_count() or 1) // replicas)


def replica_name() -> str:
    """This replica's id as Ray names it (the process id outside a replica)."""
    try:
        from ray import serve
        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return f"pid{os.getpid()}"


class _ReplicaApp:
    """The server's app as one replica runs it: every HTTP answer tagged with the replica's name,
    and the model closed once the app has shut down."""

    def __init__(self, app, model, name: str):
        self.app, self.model, self.name = app, model, name
        self.state = app.state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            tag = (REPLICA_HEADER.encode(), self.name.encode())

            async def tagged(message):
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), tag]}
                await send(message)
            await self.app(scope, receive, tagged)
        elif scope["type"] == "lifespan":
            async def closing(message):
                if message["type"] == "lifespan.shutdown.complete":
                    self.model.close()
                await send(message)
            await self.app(scope, receive, closing)
        else:
            await self.app(scope, receive, send)


def build_replica_app(model_path: str, model_kwargs: dict, config: ServerConfig) -> _ReplicaApp:
    """What one replica serves: the model opened in this process and create_app's routes on it."""
    from .model import Model
    from .server import create_app

    model = Model(model_path, **model_kwargs)
    try:
        return _ReplicaApp(create_app(model, config), model, replica_name())
    except BaseException:
        model.close()
        raise


def deployment(model_path: str | os.PathLike, *, replicas: int = 2, model_kwargs: dict | None = None,
               config: ServerConfig | None = None, cores: int | None = None, name: str = APP_NAME,
               log_level: str | None = None) -> Any:
    """A Ray Serve application (bound deployment) of ``replicas`` copies of the server on
    ``model_path``. ``model_kwargs`` go to Model (n_threads defaults to replica_threads(replicas,
    cores), use_mmap to True, so that the replicas share the file's pages); ``config`` is each replica's ServerConfig (its host/port are not used: Ray's proxy
    listens); ``log_level`` (e.g. "WARNING") sets the replicas' Serve log level (each request is
    logged at INFO). Pass it to ``serve.run``."""
    serve = _serve()
    path = os.path.abspath(os.fspath(model_path))
    if not os.path.isfile(path):
        raise RapidMoEError(f"ray_serve.deployment: the model file {path} does not exist")
    kwargs = dict(model_kwargs or {})
    share = replica_threads(replicas, cores)
    if not kwargs.get("n_threads"):
        kwargs["n_threads"] = share
    # Replicas on one machine share a mapped file's pages in the page cache; read into memory (the
    # default for one process where the file fits), each would hold a copy of its own.
    if kwargs.get("use_mmap") is None and not os.environ.get("RAPIDMOE_MMAP"):
        kwargs["use_mmap"] = True
    # Ray's CPUs for one replica: its threads, at most its part of this machine's cores (a fraction
    # when the replicas outnumber them), so that all replicas fit on one machine.
    num_cpus = min(kwargs["n_threads"], (cores or os.cpu_count() or 1) / replicas)
    if kwargs.get("gpu_memory") is not None:
        raise RapidMoEError("ray_serve.deployment: replicas run on the CPU; GPU replicas (gpu_memory) are not "
                            "supported yet, see docs/SCALING.md")
    config = dataclasses.replace(config or ServerConfig())

    def build():                                   # runs in each replica, at its start
        return build_replica_app(path, kwargs, config)

    ingress = serve.ingress(build)()
    options = {"logging_config": {"log_level": log_level}} if log_level else {}
    return serve.deployment(ingress, name=name, num_replicas=replicas,
                            ray_actor_options={"num_cpus": num_cpus},
                            max_ongoing_requests=config.parallel + config.queue, **options).bind()


def run(model_path: str | os.PathLike, *, replicas: int, host: str = "127.0.0.1", port: int = 8080,
        model_kwargs: dict | None = None, config: ServerConfig | None = None, route_prefix: str = "/",
        block: bool = True, log_level: str = "WARNING") -> None:
    """Starts a local Ray (all the machine's cores; one this process started already is used as
    it is), deploys ``deployment(...)`` behind
    http://host:port/route_prefix and, with ``block``, serves until Ctrl-C, then shuts Ray down.
    ``log_level`` applies to Serve's proxy, controller and replicas."""
    app = deployment(model_path, replicas=replicas, model_kwargs=model_kwargs,
                     config=dataclasses.replace(config or ServerConfig(), host=host, port=port), log_level=log_level)
    import ray
    serve = _serve()
    ray.init(include_dashboard=False, logging_level="warning", ignore_reinit_error=True)
    deployed = False
    try:
        serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": log_level})
        serve.run(app, name=APP_NAME, route_prefix=route_prefix)
        deployed = True
        if not block:
            return
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if block or not deployed:
            serve.shutdown()
            ray.shutdown()
