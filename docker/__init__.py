"""ddpkit.docker: the node image's Dockerfile, its entrypoint and the launch plan it runs."""
