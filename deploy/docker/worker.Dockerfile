# syntax=docker/dockerfile:1.7
# The GPU worker image: tulip (scheduler) and rose (model worker), both at /opt/garden/bin.
# The Kubernetes worker pod runs it twice (rose as a sidecar, tulip as the main container, each
# with its own `command`); standalone, the default command runs tulip spawning rose.
#   docker build -f deploy/docker/worker.Dockerfile -t garden/worker:TAG .
# Stage 1 is the development machine's setup (Debian 12 + CUDA 13.0 from NVIDIA's repository)
# and builds the release bundle with scripts/bundle.sh; stage 2 is NVIDIA's CUDA runtime image,
# which supplies what the bundle deliberately leaves out (cuBLAS/cuBLASLt, NCCL; the driver is
# mounted in by the NVIDIA container toolkit).

FROM debian:12 AS build
ARG CUDA_PKG_VERSION=13-0
WORKDIR /src
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl gnupg && \
    curl -fsSLo /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb && \
    dpkg -i /tmp/cuda-keyring.deb && apt-get update && \
    apt-get install -y --no-install-recommends cuda-nvcc-${CUDA_PKG_VERSION} \
      cuda-cudart-dev-${CUDA_PKG_VERSION} libcublas-dev-${CUDA_PKG_VERSION} libnccl-dev && \
    rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:$PATH
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN scripts/bundle.sh --cuda ON --jobs "$(nproc)" --out /out/garden

FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04
RUN groupadd --gid 65532 garden && useradd --uid 65532 --gid 65532 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin garden
COPY --from=build /out/garden/bin/tulip /out/garden/bin/rose /opt/garden/bin/
COPY --from=build /out/garden/lib/ /opt/garden/lib/
COPY --from=build /out/garden/MANIFEST /opt/garden/MANIFEST
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
EXPOSE 50051 9091
# tulip serves its metrics over HTTP on 9091; an answer there means the process is up (the gRPC
# health service on 50051 is what Kubernetes probes).
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9091 && printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/opt/garden/bin/tulip"]
# tulip binds 127.0.0.1 unless told otherwise; in a container it must listen on every interface.
# Anything that can reach the port can call tulip: add --auth-token-file=FILE (and give ivy the
# token with --tulip-token-file) unless only ivy can reach it.
CMD ["--host=0.0.0.0", "--port=50051", "--metrics-port=9091", "--model=/models/model", "--device=cuda", "--rose-bin=/opt/garden/bin/rose"]
