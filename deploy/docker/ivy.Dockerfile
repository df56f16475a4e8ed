# syntax=docker/dockerfile:1.7
# ivy, the HTTP gateway: CPU image. Build from the repository root:
#   docker build -f deploy/docker/ivy.Dockerfile -t garden/ivy:TAG .
# Stage 1 builds the release bundle with the same script used for bare GPU hosts
# (scripts/bundle.sh, CUDA off); stage 2 keeps only ivy and the libraries it needs.

FROM debian:12 AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN scripts/bundle.sh --cuda OFF --jobs "$(nproc)" --out /out/garden && \
    mkdir -p /out/ivy/bin && cp -a /out/garden/lib /out/garden/MANIFEST /out/ivy/ && \
    cp -a /out/garden/bin/ivy /out/ivy/bin/ && \
    { cp -a /out/garden/bin/*.so /out/ivy/bin/ 2>/dev/null || true; }

FROM debian:12-slim
# Same uid/gid as the Kubernetes manifests' runAsUser/runAsGroup (deploy/k8s/base).
RUN groupadd --gid 65532 garden && useradd --uid 65532 --gid 65532 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin garden
# ivy, the shared objects it dlopen()s (next to it), its libraries.
COPY --from=build /out/ivy/ /opt/garden/
USER 65532:65532
EXPOSE 8080
# No curl in the image: bash's /dev/tcp speaks just enough HTTP for GET /health.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/opt/garden/bin/ivy"]
# ivy binds 127.0.0.1 unless told otherwise; in a container it must listen on every interface.
CMD ["--host=0.0.0.0", "--port=8080"]
