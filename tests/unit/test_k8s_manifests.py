"""deploy/k8s: the Kubernetes manifests, checked offline (nothing here talks to
a cluster). yamllint, then each manifest parsed (python3-yaml) and held to
what forkboxd needs: every flag and settings-file name is one the build
tree's forkboxd knows (its --help) and parses (the args with the ConfigMap's
file, then --help: exit 0), /ready for readiness and /health for liveness on
the container's own port, a grace period above the preStop sleep plus the
drain, the token from a Secret volume as a file, the metrics port where the
Prometheus annotations say. The token-reload sidecar's script is run against
a fake /proc: it signals a ready forkboxd once the Secret's version changes,
and never a decoy. Run by meson (suite unit) with FORKBOXD and FORKBOX_SRCDIR.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

SRC = os.environ.get("FORKBOX_SRCDIR") or os.path.join(os.path.dirname(__file__), "..", "..")
K8S = os.path.join(SRC, "deploy", "k8s")
FORKBOXD = os.environ.get("FORKBOXD") or os.path.join(SRC, "build", "src", "forkboxd")
MARGIN = 10  # seconds between the drain's end and SIGKILL, for the fork server and sandboxes


def manifests():
    out = {}
    for name in sorted(os.listdir(K8S)):
        if name.endswith(".yaml"):
            with open(os.path.join(K8S, name)) as f:
                out[name] = [d for d in yaml.safe_load_all(f) if d is not None]
    return out


def one(kind):
    found = [d for docs in manifests().values() for d in docs if d.get("kind") == kind]
    assert len(found) == 1, f"one {kind} expected, found {len(found)}"
    return found[0]


def pod():
    return one("Deployment")["spec"]["template"]["spec"]


def container(name):
    (c,) = [c for c in pod()["containers"] if c["name"] == name]
    return c


def forkboxd_args():
    c = container("forkboxd")
    argv = list(c.get("command", [])) + list(c.get("args", []))
    i = argv.index("/usr/sbin/forkboxd")
    assert argv[:i] == ["/usr/local/libexec/forkbox/forkbox-k8s-start"], argv
    return argv[i + 1:]


def flag(args, name):
    i = args.index(name)
    return args[i + 1]


def conf_text():
    return one("ConfigMap")["data"]["forkboxd.conf"]


def conf():
    """The settings file as forkboxd reads it: name value or name = value."""
    out = {}
    for line in conf_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"([a-z-]+)\s*(?:=\s*|\s+)?(.*)$", line)
        assert m, line
        out[m.group(1)] = m.group(2).strip()
    return out


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def quantity(text):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for u, n in units.items():
        if text.endswith(u):
            return int(text[: -len(u)]) * n
    return int(text)


def mount_of(c, path):
    """The volume mount of container c whose directory holds path."""
    mounts = [m for m in c.get("volumeMounts", [])
              if os.path.dirname(path) == m["mountPath"].rstrip("/")]
    assert len(mounts) == 1, f"{path}: no volume mounted at its directory"
    vols = {v["name"]: v for v in pod()["volumes"]}
    return mounts[0], vols[mounts[0]["name"]]


def port_number(c, port):
    if isinstance(port, int):
        return port
    (p,) = [p for p in c["ports"] if p["name"] == port]
    return p["containerPort"]


def test_yamllint():
    r = subprocess.run(["yamllint", "--strict", "-c", os.path.join(K8S, ".yamllint"), K8S],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_manifest_is_listed_and_namespaced():
    docs = manifests()
    kust = docs.pop("kustomization.yaml")[0]
    assert sorted(kust["resources"]) == sorted(docs), "kustomization.yaml must list every manifest"
    for name, ds in docs.items():
        for d in ds:
            assert d["apiVersion"] and d["kind"] and d["metadata"]["name"], name
            if d["kind"] != "Namespace":
                assert d["metadata"]["namespace"] == "forkbox", name
    # A token is never committed: the Secret is made by hand.
    kinds = [d["kind"] for ds in docs.values() for d in ds]
    assert "Secret" not in kinds


def test_selectors_match_the_pods():
    dep = one("Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    for sel in (dep["spec"]["selector"]["matchLabels"], one("Service")["spec"]["selector"],
                one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
                one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"]):
        assert sel and all(labels.get(k) == v for k, v in sel.items()), sel


def test_args_and_settings_are_forkboxd_flags():
    helptext = subprocess.run([FORKBOXD, "--help"], capture_output=True, text=True,
                              timeout=30, check=True).stdout
    known = set(re.findall(r"^\s+--([a-z-]+)", helptext, re.M))
    assert {"config", "token-file", "drain-timeout"} <= known
    args = forkboxd_args()
    for a in args:
        if a.startswith("--"):
            assert a[2:] in known, f"{a}: not a forkboxd flag"
    for name in conf():
        assert name in known, f"forkboxd.conf: {name}: not a forkboxd setting"


def test_args_parse(tmp_path):
    """forkboxd parses the args and the ConfigMap's file (values included)
    before it looks at --help: exit 0, or 2 with the reason."""
    cfg = tmp_path / "forkboxd.conf"
    cfg.write_text(conf_text())
    args = forkboxd_args()
    args[args.index("--config") + 1] = str(cfg)
    r = subprocess.run([FORKBOXD] + args + ["--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    # A bad value is caught the same way (the check can fail).
    cfg.write_text(conf_text() + "capacity = 0\n")
    r = subprocess.run([FORKBOXD] + args + ["--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--capacity" in r.stderr


def test_config_from_the_configmap():
    c = container("forkboxd")
    path = flag(forkboxd_args(), "--config")
    m, vol = mount_of(c, path)
    assert vol["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    assert os.path.basename(path) in one("ConfigMap")["data"]


def test_relations_forkboxd_checks_at_start():
    s = conf()
    first, count = (int(x) for x in s["id-range"].split(":"))
    assert count >= 2 * int(s["capacity"]) + int(s.get("pool", 4))
    assert s["listen"].rsplit(":", 1)[1] != s["metrics-listen"].rsplit(":", 1)[1]
    # total-buffer is set: its default is a quarter of the node's RAM, not the pod's.
    assert "total-buffer" in s


def test_token_from_a_secret_file():
    c = container("forkboxd")
    path = flag(forkboxd_args(), "--token-file")
    m, vol = mount_of(c, path)
    assert "secret" in vol and vol["secret"]["secretName"] == "forkbox-token"
    assert vol["secret"]["defaultMode"] == 0o400
    assert m.get("readOnly") is True
    assert "subPath" not in m, "a subPath mount never sees the Secret's updates"
    assert not any(e["name"] == "ADK_CODE_MODE_AUTH_TOKEN" for e in c.get("env", []))
    # The reload sidecar watches the same volume and may signal forkboxd.
    side = container("token-reload")
    assert any(sm["name"] == m["name"] and sm["mountPath"] == m["mountPath"]
               for sm in side["volumeMounts"])
    assert side["args"] == [m["mountPath"]]
    assert pod()["shareProcessNamespace"] is True
    sc = side["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["allowPrivilegeEscalation"] is False
    assert not sc.get("privileged")


def test_probes():
    c = container("forkboxd")
    listen = int(conf()["listen"].rsplit(":", 1)[1])
    want = {"readinessProbe": "/ready", "livenessProbe": "/health", "startupProbe": "/health"}
    for probe, path in want.items():
        get = c[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port_number(c, get["port"]) == listen, f"{probe}: not forkboxd's --listen port"
    svc = one("Service")["spec"]["ports"]
    assert [port_number(c, p["targetPort"]) for p in svc] == [listen]


def test_grace_period_outlasts_the_drain():
    c = container("forkboxd")
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre[0] == "/bin/sleep"
    drain = int(conf().get("drain-timeout", 30))
    assert pod()["terminationGracePeriodSeconds"] >= int(pre[1]) + drain + MARGIN


def test_metrics_port_and_annotations():
    c = container("forkboxd")
    ann = one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    mport = int(conf()["metrics-listen"].rsplit(":", 1)[1])
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
    assert int(ann["prometheus.io/port"]) == mport == port_number(c, "metrics")


def test_isolation_needs():
    c = container("forkboxd")
    sc = c["securityContext"]
    assert sc["privileged"] is True and sc["seccompProfile"]["type"] == "Unconfined"
    assert sc["readOnlyRootFilesystem"] is True
    m, vol = mount_of(c, "/tmp/forkbox-turn-x")  # the fork server's turn dirs
    assert "emptyDir" in vol and not m.get("readOnly")
    assert pod()["automountServiceAccountToken"] is False
    # One pod per node: one --id-range per node.
    (term,) = pod()["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert one("Deployment")["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    # The container's limit holds every turn's cgroup and the supervisor's buffers.
    s = conf()
    need = int(s["capacity"]) * size(s["memory"]) + size(s["total-buffer"])
    assert quantity(c["resources"]["limits"]["memory"]) >= need


def test_scripts_parse():
    for name in ("forkbox-k8s-start", "forkbox-token-reload"):
        path = os.path.join(K8S, name)
        assert os.access(path, os.X_OK), name
        subprocess.run(["sh", "-n", path], check=True, timeout=30)


WAITER = """
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
print("up", flush=True)
sys.exit(0 if signal.sigtimedwait({signal.SIGHUP}, 60) else 3)
"""


def status(name, uid, blk):
    return f"Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nSigBlk:\t{blk}\n"


def test_token_reload_signals_forkboxd_once_the_secret_changes(tmp_path):
    """First only decoys (a forkboxd not yet blocking SIGHUP, a sandbox
    renamed forkboxd): a change signals neither. Then a ready forkboxd
    appears: it gets SIGHUP. Each decoy alone would catch a missing check."""
    kids = []
    try:
        for _ in range(3):
            p = subprocess.Popen([sys.executable, "-c", WAITER], stdout=subprocess.PIPE, text=True)
            assert p.stdout.readline() == "up\n"
            kids.append(p)
        ready, not_ready, sandbox = kids
        proc = tmp_path / "proc"

        def show(p, st):
            (proc / str(p.pid)).mkdir(parents=True)
            (proc / str(p.pid) / "status").write_text(st)

        show(not_ready, status("forkboxd", 0, "0000000000000000"))
        show(sandbox, status("forkboxd", 2013265920, "0000000000010003"))
        secret = tmp_path / "secret"
        (secret / "..v1").mkdir(parents=True)
        (secret / "..v2").mkdir()
        os.symlink("..v1", secret / "..data")
        env = dict(os.environ, FORKBOX_PROC=str(proc), FORKBOX_RELOAD_INTERVAL="0.1")
        with open(tmp_path / "stderr", "w") as err:
            side = subprocess.Popen([os.path.join(K8S, "forkbox-token-reload"), str(secret)],
                                    env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        kids.append(side)
        assert "watching" in side.stdout.readline()
        time.sleep(1)
        assert ready.poll() is None, "SIGHUP sent without a change"
        os.symlink("..v2", secret / "..tmp")  # the kubelet's atomic swap
        os.rename(secret / "..tmp", secret / "..data")
        time.sleep(1.5)
        assert not_ready.poll() is None and sandbox.poll() is None, "a decoy was signalled"
        assert "no forkboxd ready" in (tmp_path / "stderr").read_text()
        show(ready, status("forkboxd", 0, "0000000000010003"))
        assert ready.wait(timeout=20) == 0
        assert f"SIGHUP to forkboxd {ready.pid}" in side.stdout.readline()
        assert not_ready.poll() is None and sandbox.poll() is None, "a decoy was signalled"
    finally:
        for p in kids:
            if p.poll() is None:
                p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
