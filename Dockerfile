# The runtime image of a training job's pods (master, PS, workers), as rendered by
# airflow_dlrover/launchers/kubernetes_manifests.py (`dlrover-rm render --launcher kubernetes`).
#
# UNTESTED: it cannot be built here: the docker CLI on this machine has no daemon to talk to
# ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock").
#
#   docker build -t airflow-dlrover:latest .
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 -t airflow-dlrover:gpu .
#
# torch: constraints.txt pins torch==2.13.0; from PyPI alone that is the CUDA build plus about a
# dozen nvidia packages (several GB, see FIELD-NOTES). The default index below serves the CPU
# wheel (2.13.0+cpu satisfies ==2.13.0); GPU workers need an image built with a CUDA index, or
# their torch.cuda.is_available() is False and they train on the CPU despite their nvidia.com/gpu.
# The image installs the package with its runtime extra (torch). The package's own dependencies
# include apache-airflow, so the image carries Airflow too although the runtime never imports it.
FROM python:3.11-slim

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

# The pods run with a read-only root filesystem: no .pyc written at run time, logs unbuffered.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/airflow-dlrover
COPY pyproject.toml README.md constraints.txt ./
COPY airflow_dlrover ./airflow_dlrover
# The package with the runtime extra, every version from the lock.
RUN pip install --no-cache-dir --extra-index-url "${TORCH_INDEX_URL}" -c constraints.txt ".[runtime]" \
    && groupadd --gid 1000 dlrover \
    && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin dlrover

# Numeric, so that the pods' runAsNonRoot can verify it; matches runAsUser/runAsGroup/fsGroup 1000.
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["python", "-m", "airflow_dlrover.runtime"]
CMD ["--help"]
