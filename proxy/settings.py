"""Settings of the proxy: PROXY_* environment variables (endpoints have their own)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from protos.cli import with_env_names
from proxy.doors.uploads import UploadLimits
from proxy.engine.predictions_sinks import redis_stream

DEFAULT_PIPELINES = Path(__file__).resolve().parent / "pipelines.yaml"


@with_env_names
class ProxySettings(BaseSettings):
    """Flags (`--kebab-case`) with environment equivalents (`PROXY_UPPER_CASE`); the
    services' addresses are variables of their own (the pipeline file names them)."""

    model_config = SettingsConfigDict(
        env_prefix="PROXY_",
        extra="ignore",
        cli_kebab_case=True,
        cli_implicit_flags=False,
        use_attribute_docstrings=True,
        cli_prog_name="python -m proxy",
    )

    host: str = "127.0.0.1"
    """Address the REST API (and the gRPC door) bind; 0.0.0.0 inside containers."""
    port: int = 8080
    """The REST API's port."""
    grpc_port: int | None = 8081
    """The v2 gRPC door (proxy/doors/grpc_door.py): the models PROXY_V2_MODELS names, as the
    /v2 REST door serves them. `off` (or empty): no gRPC door; 0 picks a free port."""
    grpc_front: Literal["auto", "nginx", "off"] = "auto"
    """What listens on the gRPC door's port (proxy/doors/grpc_front_nginx.py): `nginx`
    terminates HTTP/2 in C and hands unary ModelInfer calls to the REST server, every other
    call to the grpc.aio door behind it (at concurrency 32, 1.2-1.5x the door's unary
    throughput alone: bench/README);
    `off`: the grpc.aio door itself; `auto`: nginx when it is installed."""
    grpc_front_nginx: str = "nginx"
    """The nginx binary (a name on PATH or a path)."""
    grpc_door_port: int | None = None
    """Behind the front, the grpc.aio door's port on 127.0.0.1; unset: a free one."""
    grpc_grace_s: float = 10.0
    """On shutdown, how long the gRPC door's calls in flight may take to finish."""
    grpc_max_connections: int = Field(default=2048, ge=1)
    """Connections the gRPC door holds at once; more are closed as they arrive."""
    grpc_idle_s: float = Field(default=120.0, gt=0)
    """A gRPC door connection with no call for this long is closed (GOAWAY)."""
    workers: int = Field(default=1, ge=1, le=64)
    """Proxy processes sharing the port (proxy/workers.py); 1: this process serves."""
    pipelines: Path = DEFAULT_PIPELINES
    """The pipeline definition file."""
    check: bool = False
    """Check the pipeline file against the environment and exit, starting and calling
    nothing (a pipelines ConfigMap checked in CI before it rolls out): 0 and every call each
    pipeline makes, with its model, address and variable; or 2 and the problem, as a start
    would."""
    max_body_mb: float = 20.0
    """Largest request body; larger ones get 413 as soon as the excess arrives."""
    min_upload_kbps: float = 32.0
    """Slowest body accepted after its first 2 s (KiB/s); slower gets 408. The request's
    budget (X-Request-Timeout-Ms, or the pipeline's) covers the upload too."""
    max_head_kb: float = 32.0
    """Largest request line plus headers; more gets 431."""
    max_headers: int = 100
    """Most header lines; more gets 431."""
    head_timeout_s: float = 10.0
    """Time from a request's first byte to the end of its headers; more gets 408."""
    max_connections: int = 1024
    """Open connections and requests; beyond, uvicorn answers 503."""
    max_timeout_ms: float = 60_000
    """Cap on X-Request-Timeout-Ms."""
    max_in_flight: int = 512
    """Pipeline requests served at once; more get 503 with Retry-After."""
    max_inflight_mb: float = 1024.0
    """Bytes that uploads and the tensors of requests in flight may hold together; while
    they hold more, new requests get 503 with Retry-After."""
    max_request_mb: float = 512.0
    """Bytes one request's upload and tensors may hold; more gets 413."""
    v2_timeout_ms: float = 30_000
    """Budget of a v2 call forwarded to a service (when its caller sets none)."""
    v2_models: Literal["all", "pipelines"] = "all"
    """What the v2 doors (REST /v2 and gRPC) serve: `all`, every pipeline and every model a
    pipeline calls (forwarded to its service); `pipelines`, the pipelines only. The same
    on both doors."""
    ready_timeout_ms: float = 1000
    """Per-endpoint timeout of the /readyz checks, and of asking a service for a model's
    metadata (PROXY_CACHE_CHECK_MS says how often)."""
    ready_cache_ms: float = Field(default=1000, ge=0)
    """/readyz and /v2/health/ready answer from checks at most this old: however many
    clients poll them, the services are asked once per period."""
    api_key: str | None = None
    """When set, requests need `Authorization: Bearer <key>`, `X-API-Key: <key>`, or HTTP
    Basic with the key as the password (a browser's, for the console page)."""
    open_paths: str = "/healthz,/readyz,/metrics"
    """Paths served without the API key."""
    cors_origins: str = ""
    """Origins whose web pages may call the proxy from a browser (comma-separated, e.g.
    `https://app.example.com`, or `*`), as MLServer's `cors_settings` and BentoML's `cors`:
    preflights answered before the API key is asked for, the mesh's headers (X-Request-Id,
    X-Cache, Retry-After, Location) readable by the page. Empty: no CORS headers, and
    browsers keep other origins' pages out."""
    cors_max_age_s: int = Field(default=600, ge=0)
    """How long a browser may keep a preflight's answer."""
    console: bool = True
    """The console page at /console/ (docs/console.md) and the record of the last requests
    it shows."""
    console_requests: int = Field(default=200, ge=1, le=100_000)
    """How many of the last requests the console keeps (in each proxy worker)."""
    prediction_log: str = ""
    """The prediction log (docs/operating.md): each request a pipeline ended (jobs' runs
    included) as one JSON record, written in the background: its inputs' digests, its
    answer, its steps and the model that answered each. A file (`/var/log/mesh/predictions.jsonl`
    or `file:///...`), rotated at `prediction_log_file_mb`; an HTTP receiver (`http://`,
    `https://`) taking each record as a CloudEvent, as KServe's logger sends them; or a Redis
    stream (`redis://host:6379/0?stream=mesh:predictions&maxlen=100000`, both optional), an
    entry a record, trimmed to about `maxlen`. Empty: off."""
    prediction_log_percent: float = Field(default=100.0, gt=0, le=100)
    """The share of requests the prediction log records, chosen at random."""
    prediction_log_inputs: bool = False
    """Records carry each input's bytes too (base64, inputs of up to `prediction_log_inputs_kb`):
    the upload beside its answer, for a training set. Off: its datatype, shape, size and
    SHA-256 only."""
    prediction_log_inputs_kb: int = Field(default=1024, ge=1)
    """An input larger than this is recorded by its digest alone, its bytes left out."""
    prediction_log_file_mb: float = Field(default=100.0, gt=0)
    """A prediction log file is rotated at this size (five older files kept: `<file>.1` the
    newest)."""
    max_message_mb: int = 64
    """Largest gRPC message to or from the services (and the gRPC door)."""
    transport: Literal["stream", "unary"] = "stream"
    """How calls reach the services: multiplexed on long-lived ModelStreamInfer streams
    (a service without them, UNIMPLEMENTED, is called unary from then on), or one unary
    ModelInfer call each."""
    streams_per_endpoint: int = Field(default=2, ge=1, le=64)
    """Streams kept open to each service address."""
    balance: Literal["proxy", "grpc"] = "proxy"
    """For an endpoint naming replicas (`dns:///name:port`, `ipv4:a:port,b:port`): `proxy`
    resolves the name and spreads calls and streams over the replicas by load, passing over
    failed ones (proxy/transport/balancing.py); `grpc` leaves it to gRPC's round_robin (per call on
    unary calls; a stream stays on the replica it opened on)."""
    connections_per_endpoint: int = Field(default=1, ge=1, le=16)
    """Connections to each plain `host:port` endpoint, each with its own streams, calls to
    the least busy: behind a Service that balances connections, not calls (a Kubernetes
    ClusterIP, KServe's predictors), each may reach another replica."""
    resolve_interval_s: float = Field(default=10.0, gt=0)
    """How often a `dns:///` endpoint is looked up again (and soon after a replica fails)."""
    keepalive_ms: int = Field(default=1000, ge=100)
    """HTTP/2 keepalive to the services: a ping this often while calls are open, and the
    connection closed (its calls failed UNAVAILABLE, retried elsewhere) when one is not
    acknowledged within as long again; so a replica that froze or whose packets are dropped
    is noticed within about twice this. Our services accept pings this often; a foreign
    server's defaults tolerate them while it is answering (gRPC stops pinging an idle
    connection after two pings)."""
    shed_late: bool = True
    """Refuse at once (503 + Retry-After) a request whose budget the pipeline's work in
    flight would outlast at its measured pace, rather than let it share the cores and make
    every request late (proxy/engine/pace.py). OCR pages at 1.5 s budgets: as many answers
    in time with two clients (none refused), 1.35x with four, 2.2x with eight, 4-6x with 32;
    `digits` unchanged (bench/README). False: every request admitted within the fixed
    limits is run, however late it will be."""
    merge: bool = True
    """Caller-side batching: calls of requests in flight together to the same step of a
    batching model (max_batch_size > 0) merged into one call (proxy/transport/merging.py)."""
    cache: bool = True
    """The caches the pipelines declare (`cache:`, a step's `cache: true`); false: none at
    all (e.g. to measure the services themselves)."""
    cache_url: str | None = None
    """The inference and data caches in Redis (`redis://host:6379/0`), shared by every proxy
    replica; unset: in process, each pipeline's bounded by its `cache.max_mb`."""
    cache_steps_mb: float = Field(default=64.0, gt=0)
    """In-process bytes for the outputs of steps marked `cache: true` (all pipelines)."""
    cache_timeout_ms: float = Field(default=50.0, gt=0)
    """Longest a Redis cache operation may take; a slower one counts as a miss (the run it
    races is never held up)."""
    cache_check_ms: float = Field(default=1000.0, gt=0)
    """How long the proxy trusts a model's metadata (its versions and tensors) before it asks
    its service again; one catalog serves all that read it. A model reloaded in a new
    version or with other tensors is seen within this: by the caches (it stops matching its
    old entries), by the v2 door (a forwarded call is checked against its new inputs) and by
    the wiring check of a call refused INVALID_ARGUMENT."""
    wiring_check_s: float = Field(default=10.0, ge=0)
    """How often every pipeline's wiring is checked against its models' metadata in the
    background: a model swapped for one that does not fit is then logged and counted
    (`proxy_pipeline_misconfigured`, the MeshPipelineMisconfigured alert) before a request
    meets it. 0: never (the calls that do not fit still fail 502, naming why)."""
    jobs_url: str | None = None
    """The jobs' queue: `sqlite:///path/jobs.sqlite3` (one machine: the proxy's processes
    and worker processes beside it) or `redis://host:6379/1` (shared by every replica and
    worker). Unset: `sqlite:///data/jobs.sqlite3`, under the working directory."""
    jobs_workers: int = Field(default=4, ge=0, le=256)
    """Jobs this process runs at once (0: it queues jobs, worker processes run them)."""
    jobs_share: float = Field(default=0.5, gt=0, le=1)
    """Share of the proxy's and each pipeline's admission limits that jobs may hold; the
    rest is kept for requests whose clients wait."""
    jobs_busy_workers: int = Field(default=1, ge=1, le=256)
    """Jobs this process runs at once while requests whose clients wait are being served here
    (or were, within `jobs_quiet_ms`): the services' cores are shared, and a backlog run at full
    width doubles those clients' p99. Jobs already running finish; a process with no such
    clients (a worker-only one) runs up to `jobs_workers`."""
    jobs_quiet_ms: float = Field(default=1000.0, ge=0)
    """How long after the last request whose client waited the jobs widen again."""
    jobs_max_queued: int = Field(default=10_000, ge=1)
    """Unfinished jobs the queue holds; more get 429 with Retry-After."""
    jobs_max_queued_mb: float = Field(default=1024.0, gt=0)
    """Uploads the unfinished jobs may hold in the queue's store (MB); a job that would pass
    it gets 429 with Retry-After. The count alone allowed 10,000 x 20 MiB."""
    jobs_min_free_mb: float = Field(default=64.0, ge=0)
    """SQLite: a job whose upload would leave the database's disk with less free than this
    (MB) gets 503 with Retry-After, so that the jobs it holds can always end and give their
    uploads' room back (on a full disk none could: the queue stood still). 0: not kept."""
    jobs_attempts: int = Field(default=3, ge=1, le=20)
    """Attempts a job gets (each with the pipeline's budget) when it fails in a way another
    attempt may not (502, 503, 504, or its worker died)."""
    jobs_backoff_s: float = Field(default=1.0, gt=0)
    """Wait before a job's second attempt; doubled each attempt after, jittered."""
    jobs_lease_s: float = Field(default=30.0, ge=1)
    """A running job's lease, renewed while its worker lives: a worker that dies leaves its
    jobs to be taken again this long after."""
    jobs_keep_s: float = Field(default=86_400.0, gt=0)
    """How long an ended job (and its result) is kept."""
    jobs_callback_hosts: str = ""
    """Hosts (`host` or `host:port`, comma-separated) a job's callback may be POSTed to;
    empty: callbacks refused."""
    jobs_callback_secret: str | None = None
    """When set, every callback carries `X-Mesh-Signature: t=<unix seconds>,v1=<hex
    HMAC-SHA256 of "<t>.<body>" with this secret>`: a receiver checks it (and that `t` is
    recent) to know the callback came from the mesh, unchanged and not replayed."""
    jobs_callback_most_s: float = Field(default=600.0, gt=0)
    """Longest wait between two tries of a callback that fails: each wait is as long as the
    job has been ended (tries at 0, 0.5, 1, 2, 4 ... s after its end), up to this; tried
    until delivered, refused (a 4xx) or the job is removed (`jobs_keep_s`)."""
    jobs_callback_hold_s: float = Field(default=30.0, ge=0.1)
    """How long a callback being tried is left to the process trying it before another one
    may (after a crash or a restart of that process): one POST's 10 s timeout, with room."""
    tls_ca: Path | None = None
    """PEM CA that signed the services' certificates: calls them over TLS. Unset: plaintext."""
    tls_cert: Path | None = None
    """PEM client certificate for services that require one (mutual TLS); needs tls_key."""
    tls_key: Path | None = None
    """PEM private key of tls_cert."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR; JSON lines on stderr."""

    @field_validator("jobs_url", mode="before")
    @classmethod
    def _unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("prediction_log")
    @classmethod
    def _sink(cls, value: str) -> str:
        value = value.strip()
        scheme = value.partition("://")[0] if "://" in value else ""
        if scheme not in ("", "file", "http", "https", "redis", "rediss"):
            raise ValueError(
                f"'{value}' is neither a file (a path, or file:///...), an http:// or "
                "https:// receiver nor a redis:// stream"
            )
        if scheme in ("redis", "rediss"):
            redis_stream(value)  # a bad stream or maxlen named now
        if scheme == "file" and not value.startswith("file:///"):
            raise ValueError(f"'{value}' names no absolute path: write file:///path/to/file")
        return value

    @field_validator("grpc_port", mode="before")
    @classmethod
    def _off(cls, value: object) -> object:
        return None if isinstance(value, str) and value.strip().lower() in ("", "off") else value

    def jobs_queue_url(self) -> str:
        return self.jobs_url or f"sqlite:///{Path('data', 'jobs.sqlite3').resolve()}"

    def door_message_mb(self) -> float:
        """The largest message the gRPC door takes (once inflated): what REST takes, an image
        up to the body limit, plus the message's own few bytes."""
        return self.max_body_mb + 1 / 16

    def upload_limits(self) -> UploadLimits:
        return UploadLimits(int(self.max_body_mb * 2**20), self.min_upload_kbps * 1024)
