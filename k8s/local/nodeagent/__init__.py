"""A small node agent for the local control plane, in place of a kubelet.

It registers Ready nodes (cpu, memory, pods and nvidia.com/gpu advertised),
binds pending pods to them (there is no scheduler), runs each pod's containers
as local processes standing in for the image (command + args, env incl.
fieldRef / Secret / ConfigMap references, workingDir), reports phase, container
states, pod IP and exit codes, serves container logs to `kubectl logs` (the API
server asks the node's kubelet port for them), and on delete sends SIGTERM,
waits the pod's grace period, then SIGKILL.

A container runs in its own mount and UTS namespace (and, with --network netns,
the pod's network namespace on a bridge): the image is a local Python
environment (--image PATTERN=VENV[:WORKSPACE]: VENV/bin first on PATH, WORKSPACE
copied to /workspace), volumes are local dirs bind-mounted at their mountPaths
(PVC: a dir per claim under the state dir; emptyDir: per pod, medium Memory in
/dev/shm; hostPath: itself), /etc/hosts is the agent's file of pod and Service
names -> pod IPs, and the command runs as the securityContext's user where that
user can start the environment's Python (else as root, with a warning).

Binding honours the pod's nodeSelector and required node affinity and picks the
least loaded node that fits (schedule.py); pods get the API server as a kubelet
and kube-proxy give it (KUBERNETES_SERVICE_HOST, a relay from the pod network to
the API server on loopback, the service account's token in its projected volume:
incluster.py). What a kubelet and a scheduler do and this does not: real images,
resource limits, probes, DNS, PVC binding, taints, preferred affinity, token refresh.

usage: python k8s/local/node_agent.py --kubeconfig K [--nodes 2] [--gpus 8] [--state DIR]

Modules, one concern each:

  common   time stamps, $(VAR) expansion, quantities, the logger
  network  pod addresses: a bridge and one network namespace per pod (or the host's)
  sandbox  an image as a local environment; a pod's env, volumes, mounts, user (Sandbox)
  status   what the API is told: container and pod status (PodStatus), node status,
           registration and heartbeats (NodeStatus)
  pod      PodRunner: one pod's processes and restart policy, SIGTERM/grace/SIGKILL
  hosts    the hosts file standing in for cluster DNS (HostsFile)
  schedule which node a pending pod goes to (nodeSelector, node affinity, least loaded)
  incluster the API server as pods reach it: env, relay, service account token (ApiAccess)
  logs     the kubelet log endpoint that `kubectl logs` reaches (LogServer)
  agent    Agent: the API client, binding, the pod sync loop, graceful deletion
  cli      the command line (python k8s/local/node_agent.py, python -m nodeagent)
"""
