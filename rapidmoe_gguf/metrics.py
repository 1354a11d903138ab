"""The server's Prometheus metrics (``GET /metrics``), through ``prometheus_client``.

Each Server has a registry of its own (two servers in one process do not share counts). The
scheduler's thread reports into it (scheduler.Observer); the HTTP side counts the requests it
refuses. Names follow Prometheus' conventions: ``_total`` counters, ``_seconds`` histograms.

    rapidmoe_requests_total{status}              ok, cancelled (the client left), error (failed
                                                 while generating), invalid (4xx before it ran),
                                                 busy (503: queue full), draining (503: shutting down)
    rapidmoe_queue_depth                         requests waiting for a slot
    rapidmoe_running_sequences                   requests holding a slot
    rapidmoe_prompt_tokens_total                 prompt tokens of the requests served
    rapidmoe_prompt_tokens_evaluated_total       of them, evaluated (the rest came from a cached prefix)
    rapidmoe_generated_tokens_total
    rapidmoe_time_to_first_token_seconds         histogram, from the request's arrival at the scheduler
    rapidmoe_inter_token_latency_seconds         histogram, between two tokens of one request
    rapidmoe_batch_sequences                     histogram: sequences per evaluation step
    rapidmoe_kv_cache_tokens / _capacity_tokens  positions held in the slots' caches / their sum of n_ctx
    rapidmoe_kv_cache_bytes{type_k,type_v}       the bytes the slots' caches take, in their element types
    rapidmoe_expert_activations_total            activated (token, expert) slots of the requests served
    rapidmoe_residual_applications_total         of them, with the expert's residual applied
    rapidmoe_residual_rate                       the realised residual rate: the two above's ratio
    rapidmoe_draining                            1 after SIGTERM, while running requests finish

A model streamed from its files (``ram_budget``) adds its expert cache, read at each scrape:

    rapidmoe_expert_cache_bytes / _resident_bytes  the cache's slots / the weights kept in memory
    rapidmoe_expert_cache_hits_total             experts found in the cache (read ahead included)
    rapidmoe_expert_cache_misses_total           experts the evaluation waited to read
    rapidmoe_expert_cache_read_ahead_total       experts read ahead of use
    rapidmoe_expert_cache_read_bytes_total       bytes read from the files
"""

from __future__ import annotations

try:
    import prometheus_client as prom
except ImportError:                  # a dependency (pyproject.toml); without it /metrics says so
    prom = None

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ExpertCacheCollector:
    """The expert cache's counters (``Model.expert_cache``), read when the registry is scraped."""

    def __init__(self, read):
        self.read = read

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self.read()
        if not c["streaming"]:
            return
        yield GaugeMetricFamily("rapidmoe_expert_cache_bytes", "Bytes of the expert cache's slots", value=c["cache_bytes"])
        yield GaugeMetricFamily("rapidmoe_expert_cache_resident_bytes", "Weight bytes kept in memory (all but the experts)",
                                value=c["resident_bytes"])
        yield CounterMetricFamily("rapidmoe_expert_cache_hits", "Experts found in the cache",
                                  value=c["hits"] + c["prefetch_used"])
        yield CounterMetricFamily("rapidmoe_expert_cache_misses", "Experts the evaluation waited to read", value=c["misses"])
        yield CounterMetricFamily("rapidmoe_expert_cache_read_ahead", "Experts read ahead of use", value=c["prefetched"])
        yield CounterMetricFamily("rapidmoe_expert_cache_read_bytes", "Bytes read from the model's files",
                                  value=c["bytes_read"])


class ServerMetrics:
    """The metrics of one server; ``render()`` is the text ``GET /metrics`` answers. ``expert_cache``:
    a function returning ``Model.expert_cache``, for a streamed model's counters."""

    def __init__(self, kv_capacity_tokens: int, kv_cache_bytes: int = 0, cache_types: tuple[str, str] = ("f32", "f32"),
                 expert_cache=None):
        if prom is None:
            raise ImportError("prometheus_client is not installed (pip install prometheus_client)")
        r = self.registry = prom.CollectorRegistry()
        if expert_cache is not None:
            r.register(ExpertCacheCollector(expert_cache))
        self.requests = prom.Counter("rapidmoe_requests", "Requests by how they ended", ["status"], registry=r)
        for status in ("ok", "cancelled", "error", "invalid", "busy", "draining"):
            self.requests.labels(status)            # present at 0 before the first one
        self.queue_depth = prom.Gauge("rapidmoe_queue_depth", "Requests waiting for a slot", registry=r)
        self.running = prom.Gauge("rapidmoe_running_sequences", "Requests holding a slot", registry=r)
        self.prompt_tokens = prom.Counter("rapidmoe_prompt_tokens", "Prompt tokens of the requests served", registry=r)
        self.prompt_evaluated = prom.Counter("rapidmoe_prompt_tokens_evaluated",
                                             "Prompt tokens evaluated (not reused from a cached prefix)", registry=r)
        self.generated = prom.Counter("rapidmoe_generated_tokens", "Tokens generated", registry=r)
        self.ttft = prom.Histogram("rapidmoe_time_to_first_token_seconds", "Time to first token", registry=r,
                                   buckets=TTFT_BUCKETS)
        self.itl = prom.Histogram("rapidmoe_inter_token_latency_seconds", "Time between two tokens of a request",
                                  registry=r, buckets=ITL_BUCKETS)
        self.batch = prom.Histogram("rapidmoe_batch_sequences", "Sequences per evaluation step", registry=r,
                                    buckets=BATCH_BUCKETS)
        self.kv_tokens = prom.Gauge("rapidmoe_kv_cache_tokens", "Positions held in the slots' KV caches", registry=r)
        self.kv_capacity = prom.Gauge("rapidmoe_kv_cache_capacity_tokens",
                                      "Positions the slots' KV caches hold at most", registry=r)
        self.kv_capacity.set(kv_capacity_tokens)
        self.kv_bytes = prom.Gauge("rapidmoe_kv_cache_bytes", "Bytes the slots' KV caches take", ["type_k", "type_v"],
                                   registry=r)
        self.kv_bytes.labels(*cache_types).set(kv_cache_bytes)
        self.activations = prom.Counter("rapidmoe_expert_activations", "Activated (token, expert) slots", registry=r)
        self.residuals = prom.Counter("rapidmoe_residual_applications", "Activated slots given their residual",
                                      registry=r)
        self.residual_rate = prom.Gauge("rapidmoe_residual_rate", "Realised residual rate of the requests served",
                                        registry=r)
        self.draining = prom.Gauge("rapidmoe_draining", "1 while the server drains before it exits", registry=r)
        self._act = self._res = 0

    def render(self) -> bytes:
        return prom.generate_latest(self.registry)

    # -- scheduler.Observer (the scheduler's thread) -------------------------------------------------

    def queued(self, n_waiting: int, n_running: int) -> None:
        self.queue_depth.set(n_waiting)
        self.running.set(n_running)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def token_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def step(self, n_tokens: int, n_seqs: int, kv_tokens: int) -> None:
        self.batch.observe(n_seqs)
        self.kv_tokens.set(kv_tokens)

    def finished(self, status: str, prompt_tokens: int, evaluated: int, completion_tokens: int,
                 stats: dict | None) -> None:
        self.requests.labels(status).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.prompt_evaluated.inc(evaluated)
        self.generated.inc(completion_tokens)
        if stats is not None:
            act, res = int(stats["active"].sum()), int(stats["residual"].sum())
            self.activations.inc(act)
            self.residuals.inc(res)
            self._act, self._res = self._act + act, self._res + res
            self.residual_rate.set(self._res / self._act if self._act else 0.0)
