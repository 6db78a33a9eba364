# Laya on the CPU: one image for the router and the worker (`laya router`, `laya worker`).
#
#   docker build -t laya:cpu .
#   docker compose --profile cpu up        # Valkey, router, worker (compose.yaml)
#
# The CUDA variant is Dockerfile.cuda. llama-cpp-python is installed the documented way
# (pip compiles llama.cpp, with CMAKE_ARGS for the build options), in a build stage so the
# image carries no compiler. Compiling takes several minutes.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY laya ./laya
# GGML_NATIVE=OFF: kernels for any x86-64 CPU the image may run on, not only the build host's
# (llama.cpp still picks AVX2/AVX-512 paths at run time where the CPU has them).
ARG CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
RUN python -m venv /opt/laya \
    && CMAKE_ARGS="${CMAKE_ARGS}" /opt/laya/bin/pip install --no-cache-dir ".[router,worker,http,semantic]"

FROM ${PYTHON_IMAGE}
# libgomp1: llama.cpp's CPU backend threads with OpenMP.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 laya
COPY --from=build /opt/laya /opt/laya
COPY configs /app/configs
ENV PATH=/opt/laya/bin:$PATH \
    LAYA_METRICS__BIND=0.0.0.0 \
    PYTHONUNBUFFERED=1
WORKDIR /app
USER 10001
EXPOSE 9464
# compose.yaml gives each service a narrower check (`laya health --role router|worker`).
HEALTHCHECK --interval=15s --timeout=10s --start-period=120s --retries=3 CMD ["laya", "health", "--quiet"]
ENTRYPOINT ["laya"]
CMD ["router"]
