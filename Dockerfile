# syntax=docker/dockerfile:1
#
# okso: one static binary in a distroless, non-root image.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t okso:dev .
#   docker run --rm -p 8080:8080 -p 8081:8081 okso:dev          # all-in-one
#   docker run --rm okso:dev gateway --help                      # any role
#
# See deploy/README.md for Kubernetes.

ARG GO_VERSION=1.26

############################ build ############################
FROM golang:${GO_VERSION} AS build
WORKDIR /src

# Modules first, in their own layer: source edits do not download them again.
COPY go.mod go.sum ./
RUN go mod download && go mod verify

COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/okso-io/okso/roles.Version=${VERSION}" \
      -o /okso . \
 && mkdir -p /out/data

############################ run ##############################
# static: no libc, no shell; nonroot: uid/gid 65532.
FROM gcr.io/distroless/static-debian12:nonroot

ARG VERSION=dev
LABEL org.opencontainers.image.title="okso" \
      org.opencontainers.image.description="AI agents operate edge devices over MCP" \
      org.opencontainers.image.source="https://github.com/okso-io/okso" \
      org.opencontainers.image.version="${VERSION}"

COPY --from=build /okso /okso
# all-in-one keeps its signing key in --data-dir /data: owned by the
# non-root user so the first start can create it (mount a volume there to
# keep it across containers).
COPY --from=build --chown=65532:65532 /out/data /data

USER 65532:65532

# 8080 gateway (MCP, /healthz, /readyz) · 8081 device tier (WebSocket
# /v1/device/ws) · 4222 NATS clients and 6222 NATS routes, only when the
# embedded server is exposed (--nats-listen, --nats-cluster-addr).
EXPOSE 8080 8081 4222 6222

ENTRYPOINT ["/okso"]
CMD ["all-in-one", "--mcp-addr", "0.0.0.0:8080", "--device-addr", "0.0.0.0:8081", "--data-dir", "/data"]
