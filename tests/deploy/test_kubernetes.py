"""The Kubernetes manifests, checked offline: every overlay renders with `kubectl kustomize`,
every object validates against the API schema of a pinned Kubernetes version, the
Deployments match the compose topology, every endpoint the pipelines use reaches a Service
port that exists, and the NetworkPolicies admit exactly the mesh's own connections."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from compose.topology import interpolate, merged_specs
from deploy import capacity
from deploy.kubernetes import generate
from deploy.observability import dashboard, operator
from predictors.settings import PredictorSettings
from preprocess import config as recipe_file
from preprocess.settings import PreprocessSettings
from proxy.engine import plan
from tests.pki import PKI
from tests.procs import ROOT, start_service

KUBERNETES = "1.32.0"
"""The API version the objects must be valid for (kubectl on the machine is 1.32)."""
OVERLAYS = generate.HERE / "overlays"
NAMES = list(merged_specs([generate.COMPOSE]))
"""Every compose service: the mesh's own as Deployments, `redis` as a StatefulSet."""
SERVICES = [n for n in NAMES if n != "redis"]
DEPLOYED = [*SERVICES, "job-worker"]
"""The Deployments: the mesh's services and the job workers derived from the proxy."""


@cache
def render(overlay: str) -> tuple[dict, ...]:
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is needed to render the overlays (kubectl kustomize)")
    out = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def objects(overlay: str, kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in render(overlay) if d["kind"] == kind}


def container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def env_of(deployment: dict) -> dict[str, str]:
    """The container's settings given inline (those from Secrets: secrets_of)."""
    return {e["name"]: e["value"] for e in container(deployment)["env"] if "value" in e}


def secrets_of(container: dict) -> dict[str, dict]:
    """The container's settings read from Secrets: name -> its secretKeyRef."""
    return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}


def test_generated_files_are_up_to_date() -> None:
    assert generate.check() == [], "run: python -m deploy.kubernetes.generate"


@pytest.mark.parametrize("overlay", ["local", "production", "production-mtls", "kserve"])
def test_every_object_validates_against_the_pinned_api(overlay: str) -> None:
    checked = 0
    for doc in render(overlay):
        if doc["apiVersion"].startswith(("serving.kserve.io/", "monitoring.coreos.com/")):
            continue  # not in Kubernetes' schema: test_kserve.py, the test below check them
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
        checked += 1
    assert checked >= len(NAMES) * 2


def test_the_validator_refuses_what_the_api_would() -> None:
    deployment = copy.deepcopy(objects("local", "Deployment")["proxy"])
    container(deployment)["readinessProbe"]["periodSecond"] = 5  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def _compose(name: str) -> dict:
    return merged_specs([generate.COMPOSE])[name]


@pytest.mark.parametrize("name", SERVICES)
def test_each_compose_service_has_its_deployment(name: str) -> None:
    spec = _compose(name)
    deployment = objects("local", "Deployment")[name]
    main = container(deployment)
    assert main["command"] == [str(c) for c in spec["command"]]
    want = {k: interpolate(str(v), {}) for k, v in spec["environment"].items()}
    want = {k: v for k, v in want.items() if v}  # empty in compose: left to the default
    got = env_of(deployment)
    for key, value in want.items():
        # Endpoints name the headless Service for the proxy's balancing; nothing else moves.
        endpoint = key.endswith("_URL") and not key.startswith("PROXY_")
        assert got[key] == (f"dns:///{value}" if endpoint else value), key
    # The pipelines' file as mounted; the bytes in flight its pod's memory holds (below).
    bounds = {"PROXY_MAX_INFLIGHT_MB", "PREDICTOR_MAX_INFLIGHT_MB", "PREPROCESS_MAX_INFLIGHT_MB"}
    assert set(got) - set(want) <= {"PROXY_PIPELINES", *bounds}
    ports = {p["containerPort"] for p in main["ports"]}
    assert ports == {int(v) for k, v in want.items() if k.endswith("_PORT")}
    service = objects("local", "Service")[name]
    assert {p["port"] for p in service["spec"]["ports"]} == ports
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )


@pytest.mark.parametrize("name", SERVICES)
def test_probes_check_what_the_compose_healthcheck_checks(name: str) -> None:
    test = _compose(name)["healthcheck"]["test"]
    main = container(objects("local", "Deployment")[name])
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in main
    if test[2:4] == ["-m", "v2server.healthcheck"]:
        # compose asks the v2 server whether it is ready; the kubelet asks grpc.health.v1,
        # which the server answers SERVING once its models are loaded (v2server/server.py).
        port = int(test[4].rsplit(":", 1)[1])
        assert main["readinessProbe"]["grpc"] == {"port": port} == {"port": ports["grpc"]}
    else:
        # compose shows the whole mesh's state (`docker compose ps`, `--wait`): /readyz; the
        # kubelet keeps a proxy in its Service while it answers (below): /healthz.
        assert test[2:4] == ["-m", "proxy.healthcheck"]
        url = test[4]
        assert url[url.index("/", 8) :] == "/readyz"
        assert main["readinessProbe"]["httpGet"]["path"] == "/healthz"
        assert int(url.split(":")[2].split("/")[0]) == ports["http"]


def test_every_endpoint_the_pipelines_use_reaches_a_service_port() -> None:
    deployments, services = objects("local", "Deployment"), objects("local", "Service")
    proxy = deployments["proxy"]
    pipelines = generate.PIPELINES
    plans = plan.load(pipelines, env_of(proxy))
    reached = set()
    for pipeline in plans.values():
        for target in pipeline.targets.values():
            host, port = target.address.removeprefix("dns:///").rsplit(":", 1)
            service = services[host]
            assert service["spec"].get("clusterIP") == "None", f"{host}: headless"
            by_port = {p["port"]: p for p in service["spec"]["ports"]}
            assert int(port) in by_port, f"{target.endpoint}: {host} has no port {port}"
            backend = deployments[host]
            exposed = {p["name"]: p["containerPort"] for p in container(backend)["ports"]}
            assert exposed[by_port[int(port)]["targetPort"]] == int(port)
            reached.add(host)
    assert reached == set(SERVICES) - {"proxy"}


def test_the_jobs_queue_is_the_compose_redis_on_a_volume_both_callers_reach() -> None:
    spec = _compose("redis")
    statefulset = objects("local", "StatefulSet")["redis"]
    main = container(statefulset)
    assert main["command"] == [str(c) for c in spec["command"]]
    argv = main["command"]
    assert argv[argv.index("--appendonly") + 1] == "yes"
    assert argv[argv.index("--maxmemory-policy") + 1] == "volatile-lru"
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    claims = statefulset["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]
    assert mounts["data"] == argv[argv.index("--dir") + 1]
    # The probe asks the pod itself what compose's healthcheck asks the service.
    shell = spec["healthcheck"]["test"][1].replace("redis://redis:", "redis://127.0.0.1:")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["exec"]["command"] == ["sh", "-c", shell]
    port = int(argv[argv.index("--port") + 1])
    service = objects("local", "Service")["redis"]
    assert service["spec"]["ports"][0]["port"] == port
    assert statefulset["spec"]["serviceName"] == "redis"
    deployments = objects("local", "Deployment")
    for caller in ("proxy", "job-worker"):
        url = env_of(deployments[caller])["PROXY_JOBS_URL"]
        assert url == f"redis://redis:{port}/0", caller


def test_queued_uploads_are_refused_by_the_proxy_before_redis_is_full() -> None:
    """The queue's bytes bound sits under Redis's maxmemory with room for the results and
    the keys: with the setting's default (1,024 MB) over the shipped 512mb, a flood of big
    jobs met Redis's own refusal (503 naming a Lua script) instead of the proxy's 429."""
    argv = [str(c) for c in _compose("redis")["command"]]
    maxmemory = argv[argv.index("--maxmemory") + 1]
    assert maxmemory.endswith("mb")
    deployments = objects("local", "Deployment")
    queued_mb = float(env_of(deployments["proxy"])["PROXY_JOBS_MAX_QUEUED_MB"])
    assert queued_mb <= 0.5 * int(maxmemory[:-2])


def test_job_workers_run_the_proxys_engine_without_its_doors() -> None:
    deployments = objects("production-mtls", "Deployment")
    proxy, worker = container(deployments["proxy"]), container(deployments["job-worker"])
    assert worker["command"] == ["python", "-m", "proxy.job_worker"]
    assert worker["image"] == proxy["image"]
    # The same settings (endpoints, queue, mutual TLS) but no gRPC door; its spans under
    # its own name.
    assert {**env_of(deployments["proxy"])} == {
        **env_of(deployments["job-worker"]),
        "PROXY_GRPC_PORT": env_of(deployments["proxy"])["PROXY_GRPC_PORT"],
        "OTEL_SERVICE_NAME": "proxy",
    }
    assert env_of(deployments["job-worker"])["OTEL_SERVICE_NAME"] == "job-worker"
    assert env_of(deployments["job-worker"])["PROXY_TLS_CA"] == "/etc/mesh/tls/ca.crt"
    assert [p["name"] for p in worker["ports"]] == ["metrics"]
    assert worker["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert worker["volumeMounts"] == proxy["volumeMounts"]


def test_a_proxy_stays_in_its_service_while_what_it_calls_is_down() -> None:
    # Every replica sees the same services and queue: a probe of /readyz (everything it calls)
    # would take every proxy out of the Service at once when one model's pods or Redis are
    # down, and digits would stop with OCR. Ready when it answers; /readyz is the report.
    for overlay in ("local", "production"):
        proxy = container(objects(overlay, "Deployment")["proxy"])
        assert proxy["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_pods_run_unprivileged_and_outlive_their_drain() -> None:
    workloads = {**objects("production", "Deployment"), **objects("production", "StatefulSet")}
    assert set(workloads) == {*DEPLOYED, "redis"}
    for name, deployment in workloads.items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for c in pod["containers"] + pod.get("initContainers", []):
            context = c["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            assert {"cpu", "memory"} <= c["resources"]["requests"].keys(), name
        if name == "redis":
            continue  # no requests to drain: SIGTERM flushes its append-only file and exits
        pre_stop = int(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
        assert pod["terminationGracePeriodSeconds"] > pre_stop + generate.DRAIN_S, name


def test_production_scales_every_service_and_keeps_one_up() -> None:
    deployments = objects("production", "Deployment")
    autoscalers = objects("production", "HorizontalPodAutoscaler")
    budgets = objects("production", "PodDisruptionBudget")
    assert set(autoscalers) == set(budgets) == set(deployments) == set(DEPLOYED)
    for name, deployment in deployments.items():
        assert "replicas" not in deployment["spec"], f"{name}: the autoscaler owns it"
        hpa = autoscalers[name]["spec"]
        assert hpa["scaleTargetRef"]["name"] == name and hpa["minReplicas"] >= 2
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert budgets[name]["spec"]["selector"]["matchLabels"].items() <= labels.items()
        spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert {c["topologyKey"] for c in spread} == {
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone",
        }


# --- NetworkPolicy: which connections are admitted -------------------------------------

NAMESPACE = "mesh"


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        value = labels.get(expression["key"])
        if expression["operator"] == "In" and value not in expression["values"]:
            return False
    return True


def _peer_admits(peer: dict, source: tuple[str, dict[str, str]]) -> bool:
    namespace, labels = source
    namespaces = {NAMESPACE: {"kubernetes.io/metadata.name": NAMESPACE}}
    namespaces.setdefault(namespace, {"kubernetes.io/metadata.name": namespace})
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], namespaces[namespace]):
            return False
    elif namespace != NAMESPACE:
        return False  # a podSelector alone means pods of the policy's namespace
    return _selects(peer.get("podSelector", {}), labels)


def admitted(overlay: str, source: tuple[str, dict[str, str]], pod: dict, port: dict) -> bool:
    labels = pod["spec"]["template"]["metadata"]["labels"]
    policies = [
        p
        for p in objects(overlay, "NetworkPolicy").values()
        if _selects(p["spec"]["podSelector"], labels)
    ]
    if not policies:
        return True
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p["port"] in (port["name"], port["containerPort"]) for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_admits(peer, source) for peer in peers):
                return True
    return False


def test_network_policies_admit_exactly_the_mesh_connections() -> None:
    deployments = {**objects("local", "Deployment"), **objects("local", "StatefulSet")}
    sources = {
        name: (NAMESPACE, d["spec"]["template"]["metadata"]["labels"])
        for name, d in deployments.items()
    }
    sources["another pod in the namespace"] = (NAMESPACE, {"app": "debug"})
    sources["a pod elsewhere"] = ("default", {"app.kubernetes.io/name": "proxy"})
    sources["prometheus"] = ("monitoring", {"app": "prometheus"})
    seen = set()
    for destination, deployment in deployments.items():
        for port in container(deployment)["ports"]:
            for source, peer in sources.items():
                if admitted("local", peer, deployment, port):
                    seen.add((source, destination, port["name"]))
    expected = {("prometheus", "job-worker", "metrics")}
    callers = ("proxy", "job-worker")
    for name in NAMES:
        if name == "proxy":
            expected |= {(s, "proxy", p) for s in sources for p in ("http", "grpc")}
        elif name == "redis":
            expected |= {(caller, "redis", "redis") for caller in callers}
        else:
            expected |= {(caller, name, "grpc") for caller in callers}
            expected.add(("prometheus", name, "metrics"))
    assert seen == expected


def test_the_mutual_tls_probe_command_checks_a_tls_predictor(
    pki: PKI, test_repository: Path, tmp_path: Path
) -> None:
    """The kubelet's gRPC probes speak plaintext, so under components/mtls a predictor's
    probes run the image's health check over TLS: run that exact command here."""
    deployment = objects("production-mtls", "Deployment")["digits-logreg"]
    command = container(deployment)["readinessProbe"]["exec"]["command"]
    env = {e["name"]: e["value"] for e in container(deployment)["env"]}
    assert env["PREDICTOR_TLS_CLIENT_CA"] == "/etc/mesh/tls/ca.crt"
    tls = {"PREDICTOR_TLS_CERT": pki.server_cert, "PREDICTOR_TLS_KEY": pki.server_key}
    server = start_service(
        "predictors",
        ["--repository", str(test_repository)],
        tmp_path,
        env={**{k: str(v) for k, v in tls.items()}, "PREDICTOR_TLS_CLIENT_CA": str(pki.ca)},
    )
    try:

        def probe(ca: Path) -> int:
            # The Secret's files, here the test PKI's (the probe is the server's client).
            files = {"ca.crt": ca, "tls.crt": pki.client_cert, "tls.key": pki.client_key}
            line = command[-1]
            for name, file in files.items():
                line = line.replace(f"/etc/mesh/tls/{name}", str(file))
            search = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
            run_env = {**os.environ, "PATH": search, "PREDICTOR_PORT": str(server.port)}
            return subprocess.run(
                [*command[:-1], line], cwd=ROOT, env=run_env, timeout=60
            ).returncode

        assert command[:2] == ["sh", "-c"]
        assert probe(pki.ca) == 0
        assert probe(pki.other_ca) != 0  # a server it cannot trust is not healthy
    finally:
        server.stop()


def test_the_nightly_batch_runs_the_batch_cli_against_the_proxy() -> None:
    from batch.__main__ import parser

    cronjob = objects("production", "CronJob")["batch-ocr-invoices"]
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    main = pod["containers"][0]
    assert main["image"] == container(objects("production", "Deployment")["proxy"])["image"]
    assert main["command"] == ["python", "-m", "batch"]
    # The kubelet expands $(BATCH_DB_URL); the CLI must take what it then receives.
    url = "postgresql+psycopg://batch@db/scans"
    args = parser().parse_args([a.replace("$(BATCH_DB_URL)", url) for a in main["args"]])
    assert (args.pipeline, args.source, args.output) == ("ocr", url, url)
    assert args.table and args.output_table and args.url == "http://proxy:8080"
    proxy_port = objects("production", "Service")["proxy"]["spec"]["ports"][0]["port"]
    assert args.url.endswith(f":{proxy_port}")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in main["env"]}
    assert set(env) == {"BATCH_DB_URL", "MESH_API_KEY"}  # both from Secrets, never inline
    assert env["MESH_API_KEY"]["optional"] is True  # a proxy without a key needs no Secret


def test_production_keys_come_from_optional_secrets_the_batch_shares() -> None:
    """The API key the nightly batch sends is the one the proxy checks (the batch sent a
    Secret's key to a proxy that read none), and every process that may send a callback
    signs it with the same key; all optional, none inline."""
    from proxy.settings import ProxySettings

    deployments = objects("production", "Deployment")
    proxy = secrets_of(container(deployments["proxy"]))
    worker = secrets_of(container(deployments["job-worker"]))
    batch = objects("production", "CronJob")["batch-ocr-invoices"]
    sends = secrets_of(batch["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0])
    assert proxy["PROXY_API_KEY"] == sends["MESH_API_KEY"]
    assert proxy["PROXY_JOBS_CALLBACK_SECRET"] == worker["PROXY_JOBS_CALLBACK_SECRET"]
    assert all(ref["optional"] is True for ref in [*proxy.values(), *worker.values()])
    for name in ("proxy", "job-worker"):
        assert not {"PROXY_API_KEY", "PROXY_JOBS_CALLBACK_SECRET"} & set(env_of(deployments[name]))
    prefix = ProxySettings.model_config["env_prefix"]
    fields = {prefix + f.upper() for f in ProxySettings.model_fields}
    assert {"PROXY_API_KEY", "PROXY_JOBS_CALLBACK_SECRET"} <= fields


def test_the_production_overlay_scrapes_every_pod_with_the_rules_and_the_dashboard() -> None:
    """The Prometheus Operator's objects: the PodMonitor selects every Deployment's pods on a
    port each of them names, the PrometheusRule is deploy/observability's rules, Grafana's
    ConfigMap its dashboard, and all three are what `dashboard.py` writes."""
    assert dashboard.main(["--check"]) == 0, "run: python -m deploy.observability.dashboard"
    (monitor,) = objects("production", "PodMonitor").values()
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    for name, deployment in objects("production", "Deployment").items():
        pod = deployment["spec"]["template"]
        assert selector.items() <= pod["metadata"]["labels"].items(), name
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert ports & scraped, (name, ports)
    (rule,) = objects("production", "PrometheusRule").values()
    assert rule["spec"] == yaml.safe_load(operator.RULES.read_text())
    board = objects("production", "ConfigMap")["inference-mesh-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["data"]["inference-mesh.json"] == dashboard.DASHBOARD.read_text()


@pytest.mark.parametrize("name", [n for n in SERVICES if n != "proxy"])
def test_a_service_pod_holds_what_its_bound_lets_in(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes of requests a service may hold (read only while they fit), as resident
    (capacity.SERVICE_RESIDENT_PER_INFLIGHT, measured), and its measured peak fit under its
    memory limit: a flood of calls waits to be read, not ended by the kernel. At the
    setting's default (1,024 MB), 40 calls of 18.9 MB took the recogniser to 1,110 MiB, past
    its pod's 608 Mi; at 128 MB to 322 MiB."""
    deployment = objects("production", "Deployment")[name]
    env = env_of(deployment)
    (key,) = [k for k in env if k.endswith("_MAX_INFLIGHT_MB")]
    settings = PreprocessSettings if key.startswith("PREPROCESS_") else PredictorSettings
    monkeypatch.setenv(key, env[key])
    inflight = settings().max_inflight_mb  # the name the service reads
    assert inflight == float(env[key])
    limit = container(deployment)["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    peak = capacity.load()["peak_memory_mib"][name]
    assert int(limit[:-2]) >= peak + capacity.SERVICE_RESIDENT_PER_INFLIGHT * inflight
    assert capacity.SERVICE_MIN_INFLIGHT_MB <= inflight < 1024


@pytest.mark.parametrize("name", ["proxy", "job-worker"])
def test_a_proxy_pod_holds_what_its_bounds_let_in(name: str) -> None:
    """Its in-flight bound as resident (capacity.RESIDENT_PER_INFLIGHT, measured), its caches
    and its measured peak fit under its memory limit: a flood of uploads is answered 503 by
    the proxy, not ended by the kernel. With the default bound (1,024 MB) in the 608 Mi
    limit these pods had, 64 OCR pages of 17.7 MiB at once got the proxy OOM-killed (each
    request lost); with 256 MB in 1,024 Mi it peaked at 643 MiB and answered all 64."""
    deployment = objects("production", "Deployment")[name]
    env = env_of(deployment)
    inflight = float(env["PROXY_MAX_INFLIGHT_MB"])
    limit = container(deployment)["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    pipelines = yaml.safe_load(generate.PIPELINES.read_text())["pipelines"]
    caches = sum((p.get("cache") or {}).get("max_mb", 0) for p in pipelines.values())
    peak = capacity.load()["peak_memory_mib"]["proxy"]
    resident = peak + caches * 1.25 + 64 + capacity.RESIDENT_PER_INFLIGHT * inflight
    assert int(limit[:-2]) >= resident, (limit, resident)
    assert inflight < 1024  # not the setting's default, which suits a host with no limit


def test_the_files_the_recipes_name_are_in_the_preprocess_pod() -> None:
    """The `ocr` recipe reads the recogniser's characters file from the model repository;
    the preprocess pod had no repository mounted, so its recipe file named a file that was
    not there and the service could not start (compose mounts it in every service)."""
    recipes = PreprocessSettings().config
    in_image = Path("/app") / recipes.relative_to(ROOT)  # the Dockerfile's WORKDIR and COPY
    for overlay in ("local", "production", "kserve"):
        deployment = objects(overlay, "Deployment")["preprocess"]
        mounts = [m["mountPath"] for m in container(deployment)["volumeMounts"]]
        named = [
            os.path.normpath(in_image.parent / value)
            for recipe in recipe_file.parse(recipes).recipes.values()
            for step in recipe.steps
            for params in step.values()
            for key, value in params.items()
            if key.endswith("_file")
        ]
        assert named, "the shipped recipes name a file (the OCR characters)"
        for path in named:
            assert any(path.startswith(f"{m}/") for m in mounts), (overlay, path, mounts)
