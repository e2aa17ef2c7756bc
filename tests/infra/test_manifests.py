"""Static checks of the production infrastructure files under infra/.

Nothing here needs Docker, Kubernetes, Slurm or a GPU: every YAML/JSON file is parsed, Kubernetes
objects are checked for the fields the API server requires, Services must select the pods they
front, every module / script / `ctrpipe` subcommand the files name must exist in this repository
(or the environment), the Dockerfiles may only COPY what exists, and no credential may be written
inline.  Each checker is a plain function returning a list of problems; the `test_checker_*` tests
feed them broken input to show that they fail when they should.

Files owned elsewhere (infra/prefect.yaml, infra/dask/*.yaml) are checked when they exist; a check
specific to one of them is skipped, saying so, when it is absent.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
K8S = INFRA / "k8s"
DOCKER = INFRA / "docker"
SLURM = INFRA / "slurm"
SBATCH = SLURM / "train.sbatch"
WORK_POOL_TEMPLATE = K8S / "work-pool-template.json"
PREFECT_YAML = INFRA / "prefect.yaml"

OUR_FILES = [
    DOCKER / "Dockerfile.cpu",
    DOCKER / "Dockerfile.cuda",
    K8S / "namespace.yaml",
    K8S / "prefect-server.yaml",
    K8S / "prefect-worker.yaml",
    K8S / "ssd-local-volume.yaml",
    K8S / "train-job.yaml",
    K8S / "scorer.yaml",
    WORK_POOL_TEMPLATE,
    SBATCH,
    INFRA / "README.md",
]
WORK_POOLS = {"ctr-process": "process", "ctr-k8s": "kubernetes"}
DEPLOYMENTS = {"ctr-daily", "ctr-on-demand", "ctr-backfill"}  # flows.prefect.deploy.deployment_names("ctr")
LOCAL_DIR = "/mnt/ctr-local"  # store.local_dir inside the pods
INIT = ["/usr/bin/tini", "--"]
"""The init our images run their command under (PID 1: it reaps zombies; ctrpipe stops only what its run started)."""
OUR_IMAGES = ("registry.example.com/ctr-pipeline:", "{{ image }}")  # the work pool's pods run our image


# ---- loading ---------------------------------------------------------------------------------
def data_files() -> list[Path]:
    """Every YAML and JSON file under infra/ (ours and the ones other people own)."""
    return sorted(p for p in INFRA.rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))


def load_docs(path: Path) -> list[Any]:
    text = path.read_text()
    if path.suffix == ".json":
        return [json.loads(text)]
    return [d for d in yaml.safe_load_all(text) if d is not None]


def all_docs() -> list[tuple[Path, Any]]:
    return [(p, d) for p in data_files() for d in load_docs(p)]


def is_k8s_object(doc: Any) -> bool:
    return isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc


def k8s_objects() -> list[tuple[Path, dict]]:
    return [(p, d) for p, d in all_docs() if is_k8s_object(d)]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ---- checkers (pure: input -> list of problems) ---------------------------------------------------
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod", "PyTorchJob"}
CLUSTER_SCOPED = {
    "Namespace",
    "StorageClass",
    "PersistentVolume",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "CustomResourceDefinition",
}


def pod_templates(doc: dict) -> list[tuple[str, dict, dict]]:
    """(where, pod spec, pod labels) of every pod a workload object creates."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "Pod":
        return [("spec", spec, (doc.get("metadata") or {}).get("labels") or {})]
    if kind == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    if kind == "PyTorchJob":
        return [
            (
                f"spec.pytorchReplicaSpecs.{role}.template",
                (r.get("template") or {}).get("spec") or {},
                ((r.get("template") or {}).get("metadata") or {}).get("labels") or {},
            )
            for role, r in (spec.get("pytorchReplicaSpecs") or {}).items()
        ]
    if kind in WORKLOAD_KINDS:
        tpl = spec.get("template") or {}
        return [("spec.template", tpl.get("spec") or {}, (tpl.get("metadata") or {}).get("labels") or {})]
    return []


def check_k8s_object(doc: dict) -> list[str]:
    """apiVersion / kind / metadata.name, a namespace where one is needed, containers with image and command."""
    problems = []
    name = (doc.get("metadata") or {}).get("name")
    label = f"{doc.get('kind')}/{name}"
    for key in ("apiVersion", "kind"):
        if not isinstance(doc.get(key), str) or not doc.get(key):
            problems.append(f"{label}: missing {key}")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name or ""):
        problems.append(f"{label}: metadata.name missing or not a DNS name")
    if doc.get("kind") not in CLUSTER_SCOPED and not (doc.get("metadata") or {}).get("namespace"):
        problems.append(f"{label}: namespaced object without metadata.namespace")
    if doc.get("kind") in WORKLOAD_KINDS:
        templates = pod_templates(doc)
        if not templates:
            problems.append(f"{label}: workload without a pod template")
        for where, pod, _ in templates:
            containers = pod.get("containers") or []
            if not containers:
                problems.append(f"{label}: {where} has no containers")
            for c in [*containers, *(pod.get("initContainers") or [])]:
                cname = c.get("name", "?")
                if not c.get("name"):
                    problems.append(f"{label}: {where}: a container has no name")
                if not c.get("image"):
                    problems.append(f"{label}: container {cname} has no image")
                if not c.get("command"):
                    problems.append(f"{label}: container {cname} has no command")
    if doc.get("kind") == "Deployment":
        match = ((doc.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        labels = pod_templates(doc)[0][2] if pod_templates(doc) else {}
        if not match or any(labels.get(k) != v for k, v in match.items()):
            problems.append(f"{label}: spec.selector.matchLabels {match} do not select its pod labels {labels}")
    return problems


def check_http_probes(container: dict, wanted: dict[str, str]) -> list[str]:
    """Each probe in `wanted` (probe -> path) is an httpGet of that path on a port the container declares."""
    problems = []
    ports = {p.get("name") for p in container.get("ports") or []} | {
        p.get("containerPort") for p in container.get("ports") or []
    }
    for probe, path in wanted.items():
        get = ((container.get(probe) or {}).get("httpGet")) or {}
        if get.get("path") != path:
            problems.append(
                f"container {container.get('name')}: {probe} must be an httpGet of {path}, got {get or None}"
            )
        elif get.get("port") not in ports:
            problems.append(
                f"container {container.get('name')}: {probe} port {get.get('port')} is not a container port"
            )
    return problems


def check_service_selectors(objects: list[dict]) -> list[str]:
    """Every Service with a selector selects the pods of some workload in its namespace."""
    problems = []
    pods = [((o.get("metadata") or {}).get("namespace"), labels) for o in objects for _, _, labels in pod_templates(o)]
    for svc in (o for o in objects if o.get("kind") == "Service"):
        ns = (svc.get("metadata") or {}).get("namespace")
        selector = (svc.get("spec") or {}).get("selector") or {}
        name = (svc.get("metadata") or {}).get("name")
        if not selector:
            problems.append(f"Service/{name}: no selector")
            continue
        if not any(pns == ns and all(lab.get(k) == v for k, v in selector.items()) for pns, lab in pods):
            problems.append(f"Service/{name}: selector {selector} matches no pod template in namespace {ns}")
    return problems


SECRET_NAME = re.compile(
    r"pass(word|wd)?|secret|token|auth|api[-_]?key|access[-_]?key|private[-_]?key|credential", re.IGNORECASE
)
# keys whose value names a Secret object or is a flag, not a credential
REFERENCE_KEYS = {
    "secretKeyRef",
    "secretRef",
    "secretName",
    "serviceAccountName",
    "automountServiceAccountToken",
    "service_account_name",
    "imagePullSecrets",
}


def is_reference(value: str) -> bool:
    """A templated or environment value: Prefect `{{ ... }}`, shell `$VAR` / `${VAR}`, or empty."""
    v = value.strip()
    return not v or bool(re.fullmatch(r"\{\{.*\}\}", v) or re.fullmatch(r"\$\{?\w+\}?", v))


def find_inline_secrets(obj: Any, path: str = "") -> list[str]:
    """Literal values under credential-like keys, and env entries {name: <credential-like>, value: literal}."""
    problems = []
    if isinstance(obj, dict):
        env_name = obj.get("name")
        if (
            isinstance(env_name, str)
            and "value" in obj
            and SECRET_NAME.search(env_name)
            and isinstance(obj["value"], str)
            and not is_reference(obj["value"])
        ):
            problems.append(f"{path}: env {env_name} has an inline value (use valueFrom.secretKeyRef)")
        for key, value in obj.items():
            where = f"{path}.{key}" if path else str(key)
            if (
                isinstance(key, str)
                and key not in REFERENCE_KEYS
                and SECRET_NAME.search(key)
                and isinstance(value, str)
                and not is_reference(value)
            ):
                problems.append(f"{where}: inline value under a credential-like key")
            problems += find_inline_secrets(value, where)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            problems += find_inline_secrets(item, f"{path}[{i}]")
    return problems


_TEXT_SECRET = re.compile(
    r"^\s*(?:ENV|ARG|export)\s+(\w*(?:PASSWORD|SECRET|TOKEN|AUTH|API_KEY|ACCESS_KEY)\w*)=(?![\"']?\$)(\S+)",
    re.IGNORECASE | re.MULTILINE,
)


def find_text_secrets(text: str) -> list[str]:
    """`ENV X_TOKEN=literal` / `export AWS_SECRET_ACCESS_KEY=literal` in Dockerfiles and shell scripts."""
    return [f"{m.group(1)} is set to a literal" for m in _TEXT_SECRET.finditer(text) if m.group(2) not in ('""', "''")]


def module_exists(module: str) -> bool:
    """`python -m module` would find it: a file/package in this repo, else in the environment (not imported)."""
    parts = module.split(".")
    if (REPO / parts[0]).is_dir() or (REPO / f"{parts[0]}.py").is_file():
        base = REPO.joinpath(*parts)
        return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()
    spec = importlib.util.find_spec(parts[0])
    if spec is None:
        return False
    if len(parts) == 1:
        return True
    for location in spec.submodule_search_locations or []:
        base = Path(location).joinpath(*parts[1:])
        if base.with_suffix(".py").is_file() or (base / "__main__.py").is_file() or base.with_suffix(".pyi").exists():
            return True
    return False


def ctrpipe_subcommands() -> set[str]:
    from flows.cli.parser import build_parser

    parser = build_parser()
    for action in parser._actions:  # the subparsers action holds the subcommand names
        if getattr(action, "choices", None) and isinstance(action.choices, dict):
            return set(action.choices)
    return set()


_PY_MODULE = re.compile(r"(?<![\w-])-m[ \t]+([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_REPO_PATH = re.compile(
    r"(?<![\w.-])((?:infra|flows|pipeline|storage|trainer|bench|tests|docs)/[\w./-]*\w)(?![\w./*{-])"
)
_CTRPIPE = re.compile(r"(?<![\w/-])ctrpipe[ \t]+([a-z][\w-]*)")
_PREFECT_POOL = re.compile(r"--pool[ \t=]+[\"']?([\w-]+)")


def code_text(path: Path) -> str:
    """The parts of a file that are commands: code spans of Markdown, non-comment lines elsewhere."""
    text = path.read_text()
    if path.suffix == ".md":
        blocks = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.DOTALL)
        spans = re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
        return "\n".join(blocks + spans)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def check_references(text: str, subcommands: set[str]) -> list[str]:
    """Every `-m module`, repository path and `ctrpipe <subcommand>` named in `text` exists."""
    problems = []
    for m in sorted(set(_PY_MODULE.findall(text))):
        if not module_exists(m):
            problems.append(f"python -m {m}: no such module")
    for p in sorted(set(_REPO_PATH.findall(text))):
        path = p.split(":", 1)[0]
        if "date=" in path:  # storage layout, not a file of the repository
            continue
        if path.startswith("infra/dask/") and not (INFRA / "dask").is_dir():
            continue  # infra/dask/ is another engineer's; linking to it before it lands is fine
        if not (REPO / path).exists():
            problems.append(f"{path}: no such file in the repository")
    for sub in sorted(set(_CTRPIPE.findall(text))):
        if sub not in subcommands:
            problems.append(f"ctrpipe {sub}: not a subcommand (known: {sorted(subcommands)})")
    for pool in sorted(set(_PREFECT_POOL.findall(text))):
        if pool not in WORK_POOLS:
            problems.append(f"--pool {pool}: not one of the work pools {sorted(WORK_POOLS)}")
    return problems


def containers(objects: list[dict]) -> list[dict]:
    """Every container (and init container) of the pods `objects` create."""
    return [
        c
        for o in objects
        for _, pod, _ in pod_templates(o)
        for c in [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]
    ]


def container_commands(objects: list[dict]) -> list[str]:
    """command + args of every container, after the image's init (`INIT`), as one shell-like line each."""
    out = []
    for c in containers(objects):
        argv = [*(c.get("command") or []), *(c.get("args") or [])]
        argv = argv[len(INIT) :] if argv[: len(INIT)] == INIT else argv
        out.append(" ".join(str(a) for a in argv))
    return out


def check_init(cs: list[dict]) -> list[str]:
    """Containers of our images whose command replaces the image's ENTRYPOINT without its init (`INIT`)."""
    return [
        f"container {c.get('name')}: command {c['command']} does not start with {INIT} (the image's init)"
        for c in cs
        if str(c.get("image", "")).startswith(OUR_IMAGES) and c.get("command") and c["command"][: len(INIT)] != INIT
    ]


def dockerfile_copy_sources(text: str) -> list[str]:
    """Sources of every COPY/ADD without --from (relative to the build context = the repository root)."""
    sources = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words[1:]):
            continue
        if args and args[0].startswith("["):
            args = json.loads(" ".join(args))
        sources += args[:-1]
    return sources


def check_dockerfile(text: str) -> list[str]:
    problems = [
        f"COPY source {s} does not exist" for s in dockerfile_copy_sources(text) if not any(REPO.glob(s.lstrip("/")))
    ]
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.MULTILINE)
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append("the image does not end with a non-root USER")
    entry = re.findall(r"^ENTRYPOINT\s+(.+)$", text, flags=re.MULTILINE)
    if not entry or json.loads(entry[-1]) != [*INIT, "ctrpipe"]:
        problems.append(f"ENTRYPOINT is {entry[-1] if entry else None}, expected {json.dumps([*INIT, 'ctrpipe'])}")
    if not re.search(r"apt-get install [^\n]*\btini\b", re.sub(r"\\\n", " ", text)):
        problems.append("tini (the ENTRYPOINT's init) is not installed with apt-get")
    if not re.search(r"torch==\$\{TORCH_VERSION\}|torch==2\.13\.0", text) or "TORCH_VERSION=2.13.0" not in text:
        problems.append("torch is not pinned to 2.13.0")
    if "download.pytorch.org/whl/" not in text:
        problems.append("torch does not come from the PyTorch wheel index")
    problems += find_text_secrets(text)
    return problems


_PLACEHOLDER = re.compile(r"\{\{\s*([\w.$-]+)\s*\}\}")


def placeholders(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set().union(*(placeholders(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(placeholders(v) for v in obj)) if obj else set()
    return set(_PLACEHOLDER.findall(obj)) if isinstance(obj, str) else set()


def check_work_pool_template(t: dict) -> list[str]:
    """What `prefect work-pool create --base-job-template` and the kubernetes worker require of it."""
    problems = []
    if set(t) != {"job_configuration", "variables"}:
        return [f"top-level keys must be job_configuration and variables, got {sorted(t)}"]
    variables = t["variables"]
    props = variables.get("properties") or {}
    if variables.get("type") != "object" or not props:
        problems.append("variables must be a JSON schema object with properties")
    for name in sorted(placeholders(t["job_configuration"]) - set(props)):
        problems.append(f"placeholder {{{{ {name} }}}} has no variable in variables.properties")
    for name in sorted(set(props) - placeholders(t["job_configuration"])):
        problems.append(f"variable {name} is never used in job_configuration (Prefect ignores it)")
    for name, schema in props.items():
        if "default" in schema and schema.get("type") == "integer" and not isinstance(schema["default"], int):
            problems.append(f"variable {name}: default is not an integer")
    manifest = t["job_configuration"].get("job_manifest") or {}
    if manifest.get("apiVersion") != "batch/v1" or manifest.get("kind") != "Job":
        problems.append("job_manifest must be a batch/v1 Job")
    pod = ((manifest.get("spec") or {}).get("template") or {}).get("spec") or {}
    # prefect_kubernetes.worker._get_base_job_manifest: these must be present with these values
    for key, value in (("parallelism", 1), ("completions", 1), ("restartPolicy", "Never")):
        if pod.get(key) != value:
            problems.append(f"job_manifest spec.template.spec.{key} must be {value!r}")
    containers = pod.get("containers") or []
    if not containers or containers[0].get("name") != "prefect-job":
        problems.append("the first container must be named prefect-job")
    problems += find_inline_secrets(t)
    return problems


def flow_params(entrypoint: str) -> set[str] | None:
    """Parameter names of the flow function `path.py:func`, or None when the file or function is missing."""
    path, _, func = entrypoint.partition(":")
    file = REPO / path
    if not file.is_file():
        return None
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == func:
            a = node.args
            return {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    return None


def check_prefect_yaml(doc: dict) -> list[str]:
    problems = []
    deployments = doc.get("deployments") or []
    names = {d.get("name") for d in deployments}
    if missing := DEPLOYMENTS - names:
        problems.append(f"deployments {sorted(missing)} are missing")
    for d in deployments:
        name = d.get("name")
        params = flow_params(d.get("entrypoint", ""))
        if params is None:
            problems.append(f"deployment {name}: entrypoint {d.get('entrypoint')!r} does not exist")
        elif unknown := set(d.get("parameters") or {}) - params:
            problems.append(f"deployment {name}: parameters {sorted(unknown)} are not parameters of the flow")
        pool = (d.get("work_pool") or {}).get("name")
        if pool not in WORK_POOLS:
            problems.append(f"deployment {name}: work pool {pool!r} is not one of {sorted(WORK_POOLS)}")
    return problems + find_inline_secrets(doc)


# ---- the files exist and parse ------------------------------------------------------------------
@pytest.mark.parametrize("path", OUR_FILES, ids=rel)
def test_file_exists(path: Path) -> None:
    assert path.is_file(), f"{rel(path)} is missing"


def test_data_files_found() -> None:
    names = {rel(p) for p in data_files()}
    assert {rel(K8S / "train-job.yaml"), rel(WORK_POOL_TEMPLATE)} <= names


@pytest.mark.parametrize("path", data_files(), ids=rel)
def test_parses(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{rel(path)} holds no document"
    for doc in docs:
        assert isinstance(doc, dict), f"{rel(path)}: a document is a {type(doc).__name__}, not a mapping"


# ---- Kubernetes objects ---------------------------------------------------------------------------
def test_k8s_files_hold_only_k8s_objects() -> None:
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_docs(path):
            assert is_k8s_object(doc), f"{rel(path)}: a document without apiVersion/kind"


@pytest.mark.parametrize("path", sorted({p for p, _ in k8s_objects()}), ids=rel)
def test_k8s_required_fields(path: Path) -> None:
    problems = [p for d in load_docs(path) if is_k8s_object(d) for p in check_k8s_object(d)]
    assert not problems, f"{rel(path)}:\n" + "\n".join(problems)


def test_services_select_pods() -> None:
    problems = check_service_selectors([d for _, d in k8s_objects()])
    assert not problems, "\n".join(problems)


def test_no_inline_secrets_in_data_files() -> None:
    problems = [f"{rel(p)}: {x}" for p, d in all_docs() for x in find_inline_secrets(d)]
    assert not problems, "\n".join(problems)


def test_no_inline_secrets_in_scripts() -> None:
    problems = [
        f"{rel(p)}: {x}"
        for p in (SBATCH, *DOCKER.glob("Dockerfile.*"))
        if p.suffix != ".dockerignore"
        for x in find_text_secrets(p.read_text())
    ]
    assert not problems, "\n".join(problems)


def test_referenced_modules_paths_and_subcommands_exist() -> None:
    subcommands = ctrpipe_subcommands()
    assert {"run", "backfill", "evaluate", "models"} <= subcommands
    texts = {
        rel(p): code_text(p)
        for p in INFRA.rglob("*")
        if p.is_file()
        and (p.suffix in (".yaml", ".yml", ".json", ".sbatch", ".sh", ".md") or p.name.startswith("Dockerfile."))
        and not p.name.endswith(".dockerignore")
    }
    texts["k8s container commands"] = "\n".join(container_commands([d for _, d in k8s_objects()]))
    problems = [f"{name}: {x}" for name, text in texts.items() for x in check_references(text, subcommands)]
    assert not problems, "\n".join(problems)


def test_prefect_commands_use_our_pools() -> None:
    objects = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_objects()}
    worker = objects[("Deployment", "prefect-worker-ctr-k8s")]
    argv = container_commands([worker])[0].split()
    assert argv[:3] == ["prefect", "worker", "start"]
    assert argv[argv.index("--pool") + 1] == "ctr-k8s" and argv[argv.index("--type") + 1] == "kubernetes"
    server = objects[("Deployment", "prefect-server")]
    assert container_commands([server])[0].split()[:3] == ["prefect", "server", "start"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env") or []}


def secret_ref(entry: dict | None) -> tuple[str, str] | None:
    ref = ((entry or {}).get("valueFrom") or {}).get("secretKeyRef")
    return (ref["name"], ref["key"]) if ref else None


def test_prefect_auth_comes_from_secrets() -> None:
    objects = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_objects()}
    server = objects[("Deployment", "prefect-server")]["spec"]["template"]["spec"]["containers"][0]
    worker = objects[("Deployment", "prefect-worker-ctr-k8s")]["spec"]["template"]["spec"]["containers"][0]
    auth = secret_ref(env_of(server).get("PREFECT_SERVER_API_AUTH_STRING"))
    assert auth, "the server's PREFECT_SERVER_API_AUTH_STRING must come from a Secret"
    assert secret_ref(env_of(worker).get("PREFECT_API_AUTH_STRING")) == auth, (
        "worker and server must share the auth Secret"
    )
    assert secret_ref(env_of(worker).get("PREFECT_API_URL")), "the worker's PREFECT_API_URL must come from a Secret"


def test_ssd_volume() -> None:
    objs = [d for p, d in k8s_objects() if p == K8S / "ssd-local-volume.yaml"]
    sc = next(d for d in objs if d["kind"] == "StorageClass")
    pv = next(d for d in objs if d["kind"] == "PersistentVolume")
    pvc = next(d for d in objs if d["kind"] == "PersistentVolumeClaim")
    assert sc["metadata"]["name"] == "local-nvme"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    assert sc["provisioner"] == "kubernetes.io/no-provisioner"
    assert pv["spec"]["storageClassName"] == pvc["spec"]["storageClassName"] == "local-nvme"
    assert pv["spec"]["local"]["path"], "a local PV needs spec.local.path"
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms and terms[0]["matchExpressions"], "a local PV must be pinned to its node"
    assert set(pvc["spec"]["accessModes"]) <= set(pv["spec"]["accessModes"])


def test_train_job() -> None:
    objs = {(d["kind"], d["metadata"]["name"]): d for p, d in k8s_objects() if p == K8S / "train-job.yaml"}
    job, svc = objs[("Job", "ctr-train")], objs[("Service", "ctr-train")]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = env_of(container)
    nnodes, gpus = int(env["NNODES"]["value"]), int(env["GPUS_PER_NODE"]["value"])
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == nnodes, "completions, parallelism and NNODES must agree"
    assert svc["spec"]["clusterIP"] == "None" and pod["subdomain"] == svc["metadata"]["name"], (
        "pods need a headless Service named like their subdomain for ctr-train-<i>.ctr-train"
    )
    assert svc["spec"].get("publishNotReadyAddresses") is True
    script = " ".join(container["args"])
    argv = shlex.split(script.split("exec ", 1)[1].replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]
    opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert opt["--rdzv_backend"] == "c10d"
    host, port = opt["--rdzv_endpoint"].split(":")
    assert host == f"{job['metadata']['name']}-0.{svc['metadata']['name']}"
    assert int(port) in [p["port"] for p in svc["spec"]["ports"]]
    assert opt["--nnodes"] == "$NNODES" and opt["--nproc_per_node"] == "$GPUS_PER_NODE"
    assert opt["--node_rank"] == "$JOB_COMPLETION_INDEX"
    assert "--local_addr" in opt, "c10d orders nodes by address; ctrpipe warm-node needs the same addresses"
    assert argv[-4:-2] == ["-m", "trainer.main"] and argv[-2] == "--spec"
    assert "-m flows.cli.main warm-node" in script.split("exec ", 1)[0], "each node warms its shards before torchrun"
    for res in ("requests", "limits"):
        assert int(container["resources"][res]["nvidia.com/gpu"]) == gpus
    assert any(k.startswith("rdma/") for k in container["resources"]["limits"]), "RDMA device resource"
    assert not {n for n in env if n.startswith("NCCL_")}, "NCCL settings come from the spec (trainer.nccl_env)"
    before = script.split("exec ", 1)[0]
    assert "--env-file /tmp/ctr/train-env.sh" in before and "source /tmp/ctr/train-env.sh" in before, (
        "the pod sources the spec's environment (ctrpipe warm-node --env-file) before torchrun"
    )
    assert secret_ref(env.get("RDZV_ID")) is None and env["RDZV_ID"]["valueFrom"]["fieldRef"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert LOCAL_DIR in mounts and mounts[LOCAL_DIR] in volumes, f"the SSD tier must be mounted at {LOCAL_DIR}"
    assert set(mounts.values()) <= set(volumes), "every mount needs a volume"


def test_scorer_deployment() -> None:
    objs = {(d["kind"], d["metadata"]["name"]): d for p, d in k8s_objects() if p == K8S / "scorer.yaml"}
    dep, svc, config = (
        objs[("Deployment", "ctr-scorer")],
        objs[("Service", "ctr-scorer")],
        objs[("ConfigMap", "ctr-scorer-config")],
    )
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert not check_http_probes(container, {"readinessProbe": "/readyz", "livenessProbe": "/healthz"})
    argv = container_commands([dep])[0].split()
    assert argv[:4] == ["python", "-m", "flows.cli.main", "score-server"]
    opt = {argv[i]: argv[i + 1] for i in range(4, len(argv) - 1) if argv[i].startswith("--")}
    assert opt["--model"] == "latest" and opt["--host"] == "0.0.0.0", "a pod must listen beyond loopback"  # noqa: S104
    port = int(opt["--port"])
    assert port in [p["containerPort"] for p in container["ports"]]
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == [container["ports"][0]["name"]]
    # the token comes from a Secret, by the variable --auth-token-env names
    assert secret_ref(env_of(container).get(opt["--auth-token-env"])), "the bearer token must come from a Secret"
    # --config is the mounted ConfigMap, whose config names a root the daily flow also writes
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == config["metadata"]["name"])
    key = opt["--config"].removeprefix(mounts[volume["name"]].rstrip("/") + "/")
    loaded = yaml.safe_load(config["data"][key])
    assert loaded["root"].startswith("s3://") and loaded["store"]["local_dir"] == LOCAL_DIR
    assert LOCAL_DIR in mounts.values()


def test_checker_http_probes_fail() -> None:
    good = {
        "name": "c",
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}},
    }
    assert check_http_probes(good, {"readinessProbe": "/readyz"}) == []
    assert check_http_probes(good, {"livenessProbe": "/healthz"})
    wrong_port = {**good, "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9}}}
    assert any("not a container port" in p for p in check_http_probes(wrong_port, {"readinessProbe": "/readyz"}))


def test_work_pool_template() -> None:
    t = json.loads(WORK_POOL_TEMPLATE.read_text())
    problems = check_work_pool_template(t)
    assert not problems, "\n".join(problems)
    props = t["variables"]["properties"]
    pod = t["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = env_of(container)
    assert secret_ref(env.get("PREFECT_API_AUTH_STRING")) and secret_ref(env.get("PREFECT_API_URL"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpus }}"
    claim = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    mount = next(m for m in container["volumeMounts"] if m["name"] == claim["name"])
    assert mount["mountPath"] == LOCAL_DIR
    pvcs = {d["metadata"]["name"] for _, d in k8s_objects() if d["kind"] == "PersistentVolumeClaim"}
    assert props["ssd_claim_name"]["default"] in pvcs, "the default SSD claim must be a PVC in infra/k8s"
    # the image's ENTRYPOINT is ctrpipe: Prefect's `prefect flow-run execute` args need a neutral command
    assert container["command"] == [*INIT, "/usr/bin/env"] and container["args"] == "{{ command }}"
    sas = {d["metadata"]["name"] for _, d in k8s_objects() if d["kind"] == "ServiceAccount"}
    assert props["service_account_name"]["default"] in sas


def test_prefect_yaml() -> None:
    if not PREFECT_YAML.exists():
        pytest.skip("infra/prefect.yaml does not exist (written by the lead engineer)")
    problems = check_prefect_yaml(load_docs(PREFECT_YAML)[0])
    assert not problems, "\n".join(problems)


def test_dask_files_are_checked_when_present() -> None:
    files = sorted((INFRA / "dask").glob("*.yaml")) if (INFRA / "dask").is_dir() else []
    if not files:
        pytest.skip("infra/dask/*.yaml does not exist (owned by another engineer)")
    for path in files:
        assert path in data_files()  # so test_parses / required fields / secrets cover it


# ---- Dockerfiles ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfile(name: str) -> None:
    text = (DOCKER / name).read_text()
    problems = check_dockerfile(text)
    assert not problems, f"{name}:\n" + "\n".join(problems)


def test_dockerfile_bases() -> None:
    cpu, cuda = (DOCKER / "Dockerfile.cpu").read_text(), (DOCKER / "Dockerfile.cuda").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", cpu, flags=re.MULTILINE)
    assert "download.pytorch.org/whl/cpu" in cpu
    assert re.search(r"^FROM nvidia/cuda:", cuda, flags=re.MULTILINE)
    assert re.search(r"download\.pytorch\.org/whl/cu\d+", cuda)
    assert "is_nccl_available" in cuda, "the CUDA image checks that torch has NCCL"
    for text in (cpu, cuda):
        assert "CTR_PIPELINE_HOME=/opt/ctr-pipeline" in text, "infra/prefect.yaml's pull step uses it"
    assert re.search(r"apt-get install [^\n]*\bgcc\b", cpu) and "kernel(26, 2, 8) is not None" in cpu, (
        "the CPU image carries a compiler and checks that the attention's CPU kernel builds with it"
    )


# ---- Slurm ----------------------------------------------------------------------------------------
@pytest.mark.subprocess  # bash -n
def test_sbatch_syntax() -> None:
    out = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr


def test_sbatch_torchrun_across_nodes() -> None:
    text = SBATCH.read_text()
    assert re.search(r"^#SBATCH --ntasks-per-node=1$", text, flags=re.MULTILINE)
    assert re.search(r"srun [^\n]*--ntasks-per-node=1", text), "one srun task (one torchrun) per node"
    assert "-m torch.distributed.run" in text and "-m trainer.main --spec" in text
    assert "--rdzv_backend c10d" in text
    assert re.search(r'--rdzv_endpoint "\$\w+:\$\w+"', text) and 'RDZV_PORT="${CTR_RDZV_PORT:-29500}"' in text
    assert '--nnodes "$SLURM_NNODES"' in text and '--node_rank "$SLURM_NODEID"' in text
    assert re.search(r'--nproc_per_node "\$\w+"', text) and "--gpus-per-node" in text
    assert '--local_addr "$ME"' in text and '--my-addr "$ME"' in text, "torchrun and ctrpipe warm-node must agree"
    assert "-m flows.cli.main warm-node --spec" in text.split("exec ", 1)[0], (
        "each node warms its shards before torchrun"
    )
    assert not re.search(r"^\s*export NCCL_", text, flags=re.MULTILINE), "NCCL settings come from the spec"
    before = text.split("exec ", 1)[0]
    env_file = re.search(r'--env-file "([^"]+)"', before)
    assert env_file and f'source "{env_file.group(1)}"' in before, (
        "each node sources the spec's environment (ctrpipe warm-node --env-file) before torchrun"
    )


def test_installed_torch_orders_c10d_nodes_by_address() -> None:
    """`ctrpipe warm-node`'s assumption, read from the installed torch's source (importing torch takes seconds)."""
    torch_dir = Path(importlib.util.find_spec("torch").submodule_search_locations[0])
    src = (torch_dir / "distributed" / "elastic" / "rendezvous" / "dynamic_rendezvous.py").read_text()
    assert "enumerate(sorted(state.participants))" in src, "c10d no longer numbers nodes in sorted order"
    desc = re.search(r"@dataclass\(([^)]*)\)\s*class _NodeDesc:.*?\n\s+addr: str\n\s+pid: int", src, flags=re.DOTALL)
    assert desc and "order=True" in desc.group(1), "_NodeDesc no longer orders by address first"
    run = (torch_dir / "distributed" / "run.py").read_text()
    assert '"--local_addr"' in run or '"--local-addr"' in run


# ---- the checkers fail on broken input ---------------------------------------------------------------
def _deployment(**container: Any) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "w", "namespace": "ctr"},
        "spec": {
            "selector": {"matchLabels": {"app": "w"}},
            "template": {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "c", **container}]}},
        },
    }


def test_checker_k8s_object_fails() -> None:
    assert check_k8s_object(_deployment(image="i", command=["x"])) == []
    problems = check_k8s_object(_deployment())
    assert any("no image" in p for p in problems) and any("no command" in p for p in problems)
    bad = _deployment(image="i", command=["x"])
    bad["metadata"] = {"name": "Bad_Name"}
    bad["spec"]["selector"]["matchLabels"] = {"app": "other"}
    problems = check_k8s_object(bad)
    assert any("DNS name" in p for p in problems) and any("namespace" in p for p in problems)
    assert any("matchLabels" in p for p in problems)


def test_checker_service_selector_fails() -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "namespace": "ctr"},
        "spec": {"selector": {"app": "w"}},
    }
    assert check_service_selectors([svc, _deployment(image="i", command=["x"])]) == []
    svc["spec"]["selector"] = {"app": "nope"}
    assert check_service_selectors([svc, _deployment(image="i", command=["x"])])
    svc["spec"]["selector"] = {"app": "w"}
    svc["metadata"]["namespace"] = "elsewhere"
    assert check_service_selectors([svc, _deployment(image="i", command=["x"])])


def test_checker_inline_secrets_fails() -> None:
    assert find_inline_secrets({"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "abc123"}]})
    assert find_inline_secrets({"env": [{"name": "PREFECT_API_AUTH_STRING", "value": "admin:pw"}]})
    assert find_inline_secrets({"storage_options": {"secret": "abc", "key": "k"}})
    assert find_inline_secrets({"password": "hunter2"})
    assert not find_inline_secrets(
        {
            "env": [
                {"name": "PREFECT_API_AUTH_STRING", "valueFrom": {"secretKeyRef": {"name": "a", "key": "auth-string"}}}
            ]
        }
    )
    assert not find_inline_secrets(
        {"secretName": "ctr-dask-tls", "token": "{{ prefect.blocks.secret.t }}", "auth": "${PREFECT_AUTH}"}
    )
    assert find_text_secrets("ENV AWS_SECRET_ACCESS_KEY=abc\n")
    assert find_text_secrets("export PREFECT_API_AUTH_STRING=admin:pw\n")
    assert not find_text_secrets('export PREFECT_API_AUTH_STRING="$AUTH"\n')


def test_checker_references_fail() -> None:
    subs = ctrpipe_subcommands()
    assert check_references("python -m trainer.main; python -m torch.distributed.run; ctrpipe run", subs) == []
    assert check_references("python -m trainer.nosuchmodule", subs)
    assert check_references("python -m nosuchpackage_xyz.run", subs)
    assert check_references("python -m torch.distributed.nosuchrun", subs)
    assert check_references("ctrpipe train-everything --date D", subs)
    assert check_references("python infra/slurm/missing.py", subs)
    assert check_references("prefect worker start --pool ctr-gpu", subs)


def test_checker_dockerfile_fails() -> None:
    good = (DOCKER / "Dockerfile.cpu").read_text()
    assert check_dockerfile(good) == []
    assert any("does not exist" in p for p in check_dockerfile(good + "\nCOPY no_such_dir ./x\n"))
    assert any("non-root" in p for p in check_dockerfile(good + "\nUSER root\n"))
    assert any(
        "ENTRYPOINT" in p
        for p in check_dockerfile(good.replace('ENTRYPOINT ["/usr/bin/tini", "--", "ctrpipe"]', 'ENTRYPOINT ["bash"]'))
    )
    no_init = good.replace('ENTRYPOINT ["/usr/bin/tini", "--", "ctrpipe"]', 'ENTRYPOINT ["ctrpipe"]')
    assert any("ENTRYPOINT" in p for p in check_dockerfile(no_init))
    assert any("tini" in p for p in check_dockerfile(good.replace(" tini ", " ")))
    assert any("2.13.0" in p for p in check_dockerfile(good.replace("TORCH_VERSION=2.13.0", "TORCH_VERSION=2.12.0")))
    assert dockerfile_copy_sources('COPY --chown=1:1 a b ./\nCOPY --from=build /x /y\nCOPY ["c", "d"]\n') == [
        "a",
        "b",
        "c",
    ]


def test_the_containers_of_our_images_run_under_its_init() -> None:
    pool = json.loads(WORK_POOL_TEMPLATE.read_text())["job_configuration"]["job_manifest"]
    cs = containers([d for _, d in k8s_objects()]) + containers([pool])
    assert not check_init(cs), "\n".join(check_init(cs))
    assert sum(str(c.get("image", "")).startswith(OUR_IMAGES) for c in cs) >= 5  # server, worker, scorer, train, pool


def test_checker_init_fails() -> None:
    ours = {"name": "x", "image": "registry.example.com/ctr-pipeline:0.1.0-cpu"}
    assert check_init([{**ours, "args": ["run"]}, {**ours, "command": [*INIT, "prefect"]}]) == []
    assert check_init([{**ours, "command": ["prefect"]}]) and not check_init([{"image": "b", "command": ["c"]}])


def test_checker_work_pool_template_fails() -> None:
    t = json.loads(WORK_POOL_TEMPLATE.read_text())
    t["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]["image"] = "{{ imagee }}"
    t["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    problems = check_work_pool_template(t)
    assert any("imagee" in p for p in problems) and any("restartPolicy" in p for p in problems)


def test_checker_prefect_yaml_fails() -> None:
    doc = {
        "deployments": [
            {
                "name": "daily",
                "entrypoint": "flows/prefect/daily.py:no_such_flow",
                "work_pool": {"name": "ctr-process"},
            },
            {
                "name": "backfill",
                "entrypoint": "flows/prefect/daily.py:backfill",
                "work_pool": {"name": "gpu"},
                "parameters": {"start": "2026-01-01", "begin": "x"},
            },
        ]
    }
    problems = check_prefect_yaml(doc)
    assert any("on-demand" in p for p in problems)
    assert any("no_such_flow" in p for p in problems)
    assert any("begin" in p for p in problems) and any("'gpu'" in p for p in problems)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
