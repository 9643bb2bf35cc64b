# The model repository as an image, for the init container that copies it into each
# predictor pod (deploy/kubernetes/generate.py says why). Build after ./mesh setup, from
# the repository's root:
#   docker build -f deploy/kubernetes/models.Dockerfile -t inference-mesh-models .
FROM busybox:1.37
COPY models/repository /models
USER 10001
