#!/usr/bin/env python3
"""Checks on the rendered manifests that the OpenAPI schemas cannot make.

Usage: check_manifests.py RENDERED.yaml MANIFESTS_DIR LEADER_GATE_BINARY

RENDERED.yaml is `kubectl kustomize MANIFESTS_DIR`. Prints one line per
finding and exits 1 if there is any. The leader-gate wiring is
`LEADER_GATE_BINARY inject --check RENDERED.yaml`'s (src/inject/check/: every
command line as start-up validates it, native sidecars, the downward API,
timings and terminationGracePeriodSeconds, the gate socket, preStop hooks,
installed binaries, the Leases gates follow, --state-dir, the grants each
Lease needs, Metricbeat's modules glob and reload period); each of its lines
is a finding here. What stays here is this project's policy for what it
ships:

- every file in MANIFESTS_DIR is listed in kustomization.yaml;
- every pod and container: non-root with the numeric user 65532, read-only
  root filesystem, no privilege escalation, all capabilities dropped,
  seccomp RuntimeDefault, CPU and memory requests and limits, a pinned image;
- every sidecar: the port `admin` 4041, /healthz liveness, a pod-local
  --collector-health-url; its service account defined; the Roles bound to it
  grant nothing its flags do not use, and no `create` on shipped Leases; the
  NetworkPolicy and the FlowSchema cover the pod;
- Metricbeat behind a file gate: every module file of its ConfigMaps matched
  by the modules glob, its http endpoint on --collector-health-url's port;
- leader routing (--route-service): a Service without a selector, the
  shipped EndpointSlice `<service>-leader` labelled for it with the same
  port names, the pod IP from the downward API, no `create` on slices.

scripts/check_recipes.py uses the command-line helpers (gate_argv, flags,
lease_names) and check_rbac_needed for the same policy in examples/.
"""

import fnmatch
import os
import re
import subprocess
import sys

import yaml

IMAGE = "ghcr.io/leader-gate/leader-gate:0.1.0"
IMAGE_REPO = IMAGE.rsplit(":", 1)[0]
USER = 65532

findings = []


def bad(where, message):
    findings.append(f"{where}: {message}")


def flags(args):
    """--name=value and --name value pairs of a leader-gate command line."""
    out, i = {}, 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        if arg.startswith("--"):
            if "=" in arg:
                name, value = arg[2:].split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                name, value = arg[2:], args[i + 1]
                i += 1
            else:
                name, value = arg[2:], "true"
            out[name] = value
        i += 1
    return out


def flag_values(args, name):
    """Every value of a repeatable --name (`--name v` or `--name=v`), before `--`."""
    out = []
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == f"--{name}" and i + 1 < len(args):
            out.append(args[i + 1])
        elif arg.startswith(f"--{name}="):
            out.append(arg.split("=", 1)[1])
    return out


def lease_names(args):
    """The Leases a `serve` command line contends for: every --lease-name
    (repeated, or separated by commas), or NAME-0 ... of --shards."""
    names = [n for value in flag_values(args, "lease-name") for n in value.split(",") if n]
    shards = flags(args).get("shards")
    if shards and len(names) == 1:
        names = [f"{names[0]}-{i}" for i in range(int(shards))]
    return names


def positional(args):
    """Arguments after the subcommand that are neither flags nor their values."""
    out, i = [], 1
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            if "=" not in arg and i + 1 < len(args) and not args[i + 1].startswith("-"):
                i += 1
        else:
            out.append(arg)
        i += 1
    return out


def glob_match(pattern, path):
    """Go's filepath.Match per path segment: `*` never crosses `/`."""
    p, q = pattern.split("/"), path.split("/")
    return len(p) == len(q) and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, q))


def gate_argv(container):
    """The leader-gate command line of a container, or None."""
    command = container.get("command") or []
    if command and command[0].endswith("/leader-gate"):
        return command[1:] + (container.get("args") or [])
    if container.get("image", "").startswith(IMAGE_REPO) and not command:
        return container.get("args") or []
    return None


def pod_templates(docs):
    for doc in docs:
        kind = doc.get("kind")
        if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
            yield doc, doc["spec"]["template"]
        elif kind == "CronJob":
            yield doc, doc["spec"]["jobTemplate"]["spec"]["template"]
        elif kind == "Pod":
            yield doc, doc


def name_of(doc):
    return f"{doc['kind']}/{doc['metadata']['name']}"


def check_kustomization(manifests):
    with open(os.path.join(manifests, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    # Resources, and the transformer configurations (not objects).
    listed = set(kustomization.get("resources", []))
    configurations = set(kustomization.get("configurations", []))
    for gone in sorted(c for c in configurations if not os.path.exists(os.path.join(manifests, c))):
        bad("kustomization.yaml", f"configurations lists {gone}, which does not exist")
    present = {
        n for n in os.listdir(manifests) if n.endswith((".yaml", ".yml")) and n != "kustomization.yaml"
    } - configurations
    for missing in sorted(present - listed):
        bad("kustomization.yaml", f"{missing} is not in resources")
    for gone in sorted(listed - present):
        bad("kustomization.yaml", f"lists {gone}, which does not exist")


def check_security(where, pod_spec):
    pod_sc = pod_spec.get("securityContext") or {}
    if pod_sc.get("runAsNonRoot") is not True:
        bad(where, "pod securityContext.runAsNonRoot is not true")
    for field in ("runAsUser", "runAsGroup"):
        if pod_sc.get(field) != USER:
            bad(where, f"pod securityContext.{field} is not {USER}")
    if (pod_sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        bad(where, "pod seccompProfile is not RuntimeDefault")
    shared = [v["name"] for v in pod_spec.get("volumes", []) if "emptyDir" in v]
    if shared and pod_sc.get("fsGroup") != USER:
        bad(where, f"emptyDir volumes {shared} but pod fsGroup is not {USER}")
    containers = pod_spec.get("initContainers", []) + pod_spec.get("containers", [])
    for c in containers:
        cw = f"{where} container {c['name']}"
        sc = c.get("securityContext") or {}
        expected = {
            "runAsNonRoot": True,
            "runAsUser": USER,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
        }
        for field, value in expected.items():
            if sc.get(field) != value:
                bad(cw, f"securityContext.{field} is {sc.get(field)!r}, not {value!r}")
        if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
            bad(cw, "securityContext.capabilities.drop is not [ALL]")
        if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            bad(cw, "securityContext.seccompProfile is not RuntimeDefault")
        if sc.get("privileged"):
            bad(cw, "privileged")
        resources = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for res in ("cpu", "memory"):
                if res not in (resources.get(kind) or {}):
                    bad(cw, f"no {kind}.{res}")
        image = c.get("image", "")
        if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest"):
            bad(cw, f"image {image!r} is not pinned to a version")
        if image.startswith(IMAGE_REPO) and image != IMAGE:
            bad(cw, f"leader-gate image is {image!r}, not {IMAGE}")


def role_grants(docs, namespace, service_account, lease, group="coordination.k8s.io", resource="leases"):
    """Which verbs on the object `lease` (a Lease unless `group` and `resource`
    say otherwise) the RoleBindings give this service account."""
    granted = set()
    roles = {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == "Role" and d["metadata"].get("namespace") == namespace
    }
    for rb in docs:
        if rb["kind"] != "RoleBinding" or rb["metadata"].get("namespace") != namespace:
            continue
        subjects = rb.get("subjects") or []
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == service_account
            and s.get("namespace", namespace) == namespace
            for s in subjects
        ):
            continue
        role = roles.get(rb["roleRef"]["name"]) if rb["roleRef"]["kind"] == "Role" else None
        if role is None:
            continue
        for rule in role.get("rules", []):
            if group not in rule.get("apiGroups", []):
                continue
            if resource not in rule.get("resources", []):
                continue
            names = rule.get("resourceNames")
            for verb in rule.get("verbs", []):
                if verb == "create" and not names:
                    granted.add("create")
                elif verb != "create" and (not names or lease in names):
                    granted.add(verb)
    return granted


def check_leader_gate(docs, doc, template):
    """The project's policy for a gated pod of its manifests. The wiring
    (flags as start-up takes them, native sidecars, the downward API,
    timings, the gate socket, preStop hooks, installed binaries, the Leases
    gates follow, --state-dir, the grants each Lease needs, Metricbeat's
    glob and reload period) is `leader-gate inject --check`'s: check_wiring."""
    where = name_of(doc)
    spec = template["spec"]
    namespace = doc["metadata"].get("namespace", "default")
    labels = template.get("metadata", {}).get("labels", {})
    inits = spec.get("initContainers", [])
    mains = spec.get("containers", [])
    gates = [(c, gate_argv(c)) for c in inits + mains]
    gates = [(c, argv) for c, argv in gates if argv is not None]
    serves = [(c, argv) for c, argv in gates if argv and argv[0] == "serve"]
    if len(serves) != 1:
        return gates
    serve, argv = serves[0]
    cw = f"{where} container {serve['name']}"
    opts = flags(argv[1:])
    ports = {p.get("name"): p["containerPort"] for p in serve.get("ports", [])}
    if ports.get("admin") != 4041:
        bad(cw, "no port `admin` 4041")
    live = (serve.get("livenessProbe") or {}).get("httpGet") or {}
    if live.get("path") != "/healthz":
        bad(cw, "liveness probe is not GET /healthz")
    ready_path = ((serve.get("readinessProbe") or {}).get("httpGet") or {}).get("path")
    health = opts.get("collector-health-url")
    if health and not re.fullmatch(r"http://127\.0\.0\.1:\d+(/.*)?", health):
        bad(cw, f"--collector-health-url {health} is not pod-local")
    for c, a in gates:
        if a and a[0] == "file-gate":
            check_file_gate(docs, where, spec, c, a, health)
    leases = lease_names(argv[1:])
    sa = spec.get("serviceAccountName", "default")
    # With manifests/lease-protection the Leases are shipped and the Role
    # must not create them (a deleted Lease stays deleted until applied again).
    shipped_names = {
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Lease" and d["metadata"].get("namespace", "default") == namespace
    }
    shipped = bool(leases) and all(lease in shipped_names for lease in leases)
    for lease_name in leases:
        if shipped and "create" in role_grants(docs, namespace, sa, lease_name):
            bad(where, f"Lease {lease_name} is shipped but service account {sa} may still create Leases: a deleted Lease would be re-created at once")
    if not any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == sa for d in docs):
        bad(where, f"service account {sa} is not defined")
    check_rbac_needed(docs, where, namespace, sa, opts, leases, shipped, serve)
    # The admin port behind a NetworkPolicy.
    covered = False
    for np in docs:
        if np["kind"] != "NetworkPolicy" or np["metadata"].get("namespace") != namespace:
            continue
        selector = np["spec"].get("podSelector", {}).get("matchLabels", {})
        if all(labels.get(k) == v for k, v in selector.items()):
            for rule in np["spec"].get("ingress", []):
                if any(p.get("port") in (4041, "admin") for p in rule.get("ports", [])):
                    covered = True
    if not covered:
        bad(where, "no NetworkPolicy limits the admin port 4041 of these pods")
    # The FlowSchema.
    for fs in docs:
        if fs["kind"] == "FlowSchema":
            subjects = [s.get("serviceAccount", {}) for r in fs["spec"]["rules"] for s in r.get("subjects", [])]
            if {"name": sa, "namespace": namespace} not in subjects:
                bad(where, f"FlowSchema {fs['metadata']['name']} does not name service account {sa}")
    # Leader routing.
    if "route-service" in opts:
        if ready_path == "/leader":
            bad(cw, "readiness on /leader with --route-service: the slice routes, readiness should say the pod works")
        check_routing(docs, doc, serve, opts, namespace, sa)
    return gates


def check_wiring(binary, rendered):
    """`leader-gate inject --check` on the rendered stream: one finding per
    line it prints; run with an empty environment, as any user's shell."""
    result = subprocess.run(
        [binary, "inject", "--check", rendered], env={}, capture_output=True, text=True, timeout=60
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.returncode not in (0, 1) or (result.returncode == 1) != bool(lines):
        bad("leader-gate inject --check", f"exited {result.returncode}: {result.stderr.strip()[-300:]}")
        return
    findings.extend(lines)


def bound_roles(docs, namespace, service_account):
    """The Roles of `namespace` that its RoleBindings give this service account."""
    roles = {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == "Role" and d["metadata"].get("namespace") == namespace
    }
    for rb in docs:
        if rb["kind"] != "RoleBinding" or rb["metadata"].get("namespace") != namespace:
            continue
        if rb["roleRef"]["kind"] != "Role" or rb["roleRef"]["name"] not in roles:
            continue
        if any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == service_account
            and s.get("namespace", namespace) == namespace
            for s in rb.get("subjects") or []
        ):
            yield roles[rb["roleRef"]["name"]]


def check_rbac_needed(docs, where, namespace, sa, opts, leases, shipped, serve):
    """RBAC only for what the flags use: every (group, resource, verb, name)
    that a Role bound to the sidecar's service account grants must be one the
    sidecar's command line needs."""
    needed = {
        ("coordination.k8s.io", "leases", v, lease)
        for v in ("get", "update", "list", "watch")
        for lease in leases
    }
    if not shipped:
        needed.add(("coordination.k8s.io", "leases", "create", None))
    if "route-service" in opts:
        slice_name = f"{opts['route-service']}-leader"
        needed |= {("discovery.k8s.io", "endpointslices", v, slice_name) for v in ("get", "update")}
    env = {e["name"]: e.get("value") for e in serve.get("env", [])}
    record = opts.get("record-events", env.get("LEADER_GATE_RECORD_EVENTS", "false"))
    if str(record).lower() == "true":
        needed.add(("", "events", "create", None))
    for role in bound_roles(docs, namespace, sa):
        for rule in role.get("rules", []):
            names = rule.get("resourceNames") or [None]
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule.get("verbs", []):
                        for name in names:
                            if (group, resource, verb, name) not in needed:
                                what = f"{verb} on {group or 'core'}/{resource}" + (f" {name}" if name else "")
                                bad(where, f"Role {role['metadata']['name']} grants {what}, which the flags of service account {sa} do not use")


def check_file_gate(docs, where, spec, container, argv, health):
    """The module files beside a file gate's DST that Metricbeat must load,
    and its http endpoint for --collector-health-url (the glob against DST
    and its temporary file, and reload.period, are inject --check's)."""
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    for mapping in positional(argv):
        _, dst = mapping.split(":", 1)
        volume = mounts.get(os.path.dirname(dst))
        for reader in spec.get("containers", []):
            if "metricbeat" in reader.get("image", "") and any(
                m["name"] == volume for m in reader.get("volumeMounts", [])
            ):
                check_metricbeat(docs, where, spec, reader, health)


def check_metricbeat(docs, where, spec, container, health):
    cw = f"{where} container {container['name']}"
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    config = None
    mounted_cms = []
    for m in container.get("volumeMounts", []):
        cm_name = (volumes.get(m["name"], {}).get("configMap") or {}).get("name")
        cm = configmaps.get(cm_name)
        if cm is None:
            continue
        mounted_cms.append((m["mountPath"], cm))
        if "metricbeat.yml" in cm.get("data", {}):
            config = yaml.safe_load(cm["data"]["metricbeat.yml"])
    if config is None:
        bad(cw, "no metricbeat.yml in a mounted ConfigMap")
        return
    pattern = (config.get("metricbeat.config.modules") or {}).get("path", "")
    module_dirs = 0
    for path, cm in mounted_cms:
        for key in cm.get("data", {}):
            if key == "metricbeat.yml":
                continue
            if glob_match(pattern, f"{path}/{key}"):
                module_dirs += 1
            elif key.endswith(".yml"):
                bad(cw, f"module file {path}/{key} (ConfigMap {cm['metadata']['name']}) is not matched by {pattern}")
    if module_dirs == 0:
        bad(cw, f"no always-present module file is matched by {pattern}")
    if health:
        port = re.search(r":(\d+)", health[len("http://"):]).group(1)
        if config.get("http.enabled") is not True or str(config.get("http.port")) != port:
            bad(cw, f"--collector-health-url {health} but Metricbeat's http endpoint is not enabled on port {port}")


def check_routing(docs, doc, serve, opts, namespace, sa):
    """--route-service: the Service without a selector, the shipped slice that
    kube-proxy will join with it, the pod's IP from the downward API, and get
    and update on that one slice."""
    where = name_of(doc)
    service_name = opts["route-service"]
    slice_name = f"{service_name}-leader"
    env = {e["name"]: e for e in serve.get("env", [])}
    got = ((env.get("LEADER_GATE_POD_IP") or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
    if got != "status.podIP" and "pod-ip" not in opts:
        bad(where, "--route-service without LEADER_GATE_POD_IP from the downward API's status.podIP")
    in_ns = [d for d in docs if d["metadata"].get("namespace", "default") == namespace]
    services = [d for d in in_ns if d["kind"] == "Service" and d["metadata"]["name"] == service_name]
    slices = [d for d in in_ns if d["kind"] == "EndpointSlice" and d["metadata"]["name"] == slice_name]
    if not services:
        return bad(where, f"--route-service {service_name}: no such Service")
    if not slices:
        return bad(where, f"--route-service {service_name}: the EndpointSlice {slice_name} is not shipped (the sidecar may not create it)")
    service, slice_ = services[0], slices[0]
    if service["spec"].get("selector"):
        bad(name_of(service), "has a selector: its own endpoints would be added to the leader's")
    labels = slice_["metadata"].get("labels", {})
    if labels.get("kubernetes.io/service-name") != service_name:
        bad(name_of(slice_), f"not labelled kubernetes.io/service-name={service_name}: kube-proxy ignores it")
    if labels.get("endpointslice.kubernetes.io/managed-by", "").startswith("endpointslice"):
        bad(name_of(slice_), "managed-by names a Kubernetes controller, which would take it over")
    service_ports = {p.get("name") for p in service["spec"].get("ports", [])}
    slice_ports = {p.get("name") for p in slice_.get("ports") or []}
    if service_ports != slice_ports:
        bad(name_of(slice_), f"port names {sorted(slice_ports)} differ from the Service's {sorted(service_ports)}: kube-proxy joins them by name")
    granted = role_grants(docs, namespace, sa, slice_name, group="discovery.k8s.io", resource="endpointslices")
    missing = {"get", "update"} - granted
    if missing:
        bad(where, f"service account {sa} lacks {sorted(missing)} on EndpointSlice {slice_name}")
    if "create" in granted:
        bad(where, f"service account {sa} may create EndpointSlices: the slice is shipped, and create cannot be limited to one name")


def main():
    rendered, manifests, binary = sys.argv[1:4]
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    check_kustomization(manifests)
    for doc, template in pod_templates(docs):
        check_security(name_of(doc), template["spec"])
        check_leader_gate(docs, doc, template)
    check_wiring(binary, rendered)
    for finding in findings:
        print(f"FAIL {finding}")
    print(f"check_manifests: {len(docs)} objects, {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
