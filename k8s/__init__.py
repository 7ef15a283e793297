"""ddpkit.k8s: the pods' launch script (launch.sh); the manifests are built in ddpkit.k8s."""
