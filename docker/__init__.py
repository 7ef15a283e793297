"""ddpkit.docker: the Docker engine: backend.py (DockerBackend), options.py ([docker]),
render.py (pure: the run argv), image.py (builds), run.py (the container's life); and the node
image: its Dockerfile, its entrypoint and nproc.py (the process count the entrypoint asks).
Importing this package stays cheap: the image's entrypoint imports ddpkit.docker.nproc."""
