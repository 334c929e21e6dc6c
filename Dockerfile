# One static, non-root image holding the three binaries:
#   /manager (the operator), /scheduler (the data plane), /providersim (the simulator).
# Build: docker build -t ghcr.io/fairshare-dev/fairshare:v0.1.0 .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
# The RBAC manifests the binaries embed to check their permissions at start.
COPY config/rbac/ config/rbac/
COPY controllers/ controllers/
COPY internal/ internal/
ARG TARGETOS=linux
ARG TARGETARCH=amd64
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/manager ./cmd/scheduler ./cmd/providersim

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/manager /out/scheduler /out/providersim /
USER 65532:65532
ENTRYPOINT ["/manager"]
