#!/usr/bin/python3
"""docs/kubernetes.md's manifests against what the launcher needs (no cluster here).

Each yaml block must parse, and each PyTorchJob or TrainJob in it must run, in the CPU image
(docker/Dockerfile.cpu: working directory /ddp), `build/launcher build/ddp_train --config X`
with no launcher option (the operator's PET_* variables give them) and a config the repository
has; give DDP_JOB_TOKEN from a Secret; mount an emptyDir of medium Memory at /dev/shm; and stop
its workers (DDP_LAUNCH_GRACE_PERIOD) inside the pod's termination grace period.

  kubernetes_test.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import sys

import yaml

DEFAULT_POD_GRACE = 30  # Kubernetes' terminationGracePeriodSeconds
LAUNCHER_GRACE = 5.0    # the launcher's --grace-period default


def yaml_blocks(markdown):
    return re.findall(r"^```yaml\n(.*?)^```", markdown, flags=re.S | re.M)


def check_command(command, where, source, build):
    assert command[:2] == ["build/launcher", "build/ddp_train"], \
        f"{where}: the command must be build/launcher build/ddp_train ..., got {command[:2]}"
    for program in ("launcher", "ddp_train"):
        assert os.access(os.path.join(build, program), os.X_OK), f"{where}: no build/{program}"
    assert "--config" in command, f"{where}: no --config"
    config = command[command.index("--config") + 1]
    assert os.path.isfile(os.path.join(source, config)), f"{where}: no {config} in the repository"


def check_env(env, where, pod_grace):
    by_name = {e["name"]: e for e in env}
    token = by_name.get("DDP_JOB_TOKEN", {})
    assert "secretKeyRef" in token.get("valueFrom", {}), \
        f"{where}: DDP_JOB_TOKEN must come from a Secret (the store refuses clients without it)"
    grace = float(by_name.get("DDP_LAUNCH_GRACE_PERIOD", {}).get("value", LAUNCHER_GRACE))
    assert grace < pod_grace, \
        f"{where}: the launcher's grace period {grace} s must end inside the pod's {pod_grace} s"
    assert not any(name.startswith("PET_") for name in by_name), \
        f"{where}: the operator sets the PET_* variables itself"


def check_shm(mounts, volumes, where):
    at = [m["name"] for m in mounts if m["mountPath"] == "/dev/shm"]
    assert at, f"{where}: nothing mounted at /dev/shm (Docker's 64 MB default is too small)"
    volume = next(v for v in volumes if v["name"] == at[0])
    assert volume.get("emptyDir", {}).get("medium") == "Memory", \
        f"{where}: /dev/shm must be an emptyDir of medium Memory"


def check_pytorchjob(job, source, build):
    spec = job["spec"]
    nproc = str(spec["nprocPerNode"])
    assert nproc.isdigit() or nproc in ("auto", "cpu", "gpu"), f"nprocPerNode {nproc}"
    replicas = spec["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1, "one Master (node 0)"
    for role, replica in replicas.items():
        where = f"PyTorchJob {job['metadata']['name']} {role}"
        pod = replica["template"]["spec"]
        container = next(c for c in pod["containers"] if c["name"] == "pytorch")  # the operator's
        assert container["image"].endswith("/ddp:cpu"), f"{where}: the CPU image"
        check_command(container["command"], where, source, build)
        check_env(container["env"], where, pod.get("terminationGracePeriodSeconds",
                                                    DEFAULT_POD_GRACE))
        check_shm(container["volumeMounts"], pod["volumes"], where)


def check_trainjob(job, source, build):
    spec = job["spec"]
    where = f"TrainJob {job['metadata']['name']}"
    assert spec["runtimeRef"]["name"] == "torch-distributed", f"{where}: the torch runtime"
    trainer = spec["trainer"]
    assert trainer["image"].endswith("/ddp:cpu"), f"{where}: the CPU image"
    assert int(trainer["numNodes"]) >= 1 and int(trainer["numProcPerNode"]) >= 1
    check_command(trainer["command"], where, source, build)
    check_env(trainer["env"], where, DEFAULT_POD_GRACE)
    override = next(o for o in spec["podSpecOverrides"]
                    if {"name": "node"} in o["targetJobs"])
    container = next(c for c in override["containers"] if c["name"] == "node")
    check_shm(container["volumeMounts"], override["volumes"], where)


def main():
    source, build = sys.argv[1], sys.argv[2]
    with open(os.path.join(source, "docs", "kubernetes.md")) as f:
        blocks = yaml_blocks(f.read())
    checked = []
    for block in blocks:
        document = yaml.safe_load(block)
        kind = document.get("kind")
        if kind == "PyTorchJob":
            check_pytorchjob(document, source, build)
        elif kind == "TrainJob":
            check_trainjob(document, source, build)
        else:
            continue
        checked.append(kind)
    assert sorted(checked) == ["PyTorchJob", "TrainJob"], f"manifests found: {checked}"
    print(f"kubernetes_test: {', '.join(checked)} fit the launcher")


if __name__ == "__main__":
    main()
